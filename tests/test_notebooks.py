"""The notebooks: stripped in git, saved as committed, lines that fit a 900 px window, and
nothing on stderr and no warning when they run; and the documentation site, whose build
runs them.

The site is built (tests/docs_site.py) in a scratch copy of ``docs/``, ``notebooks/``
and ``demo/`` with its own demo runs next to them (at ``../demo_run``, where the
notebooks look for them), so the tests neither read nor write the checkout's
``demo_run/``; its build executes every notebook once, and the tests read what each
printed from the executed notebooks the build keeps.
"""

from __future__ import annotations

import functools
import http.server
import re
import runpy
import shutil
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import nbformat
import pytest
from browser.lab import CHROMIUM, CHROMIUM_ARGS
from docs_site import Site, build_site
from nbclient import NotebookClient
from notebook_outputs import complaints
from playwright.sync_api import (
    Browser,
    BrowserContext,
    Locator,
    Page,
    Route,
    expect,
    sync_playwright,
)
from traitlets.config import Config

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
EXPECTED = (
    "01_quickstart.ipynb",
    "02_explore_a_run.ipynb",
    "03_restore_targets.ipynb",
    "04_legacy_v0.ipynb",
    "05_safetensors.ipynb",
    "06_run_timeline.ipynb",
)
CELL_TIMEOUT_S = 120


def _read(name: str) -> nbformat.NotebookNode:
    return nbformat.read(NOTEBOOKS / name, as_version=4)


def test_the_notebooks_are_the_expected_set() -> None:
    assert tuple(sorted(p.name for p in NOTEBOOKS.glob("*.ipynb"))) == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_notebook_is_stripped_and_valid(name: str) -> None:
    nb = _read(name)
    nbformat.validate(nb)
    assert nb.metadata.kernelspec.name == "python3"
    # Saved widget state would be stale, machine-specific output.
    assert "widgets" not in nb.metadata
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code, f"{name} has no code"
    for cell in code:
        assert cell.outputs == [], f"{name}: cell {cell.id} has saved outputs"
        assert cell.execution_count is None, f"{name}: cell {cell.id} has an execution count"
    assert nb.cells[0].cell_type == "markdown" and nb.cells[0].source.startswith("# ")
    # Paths are found relative to the notebook, never spelled out for one machine.
    assert not [c.id for c in nb.cells if str(REPO) in c.source or "/home/" in c.source]


def _server_hook() -> Any:
    """What the contents manager of the shipped server settings runs before a save."""
    config = Config()
    runpy.run_path(
        str(REPO / "demo" / "jupyter_server_config.py"), init_globals={"get_config": lambda: config}
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Jupyter's "Overriding existing pre_save_hook"
        manager = config.ServerApp.contents_manager_class(root_dir=str(NOTEBOOKS), config=config)

    def hook(*, model: dict[str, Any], path: str, contents_manager: object) -> None:
        manager.run_pre_save_hooks(model=model, path=path)

    return hook


@pytest.mark.parametrize("name", EXPECTED)
def test_saving_after_a_kernel_started_leaves_the_bytes_as_committed(name: str) -> None:
    """What JupyterLab saves once a kernel has filled in its details, after the hook."""
    committed = (NOTEBOOKS / name).read_text(encoding="utf-8")
    content = nbformat.reads(committed, as_version=4)
    content.metadata["language_info"] = {
        "codemirror_mode": {"name": "ipython", "version": 3},
        "file_extension": ".py",
        "mimetype": "text/x-python",
        "name": "python",
        "pygments_lexer": "ipython3",
        "version": "3.11.7",
    }
    content.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    model = {"type": "notebook", "content": content}
    _server_hook()(model=model, path=name, contents_manager=None)
    # The contents manager writes with nbformat, one newline at the end.
    saved = nbformat.writes(nbformat.from_dict(model["content"])).rstrip("\n") + "\n"
    assert saved == committed


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory, demo_run: Path, big_run: Path) -> Path:
    """A scratch checkout with docs/, notebooks/, demo/ and a finished demo_run/ (a copy
    of the session's, which the notebooks may add to) and demo_big_run/ (notebook 06's)."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(NOTEBOOKS, root / "notebooks", ignore=shutil.ignore_patterns(".ipynb*"))
    shutil.copytree(REPO / "demo", root / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(
        REPO / "docs",
        root / "docs",
        symlinks=True,
        ignore=shutil.ignore_patterns("_build", "generated"),
    )
    shutil.copytree(demo_run, root / "demo_run", symlinks=True)
    shutil.copytree(big_run, root / "demo_big_run", symlinks=True)
    return root


# The notebooks run once, as the documentation site's build executes them (each in a
# fresh kernel, in notebooks/), and notebook 03 once more beside that build, as two
# people working side by side would.
REPEATED = "03_restore_targets.ipynb"


def _run(workspace: Path, name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(workspace / "notebooks" / name, as_version=4)
    NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",  # jupyter_client runs it with this very interpreter
        resources={"metadata": {"path": str(workspace / "notebooks")}},
    ).execute()  # raises CellExecutionError on the first failing cell
    return nb


@pytest.fixture(scope="module")
def site(workspace: Path) -> Site:
    """The documentation site built as ``make docs`` builds it (warnings are errors,
    references nitpicky, the notebooks executed), with notebook 03 run once more in a
    kernel of its own while the build runs."""
    return build_site(workspace, beside=lambda: _run(workspace, REPEATED))


@pytest.fixture(scope="module")
def executed(site: Site) -> list[tuple[str, nbformat.NotebookNode]]:
    """Every notebook as the site's build executed it, and notebook 03's second run."""
    return [*((name, site.notebook(name)) for name in EXPECTED), (REPEATED, site.beside)]


def test_every_notebook_runs_with_nothing_on_stderr_and_no_warnings(
    executed: list[tuple[str, nbformat.NotebookNode]],
) -> None:
    # A refused load used to leave Orbax reading in the background, which printed
    # "Exception ignored in: <coroutine …>" into notebook 03 in some runs, not all;
    # flax's DeprecationWarnings printed red into notebook 05.
    assert sorted({name for name, _ in executed}) == list(EXPECTED)
    for name, nb in executed:
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code), name
        assert complaints(nb) == [], name


# What changes a builder's ticks, its load or its path.
_CHANGES_A_BUILDER = r"\.(tick|apply_preset|apply|expand)\(|\S*\.click\(|\.checkboxes\[|\.path ="


def test_each_builder_in_notebook_03_shows_the_choice_of_its_own_step(
    executed: list[tuple[str, nbformat.NotebookNode]],
) -> None:
    """After Run All, no later cell changes a builder an earlier cell displayed."""
    nb = next(nb for name, nb in executed if name == REPEATED)
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    builders = [
        (i, made.group(1))
        for i, source in enumerate(sources)
        if (made := re.search(r"^(\w+) = RestoreTargetBuilder\(", source, re.M))
    ]
    assert len(builders) >= 4, builders
    for i, name in builders:
        lines = sources[i].splitlines()
        assert name in (lines[-1], f"display({name})") or f"display({name})" in lines, (
            f"{name} is made in cell {i} but not shown there"
        )
        for later in sources[i + 1 :]:
            assert not re.search(rf"\b{name}(?:{_CHANGES_A_BUILDER})", later), (
                f"{name}, shown in cell {i}, is changed by a later cell:\n{later}"
            )
    # The fine-tuned model kept its own BatchNorm statistics and took the rest.
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs)
    assert "left out of the model: [('norm', 'mean'), ('norm', 'var')]" in text
    assert re.search(r"loaded \d+ leaves .*not loaded: optimizer, rng, auxiliary", text)


# What JupyterLab's code cells show without cutting a line at 900 px (its default
# monospace font at 13 px, prompt and margins taken off): 79 characters, as PEP 8 has it.
MAX_CODE_LINE = 79


@pytest.mark.parametrize("path", sorted(NOTEBOOKS.glob("*.ipynb")), ids=lambda p: p.name)
def test_code_lines_fit_a_900_px_window(path: Path) -> None:
    nb = nbformat.read(path, as_version=4)
    long = [
        f"cell {cell.id}: {len(line)} characters: {line}"
        for cell in nb.cells
        if cell.cell_type == "code"
        for line in cell.source.splitlines()
        if len(line) > MAX_CODE_LINE
    ]
    assert long == []


def test_every_public_name_has_a_reference_page(site: Site) -> None:
    documented = site.inventory()
    missing = [
        f"{name} (add it to docs/api/{page}.md)"
        for name, page in site.public_names().items()
        if not documented.get(name, "").startswith("api/")
    ]
    assert missing == []
    # Cross-linked: TrainingRun.restore's page links to what it returns.
    restore = (site.html / documented["tinax.checkpointing.TrainingRun"].split("#")[0]).read_text()
    assert 'href="tinax.checkpointing.TrainingCheckpoint.html' in restore
    # A guide a docstring names is a link to the guide's section.
    save = documented["tinax.checkpointing.save_checkpointables"].split("#")[0]
    assert 'href="../../guides/preemption.html#claim-then-write"' in (site.html / save).read_text()


def test_the_site_has_no_broken_internal_link(site: Site) -> None:
    assert site.broken_links() == []
    # A guide, a tutorial with its outputs and the command line's page were built.
    assert (site.html / "guides" / "training_runs.html").is_file()
    tutorial = (site.html / "tutorials" / "01_quickstart.html").read_text()
    assert "cell_output" in tutorial


def test_the_command_line_page_shows_every_command_and_exit_status(site: Site) -> None:
    page = (site.html / "guides" / "command_line.html").read_text()
    top, commands = site.command_parsers()
    for name, parser in commands.items():
        assert f"tinax {name}" in page, name
        for action in parser._actions:
            for flag in action.option_strings:
                assert flag in page, f"{name} {flag}"
    for status in ("0", "1", "2", "130"):
        assert (
            f'<code class="docutils literal notranslate"><span class="pre">{status}</span>' in page
        )


@pytest.fixture(scope="module")
def served(site: Site) -> Iterator[str]:
    """The built site served over HTTP on the loopback, as a reader's browser gets it."""
    handler = functools.partial(_QuietHandler, directory=str(site.html))
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        yield f"http://127.0.0.1:{server.server_address[1]}"
        server.shutdown()
        thread.join()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


def _offline(chromium: Browser, width: int) -> tuple[BrowserContext, list[str]]:
    """A browser window with no network: every request for anything but a file, the
    page's own data and the loopback is refused, and listed in the list returned."""
    context = chromium.new_context(viewport={"width": width, "height": 900})
    left: list[str] = []

    def only_this_machine(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).scheme in ("file", "data", "blob") or urlsplit(url).hostname in (
            "127.0.0.1",
            "localhost",
        ):
            route.continue_()
        else:
            left.append(url)
            route.abort()

    context.route("**/*", only_this_machine)
    return context, left


ARTIFACTS = REPO / "test-artifacts" / "docs"


@pytest.mark.browser
def test_a_reader_finds_their_way_in_chromium(served: str) -> None:
    """The front page, a guide reached by its links, an API page, and the search, with
    no request leaving the machine."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context, left = _offline(chromium, 1280)
        page = context.new_page()
        page.goto(f"{served}/index.html")
        expect(page.locator("h1").first).to_have_text(re.compile("tinax"))
        page.screenshot(path=str(ARTIFACTS / "front.png"))
        # A guide, by the links a reader would follow.
        page.get_by_role("link", name="Guides", exact=True).first.click()
        page.get_by_role("link", name="Training runs and retention").first.click()
        expect(page.locator("h1").first).to_have_text(re.compile("Training runs"))
        assert "local_keep" in page.content() or "keep_best" in page.content()
        page.screenshot(path=str(ARTIFACTS / "guide.png"), full_page=False)
        # An API page: TrainingRun.restore, its arguments, linked to what it returns.
        page.goto(f"{served}/api/generated/tinax.checkpointing.TrainingRun.html")
        restore = page.locator('[id="tinax.checkpointing.TrainingRun.restore"]')
        expect(restore).to_be_visible()
        expect(page.locator('a[href*="TrainingCheckpoint"]').first).to_be_attached()
        page.screenshot(path=str(ARTIFACTS / "api.png"))
        # The search finds TrainingRun.
        page.goto(f"{served}/search.html?q=TrainingRun")
        found = page.locator("#search-results a", has_text="TrainingRun")
        expect(found.first).to_be_visible(timeout=30_000)
        page.screenshot(path=str(ARTIFACTS / "search.png"))
        chromium.close()
    assert left == []


def _widget_output(page: Page, made_by: str) -> Locator:
    """The output of the cell whose code holds ``made_by``: the widget it left."""
    cell = page.locator("div.cell", has=page.locator("div.cell_input", has_text=made_by))
    return cell.locator("div.cell_output .jupyter-widgets").first


@pytest.mark.browser
def test_the_tutorials_widgets_draw_from_their_saved_state_with_no_network(
    site: Site, served: str
) -> None:
    """The explorer of notebook 02 and the run timeline of notebook 06 as the run left
    them, tables and drawings included (anywidget views), from the site's own scripts:
    served, and opened from disk as a reader with no network would."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    errors: list[str] = []
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context, left = _offline(chromium, 1280)
        page = context.new_page()
        page.on("pageerror", lambda error: errors.append(str(error)))
        explorer_page = (site.html / "tutorials" / "02_explore_a_run.html").as_uri()
        for address in (f"{served}/tutorials/02_explore_a_run.html", explorer_page):
            page.goto(address)
            explorer = _widget_output(page, "explorer = CheckpointExplorer(RUN)")
            # The open checkpoint's heading, its tree of leaves (a tinax table), and the
            # picked leaf's statistics and histogram.
            expect(explorer.get_by_text("29 leaves in 5 checkpointables")).to_be_visible()
            tree = explorer.locator("table", has_text="dense1")
            expect(tree).to_be_visible()
            expect(tree.locator("tr", has_text="kernel").first).to_be_visible()
            expect(explorer.get_by_text("(16, 256)").first).to_be_visible()
            histogram = explorer.locator("img").first
            expect(histogram).to_be_visible()
            assert histogram.evaluate("image => image.naturalWidth") > 0
        page.screenshot(path=str(ARTIFACTS / "tutorial-explorer.png"), full_page=True)

        page.goto(f"{served}/tutorials/06_run_timeline.html")
        timeline = _widget_output(page, "timeline = RunTimeline(RUN")
        # The drawing: the layer that jumped is a row of the drift heatmap, and the
        # summary under it names the roll-back step.
        expect(timeline.locator("svg text", has_text="blocks.7").first).to_be_visible()
        expect(timeline.get_by_text("roll back to").first).to_be_visible()
        page.screenshot(path=str(ARTIFACTS / "tutorial-timeline.png"), full_page=True)
        chromium.close()
    assert left == []
    assert errors == []
