"""``verify``: the checks of a checkpoint, its structure, metadata, checksums and data."""
