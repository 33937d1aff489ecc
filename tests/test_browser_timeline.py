"""RunTimeline in a real browser (JupyterLab + Chromium): readable at 900 px, at 1,280 px
with the file browser open and at 1,600 px, on a small run with a planted jump and NaN and
on a run of 300 checkpoints; a click on a heatmap cell reaches Python. Screenshots go to
``test-artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path

import nbformat
import pytest
from browser.lab import CHROMIUM, CHROMIUM_ARGS, REPO, TIMEOUT_MS, run_all_cells, running_lab
from playwright.sync_api import Page, sync_playwright
from run_view_fixtures import JUMP_LAYER, JUMP_STEP, write_small_run

ARTIFACTS = REPO / "test-artifacts"
WIDTHS = (900, 1280, 1600)
HEIGHT = 1100
LONG_RUN = 300

# What cannot be read in a timeline: a drawing wider than its output, text drawn
# outside the drawing or cut at its edge, heatmap rows too thin to tell apart, or
# row labels that overlap.
_READABLE_JS = """
(root) => {
  const problems = [];
  const output = root.closest('.jp-OutputArea-output') || root;
  const edge = output.getBoundingClientRect();
  for (const box of [output, root, ...root.querySelectorAll('.widget-box')]) {
    if (box.offsetParent === null) continue;
    if (box.scrollWidth > box.clientWidth + 1) {
      problems.push(`${box.className}: needs sideways scrolling (${box.scrollWidth} > ${box.clientWidth})`);
    }
  }
  const svg = root.querySelector('svg.tinax-timeline-svg');
  if (!svg) return ['no drawing'];
  const area = svg.getBoundingClientRect();
  if (area.right > edge.right + 1) problems.push(`drawing reaches past the output`);
  if (area.width < 300) problems.push(`drawing only ${area.width} px wide`);
  for (const t of svg.querySelectorAll('text')) {
    const r = t.getBoundingClientRect();
    if (!r.width) continue;
    if (r.left < area.left - 1 || r.right > area.right + 1) {
      problems.push(`text cut: ${t.textContent} (${r.left}..${r.right} in ${area.left}..${area.right})`);
    }
    if (parseFloat(t.getAttribute('font-size') || '11') < 9) {
      problems.push(`text too small: ${t.textContent}`);
    }
  }
  const labels = [...svg.querySelectorAll('text[text-anchor="end"]')]
    .map((t) => t.getBoundingClientRect()).filter((r) => r.width).sort((a, b) => a.top - b.top);
  for (let i = 1; i < labels.length; i++) {
    const a = labels[i - 1], b = labels[i];
    if (b.top < a.bottom - 3 && Math.abs(a.right - b.right) < 2) {
      problems.push(`labels overlap at y=${b.top}`);
    }
  }
  const cells = svg.querySelectorAll('.tinax-timeline-cell');
  for (const c of cells) {
    const r = c.getBoundingClientRect();
    if (r.height < 8) { problems.push(`heatmap rows ${r.height} px high`); break; }
  }
  return problems;
}
"""


def _write_long_run(source: str, run: Path) -> None:
    """``LONG_RUN`` checkpoints: copies of one real checkpoint under successive steps."""
    run.mkdir()
    for step in range(1, LONG_RUN + 1):
        shutil.copytree(Path(source) / "step_000003", run / f"step_{step:06d}")


def _write_notebook(path: Path) -> None:
    notebook = nbformat.v4.new_notebook()
    notebook.metadata["kernelspec"] = {
        "name": "python3",
        "display_name": "Python 3",
        "language": "python",
    }
    notebook.cells = [
        nbformat.v4.new_code_cell(
            "from tinax.widgets import RunTimeline\n\n"
            "timeline = RunTimeline('run', drift=True)\n"
            "timeline.wait(300)\n"
            "timeline.compute_scan()\n"
            "timeline.wait(300)\n"
            "timeline"
        ),
        nbformat.v4.new_code_cell(
            "long = RunTimeline('long_run', drift=True)\nlong.wait(600)\nlong"
        ),
        nbformat.v4.new_code_cell("print('picked', timeline.picked_cell, timeline.error)"),
    ]
    nbformat.write(notebook, path)


def _set_width(page: Page, width: int) -> None:
    page.set_viewport_size({"width": width, "height": HEIGHT})
    if width == 1280:
        page.evaluate(
            "async () => { if (window.jupyterapp.shell.leftCollapsed)"
            " await window.jupyterapp.commands.execute('filebrowser:activate'); }"
        )
        page.wait_for_function("() => !window.jupyterapp.shell.leftCollapsed")
    else:
        page.evaluate("() => window.jupyterapp.shell.collapseLeft()")
        page.wait_for_function("() => window.jupyterapp.shell.leftCollapsed")
    page.wait_for_timeout(700)


def test_the_timeline_is_readable_and_clickable_at_three_widths(tmp_path: Path) -> None:
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    notebooks = tmp_path / "notebooks"
    notebooks.mkdir()
    write_small_run(str(notebooks / "run"))
    _write_long_run(str(notebooks / "run"), notebooks / "long_run")
    _write_notebook(notebooks / "timeline.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    with running_lab(notebooks, tmp_path / "jupyter") as lab, sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": WIDTHS[-1], "height": HEIGHT})
        page.set_default_timeout(TIMEOUT_MS)
        try:
            page.goto(lab.page_url("timeline.ipynb"), timeout=TIMEOUT_MS)
            page.locator(".jp-Notebook").wait_for()
            run_all_cells(page)
            timelines = page.locator(".tinax-run-timeline")
            timelines.nth(1).locator("svg.tinax-timeline-svg").wait_for(timeout=8 * TIMEOUT_MS)
            small, long = timelines.nth(0), timelines.nth(1)
            small.locator(".tinax-timeline-cell").first.wait_for()
            long.locator(".tinax-timeline-cell").first.wait_for()
            assert long.locator(".tinax-timeline-cell").count() == 5 * (LONG_RUN - 1)
            for width in WIDTHS:
                _set_width(page, width)
                for name, widget in (("timeline", small), ("timeline-300", long)):
                    widget.scroll_into_view_if_needed()
                    problems = widget.evaluate(_READABLE_JS)
                    assert not problems, f"{name} at {width} px: " + "; ".join(problems)
                    widget.screenshot(path=str(ARTIFACTS / f"{name}-{width}px.png"))
            # The NaN markers and the roll-back line are drawn.
            assert "roll back" in (small.locator("svg").text_content() or "")
            # A click on the jump's cell opens that layer's diff (in Python).
            labels = small.locator("svg text.tinax-timeline-layer").evaluate_all(
                "els => els.map((e) => e.firstChild.textContent)"
            )
            row = labels.index(JUMP_LAYER)
            column = JUMP_STEP - 2  # pairs start at step 2
            cell = small.locator(
                f'.tinax-timeline-cell[data-layer="{row}"][data-column="{column}"]'
            )
            cell.scroll_into_view_if_needed()
            cell.click()
            page.wait_for_function(
                "(el) => el.innerText.includes('layer layers.2')",
                arg=small.element_handle(),
                timeout=TIMEOUT_MS,
            )
            assert f"diff of steps {JUMP_STEP - 1} → {JUMP_STEP}" in small.inner_text()
        finally:
            browser.close()
