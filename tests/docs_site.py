"""The documentation site built as ``make docs`` builds it, for the tests that read it.

``build_site`` runs Sphinx (warnings are errors, references nitpicky, every notebook
executed by myst-nb) on a scratch checkout's ``docs/``, and ``Site`` reads what it
built: the pages, the executed notebooks myst-nb keeps beside them, and the inventory
of documented names. The build's own helpers (docs/_ext) say which names are public,
how the command line's parsers are found and which links are broken, so the tests
check the site by the same rules it is built by.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import subprocess
import sys
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import nbformat

REPO = Path(__file__).resolve().parents[1]
# What `make docs` runs: warnings are errors (each listed), references nitpicky.
SPHINX = (sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html")


def _docs_helper(name: str) -> Any:
    if str(REPO / "docs" / "_ext") not in sys.path:
        sys.path.insert(0, str(REPO / "docs" / "_ext"))
    return importlib.import_module(name)


@dataclass
class Site:
    """A built site: ``html`` (the pages), ``executed`` (the notebooks as run) and what
    ran beside the build."""

    html: Path
    executed: Path
    beside: Any

    def notebook(self, name: str) -> nbformat.NotebookNode:
        return nbformat.read(self.executed / "tutorials" / name, as_version=4)

    def inventory(self) -> dict[str, str]:
        """Each documented Python name → its page (and anchor), from objects.inv."""
        raw = (self.html / "objects.inv").read_bytes()
        body = raw.split(b"\n", 4)[4]
        found = {}
        for line in zlib.decompress(body).decode().splitlines():
            name, domain_role, _priority, uri = line.split(" ", 4)[:4]
            if domain_role.startswith("py:"):
                found[name] = uri.replace("$", name)
        return found

    def public_names(self) -> dict[str, str]:
        """Each public name → the docs/api page it belongs on."""
        helper = _docs_helper("tinax_docs")
        pages = {
            "tinax.checkpointing": "checkpointing",
            "tinax.checkpointing.legacy.v0": "legacy",
            "tinax.explore": "explore",
            "tinax.explore.display": "explore_display",
            "tinax.explore.toolkit": "explore_toolkit",
            "tinax.widgets": "widgets",
            "tinax.vocabulary": "vocabulary",
        }
        return {name: pages[module] for name, module in helper.public_names().items()}

    def broken_links(self) -> list[str]:
        return _docs_helper("check_links").broken_links(self.html)

    def command_parsers(
        self,
    ) -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
        return _docs_helper("tinax_docs").command_parsers()


def build_site(checkout: Path, beside: Callable[[], Any]) -> Site:
    """Builds ``checkout/docs`` into ``checkout/docs/_build/html`` while ``beside()``
    runs in a thread; raises naming the warnings if the build fails."""
    out = checkout / "docs" / "_build" / "html"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        other = pool.submit(beside)
        done = subprocess.run(
            [*SPHINX, str(checkout / "docs"), str(out)],
            cwd=checkout,
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        result = other.result()
    assert done.returncode == 0, f"the site's build failed:\n{done.stderr[-6000:]}"
    return Site(html=out, executed=out.parent / "jupyter_execute", beside=result)
