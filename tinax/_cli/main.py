"""The ``tinax`` command (also ``python -m tinax.explore``): the explore tables in a
terminal, or as JSON or CSV for scripts.

``tinax ls ROOT`` lists a run's checkpoints (with its metric and why each is kept),
or the runs of a folder of runs; ``tinax show PATH`` a checkpoint's leaves or
(``--leaf``) one leaf, ``tinax diff A B`` compares two checkpoints, ``tinax verify
PATH`` checks a checkpoint or every checkpoint of a run, ``tinax export CKPT OUT``
writes safetensors, ``tinax run ROOT`` prints the run at a glance, ``tinax plan PATH``
what restoring a checkpoint will read and hold, ``tinax set-aside ROOT`` sets a run's
diverged checkpoints aside (or removes them), and ``tinax derive SRC DST`` and
``tinax average SRC … --out DST`` make new checkpoints from old ones.
``tinax PATH`` is ``ls`` for a run and ``show`` for a checkpoint.

A tool for scripts as much as for people: one table of exit statuses for every
command (``args.EXIT_STATUSES``, under every ``--help``), kept when the reader
stops early (``tinax diff A B | head -1`` exits with diff's status); usage errors
exit 2 with the usage; Ctrl-C exits 130 with one line. This module reads the
command line and imports what a command needs only when it runs it, so that
``--help`` and usage errors answer at once. The commands live beside it:
``commands`` (``ls``, ``show``, ``diff``, ``export``), ``verify``, ``run_command``,
``surgery`` (``derive``, ``average``); with
``args`` (every command's arguments), ``output`` (JSON, CSV, progress bars),
``terminal`` (the tables' layout) and ``findings`` (``verify``'s findings grouped);
the leaf a name given to ``--leaf`` means is ``tinax.explore._key_match``'s, as for
``read_leaf``.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import sys
from collections.abc import Sequence
from typing import TextIO

from tinax._cli import args as cli_args
from tinax._cli.args import EXIT_OK, EXIT_TROUBLE, interrupted

__all__ = ["console", "main"]

PROG = "tinax"
# A first argument that is one of these is the command ("tinax verify" alone is a
# usage error); a directory with such a name is shown with "tinax show ./verify".
COMMANDS = (
    "ls",
    "show",
    "diff",
    "verify",
    "export",
    "run",
    "plan",
    "derive",
    "average",
    "set-aside",
)


class ReaderGone(io.TextIOBase):
    """A stream whose reader may stop reading (``| head``): from then on what is
    written is dropped, so that the command goes on to its end and exits with its
    own status, as ``diff`` and ``grep`` do.

    The stream's file descriptor is then pointed at ``/dev/null``, so that
    nothing left in Python's buffers fails at exit either.
    """

    def __init__(self, stream: TextIO) -> None:
        super().__init__()
        self._stream = stream
        self.gone = False

    def _lost(self) -> None:
        self.gone = True
        try:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, self._stream.fileno())
            os.close(devnull)
        except (OSError, ValueError, io.UnsupportedOperation):
            pass

    def write(self, text: str) -> int:
        if not self.gone:
            try:
                self._stream.write(text)
            except BrokenPipeError:
                self._lost()
        return len(text)

    def flush(self) -> None:
        if not self.gone:
            try:
                self._stream.flush()
            except BrokenPipeError:
                self._lost()

    def isatty(self) -> bool:
        return not self.gone and self._stream.isatty()

    def fileno(self) -> int:
        return self._stream.fileno()

    def writable(self) -> bool:
        return True


def _lay_out(parsed: argparse.Namespace) -> argparse.Namespace:
    """Tables laid out as ``--wide`` says (terminal's width otherwise); the parsed
    arguments given back. The table machinery is imported where a table is drawn."""
    wide = bool(getattr(parsed, "wide", False))
    if wide or "tinax._cli.terminal" in sys.modules:
        from tinax._cli import terminal

        terminal.set_wide(wide)
    return parsed


def _dispatch(argv: list[str], out: TextIO, err: TextIO, prog: str) -> int:
    command = argv[0] if argv and argv[0] in COMMANDS else None
    rest = argv[1:] if command else argv
    if command == "diff":
        with cli_args.importing(prog):
            from tinax._cli.commands import diff

        return diff(_lay_out(cli_args._diff_parser(prog).parse_args(rest)), out)
    if command == "verify":
        parsed = _lay_out(cli_args._verify_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.verify import verify_command

        return verify_command(parsed, out, err)
    if command == "export":
        parsed = _lay_out(cli_args._export_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.commands import export

        return export(parsed, out, err)
    if command == "run":
        parsed = _lay_out(cli_args._run_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.run_command import run_command

        return run_command(parsed, out, err)
    if command == "plan":
        parsed = _lay_out(cli_args._plan_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.plan import plan_command

        return plan_command(parsed, out, err)
    if command == "set-aside":
        parsed = _lay_out(cli_args._set_aside_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.set_aside import set_aside_command

        return set_aside_command(parsed, out)
    if command in ("derive", "average"):
        with cli_args.importing(prog):
            from tinax._cli import surgery

        return surgery.run(command, rest, out, err, prog)
    if command == "ls":
        parsed = _lay_out(cli_args._ls_parser(prog).parse_args(rest))
        with cli_args.importing(prog):
            from tinax._cli.ls import show_listing

        show_listing(parsed.root, parsed, out, err)
        return EXIT_OK
    if command == "show":
        parsed = _lay_out(cli_args._show_parser(prog).parse_args(rest))
    else:
        parsed = _lay_out(cli_args._parser(prog).parse_args(rest))
    with cli_args.importing(prog):
        from tinax._cli.commands import show

    show(parsed.path, parsed, out, err, listing=False)
    return EXIT_OK


def main(
    argv: Sequence[str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
    *,
    prog: str = PROG,
) -> int:
    """Runs the command line; returns the exit status (``args.EXIT_STATUSES``).

    ``ls``, ``show``, ``diff``, ``verify``, ``export``, ``run``, ``plan``, ``derive`` and
    ``average`` are commands;
    anything else shows a run or a checkpoint. 0 is success, 1 a ``diff`` that
    differs or a ``verify`` that is not sound, 2 trouble (a usage error, with the
    usage; a missing path; an unreadable checkpoint), the same for every command.
    """
    out = out or sys.stdout
    err = err or sys.stderr
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv[0] if argv and argv[0] in COMMANDS else None
    try:
        # argparse writes --help, --version and usage errors to sys.stdout and
        # sys.stderr: they go where the caller said.
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            return _dispatch(argv, out, err, prog)
    except SystemExit as e:
        # argparse: --help and --version (0), a usage error with the usage (2).
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else 2)
    except (OSError, ValueError, TypeError) as e:
        if isinstance(e, BrokenPipeError):
            raise
        print(f"{prog}{' ' + command if command else ''}: error: {e}", file=err)
        return EXIT_TROUBLE


def console(prog: str = PROG) -> None:
    """The ``tinax`` console command: ``main``'s status as the exit status; Ctrl-C is
    one line and status 130 (``args.interrupted``) whenever it comes, the process's
    end included; a reader that stops early changes no status."""
    try:
        out, err = ReaderGone(sys.stdout), ReaderGone(sys.stderr)
        status = main(out=out, err=err, prog=prog)  # type: ignore[arg-type]
        out.flush()
        err.flush()
        # From here the process only ends (threads joined, modules torn down).
        signal.signal(signal.SIGINT, lambda *_: interrupted(prog))
    except KeyboardInterrupt:
        interrupted(prog)
    sys.exit(status)
