"""The notebooks: stripped in git, saved as committed, and notebook 03 quiet on stderr.

Execution happens in a scratch copy of ``notebooks/`` and ``demo/`` with its own demo
run next to them (at ``../demo_run``, where the notebooks look for it), so the test
neither reads nor writes the checkout's ``demo_run/``.
"""

from __future__ import annotations

import concurrent.futures
import runpy
import shutil
import warnings
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from traitlets.config import Config

REPO = Path(__file__).resolve().parents[1]
NOTEBOOKS = REPO / "notebooks"
EXPECTED = (
    "01_quickstart.ipynb",
    "02_explore_a_run.ipynb",
    "03_restore_targets.ipynb",
    "04_legacy_v0.ipynb",
    "05_safetensors.ipynb",
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
def workspace(tmp_path_factory: pytest.TempPathFactory, demo_run: Path) -> Path:
    """A scratch checkout with notebooks/, demo/ and a finished demo_run/ (a copy of the
    session's, which the notebooks may add to)."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(NOTEBOOKS, root / "notebooks", ignore=shutil.ignore_patterns(".ipynb*"))
    shutil.copytree(REPO / "demo", root / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(demo_run, root / "demo_run", symlinks=True)
    return root


# Every notebook runs top to bottom in Binder's environment (tests/test_binder.py); here,
# in this one, notebook 03 runs again and again.


def _stderr_of_one_run(workspace: Path) -> list[str]:
    nb = nbformat.read(workspace / "notebooks" / "03_restore_targets.ipynb", as_version=4)
    NotebookClient(
        nb,
        timeout=CELL_TIMEOUT_S,
        kernel_name="python3",  # jupyter_client runs it with this very interpreter
        resources={"metadata": {"path": str(workspace / "notebooks")}},
    ).execute()  # raises CellExecutionError on the first failing cell
    assert all(c.execution_count is not None for c in nb.cells if c.cell_type == "code")
    return [
        o.text
        for c in nb.cells
        if c.cell_type == "code"
        for o in c.outputs
        if o.output_type == "stream" and o.name == "stderr"
    ]


def test_notebook_03_prints_nothing_to_stderr_four_times_in_a_row(workspace: Path) -> None:
    # A refused load used to leave Orbax reading in the background, which printed
    # "Exception ignored in: <coroutine …>" into the notebook in some runs, not all.
    # Four fresh kernels, two at a time.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(lambda _: _stderr_of_one_run(workspace), range(4)))
    assert runs == [[]] * 4, [r for r in runs if r]
