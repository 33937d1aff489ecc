"""The guides' examples run: each ``pycon`` block of a page of docs/ as a doctest, and
each ``console`` block as commands in a shell, their output compared with the page's.

A page's examples run in order in one namespace, in a fresh directory of their own
that holds a copy of the session's demo run (``demo_run/``), the way a reader who
ran ``make demo-data`` would type them. Output is compared as doctest compares it:
``...`` stands for any text, and runs of white space are alike.
"""

from __future__ import annotations

import doctest
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
DOCS = REPO / "docs"
PAGES = sorted(
    p for p in DOCS.rglob("*.md") if "_build" not in p.parts and "generated" not in p.parts
)
FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE
FENCE = re.compile(r"^```(pycon|console)\n(.*?)^```$", re.M | re.S)


def _blocks(page: Path) -> list[tuple[str, str, int]]:
    """(language, text, line) of each example block of a page, in order."""
    text = page.read_text(encoding="utf-8")
    return [
        (m.group(1), m.group(2), text.count("\n", 0, m.start()) + 2) for m in FENCE.finditer(text)
    ]


EXAMPLES = [page for page in PAGES if _blocks(page)]


def test_the_guides_have_examples_that_run() -> None:
    names = {page.relative_to(DOCS).as_posix() for page in EXAMPLES}
    # Every guide that shows the library at work shows it in examples that run.
    assert {
        "guides/training_runs.md",
        "guides/preemption.md",
        "guides/two_tiers.md",
        "guides/integrity.md",
        "guides/explorer.md",
        "guides/diff_drift_scan.md",
        "guides/derived.md",
        "guides/safetensors.md",
        "guides/command_line.md",
    } <= names


def _console(block: str) -> list[tuple[str, str]]:
    """(command, expected output) of each ``$ `` line of a console block."""
    commands: list[tuple[str, str]] = []
    for line in block.splitlines():
        if line.startswith("$ "):
            commands.append((line[2:], ""))
        elif commands:
            command, expected = commands[-1]
            commands[-1] = (command, expected + line + "\n")
    return commands


@pytest.mark.parametrize("page", EXAMPLES, ids=lambda p: p.relative_to(DOCS).as_posix())
def test_the_examples_of_a_page_run_as_shown(
    page: Path, demo_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copytree(demo_run, tmp_path / "demo_run", symlinks=True)
    monkeypatch.chdir(tmp_path)
    # The commands as a reader types them: the venv's tinax first on PATH, 80 columns.
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "COLUMNS": "80",
    }
    checker = doctest.OutputChecker()
    globs: dict[str, object] = {"__name__": "__guide__"}
    failures = []
    for language, block, line in _blocks(page):
        where = f"{page.relative_to(REPO)}:{line}"
        if language == "pycon":
            test = doctest.DocTestParser().get_doctest(block, globs, where, str(page), line)
            report: list[str] = []
            runner = doctest.DocTestRunner(optionflags=FLAGS)
            runner.run(test, out=report.append, clear_globs=False)
            globs = test.globs  # a DocTest runs in a copy: the next block goes on from it
            failures += report
            continue
        for command, expected in _console(block):
            done = subprocess.run(
                ["bash", "-c", command],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            if done.returncode != 0:
                failures.append(f"{where}: `{command}` exited {done.returncode}:\n{done.stderr}")
            elif not checker.check_output(expected, done.stdout, FLAGS):
                failures.append(
                    f"{where}: `{command}` printed:\n{done.stdout}\nthe page says:\n{expected}"
                )
    assert not failures, "\n".join(failures)


# How the code names a section of a guide (docs/_ext/tinax_docs.py makes it a link on
# the site): docs/guides/preemption.md#claim-then-write.
GUIDE = re.compile(r"\bdocs/(guides/\w+)\.md(?:#([\w-]+))?")
SOURCES = sorted(
    p
    for folder in ("tinax", "widgets")
    for p in (REPO / folder).rglob("*")
    if p.suffix in (".py", ".js") and "__pycache__" not in p.parts
)


def _anchors(page: Path) -> set[str]:
    """The anchors MyST gives a page's headings (lower case, punctuation dropped,
    spaces made dashes)."""
    text = page.read_text(encoding="utf-8")
    titles = re.findall(r"^#{1,3} (.+)$", FENCE.sub("", text), re.M)
    return {re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-") for title in titles}


def test_the_code_sends_readers_to_the_guides_and_each_section_it_names_is_there() -> None:
    # The README is a front page now; what it used to explain is in the guides.
    readme = [
        f"{path.relative_to(REPO)}:{number}"
        for path in SOURCES
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if "README" in line
    ]
    assert readme == []
    named = {
        (path.relative_to(REPO).as_posix(), found.group(1), found.group(2))
        for path in SOURCES
        for found in GUIDE.finditer(path.read_text(encoding="utf-8"))
    }
    assert named, "no docstring or comment names a guide"
    missing = [
        f"{where} names docs/{page}.md#{anchor}"
        for where, page, anchor in sorted(named, key=str)
        if not (DOCS / f"{page}.md").is_file()
        or (anchor and anchor not in _anchors(DOCS / f"{page}.md"))
    ]
    assert missing == []
