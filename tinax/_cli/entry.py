"""The ``tinax`` console command as a shell starts it: Ctrl-C at any moment, while its
imports run too, is one line on stderr and status 130, never a traceback.

Light on purpose: the command's machinery (``main`` and what it imports) is imported
inside the one place that turns an interrupt into that line.
"""

from __future__ import annotations

from tinax._cli.args import importing, interrupted

PROG = "tinax"


def console(prog: str = PROG) -> None:
    """The ``tinax`` command (``tinax._cli.main.console``), its imports interruptible."""
    try:
        with importing(prog):
            from tinax._cli import main

        main.console(prog)
    except KeyboardInterrupt:
        interrupted(prog)


def __getattr__(name: str) -> object:
    # The command's parsers and runner, for what reads the command through its entry
    # point (the documentation's page of it), imported when asked for.
    if name in ("COMMANDS", "main"):
        from tinax._cli import main

        return getattr(main, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
