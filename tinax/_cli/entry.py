"""The ``tinax`` console command as a shell starts it: Ctrl-C at any moment, while its
imports run too, is one line on stderr and status 130, never a traceback.

Light on purpose: the command's machinery (``main`` and what it imports) is imported
inside the one place that turns an interrupt into that line. When this process was
started as the command, the guard goes on as this module is imported, so that no
moment between its import and the command's start is left unguarded.
"""

from __future__ import annotations

import os
import sys

from tinax._cli.args import guard, importing, interrupted

PROG = "tinax"
# What ``python -m tinax.explore`` calls itself.
MODULE_PROG = "python -m tinax.explore"
# Where the command's parsers (``COMMANDS``) and runner (``main``) live, for what reads
# the command through its entry point (the documentation's page of it).
COMMAND_MODULE = "tinax._cli.main"


def _started_as() -> str | None:
    """The command's name when this process runs the command (the console script, or
    ``python -m tinax.explore``); None where something else imports this module (a
    notebook, the documentation's build)."""
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if spec is not None:
        return MODULE_PROG if spec.name == "tinax.explore.__main__" else None
    return PROG if os.path.basename(getattr(main, "__file__", None) or "") == PROG else None


def console(prog: str = PROG) -> None:
    """The ``tinax`` command (``tinax._cli.main.console``), its imports interruptible."""
    try:
        with importing(prog):
            from tinax._cli import main

        main.console(prog)
    except KeyboardInterrupt:
        interrupted(prog)


_prog = _started_as()
if _prog is not None:
    guard(_prog)
