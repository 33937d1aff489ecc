"""The ``tinax`` command line: its commands, arguments, layout and output."""
