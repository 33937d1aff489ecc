"""The widgets in a real browser: JupyterLab + Debian's Chromium driven by Playwright.

One JupyterLab server and one Chromium serve every test of this file. It looks at every widget, and at the
repository's notebooks 02 and 03 run whole, at 900 px, at 1,280 px with the file
browser open and at 1,600 px; it checks from the DOM that no output needs sideways
scrolling and that no visible text is cut (a key shortened in the middle on purpose
carries the whole key as its title), that the histogram keeps its image's aspect
ratio, and keeps screenshots of every width in ``test-artifacts/``. It also checks
that JupyterLab leaves a notebook's bytes as committed when it opens and saves it.

The explorer is also driven on a real shape: the many-leaf demo run (24 NNX blocks
with AdamW, ~1,200 leaves), where it must keep keys apart, blocks in numeric order
and the page within two screens after a diff, a data check and a leaf.

RunTimeline is checked there too (``tests/browser/timeline.py``): a small run with a
planted jump and NaN and a run of 300 checkpoints, readable at every width, a click on a
heatmap cell reaching Python, the explorer's timeline staying under the pointer.

The explorer browses a gs:// run too: the run lives in a real fake-gcs-server
(``tests/gcs.py``), and the JupyterLab server and its kernels get the emulator's
environment, as a notebook on a TPU VM gets Google's.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import browser.timeline as timeline
import gcsfs
import nbformat
import numpy as np
import pytest
from browser.lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    REPO,
    TIMEOUT_MS,
    python_notebook,
    run_all_cells,
    running_lab,
    set_width,
    wait_for_kernel,
)
from conftest import BUCKET
from playwright.sync_api import Browser, Page, expect, sync_playwright
from run_view_fixtures import big_run_script

from tinax.checkpointing import save_checkpointables

ARTIFACTS = REPO / "test-artifacts"
# The explorer opens a checkpoint, diffs and checks data in the kernel's background;
# on a loaded two-core machine that takes longer than Playwright's 5 s default
# before the view shows it.
expect.set_options(timeout=TIMEOUT_MS)
# A small laptop, a common laptop with JupyterLab's file browser open, a wide screen.
WIDTHS = (900, 1280, 1600)
REPO_NOTEBOOKS = ("02_explore_a_run.ipynb", "03_restore_targets.ipynb")
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
    notebook = python_notebook()
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
        nbformat.v4.new_code_cell(
            "import tinax.checkpointing as tc\n\n"
            "with tc.memory_budget(64 * 1024):  # too little for the restore\n"
            f"    too_big = RestoreTargetBuilder(state, '{RUN_NAME}/step-300')\n"
            "    too_big.lossy_box.value = True\n"
            "too_big"
        ),
    ]
    nbformat.write(notebook, path)


# What a reader of ``root`` (an output, or a widget) cannot read without help: any
# element that scrolls sideways or reaches past the output's right edge, and any
# visible text cut short; a key shortened in the middle on purpose (with its whole
# text as a title) is fine.
_READABLE_JS = """
(root) => {
  const problems = [];
  const output = root.closest('.jp-OutputArea-output') || root;
  const edge = output.getBoundingClientRect().right;
  const name = (el) => (el.textContent || el.tagName).trim().slice(0, 60);
  for (const box of [output, ...root.querySelectorAll('table, .tinax-grid-body, .widget-box')]) {
    if (box.offsetParent === null) continue;
    if (box.scrollWidth > box.clientWidth + 1) {
      problems.push(`${box.tagName}.${box.className}: needs sideways scrolling` +
        ` (${box.scrollWidth} px in ${box.clientWidth} px)`);
    }
    const r = box.getBoundingClientRect();
    if (r.width && r.right > edge + 1) {
      problems.push(`${box.tagName}.${box.className}: reaches past the output (${r.right} > ${edge})`);
    }
  }
  for (const el of root.querySelectorAll('*')) {
    if (el.offsetParent === null || !el.clientWidth) continue;
    const text = [...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim());
    if (!text && !['TD', 'TH'].includes(el.tagName)) continue;
    if (el.scrollWidth <= el.clientWidth + 1) continue;
    if (el.querySelector('.tinax-shortened[title]') || el.matches('.tinax-shortened[title]')) continue;
    problems.push(`${name(el)}: text cut (${el.scrollWidth} px in ${el.clientWidth} px)`);
  }
  return problems;
}
"""


_ASPECT_JS = (
    "(img) => {"
    + """
  img.scrollIntoView({block: 'center'});
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


def _check_readable(root: Any, what: str) -> None:
    """Asserts that ``root`` (a widget or an output) reads without sideways scrolling."""
    problems = root.evaluate(_READABLE_JS)
    assert not problems, f"{what}: " + "; ".join(problems)


def _open_notebook(page: Page, lab: Any, path: str) -> None:
    """Opens a notebook alone in a fresh workspace (not the tabs an earlier page left)."""
    page.set_viewport_size({"width": WIDTHS[-1], "height": HEIGHT})
    page.goto(lab.page_url(path) + "&reset", timeout=TIMEOUT_MS)
    page.wait_for_function(
        "path => { const w = window.jupyterapp && window.jupyterapp.shell.currentWidget;"
        " return w && w.context && w.context.path === path; }",
        arg=path,
    )


def _run_and_check_notebook(page: Page, lab: Any, path: str, *, opened: bool = False) -> None:
    """Runs a notebook whole (``opened``: the one ``_open_notebook`` opened in ``page``)
    and checks its outputs at every width, with screenshots."""
    if not opened:
        _open_notebook(page, lab, path)
    run_all_cells(page)
    # Done when the kernel is idle and every code cell has run.
    page.wait_for_function(
        """() => {
          const w = window.jupyterapp.shell.currentWidget;
          const kernel = w.sessionContext.session && w.sessionContext.session.kernel;
          const code = w.content.widgets.filter((c) => c.model.type === 'code');
          // A cell that raised stops the run: the cells after it never get a count.
          const raised = code.some((c) => c.model.outputs.toJSON().some(
            (o) => o.output_type === 'error'));
          return kernel && kernel.status === 'idle' && (raised || code.every(
            (c) => c.model.executionCount !== null));
        }""",
        timeout=4 * TIMEOUT_MS,
        polling=500,
    )
    notebook = page.locator(".jp-NotebookPanel:not(.lm-mod-hidden) .jp-Notebook")
    name = path.rsplit("/", 1)[-1]
    errors = page.evaluate(
        """() => window.jupyterapp.shell.currentWidget.content.widgets.flatMap(
          (c) => c.model.type === 'code' ? c.model.outputs.toJSON() : [])
          .filter((o) => o.output_type === 'error').map((o) => `${o.ename}: ${o.evalue}`)"""
    )
    assert not errors, f"{name} raised: {errors}"
    stem = name.split("_")[0]
    for width in WIDTHS:
        _set_width(page, width)
        outputs = notebook.locator(".jp-OutputArea-output")
        assert outputs.count() >= 5, f"{name}: {outputs.count()} outputs"
        for i in range(outputs.count()):
            output = outputs.nth(i)
            output.scroll_into_view_if_needed()
            _check_readable(output, f"{name}, output {i + 1} at {width} px")
        # The whole notebook in one picture: a window as tall as its content.
        tall = int(
            notebook.evaluate(
                "el => Math.max(el.scrollHeight, ...[...el.querySelectorAll("
                "'.jp-WindowedPanel-outer, .jp-WindowedPanel-inner')].map((e) => e.scrollHeight))"
            )
        )
        page.set_viewport_size({"width": width, "height": min(tall + 200, 16_000)})
        page.wait_for_timeout(300)
        notebook.evaluate(
            "el => { for (const e of [el, ...el.querySelectorAll('.jp-WindowedPanel-outer')])"
            " e.scrollTop = 0; }"
        )
        page.screenshot(path=str(ARTIFACTS / f"notebook-{stem}-{width}px.png"))
        page.set_viewport_size({"width": width, "height": HEIGHT})


def _set_width(page: Page, width: int) -> None:
    set_width(page, width, HEIGHT)


@pytest.fixture(scope="module")
def lab_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder the file's JupyterLab serves; each test writes its notebooks there."""
    return tmp_path_factory.mktemp("lab") / "notebooks"


@pytest.fixture(scope="module")
def lab(lab_root: Path, tmp_path_factory: pytest.TempPathFactory, gcs: Any) -> Iterator[Any]:
    """One JupyterLab for the file's tests, its kernels given the session's GCS emulator."""
    lab_root.mkdir(parents=True, exist_ok=True)
    work = tmp_path_factory.mktemp("jupyter")
    with running_lab(lab_root, work, env=gcs.environment()) as server:
        yield server


@pytest.fixture(scope="module")
def browser() -> Iterator[Browser]:
    """One Chromium for the file's tests (a fresh page each)."""
    if not CHROMIUM.exists():
        pytest.fail(f"{CHROMIUM} is missing: install Debian's chromium (make chromium)")
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        yield chromium
        chromium.close()


@contextlib.contextmanager
def _page(browser: Browser, lab: Any, failure: str, viewport: dict[str, int]) -> Iterator[Page]:
    """A page of ``viewport``'s size; when what runs with it fails, a screenshot of it
    goes to ``ARTIFACTS / failure`` and the failure names it, with the end of
    JupyterLab's log."""
    ARTIFACTS.mkdir(exist_ok=True)
    page = browser.new_page(viewport=viewport)
    page.set_default_timeout(TIMEOUT_MS)
    try:
        yield page
    except Exception as e:
        shot = ARTIFACTS / failure
        page.screenshot(path=str(shot), full_page=True)
        raise AssertionError(
            f"browser test failed ({e}); screenshot: {shot}\nJupyterLab log:\n{lab.log_tail()}"
        ) from e
    finally:
        page.close()


def _open_step_300(explorer: Any) -> Any:
    """Opens step-300 in the explorer of a run whose step-400 has not committed (which
    must not open), and shows its leaves as a flat table, which it returns."""
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
    leaf_table.wait_for()
    return leaf_table


def test_widgets_are_readable_at_900_and_1600_px_in_chromium(
    tmp_path: Path, lab_root: Path, lab: Any, browser: Browser, demo_run: Path
) -> None:
    notebooks = lab_root
    # The kernel starts in the notebook's directory, so the run is found by its name.
    _write_run(notebooks / RUN_NAME)
    _write_notebook(notebooks / "explorer.ipynb")
    committed = REPO_NOTEBOOK.read_bytes()
    # The repository's notebooks find demo/ and the demo run one level above their
    # own folder: a copy of the session's demo run (demo/make_run.py's), which they
    # may add to.
    copy_root = notebooks / "repo"
    (copy_root / "notebooks").mkdir(parents=True)
    (copy_root / "demo").symlink_to(REPO / "demo")
    for name in REPO_NOTEBOOKS:
        (copy_root / "notebooks" / name).write_bytes((REPO / "notebooks" / name).read_bytes())
    shutil.copytree(demo_run, copy_root / "demo_run", symlinks=True)
    opened_at = (copy_root / "notebooks" / REPO_NOTEBOOK.name).stat().st_mtime_ns
    expected = _kernel(300).astype(np.float64)

    with _page(
        browser, lab, "browser-failure.png", {"width": WIDTHS[-1], "height": HEIGHT}
    ) as page:
        page.goto(lab.page_url("explorer.ipynb"), timeout=TIMEOUT_MS)
        page.locator(".jp-Notebook").wait_for()
        run_all_cells(page)

        explorer = page.locator(".tinax-checkpoint-explorer")
        explorer.wait_for()
        leaf_table = _open_step_300(explorer)
        # A header click sorts (sizes largest first), a second click reverses.
        leaf_table.locator('th[data-field="nbytes"] button').click()
        expect(leaf_table.locator('th[data-field="nbytes"]')).to_have_attribute(
            "aria-sort", "descending"
        )
        leaf_table.locator(f'tbody tr:has(span[title="{LEAF}"])').click()

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
        # Its leaves show; its subtrees wait behind the "subtrees" toggle.
        explorer.locator(".tinax-diff-view .tinax-table").last.wait_for()
        explorer.locator(".tinax-diff-view .tinax-diff-tree .tinax-table").wait_for(
            state="attached"
        )
        builder = page.locator(".tinax-restore-target-builder").first
        builder.wait_for()
        builder.locator(".tinax-table:visible").last.wait_for()
        # A restore that would not fit: Load disabled, the reason said.
        too_big = page.locator(".tinax-restore-target-builder").nth(1)
        too_big.wait_for()
        expect(too_big.get_by_role("button", name="Load")).to_be_disabled()
        expect(too_big).to_contain_text("Cannot load: it does not fit in memory")
        expect(too_big.locator(".tinax-restore-plan")).to_contain_text("Does not fit")

        # Without a known total: a sliding block that moves, not a full bar.
        pulse = page.locator(".tinax-async-progress .tinax-progress-indeterminate")
        pulse.wait_for()
        assert pulse.evaluate("el => el.firstElementChild.getAnimations().length") == 1
        bar = page.locator(".tinax-async-progress .widget-hprogress")
        assert bar.evaluate("el => el.offsetParent === null"), "a bar shows beside the block"

        # Unticking a checkpointable unticks its subtrees, visibly; ticking gives them back.
        optimizer = builder.get_by_label("optimizer", exact=True)
        optimizer.wait_for()
        # Its subtrees named dotted, as everywhere else.
        subtrees = [builder.get_by_label(k, exact=True) for k in ("count", "learning_rate")]
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
        # The restore plan before Load (once every leaf may load); its rows per device
        # fold open.
        plan = builder.locator(".tinax-restore-plan")
        expect(plan).to_contain_text("Peak host memory")
        plan.locator(".tinax-section-toggle").click()
        plan.locator(".tinax-table").wait_for()
        builder.get_by_role("button", name="Load").click()
        summary = builder.get_by_text(re.compile(r"^loaded 6 leaves \(3\.\d KiB\) in \d"))
        summary.wait_for()

        panel = page.locator(".tinax-save-panel")
        panel.wait_for()

        for width in WIDTHS:
            _set_width(page, width)
            _check_readable(panel, f"save panel at {width} px")
            _check_readable(explorer, f"explorer at {width} px")
            _check_readable(builder, f"builder at {width} px")
            _check_readable(too_big, f"builder that does not fit at {width} px")
            # Key, shape, dtype and size in every leaf table, whatever the width.
            headers = leaf_table.locator("th").all_inner_texts()
            assert {"key", "shape", "dtype"} <= {h.strip(" ▲▼") for h in headers}, headers
            assert any(h.startswith("size") for h in headers), headers
            look = histogram.evaluate(_ASPECT_JS)
            (nw, nh), (sw, sh) = look["natural"], look["shown"]
            assert nw > 0 and sh > 0
            assert abs(sw / sh - nw / nh) <= 0.01 * nw / nh, (
                f"histogram shown at {sw}x{sh}, its image is {nw}x{nh}"
            )
            assert look["inside"], f"histogram cut off at {width} px"
            _screenshot(page, explorer, width, "explorer")
            _screenshot(page, builder, width, "builder")
            _screenshot(page, too_big, width, "builder-too-big")
            _screenshot(page, panel, width, "save-panel")

        # The run's next name in its own pattern (step-400 is a save in progress),
        # and a status that follows the save to its end.
        assert panel.locator("input").input_value() == "step-500"
        panel.get_by_role("button", name="Save").click()
        panel.get_by_text(re.compile(r"^saved step-500 in \d")).wait_for()
        assert panel.get_by_text("saved step-500", exact=True).is_visible()
        assert "saving" not in panel.inner_text()
        assert panel.locator("input").input_value() == "step-600"

        # Notebook 02, opened as a reader would: its kernel starts (and tells
        # JupyterLab its language details), then it is saved; then it runs whole, and
        # notebook 03 after it: every output fits every width.
        opened = f"repo/notebooks/{REPO_NOTEBOOK.name}"
        _open_notebook(page, lab, opened)
        wait_for_kernel(page)
        page.wait_for_function(
            "() => window.jupyterapp.shell.currentWidget.context.model.dirty"
        )  # the kernel's language details arrived
        page.evaluate("() => window.jupyterapp.commands.execute('docmanager:save')")
        page.wait_for_function("() => !window.jupyterapp.shell.currentWidget.context.model.dirty")
        saved = (copy_root / "notebooks" / REPO_NOTEBOOK.name).read_bytes()
        for name in REPO_NOTEBOOKS:
            path = f"repo/notebooks/{name}"
            _run_and_check_notebook(page, lab, path, opened=path == opened)

    copy = copy_root / "notebooks" / REPO_NOTEBOOK.name
    assert copy.stat().st_mtime_ns > opened_at, "JupyterLab did not save the notebook"
    assert saved == committed, "opening and saving a notebook in JupyterLab changed its bytes"


def test_the_timeline_is_readable_and_clickable_at_three_widths(
    lab_root: Path, lab: Any, browser: Browser
) -> None:
    """RunTimeline on a small run with a planted jump and NaN and on a run of 300
    checkpoints (tests/browser/timeline.py says what is checked)."""
    folder = lab_root / "timeline"
    folder.mkdir()
    notebook = timeline.write(folder)
    viewport = {"width": timeline.WIDTHS[-1], "height": timeline.HEIGHT}
    with _page(browser, lab, "timeline-failure.png", viewport) as page:
        timeline.check(page, lab, f"timeline/{notebook}")


# The explorer on the many-leaf run: what a reader does first, timed, with the page's
# height after each step. The file browser is open at 1,280 px, as on a laptop.
SCREEN = {"width": 1280, "height": 900}
BIG_RUN = "big_run"

_TIMED_CELL = """\
import time

started = time.perf_counter()
from tinax.widgets import CheckpointExplorer

explorer = CheckpointExplorer({run!r})
print(f"made in {{time.perf_counter() - started:.2f}} s")
explorer"""

# The text of each key cell in view, and of the tree's labels, as drawn.
_KEYS_JS = """
(table) => [...table.querySelectorAll('tbody tr')].filter((tr) => tr.offsetParent !== null)
  .map((tr) => tr.querySelector('td').innerText.replace(/[\\s\\u200b]+/g, ' ').trim())
"""


# The exact key (a keystr) of each key cell in view, which hover and copy give.
_EXACT_JS = """
(table) => [...table.querySelectorAll('tbody tr')].filter((tr) => tr.offsetParent !== null)
  .map((tr) => { const k = tr.querySelector('.tinax-key-text'); return k ? k.dataset.exact : ''; })
"""


def _height(explorer: Any) -> int:
    return int(explorer.evaluate("el => el.getBoundingClientRect().height"))


def _distinct(keys: list[str], what: str) -> None:
    assert keys, f"{what}: no keys in view"
    repeated = sorted({k for k in keys if keys.count(k) > 1})
    assert not repeated, f"{what}: rows that look alike: {repeated}"


def test_the_explorer_on_a_many_leaf_run_reads_at_every_width(
    big_run: Path, lab_root: Path, lab: Any, browser: Browser
) -> None:
    (lab_root / BIG_RUN).symlink_to(big_run)
    notebook = python_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(_TIMED_CELL.format(run=BIG_RUN))]
    nbformat.write(notebook, lab_root / "big_run.ipynb")
    figures: dict[str, Any] = {}

    def step(name: str, started: float) -> None:
        figures[name] = {"seconds": round(time.monotonic() - started, 2), "height": _height(ex)}

    try:
        with _page(browser, lab, "browser-big-run-failure.png", SCREEN) as page:
            page.goto(lab.page_url("big_run.ipynb") + "&reset", timeout=TIMEOUT_MS)
            page.locator(".jp-Notebook").wait_for()
            _set_width(page, 1280)
            wait_for_kernel(page)
            started = time.monotonic()
            page.evaluate("() => window.jupyterapp.commands.execute('notebook:run-all-cells')")
            ex = page.locator(".tinax-checkpoint-explorer")
            ex.locator(".tinax-section-run .tinax-table tbody tr").first.wait_for()
            step("shown after Run All", started)
            made = page.locator(".jp-OutputArea-output").filter(has_text="made in").inner_text()
            figures["made in the kernel"] = made.strip()

            # What changed between two steps, and which weights most: the run's planted
            # jump of one block.
            script = big_run_script()
            after = script.checkpoint_name(script.JUMP_STEP)
            before = script.checkpoint_name(script.JUMP_STEP - script.CHECKPOINT_EVERY)
            started = time.monotonic()
            ex.locator(".tinax-table tbody tr").filter(has_text=after).first.click()
            expect(ex.locator(".tinax-checkpoint-title")).to_contain_text(after)
            ex.locator(".tinax-diff-view select").first.select_option(
                label=f"compare with {before}"
            )
            diff_table = ex.locator(".tinax-diff-view .tinax-table").last
            diff_table.locator("tbody tr").first.wait_for()
            expect(ex.locator(".tinax-diff-view")).to_contain_text(f"{before} to {after}")
            step("diff of two steps", started)
            # The most changed leaf is one of the block that jumped (shown without what
            # every row in view shares; its exact key on hover).
            most = diff_table.evaluate(_EXACT_JS)[0]
            block, number = script.JUMP_LAYER.split(".")
            assert most.startswith(f"['{block}']['{number}']"), f"the most changed leaf is {most}"
            # Is the newest sound, data included?
            started = time.monotonic()
            ex.get_by_role("button", name="check data").click()
            verdict = ex.locator(".tinax-data-verdict")
            verdict.wait_for()
            step("data check", started)
            # The leaf that changed most opens from its row of the diff.
            started = time.monotonic()
            diff_table.locator("tbody tr").first.click()
            ex.locator(".tinax-section-leaf table.tinax-leaf-stats").wait_for()
            expect(ex.locator(".tinax-leaf-title")).to_contain_text(f"{script.JUMP_LAYER}.")
            step("leaf from the diff", started)
            # After a diff, a data check and a leaf: two screens of a 1,280 x 900 laptop.
            height = figures["leaf from the diff"]["height"]
            assert height <= 2 * SCREEN["height"], f"the explorer is {height} px tall"

            _set_width(page, 900)
            _distinct(diff_table.evaluate(_KEYS_JS), "diff at 900 px")
            # Blocks in numeric order in the tree: 0, 1, 2, … 9, 10, never 0, 1, 10.
            tree = ex.locator(".tinax-section-checkpoint .tinax-leaf-tree")
            tree.get_by_role("button", name="close all").click()
            labels = tree.locator(".tinax-table .tinax-key-text")
            for name in ("model", "blocks"):
                labels.filter(has_text=re.compile(rf"^{name}$")).first.click()
            labels.filter(has_text=re.compile(r"^10$")).first.wait_for()
            shown = labels.all_inner_texts()
            blocks = [int(label) for label in shown if label.strip().isdigit()]
            assert blocks[:12] == list(range(12)), shown
            # Which leaves are largest: the flat table, by size.
            started = time.monotonic()
            ex.locator(".tinax-section-checkpoint .widget-toggle-button").filter(
                has_text=re.compile(r"^table$")
            ).click()
            leaf_table = ex.locator(".tinax-leaf-table")
            leaf_table.locator('th[data-field="nbytes"] button').click()
            expect(leaf_table.locator('th[data-field="nbytes"]')).to_have_attribute(
                "aria-sort", "descending"
            )
            step("largest leaves", started)
            # Export the model: its panel opens right under its button, "model" chosen.
            started = time.monotonic()
            ex.get_by_role("button", name="export…").click()
            panel = ex.locator(".tinax-export-panel")
            panel.locator("button.widget-button").filter(
                has_text=re.compile(r"^\s*Export\s*$")
            ).click()
            panel.get_by_text(re.compile(r"^wrote \d+ file")).wait_for()
            step("export the model", started)
            buttons = ex.get_by_role("button", name="export…").bounding_box()
            box = panel.bounding_box()
            assert buttons is not None and box is not None
            assert 0 <= box["y"] - (buttons["y"] + buttons["height"]) < 40, (buttons, box)
            _distinct(leaf_table.evaluate(_KEYS_JS), "leaf table at 900 px")

            for width in WIDTHS:
                _set_width(page, width)
                _check_readable(ex, f"explorer on the many-leaf run at {width} px")
                _distinct(diff_table.evaluate(_KEYS_JS), f"diff at {width} px")
                _screenshot(page, ex, width, "explorer-big-run")
            # A sound checkpoint's data check is one line.
            assert verdict.get_attribute("data-ok") == "true"
            expect(ex.locator(".tinax-data-check .tinax-table")).to_be_hidden()
    finally:
        (ARTIFACTS / "explorer-big-run.json").write_text(json.dumps(figures, indent=2))


# -- the explorer on a gs:// run ------------------------------------------------------------


def _gcs_kernel(step: int) -> np.ndarray:
    return np.random.default_rng(step).normal(0.0, 1.0, (16, 32)).astype("f4")


def _gcs_state(step: int) -> dict[str, object]:
    return {
        "model": {"dense_0": {"kernel": _gcs_kernel(step), "bias": np.zeros(32, np.float32)}},
        "optimizer": {"count": np.asarray(step, np.int32)},
    }


def _write_gcs_run(run: str) -> None:
    """Three committed steps, and a fourth as a reader sees it just before it commits."""
    for step in (100, 200, 300, 400):
        save_checkpointables(f"{run}/step-{step}", _gcs_state(step)).result()
    # On gs:// Orbax writes in place and commits with these two files last.
    fs = gcsfs.GCSFileSystem(use_listings_cache=False)
    for name in ("commit_success.txt", "_CHECKPOINT_METADATA"):
        fs.rm(f"{run[len('gs://') :]}/step-400/{name}")


def _write_gcs_notebook(path: Path, run: str) -> None:
    notebook = python_notebook()
    notebook.cells = [
        nbformat.v4.new_code_cell(
            f"from tinax.widgets import CheckpointExplorer\n\nCheckpointExplorer({run!r})"
        )
    ]
    nbformat.write(notebook, path)


def test_explorer_browses_a_gs_run_in_chromium(lab_root: Path, lab: Any, browser: Browser) -> None:
    run = f"gs://{BUCKET}/browser-{uuid.uuid4().hex[:8]}/run"
    _write_gcs_run(run)
    notebooks = lab_root / "gcs"
    notebooks.mkdir()
    _write_gcs_notebook(notebooks / "gcs.ipynb", run)
    expected = _gcs_kernel(300).astype(np.float64)

    with _page(browser, lab, "explorer-gcs-failure.png", {"width": 1500, "height": HEIGHT}) as page:
        # A fresh workspace: the notebook alone, not the tabs an earlier page left open.
        page.goto(lab.page_url("gcs/gcs.ipynb") + "&reset", timeout=TIMEOUT_MS)
        page.locator(".jp-Notebook").wait_for()
        run_all_cells(page)

        explorer = page.locator(".tinax-checkpoint-explorer")
        explorer.wait_for()
        assert run in explorer.inner_text()
        leaf_table = _open_step_300(explorer)
        leaf_table.locator(f'tbody tr:has(span[title="{LEAF}"])').click()

        stats = explorer.locator("table.tinax-leaf-stats")
        stats.wait_for()
        cell = 'td[data-stat="{}"]'.format
        assert stats.locator(cell("mean")).inner_text() == f"{expected.mean():.6g}"
        assert stats.locator(cell("max")).inner_text() == f"{expected.max():.6g}"
        assert stats.locator(cell("shape")).inner_text() == "(16, 32)"
        explorer.scroll_into_view_if_needed()
        explorer.screenshot(path=str(ARTIFACTS / "explorer-gcs.png"))
