"""What tinax's documentation build adds to Sphinx.

- References to a private module's object (``tinax.checkpointing._run.TrainingRun``,
  as annotations name them) resolve to the public name it is documented under.
- A guide a docstring names by its source (``docs/guides/NAME.md#section``) is a link
  to that page and section.
- ``command_line()`` is the ``tinax`` command's argument parser, one subcommand per
  command, taken from the parsers the installed command itself builds, for
  sphinx-argparse (docs/guides/command_line.md): the page cannot drift from the
  command.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import importlib.metadata
import io
import re
from collections.abc import Iterator
from typing import Any

from docutils import nodes
from sphinx.addnodes import pending_xref
from sphinx.application import Sphinx
from sphinx.environment import BuildEnvironment
from sphinx.util.docutils import SphinxDirective

# The modules whose ``__all__`` is the public API, each with a page under docs/api/.
PUBLIC_MODULES = (
    "tinax.checkpointing",
    "tinax.checkpointing.legacy.v0",
    "tinax.explore",
    "tinax.explore.display",
    "tinax.explore.toolkit",
    "tinax.widgets",
    "tinax.vocabulary",
)
# The console script whose parsers the command line's page shows.
COMMAND = "tinax"


def public_names() -> dict[str, str]:
    """Each public module's names, ``module.name`` → the module, in ``__all__`` order."""
    names = {}
    for module_name in PUBLIC_MODULES:
        module = importlib.import_module(module_name)
        for name in module.__all__:
            names[f"{module_name}.{name}"] = module_name
    return names


def _documented_objects() -> dict[int, str]:
    """``id`` of each public class, function or exception → its public dotted name."""
    found: dict[int, str] = {}
    for dotted, module_name in public_names().items():
        value = getattr(importlib.import_module(module_name), dotted.rsplit(".", 1)[1])
        if isinstance(value, type) or callable(value):
            found.setdefault(id(value), dotted)
    return found


def _lookup(target: str) -> tuple[Any, list[str]] | None:
    """The object ``target`` names, found by importing its longest module prefix, and
    the attribute names left after the object (``Class.method`` → ``["method"]``)."""
    parts = target.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            value: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for i, name in enumerate(parts[cut:]):
            if isinstance(value, type) and i > 0:
                return value, parts[cut + i :]
            try:
                value = getattr(value, name)
            except AttributeError:
                return None
        return value, []
    return None


def _public_target(target: str, documented: dict[int, str]) -> str | None:
    if not target.startswith("tinax.") or target in public_names():
        return None
    found = _lookup(target)
    if found is None:
        return None
    value, rest = found
    public = documented.get(id(value))
    return ".".join([public, *rest]) if public else None


def _resolve_private(
    app: Sphinx, env: BuildEnvironment, node: pending_xref, contnode: nodes.Element
) -> nodes.Element | None:
    if node.get("refdomain") != "py":
        return None
    documented = app.env.temp_data.setdefault("tinax_documented", _documented_objects())
    public = _public_target(node["reftarget"], documented)
    if public is None:
        return None
    domain = env.get_domain("py")
    return domain.resolve_xref(
        env, node["refdoc"], app.builder, node["reftype"], public, node, contnode
    )


def _repair_property_summary(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """Napoleon reads a property's first line ``Whether …: the rest`` as ``type:
    description``; a "type" of several words is the docstring's own sentence, put back."""
    if what not in ("attribute", "property"):
        return
    for i, line in enumerate(lines):
        said = re.fullmatch(r":type: (.+)", line)
        if said and len(said.group(1).split()) > 3 and not re.search(r"[\[|]", said.group(1)):
            del lines[i]
            first = next((j for j, text in enumerate(lines) if text.strip()), 0)
            lines[first] = f"{said.group(1)}: {lines[first]}" if lines else said.group(1)
            while lines and not lines[-1].strip():
                lines.pop()
            return


# How a docstring names a section of a guide: by its source, which a reader of help()
# finds in the repository (docs/guides/preemption.md#claim-then-write).
_GUIDE = re.compile(r"\bdocs/(guides/\w+)\.md(#[\w-]+)?")


def _link_guides(
    app: Sphinx, what: str, name: str, obj: Any, options: Any, lines: list[str]
) -> None:
    """On the site, a guide a docstring names is a link to its page (and section), so
    that the link checker also catches a section renamed under the docstring."""

    def link(found: re.Match[str]) -> str:
        page = app.builder.get_relative_uri(app.env.docname, found.group(1))
        return f"`{found.group(0)} <{page}{found.group(2) or ''}>`__"

    for i, line in enumerate(lines):
        lines[i] = _GUIDE.sub(link, line)


class _Captured(BaseException):
    """Raised in place of parsing: carries the parser a command built."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__()
        self.parser = parser


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign]
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]


def _parser_of(main: Any, argv: list[str]) -> argparse.ArgumentParser:
    """The parser the command line builds for ``argv``, caught as it is asked to parse."""
    sink = io.StringIO()
    with _capturing():
        try:
            main(argv, out=sink, err=sink)
        except _Captured as caught:
            return caught.parser
    raise RuntimeError(f"`{COMMAND} {' '.join(argv)}` parsed no arguments: {sink.getvalue()}")


def command_parsers() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The command's own parsers: the one of ``tinax PATH`` and one per command.

    The console script is found through the installed package's entry points, so the
    page follows the command wherever its code lives; its module, or the module it
    names (``COMMAND_MODULE``), names the commands (``COMMANDS``) and runs them
    (``main(argv, out=, err=)``).
    """
    (entry,) = importlib.metadata.entry_points(group="console_scripts", name=COMMAND)
    entry_module = importlib.import_module(entry.module)
    module = importlib.import_module(getattr(entry_module, "COMMAND_MODULE", entry.module))
    top = _parser_of(module.main, ["--help"])
    return top, {name: _parser_of(module.main, [name, "--help"]) for name in module.COMMANDS}


def command_line() -> argparse.ArgumentParser:
    """One parser for the whole command: ``tinax PATH`` and each command a subcommand
    of it, with the arguments, help and epilog its own parser has."""
    top, commands = command_parsers()
    top.prog = COMMAND
    subcommands = top.add_subparsers(title="commands", metavar="COMMAND", dest="command")
    for name, parser in commands.items():
        summary = (parser.description or "").split(". ")[0].rstrip(".") + "."
        subcommands.add_parser(
            name,
            parents=[parser],
            add_help=False,
            help=summary,
            description=parser.description,
            epilog=None,
            usage=parser.format_usage().removeprefix("usage: ").strip(),
        )
    return top


def exit_statuses(epilog: str) -> tuple[list[tuple[str, str]], list[str]]:
    """The exit-status table every command's help ends with, as (status, meaning) rows,
    and the lines of prose after it."""
    rows: list[tuple[str, str]] = []
    after: list[str] = []
    for line in epilog.splitlines()[1:]:
        status = re.match(r"^\s{1,4}(\d+)\s+(.*)$", line)
        if status:
            rows.append((status.group(1), status.group(2).strip()))
        elif rows and not after and line.startswith("     "):
            rows[-1] = (rows[-1][0], f"{rows[-1][1]} {line.strip()}")
        elif line.strip():
            after.append(line.strip())
    if not rows:
        raise ValueError(f"no exit statuses in the command's epilog: {epilog!r}")
    return rows, after


def _table(header: tuple[str, str], rows: list[tuple[str, str]]) -> nodes.table:
    table = nodes.table()
    group = nodes.tgroup(cols=2)
    table += group
    group += [nodes.colspec(colwidth=1), nodes.colspec(colwidth=8)]

    def row(cells: tuple[str, str], literal: bool) -> nodes.row:
        made = nodes.row()
        for i, text in enumerate(cells):
            entry = nodes.entry()
            paragraph = nodes.paragraph()
            paragraph += nodes.literal(text=text) if literal and i == 0 else nodes.Text(text)
            entry += paragraph
            made += entry
        return made

    head = nodes.thead()
    head += row(header, literal=False)
    body = nodes.tbody()
    body += [row(cells, literal=True) for cells in rows]
    group += [head, body]
    return table


class ExitStatuses(SphinxDirective):
    """The ``tinax`` command's exit statuses, read from its parser's epilog."""

    def run(self) -> list[nodes.Node]:
        top, _ = command_parsers()
        rows, after = exit_statuses(top.epilog or "")
        made: list[nodes.Node] = [_table(("status", "meaning"), rows)]
        if after:
            made.append(nodes.paragraph(text=" ".join(after)))
        return made


def setup(app: Sphinx) -> dict[str, Any]:
    app.connect("missing-reference", _resolve_private)
    app.add_directive("tinax-exit-statuses", ExitStatuses)
    app.connect("autodoc-process-docstring", _repair_property_summary, priority=600)
    app.connect("autodoc-process-docstring", _link_guides)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
