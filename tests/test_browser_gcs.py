"""CheckpointExplorer on a gs:// run, in JupyterLab in Debian's Chromium.

The run lives in a real fake-gcs-server (``tests/gcs.py``); the JupyterLab server
and its kernel get the emulator's environment, as a notebook on a TPU VM gets
Google's.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import gcsfs
import nbformat
import numpy as np
import pytest
from browser.lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    TIMEOUT_MS,
    run_all_cells,
    running_lab,
)
from conftest import BUCKET
from playwright.sync_api import sync_playwright

from tinax.checkpointing import save_checkpointables

ARTIFACTS = REPO / "test-artifacts"
LEAF = "['dense_0']['kernel']"


def _kernel(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(0.0, 1.0, (16, 32)).astype("f4")


def _state(step: int) -> dict[str, object]:
    return {
        "model": {"dense_0": {"kernel": _kernel(step), "bias": np.zeros(32, np.float32)}},
        "optimizer": {"count": np.asarray(step, np.int32)},
    }


def _write_run(run: str) -> None:
    """Three committed steps, and a fourth as a reader sees it just before it commits."""
    for step in (100, 200, 300, 400):
        save_checkpointables(f"{run}/step-{step}", _state(step)).result()
    # On gs:// Orbax writes in place and commits with these two files last.
    fs = gcsfs.GCSFileSystem(use_listings_cache=False)
    for name in ("commit_success.txt", "_CHECKPOINT_METADATA"):
        fs.rm(f"{run[len('gs://') :]}/step-400/{name}")


def _write_notebook(path: Path, run: str) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3"}
    notebook.cells = [
        nbformat.v4.new_code_cell(
            f"from tinax.widgets import CheckpointExplorer\n\nCheckpointExplorer({run!r})"
        )
    ]
    nbformat.write(notebook, path)


def test_explorer_browses_a_gs_run_in_chromium(gcs, tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    run = f"gs://{BUCKET}/browser-{uuid.uuid4().hex[:8]}/run"
    _write_run(run)
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    _write_notebook(notebooks / "gcs.ipynb", run)
    expected = _kernel(300).astype(np.float64)
    ARTIFACTS.mkdir(exist_ok=True)

    lab_env = gcs.environment()
    with (
        running_lab(notebooks, tmp_path / "jupyter", env=lab_env) as lab,
        sync_playwright() as playwright,
    ):
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1100})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(lab.page_url("gcs.ipynb"), timeout=TIMEOUT_MS)
            page.locator(".jp-Notebook").wait_for()
            run_all_cells(page)

            explorer = page.locator(".tinax-checkpoint-explorer")
            explorer.wait_for()
            assert run in explorer.inner_text()
            rows = explorer.locator(".tinax-table tbody tr")
            unfinished = rows.filter(has_text=re.compile(r"step-400"))
            assert "tinax-unpickable" in (unfinished.get_attribute("class") or ""), (
                "a save that has not committed must not open"
            )
            rows.filter(has_text=re.compile(r"^step-300")).click()
            # The leaves as a flat table (the tree shows first).
            explorer.locator(".tinax-section-checkpoint .widget-toggle-button").filter(
                has_text=re.compile(r"^table$")
            ).click()
            leaf_table = explorer.locator(".tinax-leaf-table")
            leaf_table.locator(f'tbody tr:has(span[title="{LEAF}"])').click()

            stats = explorer.locator("table.tinax-leaf-stats")
            stats.wait_for()
            cell = 'td[data-stat="{}"]'.format
            assert stats.locator(cell("mean")).inner_text() == f"{expected.mean():.6g}"
            assert stats.locator(cell("max")).inner_text() == f"{expected.max():.6g}"
            assert stats.locator(cell("shape")).inner_text() == "(16, 32)"
            explorer.scroll_into_view_if_needed()
            explorer.screenshot(path=str(ARTIFACTS / "explorer-gcs.png"))
        except Exception as e:
            failure = ARTIFACTS / "explorer-gcs-failure.png"
            page.screenshot(path=str(failure), full_page=True)
            raise AssertionError(
                f"browser test failed ({e}); screenshot: {failure}\n"
                f"JupyterLab log:\n{lab.log_tail()}"
            ) from e
        finally:
            browser.close()
