"""What the browser test of RunTimeline (tests/test_browser.py) writes and checks: a small
run with a planted jump and NaN and a run of 300 checkpoints, a notebook showing their
timelines, the explorer's and a restore-target builder, and the checks made on them in
JupyterLab at 900 px, at 1,280 px with the file browser open and at 1,600 px. Screenshots
go to ``test-artifacts/``."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import nbformat
from browser.lab import REPO, TIMEOUT_MS, python_notebook, run_all_cells, set_width
from playwright.sync_api import Page, expect
from run_view_fixtures import JUMP_LAYER, JUMP_STEP, NAN_STEP, STEPS, write_small_run

ARTIFACTS = REPO / "test-artifacts"
# The explorer opens and diffs in the kernel; on a loaded two-core machine that takes
# longer than Playwright's 5 s default before the view shows it.
expect.set_options(timeout=TIMEOUT_MS)
WIDTHS = (900, 1280, 1600)
HEIGHT = 1100
LONG_RUN = 300
LONG_EVERY = 3

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
    """``LONG_RUN`` checkpoints: copies of one real checkpoint, every ``LONG_EVERY`` steps
    (so that an axis label on a step without a checkpoint would show)."""
    run.mkdir()
    for step in range(1, LONG_RUN + 1):
        shutil.copytree(Path(source) / "step_000003", run / f"step_{LONG_EVERY * step:06d}")


def _write_notebook(path: Path) -> None:
    notebook = python_notebook()
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
        nbformat.v4.new_code_cell(
            "from tinax.widgets import CheckpointExplorer\n\n"
            "explorer = CheckpointExplorer('run')\n"
            "explorer.timeline_section.toggle.click()  # the timeline section, open\n"
            "explorer"
        ),
        nbformat.v4.new_code_cell(
            "import numpy as np\n"
            "from tinax.widgets import RestoreTargetBuilder\n\n"
            "layer = {'w': np.zeros((8, 8), np.float32), 'b': np.zeros(8, np.float32)}\n"
            "model = {'embed': {'w': np.ones((4, 8), np.float32)}, 'layers': [layer] * 4}\n"
            "live = {'model': model, 'optimizer': {'count': np.int32(0)}}\n"
            f"builder = RestoreTargetBuilder(live, 'run/step_{NAN_STEP:06d}')\n"
            "builder"
        ),
    ]
    nbformat.write(notebook, path)


def _set_width(page: Page, width: int) -> None:
    set_width(page, width, HEIGHT, settle_ms=700)


def write(folder: Path) -> str:
    """Writes the runs and the notebook into ``folder``; returns the notebook's name."""
    write_small_run(str(folder / "run"))
    _write_long_run(str(folder / "run"), folder / "long_run")
    _write_notebook(folder / "timeline.ipynb")
    ARTIFACTS.mkdir(exist_ok=True)
    return "timeline.ipynb"


def check(page: Page, lab: Any, notebook: str) -> None:
    """Runs ``notebook`` (``write``'s, as JupyterLab serves it) in ``page`` and checks
    the timelines at every width, a click on the jump's cell, the explorer's timeline
    under the pointer and the builder's question before a diverged load."""
    page.set_viewport_size({"width": WIDTHS[-1], "height": HEIGHT})
    page.goto(lab.page_url(notebook), timeout=TIMEOUT_MS)
    page.locator(".jp-Notebook").wait_for()
    run_all_cells(page)
    timelines = page.locator(".tinax-run-timeline")
    timelines.nth(1).locator("svg.tinax-timeline-svg").wait_for(timeout=8 * TIMEOUT_MS)
    small, long = timelines.nth(0), timelines.nth(1)
    small.locator(".tinax-timeline-cell").first.wait_for()
    long.locator(".tinax-timeline-cell").first.wait_for()
    assert long.locator(".tinax-timeline-cell").count() == 5 * (LONG_RUN - 1)
    explorer = page.locator(".tinax-checkpoint-explorer")
    explorer.locator(".tinax-run-timeline svg.tinax-timeline-svg").wait_for()
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
    cell = small.locator(f'.tinax-timeline-cell[data-layer="{row}"][data-column="{column}"]')
    cell.scroll_into_view_if_needed()
    cell.click()
    page.wait_for_function(
        "(el) => el.innerText.includes('layer layers.2')",
        arg=small.element_handle(),
        timeout=TIMEOUT_MS,
    )
    assert f"diff of steps {JUMP_STEP - 1} → {JUMP_STEP}" in small.inner_text()
    # A layer that held NaN is a pattern of its own, not the scale's red.
    row = labels.index("layers.0")
    nan_cells = small.locator(f'.tinax-timeline-cell.tinax-timeline-nonfinite[data-layer="{row}"]')
    assert nan_cells.count() == len(STEPS) - NAN_STEP + 1
    assert (nan_cells.first.get_attribute("fill") or "").startswith("url(#")
    assert cell.get_attribute("fill") != nan_cells.first.get_attribute("fill")
    assert small.locator(".tinax-timeline-key-nonfinite").count() == 1
    # The loss the run recorded as NaN is marked on its panel.
    assert small.locator(".tinax-timeline-metric-nonfinite").count() == len(STEPS) - NAN_STEP + 1
    # Axis labels name only steps that have a checkpoint.
    ticks = long.locator(".tinax-timeline-tick").all_text_contents()
    assert len(ticks) > 3 and all(int(t) % LONG_EVERY == 0 for t in ticks), ticks
    _the_page_stays_under_the_pointer(page)
    _the_builder_asks_before_loading_a_diverged_checkpoint(page)


def _the_page_stays_under_the_pointer(page: Page) -> None:
    """In the explorer, a click on a step opens it and a second diffs, while the
    timeline stays where it was under the pointer and the checkpoint list stays open."""
    explorer = page.locator(".tinax-checkpoint-explorer")
    svg = explorer.locator(".tinax-run-timeline svg.tinax-timeline-svg")
    svg.wait_for()
    _set_width(page, 1280)
    svg.scroll_into_view_if_needed()
    run_list = explorer.locator(".tinax-section-run .tinax-table")

    def click_step(step: int, *, shift: bool = False) -> float:
        tick = svg.locator(".tinax-timeline-tick").filter(has_text=f"{step}").first
        box, where = svg.bounding_box(), tick.bounding_box()
        assert box is not None and where is not None
        if shift:
            page.keyboard.down("Shift")
        page.mouse.click(where["x"] + where["width"] / 2, box["y"] + 60)
        if shift:
            page.keyboard.up("Shift")
        return box["y"]

    top = click_step(2)
    expect(explorer.locator(".tinax-checkpoint-title")).to_contain_text("step_000002")
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("step 2 open")
    page.wait_for_timeout(500)
    assert svg.bounding_box()["y"] == top, "the timeline moved under the pointer"
    assert run_list.is_visible(), "the checkpoint list folded"
    assert click_step(4) == top
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("diff of steps 2 → 4")
    expect(explorer.locator(".tinax-diff-view")).to_contain_text("step_000002 to step_000004")
    page.wait_for_timeout(500)
    assert svg.bounding_box()["y"] == top and run_list.is_visible()
    # After a diff, a click opens one step; a shift-click always only opens.
    click_step(6)
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("step 6 open")
    click_step(3, shift=True)
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("step 3 open")
    expect(explorer.locator(".tinax-checkpoint-title")).to_contain_text("step_000003")
    page.wait_for_timeout(500)
    assert svg.bounding_box()["y"] == top and run_list.is_visible()
    # Opened from the list, step 6 is the one the timeline marks, and a click on
    # step 4 diffs against it.
    run_list.locator("tr", has_text="step_000006").click()
    expect(explorer.locator(".tinax-checkpoint-title")).to_contain_text("step_000006")
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("step 6 open")
    svg.scroll_into_view_if_needed()
    click_step(4)
    expect(explorer.locator(".tinax-run-timeline")).to_contain_text("diff of steps 4 → 6")
    expect(explorer.locator(".tinax-diff-view")).to_contain_text("step_000004 to step_000006")
    expect(explorer.locator(".tinax-checkpoint-title")).to_contain_text("step_000006")
    # The loss beside the learning rate, each on its own axis.
    explorer.locator(".tinax-metric-picks button", has_text="learning_rate").click()
    expect(svg.locator(".tinax-timeline-metrics-title")).to_contain_text("learning_rate (right")
    problems = explorer.locator(".tinax-run-timeline").evaluate(_READABLE_JS)
    assert not problems, "; ".join(problems)
    explorer.screenshot(path=str(ARTIFACTS / "timeline-explorer-1280px.png"))
    # "check data" stays under the pointer while the verdict beside it changes.
    button = explorer.locator(".tinax-section-checkpoint button", has_text="check data")
    button.scroll_into_view_if_needed()
    offset = (
        "(el) => { const e = el.closest('.tinax-checkpoint-explorer').getBoundingClientRect();"
        " const r = el.getBoundingClientRect(); return [r.x - e.x, r.y - e.y]; }"
    )
    before = button.evaluate(offset)
    button.click()
    expect(explorer.locator(".tinax-verdict").first).to_contain_text("data checked")
    page.wait_for_timeout(500)
    assert button.evaluate(offset) == before, "check data moved under the pointer"


def _the_builder_asks_before_loading_a_diverged_checkpoint(page: Page) -> None:
    """Load of a checkpoint that diverged asks first, the question under the button
    (which stays where it was under the pointer); "Load anyway" loads it."""
    builder = page.locator(".tinax-restore-target-builder")
    verdict = builder.locator(".tinax-load-verdict")
    expect(verdict).to_contain_text("its logged loss is NaN")
    assert verdict.get_attribute("data-health") == "diverged"
    load = builder.locator("button.mod-primary", has_text="Load")
    load.scroll_into_view_if_needed()
    before = load.bounding_box()
    load.click()
    question = builder.locator(".tinax-load-guard", has_text="Load it all the same?")
    expect(question).to_be_visible()
    assert load.bounding_box() == before, "Load moved when the question came"
    builder.locator("button", has_text="Load anyway").click()
    expect(builder).to_contain_text("diverged: 1 NaN and 0 Inf in 1 leaf of model")
    builder.screenshot(path=str(ARTIFACTS / "builder-diverged-1280px.png"))
