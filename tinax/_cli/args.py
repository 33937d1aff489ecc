"""The ``tinax`` command's arguments: one parser per command, help that fits the terminal.

Light on purpose: ``tinax --help`` and a usage error import nothing but this (no
pandas, no readers), so they answer at once.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import signal
import textwrap
import threading
from collections.abc import Iterator
from typing import Any

# The command's exit statuses, the same for every command.
EXIT_OK = 0
EXIT_NO = 1
EXIT_TROUBLE = 2
EXIT_INTERRUPTED = 130
EXIT_STATUSES = f"""exit status, for every command:
  {EXIT_OK:<4} success; diff: the two are the same; verify: every checkpoint is sound
       and none diverged (one whose health is not yet known passes); plan: the
       restore fits
  {EXIT_NO:<4} diff: they differ; verify: a checkpoint is not sound (damaged or
       incomplete) or diverged (NaN or Inf in its model or optimizer state, or a
       logged metric NaN or infinite; with --strict, warnings too); plan: a load
       would be refused (it does not fit in memory)
  {EXIT_TROUBLE:<4} trouble: a usage error, a path that does not exist, a checkpoint that
       cannot be read (one line on stderr says which)
  {EXIT_INTERRUPTED:<4} interrupted (Ctrl-C)
A reader that stops early (| head) changes none of these."""


def interrupted(prog: str) -> None:
    """Ctrl-C: says so in one line and ends the process with ``EXIT_INTERRUPTED`` at
    once (threads reading a checkpoint are not waited for); a second Ctrl-C changes
    nothing."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with contextlib.suppress(OSError):  # stderr gone: the status says it
        os.write(2, f"{prog}: interrupted\n".encode())
    os._exit(EXIT_INTERRUPTED)


# The command's name that ``_on_interrupt`` says, while a guard is on.
_guarded_prog = "tinax"


def _on_interrupt(signum: int, frame: object) -> None:
    interrupted(_guarded_prog)


def guard(prog: str) -> bool:
    """From now on Ctrl-C ends the process at once (``interrupted``, naming ``prog``)
    instead of raising ``KeyboardInterrupt``, until ``importing``'s block ends; only in
    the main thread, and only where SIGINT is at Python's default (nobody else handles
    it). Returns whether the guard is on."""
    global _guarded_prog
    current = signal.getsignal(signal.SIGINT)
    if threading.current_thread() is not threading.main_thread() or current not in (
        signal.default_int_handler,
        _on_interrupt,
    ):
        return False
    _guarded_prog = prog
    signal.signal(signal.SIGINT, _on_interrupt)
    return True


@contextlib.contextmanager
def importing(prog: str) -> Iterator[None]:
    """While the block imports the command's modules, Ctrl-C ends the process at once
    (``interrupted``) instead of raising ``KeyboardInterrupt`` there: an interrupt
    raised inside an extension's set-up (msgspec building a decoder as a module
    imports) can crash the interpreter (SIGSEGV) instead of unwinding. A guard put on
    before (``guard``, as the command's entry module does when it is imported to run
    the command) is taken over; after the block Ctrl-C raises ``KeyboardInterrupt``
    again, for the command to stop cleanly. Elsewhere (another thread, SIGINT ignored
    or handled by someone else) it changes nothing.
    """
    if not guard(prog):
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# ``run --drift`` shows this many of the largest moves in text (--json/--csv: all).
DRIFT_ROWS = 20

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _width() -> int:
    """The terminal's width, as the tables take it (``terminal.width``)."""
    return max(20, shutil.get_terminal_size((80, 24)).columns)


class _Formatter(argparse.HelpFormatter):
    """Wraps the description; keeps the epilog's lines (the exit-status table) as written."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if "\n" in text:
            return textwrap.indent(text, indent)
        return super()._fill_text(text, width, indent)


class _Once(argparse.Action):
    """An option that takes one value: given twice, a usage error, never the last one
    silently kept."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: Any,
        option_string: str | None = None,
    ) -> None:
        seen: set[str] = getattr(parser, "_given", set())
        if self.dest in seen:
            raise argparse.ArgumentError(
                self,
                "given more than once: give it once (its last value would be the only one taken)",
            )
        seen.add(self.dest)
        setattr(namespace, self.dest, values)


class _Parser(argparse.ArgumentParser):
    """Help laid out for the terminal's width (80 in a pipe), the exit statuses under it.

    Options repeat as scripts expect: one that takes several values (``--only A B``)
    gathers them from every time it is given (``--only A --only B``); one that takes
    one value is a usage error when given twice, never narrowed to the last.
    """

    def __init__(self, **kwargs: object) -> None:
        kwargs.setdefault("epilog", EXIT_STATUSES)
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self._given: set[str] = set()

    def add_argument(self, *args: Any, **kwargs: Any) -> argparse.Action:
        if args and str(args[0]).startswith("-") and kwargs.get("action", "store") == "store":
            if kwargs.get("nargs") in ("+", "*") and not kwargs.pop("once", False):
                kwargs["action"] = "extend"
            else:
                kwargs.pop("once", None)
                kwargs["action"] = _Once
        return super().add_argument(*args, **kwargs)

    def parse_known_args(self, *args: Any, **kwargs: Any) -> Any:
        self._given = set()
        return super().parse_known_args(*args, **kwargs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        return _Formatter(self.prog, width=min(_width(), 100))


# What each command does, as its help begins (wrapped to the terminal).
_ABOUT = {
    "ls": """List a run's checkpoints: step, status, size, age, and for a run written by
        TrainingRun its metric and why each checkpoint is kept; of a folder of runs, its
        runs. Metadata only.""",
    "show": """Show a checkpoint's leaves (metadata only), or with --leaf one leaf's
        statistics (reads that leaf's bytes only).""",
    "diff": """Compare two checkpoints leaf by leaf, leaves that went NaN or Inf first,
        then the largest change. Arrays are read region by region in bounded memory.
        Exits 0 when every leaf is the same, 1 when they differ, 2 on trouble (as diff
        does).""",
    "verify": """Check that a checkpoint is whole and loadable (sound, damaged or
        incomplete) and whether a run can go on from it (healthy, diverged or not yet
        known), or every checkpoint of a run. A NaN or infinite metric the save logged
        makes it diverged without its data being read; with --data every array is
        read, checked against its checksums and its NaN and Inf counted. Exits 0 when
        all are sound and none diverged, 1 when one is not sound or diverged, 2 when
        one cannot be checked.""",
    "export": """Write a checkpointable's arrays as .safetensors files named after it,
        streamed from the checkpoint with its checksums checked. Over --max-file-size,
        several files and an index in the Hugging Face hub's layout.""",
    "set-aside": """Set a run's diverged checkpoints aside (renamed
        <name>.tinax-abandoned, listed as abandoned, kept for inspection, never resumed
        from), or remove them (--remove), so that a restore resumes from the newest
        healthy step and the steps after it can be saved again. A checkpoint diverged
        when a metric its save logged is NaN or infinite, or reading its data found NaN
        or Inf (--data reads the checkpoints whose health is not yet known). Both tiers
        of a two-tier run. Not while a run saves there.""",
    "run": """The run at a glance: one row per checkpoint with its metrics, save times
        and why it is kept (metadata only). --drift adds how far each layer moved
        between consecutive checkpoints, --scan the NaN/Inf counts and where to roll
        back to (both read array data).""",
    "plan": """What restoring a checkpoint will read and hold, per process and per
        device, before a byte is read (metadata only): bytes, files and chunks read,
        bytes read beyond each device's part, the peak host memory and each device's
        memory, against what is available. As saved, or on another mesh (--mesh).
        Exits 0 when it fits, 1 when a load would be refused.""",
    "derive": """Write a new checkpoint made from one: only some checkpointables
        (--only), only the leaves whose dotted key a regular expression finds (--keys),
        floating-point arrays cast (--cast), keys rewritten (--rename). Streamed,
        checked against the source's checksums, written atomically, with its
        lineage.""",
    "average": """Write a new checkpoint whose floating-point leaves are the (weighted)
        mean of several checkpoints of one structure; every other leaf must be equal in
        all. Streamed, checked against the sources' checksums, written atomically, with
        its lineage.""",
}
_CHECKPOINT = "a checkpoint directory (local or gs://)"
_RUN = "a run directory (local or gs://)"


def _command(prog: str, name: str, **positionals: str) -> argparse.ArgumentParser:
    """The parser of ``prog name``: its description (``_ABOUT``), its positional
    arguments (name → help, in order)."""
    parser = _Parser(prog=f"{prog} {name}", description=" ".join(_ABOUT[name].split()))
    for argument, said in positionals.items():
        parser.add_argument(argument, help=said)
    return parser


def _add_switches(
    parser: argparse.ArgumentParser, switches: dict[str | tuple[str, ...], str]
) -> None:
    """Options that are on or off: flag (or flags, the first naming it) → help."""
    for flags, said in switches.items():
        names = (flags,) if isinstance(flags, str) else flags
        parser.add_argument(*names, action="store_true", help=said)


def _add_cast(parser: argparse.ArgumentParser, flag: str, said: str) -> None:
    """``flag DTYPE``: the floating-point type arrays are written as; ``said`` is its
    help, to which the types offered are added."""
    from tinax._format.safetensors import CAST_DTYPES

    parser.add_argument(
        flag, choices=CAST_DTYPES, metavar="DTYPE", help=f"{said} ({', '.join(CAST_DTYPES)})"
    )


def _add_output(parser: argparse.ArgumentParser, *, csv_too: bool = True) -> None:
    wide = "every column of a table, however long the lines (text)"
    parser.add_argument("--wide", action="store_true", help=wide)
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--json", action="store_true", help="print JSON instead of text")
    if csv_too:
        group.add_argument("--csv", action="store_true", help="print CSV instead of text")


def _add_leaf(parser: argparse.ArgumentParser) -> None:
    said = """summarise one leaf: [CHECKPOINTABLE] KEY, the key as a table shows it
        (blocks.2.mlp.kernel, (root)) or as keystr ("['blocks'][2]..."); without
        CHECKPOINTABLE, a key that names one leaf in the checkpoint
        (model.blocks.2.mlp.kernel)"""
    parser.add_argument("--leaf", nargs="+", metavar="KEY", once=True, help=" ".join(said.split()))


def _parser(prog: str) -> argparse.ArgumentParser:
    parser = _Parser(
        prog=prog,
        description=(
            f"Show a run's checkpoints or a checkpoint's leaves. Commands: '{prog} ls "
            f"ROOT', '{prog} show PATH [--leaf KEY]', '{prog} diff A B', '{prog} "
            f"verify PATH', '{prog} export CKPT OUT', '{prog} run ROOT', '{prog} plan "
            f"PATH', '{prog} set-aside ROOT', '{prog} derive "
            f"SRC DST', '{prog} average SRC... --out DST' ('{prog} "
            "COMMAND --help' says more). Without a command, PATH is listed if it is a "
            "run and shown if it is a checkpoint."
        ),
    )
    parser.add_argument("path", help="a run directory or a checkpoint directory")
    parser.add_argument("--version", action="version", version=f"{prog} {_version()}")
    _add_leaf(parser)
    _add_output(parser)
    return parser


def _version() -> str:
    from tinax import __version__

    return __version__


def _ls_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "ls", root=_RUN)
    _add_output(parser)
    return parser


def _show_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "show", path=_CHECKPOINT)
    _add_leaf(parser)
    _add_output(parser)
    return parser


def _diff_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(
        prog,
        "diff",
        a="the checkpoint compared from (the older one)",
        b="the checkpoint compared to",
    )
    _add_switches(
        parser,
        {
            ("--key-order", "--stored-order"): (
                "rows in key order (layers by number) instead of by change"
            ),
            "--changed": "show only leaves that are not the same",
        },
    )
    _add_output(parser)
    return parser


def _verify_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "verify", path="a checkpoint directory, or a run directory")
    _add_switches(
        parser,
        {
            "--data": "also read every chunk and count NaN/Inf values",
            "--strict": "warnings (NaN/Inf values among them) and interrupted saves fail too",
            "--quiet": "print the verdicts only, one line each",
        },
    )
    _add_output(parser)
    return parser


def _positive(text: str) -> int:
    """A whole number of at least 1 (``--depth``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is less than 1")
    return value


def parse_size(text: str) -> int:
    """``5GB`` (10⁹ bytes, as the Hugging Face hub counts), ``512MiB``, ``1000000``.

    Raises:
      argparse.ArgumentTypeError: If ``text`` is not a positive size.
    """
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    unit = match.group(2).lower() if match else ""
    if match is None or unit not in _UNITS:
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a size such as 5GB, 500MB or 2GiB (a number of bytes and a unit)"
        )
    size = int(float(match.group(1)) * _UNITS[unit])
    if size <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive size")
    return size


def _export_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "export", checkpoint=_CHECKPOINT, out="a new directory for the files")
    parser.add_argument("--checkpointable", default="model", help="what to export (model)")
    keys = "only leaves whose key or tensor name contains one of these"
    parser.add_argument("--keys", nargs="+", metavar="KEY", help=keys)
    _add_cast(parser, "--dtype", "cast floating-point arrays to DTYPE")
    split = "e.g. 5GB: split the files"
    parser.add_argument("--max-file-size", type=parse_size, metavar="SIZE", help=split)
    _add_switches(parser, {"--verify": "read the written files back and compare"})
    _add_output(parser)
    return parser


def parse_mesh(text: str) -> dict[str, int]:
    """``data=4,model=2`` as axis name → size, in order.

    Raises:
      argparse.ArgumentTypeError: If ``text`` is not of that form.
    """
    axes: dict[str, int] = {}
    for item in text.split(","):
        match = re.fullmatch(r"\s*([A-Za-z_][\w-]*)\s*=\s*(\d+)\s*", item)
        if match is None or int(match.group(2)) < 1 or match.group(1) in axes:
            raise argparse.ArgumentTypeError(
                f"{text!r} is not a mesh such as data=4,model=2 (axis names, each with a "
                "positive size, once each)"
            )
        axes[match.group(1)] = int(match.group(2))
    return axes


def _plan_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "plan", path=_CHECKPOINT)
    mesh = """the saved shardings' partitions laid on a mesh of these axis sizes
        (data=4,model=2: the saved mesh's axis names); default: as saved"""
    parser.add_argument("--mesh", type=parse_mesh, metavar="AXES", help=" ".join(mesh.split()))
    budget = "e.g. 8GiB: the load's budget (default: 90%% of the host memory available)"
    parser.add_argument("--max-host-bytes", type=parse_size, metavar="SIZE", help=budget)
    platform = "plan the host memory of devices of this kind (default: cpu)"
    parser.add_argument("--platform", choices=("cpu", "tpu", "gpu"), help=platform)
    device = "e.g. 16GiB: each device's memory, to check what lands on it"
    parser.add_argument("--device-memory", type=parse_size, metavar="SIZE", help=device)
    _add_output(parser)
    return parser


def _run_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "run", root=_RUN)
    _add_switches(
        parser,
        {
            "--drift": "relative update of each layer, pair by pair",
            "--scan": "NaN/Inf counts per checkpoint, the roll-back step",
        },
    )
    depth = """with --drift, subtrees N key parts deep, counted below wrappers such as
        Linen's params (default: the model's layers)"""
    parser.add_argument("--depth", type=_positive, metavar="N", help=" ".join(depth.split()))
    top = f"with --drift, the N largest moves in text ({DRIFT_ROWS}; 0: all)"
    parser.add_argument("--top", type=int, default=DRIFT_ROWS, metavar="N", help=top)
    _add_output(parser)
    return parser


def _set_aside_parser(prog: str) -> argparse.ArgumentParser:
    parser = _command(prog, "set-aside", root=_RUN)
    _add_switches(
        parser,
        {
            "--data": "read the data of each checkpoint whose health is not yet known",
            "--remove": "remove the diverged checkpoints instead of setting them aside",
            "--dry-run": "say what would be done, and do nothing",
        },
    )
    _add_output(parser, csv_too=False)
    return parser
