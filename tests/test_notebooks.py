"""The notebooks: stripped in git, saved as committed, lines that fit a 900 px window, and
nothing on stderr and no warning when they run.

Execution happens in a scratch copy of ``notebooks/`` and ``demo/`` with its own demo
run next to them (at ``../demo_run``, where the notebooks look for it), so the test
neither reads nor writes the checkout's ``demo_run/``.
"""

from __future__ import annotations

import concurrent.futures
import re
import runpy
import shutil
import warnings
from pathlib import Path
from typing import Any

import nbformat
import pytest
from nbclient import NotebookClient
from notebook_outputs import IN_BINDER, complaints
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
    """A scratch checkout with notebooks/, demo/ and a finished demo_run/ (a copy of the
    session's, which the notebooks may add to) and demo_big_run/ (notebook 06's)."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(NOTEBOOKS, root / "notebooks", ignore=shutil.ignore_patterns(".ipynb*"))
    shutil.copytree(REPO / "demo", root / "demo", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(demo_run, root / "demo_run", symlinks=True)
    shutil.copytree(big_run, root / "demo_big_run", symlinks=True)
    return root


# The notebooks that read the demo runs run in Binder's environment (tests/test_binder.py);
# here, in this one, each of the others runs in a fresh kernel, and notebook 03 once more.
REPEATED = "03_restore_targets.ipynb"
HERE = tuple(name for name in EXPECTED if name not in IN_BINDER)


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
def executed(workspace: Path) -> list[tuple[str, nbformat.NotebookNode]]:
    """Every notebook not run in Binder's environment executed once, and notebook 03
    once more, in fresh kernels two at a time (as two people working side by side
    would)."""
    names = [*HERE, REPEATED]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        return list(zip(names, pool.map(lambda name: _run(workspace, name), names), strict=True))


def test_every_notebook_runs_with_nothing_on_stderr_and_no_warnings(
    executed: list[tuple[str, nbformat.NotebookNode]],
) -> None:
    # A refused load used to leave Orbax reading in the background, which printed
    # "Exception ignored in: <coroutine …>" into notebook 03 in some runs, not all;
    # flax's DeprecationWarnings printed red into notebook 05.
    assert sorted({name for name, _ in executed}) == list(HERE)
    assert sorted([*HERE, *IN_BINDER]) == list(EXPECTED)
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
