"""CheckpointExplorer in a real browser: JupyterLab + Debian's Chromium driven by Playwright."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import nbformat
import numpy as np
import pytest
from browser.lab import CHROMIUM, CHROMIUM_ARGS, REPO, running_lab
from playwright.sync_api import Page, sync_playwright

from tinax.checkpointing import save_checkpointables

ARTIFACTS = REPO / "test-artifacts"
SCREENSHOT = ARTIFACTS / "explorer.png"
README_SCREENSHOT = REPO / "docs" / "explorer.png"
TIMEOUT_MS = 120_000

RUN_NAME = "demo_run"
LEAF = "['dense_0']['kernel']"


def _kernel(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(0.0, 1.0 / (1 + step / 100), (16, 32)).astype("f4")


def _write_run(run: Path) -> None:
    """Three committed steps of a small MLP and one save still in progress."""
    run.mkdir()
    for step in (100, 200, 300):
        state = {
            "model": {
                "dense_0": {"kernel": _kernel(step), "bias": np.zeros(32, np.float32)},
                "dense_1": {"kernel": np.full((32, 10), 0.01, np.float32), "bias": np.zeros(10)},
            },
            "optimizer": {"count": np.asarray(step, np.int32), "learning_rate": 1e-3},
        }
        save_checkpointables(run / f"step-{step}", state).result()
    # What a reader sees while step 400 is being written: Orbax's temporary directory.
    partial = run / "step-400.orbax-checkpoint-tmp-1764670000"
    (partial / "model").mkdir(parents=True)


def _write_notebook(path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "from tinax.widgets import CheckpointExplorer\n\n"
            f"explorer = CheckpointExplorer({RUN_NAME!r})\n"
            "explorer"
        )
    ]
    nbformat.write(notebook, path)


def _run_all_cells(page: Page) -> None:
    # Wait for the notebook's kernel before running, so no kernel dialog appears.
    page.wait_for_function(
        "() => window.jupyterapp && window.jupyterapp.shell.currentWidget"
        " && window.jupyterapp.shell.currentWidget.sessionContext",
        timeout=TIMEOUT_MS,
    )
    page.evaluate(
        "async () => { await window.jupyterapp.shell.currentWidget.sessionContext.ready; }"
    )
    page.wait_for_function(
        "() => { const s = window.jupyterapp.shell.currentWidget.sessionContext;"
        " return s.session && s.session.kernel && s.session.kernel.status === 'idle'; }",
        timeout=TIMEOUT_MS,
    )
    page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")


def test_explorer_shows_a_leafs_statistics_in_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    # The kernel starts in the notebook's directory, so the run is found by its name.
    _write_run(notebooks / RUN_NAME)
    _write_notebook(notebooks / "explorer.ipynb")
    expected = _kernel(300).astype(np.float64)
    ARTIFACTS.mkdir(exist_ok=True)

    with running_lab(notebooks, tmp_path / "jupyter") as lab, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(lab.page_url("explorer.ipynb"), timeout=TIMEOUT_MS)
            page.locator(".jp-Notebook").wait_for()
            _run_all_cells(page)

            explorer = page.locator(".tinax-checkpoint-explorer")
            explorer.wait_for()
            in_progress = explorer.get_by_role("button", name=re.compile(r"^step-400"))
            assert in_progress.is_disabled(), "a save in progress must not be openable"
            explorer.get_by_role("button", name="step-300", exact=True).click()
            explorer.get_by_role("button", name=LEAF, exact=True).click()

            stats = explorer.locator("table.tinax-leaf-stats")
            stats.wait_for()
            cell = 'td[data-stat="{}"]'.format
            assert "mean" in stats.inner_text()
            assert stats.locator(cell("mean")).inner_text() == f"{expected.mean():.6g}"
            assert stats.locator(cell("std")).inner_text() == f"{expected.std():.6g}"
            assert stats.locator(cell("max")).inner_text() == f"{expected.max():.6g}"
            assert stats.locator(cell("shape")).inner_text() == "(16, 32)"
            assert stats.locator(cell("NaN")).inner_text() == "0"
            histogram = explorer.locator("img")
            histogram.wait_for()
            assert histogram.evaluate("img => img.naturalWidth") > 0
            explorer.scroll_into_view_if_needed()
            explorer.screenshot(path=str(SCREENSHOT))
        except Exception as e:
            failure = ARTIFACTS / "explorer-failure.png"
            page.screenshot(path=str(failure), full_page=True)
            raise AssertionError(
                f"browser test failed ({e}); screenshot: {failure}\n"
                f"JupyterLab log:\n{lab.log_tail()}"
            ) from e
        finally:
            browser.close()

    README_SCREENSHOT.parent.mkdir(exist_ok=True)
    shutil.copyfile(SCREENSHOT, README_SCREENSHOT)
