"""The ``tinax`` command line: its commands, arguments, layout and output.

It sits above ``tinax.explore`` (whose read-only tables its reading commands print) and
``tinax.checkpointing`` (whose ``derive_checkpoint`` and ``average_checkpoints`` its
writing commands ``derive`` and ``average`` run, imported only when they run), so that
the explore package itself never writes a checkpoint.
"""
