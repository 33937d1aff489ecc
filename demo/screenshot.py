"""Photograph the checkpoint explorer on a demo run, for the README.

Usage::

    python demo/screenshot.py [RUN_DIR] [OUTPUT]    # defaults: demo_big_run, docs/explorer.png

(``make screenshot`` writes the demo runs first, then runs this.) It starts a
throw-away JupyterLab, opens a notebook that shows ``CheckpointExplorer(RUN_DIR)``
in Debian's Chromium at ``WIDTH`` px and saves a picture of the widget to ``OUTPUT``.
On the many-leaf run (``demo/make_big_run.py``) the explorer opens the checkpoint of
the planted jump, compares it with the one before and opens the leaf that changed
most; on the small run (``demo/make_run.py``) it opens the newest complete checkpoint
and its first kernel.

This file is a demo script, not part of the installed packages; the tests never
write ``docs/``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))  # the JupyterLab harness of the browser tests

from browser.lab import CHROMIUM, CHROMIUM_ARGS, running_lab  # noqa: E402

WIDTH = 1280
HEIGHT = 1800
TIMEOUT_MS = 180_000

# Opens the newest complete checkpoint and its first kernel, as a reader would.
_CELL = """\
import os
os.chdir({repo!r})  # the run's path reads as in the README

from tinax.widgets import CheckpointExplorer

explorer = CheckpointExplorer({run!r}, page_size=8)
done = explorer.checkpoints[explorer.checkpoints["status"] == "complete"]
explorer.open_checkpoint(done["name"].iloc[-1])
kernels = explorer.leaves[explorer.leaves["key"].str.contains("kernel")]
explorer.open_leaf(kernels["checkpointable"].iloc[0], kernels["key"].iloc[0])
explorer"""

# The many-leaf run: what changed at the planted jump, and the leaf that changed most.
_BIG_CELL = """\
import json
import os
os.chdir({repo!r})  # the run's path reads as in the README

from tinax.widgets import CheckpointExplorer

explorer = CheckpointExplorer({run!r})
config = json.loads(open(os.path.join({run!r}, "big_run.json")).read())["config"]
step, every = config["jump"]["step"], config["checkpoint_every"]
explorer.go_to_step(step)
# As a reader does: "compare with" the step before, then a click on the top row.
listed = explorer.checkpoints.set_index("name")["path"]
explorer.diff_view.choice.value = listed[f"step_{{step - every:06d}}"]
most = explorer.diff_view.shown().iloc[0]
explorer.diff_view.picked = (most["checkpointable"], most["key"])
explorer"""


def _notebook(path: Path, run: str, *, big: bool) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    cell = (_BIG_CELL if big else _CELL).format(repo=str(REPO), run=run)
    notebook.cells = [nbformat.v4.new_code_cell(cell)]
    nbformat.write(notebook, path)


def photograph(run: Path, output: Path) -> None:
    """Saves a picture of ``CheckpointExplorer(run)`` in JupyterLab to ``output``."""
    from playwright.sync_api import sync_playwright

    big = (run / "big_run.json").is_file()
    if not big and not (run / "run.json").is_file():
        raise FileNotFoundError(f"{str(run)!r} holds no demo run: run `make demo-data` first")
    if not CHROMIUM.exists():
        raise FileNotFoundError(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    shown = str(run.relative_to(REPO)) if run.is_relative_to(REPO) else str(run)
    with tempfile.TemporaryDirectory(prefix="tinax-screenshot-") as tmp:
        root = Path(tmp) / "notebooks"
        root.mkdir()
        _notebook(root / "explorer.ipynb", shown, big=big)
        with running_lab(root, Path(tmp) / "jupyter") as lab, sync_playwright() as playwright:
            browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            try:
                page = browser.new_page(viewport={"width": WIDTH, "height": HEIGHT})
                page.set_default_timeout(TIMEOUT_MS)
                page.goto(lab.page_url("explorer.ipynb"))
                page.wait_for_function(
                    "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
                    " && window.jupyterapp.shell.currentWidget.sessionContext"
                )
                page.evaluate(
                    "async () => {"
                    " const app = window.jupyterapp;"
                    " if (!app.shell.leftCollapsed) app.shell.collapseLeft();"
                    " await app.shell.currentWidget.sessionContext.ready; }"
                )
                page.wait_for_function(
                    "() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
                    " return s.session && s.session.kernel"
                    " && s.session.kernel.status === 'idle'; }"
                )
                page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
                explorer = page.locator(".tinax-checkpoint-explorer")
                explorer.locator("table.tinax-leaf-stats").wait_for()
                explorer.locator("img.tinax-histogram").wait_for()
                if big:
                    explorer.locator(".tinax-diff-view .tinax-table").last.wait_for()
                page.wait_for_timeout(1000)  # let the image and the layout settle
                # A window as tall as the widget, so that the picture holds all of it.
                tall = int(explorer.evaluate("el => el.getBoundingClientRect().height"))
                page.set_viewport_size({"width": WIDTH, "height": max(HEIGHT, tall + 300)})
                page.wait_for_timeout(500)
                explorer.evaluate("el => el.scrollIntoView({block: 'start'})")
                output.parent.mkdir(parents=True, exist_ok=True)
                explorer.screenshot(path=str(output))
            except Exception as e:
                raise RuntimeError(f"screenshot failed ({e})\n{lab.log_tail()}") from e
            finally:
                browser.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", nargs="?", default=str(REPO / "demo_big_run"))
    parser.add_argument("output", nargs="?", default=str(REPO / "docs" / "explorer.png"))
    args = parser.parse_args(argv)
    output = Path(args.output).resolve()
    photograph(Path(args.run).resolve(), output)
    print(json.dumps({"written": str(output)}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
