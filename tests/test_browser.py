"""The widgets in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

One JupyterLab server serves the whole test. It looks at the explorer and the
restore-target builder at 900 px (a laptop with the file browser open) and at
1,400 and 1,600 px, checks from the DOM that every column header can be scrolled into view
and that the histogram keeps its image's aspect ratio, and keeps screenshots of
every width in ``test-artifacts/``. It also opens one of the repository's notebooks
and checks that JupyterLab leaves its bytes as committed.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

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
    wait_for_kernel,
)
from playwright.sync_api import Page, expect, sync_playwright

from tinax.checkpointing import save_checkpointables

ARTIFACTS = REPO / "test-artifacts"
# A laptop with JupyterLab's file browser open, a common laptop, and a wide screen.
WIDTHS = (900, 1400, 1600)
HEIGHT = 1100
REPO_NOTEBOOK = REPO / "notebooks" / "02_explore_a_run.ipynb"

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
        ),
        nbformat.v4.new_code_cell(
            "import numpy as np\n"
            "from tinax.widgets import RestoreTargetBuilder\n\n"
            "state = {\n"
            "    'model': {\n"
            "        'dense_0': {'kernel': np.zeros((16, 32), np.float32),"
            " 'bias': np.zeros(32, np.float32)},\n"
            "        'dense_1': {'kernel': np.zeros((32, 10), np.float32),"
            " 'bias': np.zeros(10, np.float32)},\n"
            "    },\n"
            "    'optimizer': {'count': np.asarray(0, np.int32), 'learning_rate': 0.0},\n"
            "}\n"
            f"builder = RestoreTargetBuilder(state, '{RUN_NAME}/step-300')\n"
            "builder.comparison_view.show_all.value = True\n"
            "builder"
        ),
        nbformat.v4.new_code_cell(
            "import concurrent.futures\n"
            "from tinax.widgets import AsyncProgress\n\n\n"
            "class Pending:\n"
            "    def __init__(self):\n"
            "        self.future = concurrent.futures.Future()\n\n"
            "    def result(self, timeout=None):\n"
            "        return self.future.result(timeout)\n\n"
            "    def on_complete(self, callback):\n"
            "        self.future.add_done_callback(lambda f: callback(f.result()))\n\n\n"
            "progress = AsyncProgress(Pending(), description='no total known')\n"
            "progress"
        ),
        nbformat.v4.new_code_cell(
            f"from tinax.widgets import SavePanel\n\npanel = SavePanel({RUN_NAME!r}, state)\npanel"
        ),
    ]
    nbformat.write(notebook, path)


# Scrolls ``el`` into view the way a reader can: through the ancestors that show a
# scroll bar (overflow auto or scroll), never through ones that clip (overflow hidden).
_REVEAL_JS = """
function reveal(el) {
  for (let a = el.parentElement; a && a !== document.body; a = a.parentElement) {
    const style = getComputedStyle(a);
    const box = a.getBoundingClientRect();
    let r = el.getBoundingClientRect();
    if (['auto', 'scroll'].includes(style.overflowX)) {
      if (r.right > box.right) a.scrollLeft += Math.min(r.right - box.right, r.left - box.left);
      r = el.getBoundingClientRect();
      if (r.left < box.left) a.scrollLeft -= box.left - r.left;
    }
    if (['auto', 'scroll'].includes(style.overflowY)) {
      r = el.getBoundingClientRect();
      if (r.bottom > box.bottom) a.scrollTop += Math.min(r.bottom - box.bottom, r.top - box.top);
      r = el.getBoundingClientRect();
      if (r.top < box.top) a.scrollTop -= box.top - r.top;
    }
  }
}
"""

# For every table header cell and every cell sized to its text (keys) in ``root``:
# reveal it, then report it if its text is cut, or if it still lies outside an
# ancestor that clips (a column cut off with no way to scroll to it). Tables are
# scrolled back to their start afterwards.
_REACHABLE_JS = (
    "(root) => {"
    + _REVEAL_JS
    + """
  const problems = [];
  const cells = [
    ...root.querySelectorAll('.tinax-table > .widget-hbox:first-child > .widget-label'),
    ...root.querySelectorAll('.tinax-table .tinax-fitted-cell'),
  ].filter((cell) => cell.offsetParent !== null && cell.textContent.trim() !== '');
  for (const cell of cells) {
    const text = cell.textContent.trim();
    reveal(cell);
    const r = cell.getBoundingClientRect();
    if (cell.scrollWidth > cell.clientWidth + 1) {
      problems.push(`${text}: text cut (${cell.scrollWidth} px in ${cell.clientWidth} px)`);
    }
    if (r.left < -1 || r.right > window.innerWidth + 1) {
      problems.push(`${text}: off screen (${r.left}..${r.right})`);
    }
    for (let a = cell.parentElement; a && a !== document.body; a = a.parentElement) {
      if (getComputedStyle(a).overflowX === 'visible') continue;
      const box = a.getBoundingClientRect();
      if (r.left < box.left - 1 || r.right > box.right + 1) {
        problems.push(
          `${text}: clipped by ${a.className} (${r.left}..${r.right} in ${box.left}..${box.right})`
        );
        break;
      }
    }
  }
  for (const table of root.querySelectorAll('.tinax-table')) table.scrollLeft = 0;
  // Nothing else may stick out of the output area, unless a scroll bar reaches it.
  // The box through which the widget is seen: every ancestor that clips narrows it.
  const area = {left: 0, right: window.innerWidth};
  for (let a = root; a && a !== document.body; a = a.parentElement) {
    if (getComputedStyle(a).overflowX === 'visible') continue;
    const box = a.getBoundingClientRect();
    area.left = Math.max(area.left, box.left);
    area.right = Math.min(area.right, box.right);
  }
  const parts = root.querySelectorAll('.widget-label, button, .widget-html, img, select, input');
  for (const part of parts) {
    if (part.offsetParent === null) continue;
    // Labels outside tables (whose cells are checked above) show their whole text.
    const label = part.classList.contains('widget-label') && !part.closest('.tinax-table');
    if (label && part.scrollWidth > part.clientWidth + 1) {
      problems.push(`${part.textContent.trim()}: text cut (${part.scrollWidth} px in ${part.clientWidth} px)`);
    }
    const r = part.getBoundingClientRect();
    if (r.right <= area.right + 1 && r.left >= area.left - 1) continue;
    let scrolled = false;
    for (let a = part.parentElement; a && a !== root.parentElement; a = a.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(a).overflowX)) scrolled = true;
    }
    if (!scrolled) {
      problems.push(`${part.textContent.trim() || part.tagName}: sticks out (${r.left}..${r.right})`);
    }
  }
  return {checked: cells.length, problems};
}
"""
)

_ASPECT_JS = (
    "(img) => {"
    + _REVEAL_JS
    + """
  reveal(img);
  const r = img.getBoundingClientRect();
  const area = img.closest('.jp-OutputArea-output').getBoundingClientRect();
  return {natural: [img.naturalWidth, img.naturalHeight], shown: [r.width, r.height],
          inside: r.left >= area.left - 1 && r.right <= area.right + 1};
}
"""
)


def _screenshot(page: Page, widget: Any, width: int, name: str) -> None:
    """A screenshot of ``widget`` whole: the window is made tall enough to hold it."""
    height = int(widget.evaluate("el => el.getBoundingClientRect().height"))
    page.set_viewport_size({"width": width, "height": max(HEIGHT, height + 300)})
    page.wait_for_timeout(300)
    widget.evaluate(
        "el => { el.scrollIntoView({block: 'start', inline: 'nearest'});"
        " for (const t of el.querySelectorAll('.tinax-table')) t.scrollLeft = 0; }"
    )
    widget.screenshot(path=str(ARTIFACTS / f"{name}-{width}px.png"))
    page.set_viewport_size({"width": width, "height": HEIGHT})


def _check_readable(page: Page, widget: Any, what: str) -> int:
    """Asserts that every header and key of ``widget``'s tables can be read; returns how many."""
    found = widget.evaluate(_REACHABLE_JS)
    assert not found["problems"], f"{what}: " + "; ".join(found["problems"])
    return int(found["checked"])


def _set_width(page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": HEIGHT})
    if width < 1000:
        # A laptop: the file browser is open beside the notebook.
        page.evaluate(
            "async () => { if (window.jupyterapp.shell.leftCollapsed)"
            " await window.jupyterapp.commands.execute('filebrowser:activate'); }"
        )
        page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed")
    page.wait_for_timeout(500)  # let JupyterLab lay the panels out again


def test_widgets_are_readable_at_900_and_1600_px_in_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    # The kernel starts in the notebook's directory, so the run is found by its name.
    _write_run(notebooks / RUN_NAME)
    _write_notebook(notebooks / "explorer.ipynb")
    committed = REPO_NOTEBOOK.read_bytes()
    (notebooks / REPO_NOTEBOOK.name).write_bytes(committed)
    opened_at = (notebooks / REPO_NOTEBOOK.name).stat().st_mtime_ns
    expected = _kernel(300).astype(np.float64)
    ARTIFACTS.mkdir(exist_ok=True)

    with running_lab(notebooks, tmp_path / "jupyter") as lab, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTHS[-1], "height": HEIGHT})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(lab.page_url("explorer.ipynb"), timeout=TIMEOUT_MS)
            page.locator(".jp-Notebook").wait_for()
            run_all_cells(page)

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
            histogram = explorer.locator("img.tinax-histogram")
            histogram.wait_for()
            # The diff of two checkpoints: one more table to read on a narrow screen.
            explorer.locator(".tinax-diff-view select").first.select_option(
                label="compare with step-200"
            )
            explorer.locator(".tinax-diff-view .tinax-table").wait_for()
            builder = page.locator(".tinax-restore-target-builder")
            builder.wait_for()
            builder.locator(".tinax-table").last.wait_for()

            # Without a known total: a sliding block that moves, not a full bar.
            pulse = page.locator(".tinax-async-progress .tinax-progress-indeterminate")
            pulse.wait_for()
            assert pulse.evaluate("el => el.firstElementChild.getAnimations().length") == 1
            bar = page.locator(".tinax-async-progress .widget-hprogress")
            assert bar.evaluate("el => el.offsetParent === null"), "a bar shows beside the block"

            # Unticking a checkpointable unticks its subtrees, visibly; ticking gives them back.
            optimizer = builder.get_by_label("optimizer", exact=True)
            subtrees = [
                builder.get_by_label(k, exact=True) for k in ("['count']", "['learning_rate']")
            ]
            optimizer.uncheck()
            for box in subtrees:
                expect(box).not_to_be_checked()
                expect(box).to_be_enabled()
            optimizer.check()
            for box in subtrees:
                expect(box).to_be_checked()
            # Load (the float64 bias is cast to the target's float32 once allowed) ends
            # in a one-line summary.
            builder.get_by_label("allow lossy casts").check()
            builder.get_by_role("button", name="Load").click()
            summary = builder.get_by_text(re.compile(r"^loaded 6 leaves \(3\.\d KiB\) in \d"))
            summary.wait_for()

            panel = page.locator(".tinax-save-panel")
            panel.wait_for()

            for width in WIDTHS:
                _set_width(page, width)
                _check_readable(page, panel, f"save panel at {width} px")
                checked = _check_readable(page, explorer, f"explorer at {width} px")
                # Two tables of 7 columns and the diff's, with checkpoint names and keys.
                assert checked >= 14 + 4 + 6, checked
                checked = _check_readable(page, builder, f"builder at {width} px")
                assert checked >= 3 + 6, checked  # the comparison's headers and keys
                look = histogram.evaluate(_ASPECT_JS)
                (nw, nh), (sw, sh) = look["natural"], look["shown"]
                assert nw > 0 and sh > 0
                assert abs(sw / sh - nw / nh) <= 0.01 * nw / nh, (
                    f"histogram shown at {sw}x{sh}, its image is {nw}x{nh}"
                )
                assert look["inside"], f"histogram cut off at {width} px"
                _screenshot(page, explorer, width, "explorer")
                _screenshot(page, builder, width, "builder")
                _screenshot(page, panel, width, "save-panel")

            # The run's next name in its own pattern (step-400 is a save in progress),
            # and a status that follows the save to its end.
            assert panel.locator("input").input_value() == "step-500"
            panel.get_by_role("button", name="Save").click()
            panel.get_by_text(re.compile(r"^saved step-500 in \d")).wait_for()
            assert panel.get_by_text("saved step-500", exact=True).is_visible()
            assert "saving" not in panel.inner_text()
            assert panel.locator("input").input_value() == "step-600"

            # One of the repository's notebooks, opened as a reader would: its kernel
            # starts (and tells JupyterLab its language details), then it is saved.
            page.goto(lab.page_url(REPO_NOTEBOOK.name), timeout=TIMEOUT_MS)
            page.wait_for_function(
                "name => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
                " return w && w.context && w.context.path === name; }",
                arg=REPO_NOTEBOOK.name,
            )
            wait_for_kernel(page)
            page.wait_for_function(
                "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
            )  # the kernel's language details arrived
            page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
            page.wait_for_function(
                "() => !window.jupyterapp.shell.currentWidget.context.model.dirty"
            )
        except Exception as e:
            failure = ARTIFACTS / "browser-failure.png"
            page.screenshot(path=str(failure), full_page=True)
            raise AssertionError(
                f"browser test failed ({e}); screenshot: {failure}\n"
                f"JupyterLab log:\n{lab.log_tail()}"
            ) from e
        finally:
            browser.close()

    copy = notebooks / REPO_NOTEBOOK.name
    assert copy.stat().st_mtime_ns > opened_at, "JupyterLab did not save the notebook"
    saved = copy.read_bytes()
    assert saved == committed, "opening and saving a notebook in JupyterLab changed its bytes"
