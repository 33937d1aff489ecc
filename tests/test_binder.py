"""Binder: binder/ installs the locked environment, and the notebooks run in it.

``test_binder_environment_runs_the_notebooks`` does what Binder does with this
repository, in a fresh virtualenv: ``pip install -r binder/requirements.txt``, then
``binder/postBuild`` from the repository root, then it executes the notebooks that
read what postBuild made with that environment's own kernel. The requirements are
installed by the uv that ``make`` installs (``.tools/bin/uv``) when it is there, in
seconds where pip takes one and a half minutes on an empty cache: the same pinned,
hash-checked wheels either way.
postBuild's own ``pip install`` runs as on Binder, and so does its demo run. Its
many-leaf run is the session's (``big_run``, built by the same script from the same
lock), copied in first: postBuild's script finds it finished and keeps it, as a second
build on Binder does, which spares the suite a minute of training.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from notebook_outputs import IN_BINDER, complaints

REPO = Path(__file__).resolve().parents[1]
BINDER = REPO / "binder"


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line[0].isspace() and "==" in line and not line.startswith("#"):
            name, _, rest = line.partition("==")
            pins[name.strip().lower()] = rest.split()[0].rstrip("\\").strip()
    return pins


def test_binder_requirements_are_part_of_the_lock() -> None:
    lock, binder = _pins(REPO / "requirements.lock"), _pins(BINDER / "requirements.txt")
    assert binder, "binder/requirements.txt pins nothing"
    # The same versions as the lock, and what the notebooks need: tinax's runtime
    # dependencies, the widgets extra and the demo group, but none of the test tools.
    assert {name: lock.get(name) for name in binder} == binder
    assert {"jax", "orbax-checkpoint", "grain", "ipywidgets", "flax", "optax"} <= set(binder)
    assert not {"pytest", "ruff", "mypy", "playwright"} & set(binder)
    for path in (REPO / "requirements.lock", BINDER / "requirements.txt"):
        text = path.read_text()
        assert "make lock" in text.splitlines()[1], f"{path.name} is not written by make lock"
        assert "--hash=sha256:" in text


def test_binder_python_matches_the_development_python() -> None:
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert runtime == f"python-{sys.version_info.major}.{sys.version_info.minor}"


def test_post_build_is_executable_in_git() -> None:
    # Binder runs binder/postBuild directly, so git must record the executable bit.
    mode = subprocess.run(
        ["git", "ls-files", "--stage", "binder/postBuild"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    if mode:  # tracked: check what git records
        assert mode[0] == "100755"
    assert os.access(BINDER / "postBuild", os.X_OK)


def _copy_checkout(dest: Path) -> None:
    """Copies the files a clone would have (tracked or new, not ignored) to ``dest``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        check=True,
        capture_output=True,
    ).stdout.split(b"\0")
    for raw in listed:
        rel = raw.decode()
        if not rel or not (REPO / rel).is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, dest / rel)


def test_binder_environment_runs_the_notebooks(
    tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    repo = tmp_path / "repo"
    _copy_checkout(repo)
    assert not (repo / "demo_run").exists() and not (repo / "demo_big_run").exists()
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    # Binder's environment as Binder makes it: not this venv's, and without the test
    # session's JAX compilation cache (tests/conftest.py), whose lock needs a package of
    # the test group.
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in ("VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME")
        and not key.startswith(("JAX_COMPILATION_CACHE_", "JAX_PERSISTENT_CACHE_"))
    }
    env.update(
        PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        VIRTUAL_ENV=str(venv),
        JAX_PLATFORMS="cpu",
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        # Where postBuild installs the server settings (~/.jupyter on Binder).
        JUPYTER_CONFIG_DIR=str(tmp_path / "jupyter-config"),
    )

    def run(*args: str, cwd: Path = repo) -> str:
        done = subprocess.run(
            args, cwd=cwd, env=env, capture_output=True, text=True, timeout=1500, check=False
        )
        assert done.returncode == 0, f"{args} failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
        return done.stdout

    # What Binder's Python build pack runs, in this order.
    uv = REPO / ".tools" / "bin" / "uv"
    if uv.is_file():
        run(
            str(uv),
            "pip",
            "install",
            "--quiet",
            "--python",
            str(venv / "bin" / "python"),
            "-r",
            "binder/requirements.txt",
        )
    else:
        run("python", "-m", "pip", "install", "--quiet", "-r", "binder/requirements.txt")
    # Asked for only now: the session builds it in the background meanwhile.
    big_run: Path = request.getfixturevalue("big_run")
    shutil.copytree(big_run, repo / "demo_big_run")
    kept = (repo / "demo_big_run" / "big_run.json").read_bytes()
    run("binder/postBuild")
    assert (repo / "demo_big_run" / "big_run.json").read_bytes() == kept

    assert (repo / "demo_run" / "run.json").is_file()
    assert (repo / "demo_big_run" / "big_run.json").is_file()
    installed = tmp_path / "jupyter-config" / "jupyter_server_config.py"
    assert installed.read_bytes() == (repo / "demo" / "jupyter_server_config.py").read_bytes()
    # postBuild installed the packages into the environment rather than leaving them
    # importable only from the repository directory.
    where = run(
        "python",
        "-c",
        "import tinax, tinax.widgets; print(tinax.__file__, tinax.widgets.__file__)",
        cwd=tmp_path,
    )
    assert all(str(venv) in path for path in where.split()), where
    # The views are tinax.widgets; nothing is installed as a top-level `widgets`.
    top_level = run(
        "python",
        "-c",
        "import importlib.util; print(importlib.util.find_spec('widgets'))",
        cwd=tmp_path,
    )
    assert top_level.strip() == "None", top_level

    out = tmp_path / "executed"
    # The notebooks that read what postBuild made (the demo run and the big run), in
    # the Binder environment; tests/test_notebooks.py runs the others, from the same
    # lock, in the development one.
    notebooks = [repo / "notebooks" / n for n in IN_BINDER]
    assert all(p.is_file() for p in notebooks)
    run(
        "jupyter",
        "nbconvert",
        "--to",
        "notebook",
        "--execute",
        "--ExecutePreprocessor.timeout=120",
        "--ExecutePreprocessor.kernel_name=python3",
        "--output-dir",
        str(out),
        *(str(p) for p in notebooks),
    )
    for path in notebooks:
        executed = nbformat.read(out / path.name, as_version=4)
        code = [c for c in executed.cells if c.cell_type == "code"]
        assert all(c.execution_count is not None for c in code), path.name
        outputs = [o for c in code for o in c.outputs]
        # Nothing in red: no error, nothing on stderr, no warning.
        assert complaints(executed) == [], path.name
        # Every notebook shows something: printed text, a table, a figure or a widget.
        kinds = {o.output_type for o in outputs}
        assert kinds & {"stream", "display_data", "execute_result"}, path.name
