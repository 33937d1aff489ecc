"""Compatibility with Orbax V0 checkpoints. Import ``tinax.checkpointing.legacy.v0``."""
