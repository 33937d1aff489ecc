"""The demo run: its layout, its checkpoints, its interrupted save, and reuse."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np
import pytest

from tinax.checkpointing import abstract_restore_target, load_training_checkpoint

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "demo" / "make_run.py"
COMPLETE = [f"step_{step:06d}" for step in (50, 100, 150, 200, 250)]
NAMES = {"model", "optimizer", "rng", "auxiliary", "iterator"}


def _load_script() -> ModuleType:
    spec = importlib.util.spec_from_file_location("tinax_demo_make_run", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


demo = _load_script()


def _make(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def run_dir(demo_run: Path, demo_run_output: str) -> Path:
    # The session's demo run (tests/conftest.py), made by this script.
    assert "wrote in" in demo_run_output
    return demo_run


def _run_json(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "run.json").read_text())


def _targets(config: dict[str, Any]) -> tuple[Any, Any, Any]:
    model, optimizer, rng = demo.initial_state(config)
    return tuple(abstract_restore_target(x) for x in (model, optimizer, rng))  # type: ignore[return-value]


def test_run_has_complete_checkpoints_and_one_interrupted_save(run_dir: Path) -> None:
    entries = sorted(p.name for p in run_dir.iterdir())
    temporaries = [n for n in entries if ".orbax-checkpoint-tmp" in n]
    # The killed save's claim is left behind too, held by nobody.
    claim = "step_000300.tinax-claim"
    assert entries == sorted([*COMPLETE, *temporaries, claim, "run.json", "tinax_run.json"])
    for name in COMPLETE:
        meta = json.loads((run_dir / name / "_CHECKPOINT_METADATA").read_text())
        assert set(meta["item_handlers"]) == NAMES
        assert meta["commit_timestamp_nsecs"] > meta["init_timestamp_nsecs"] > 0
        assert (run_dir / name / "commit_success.txt").is_file()
    # The step-300 save was killed mid-write: Orbax's temporary directory, holding
    # some of the data but neither the commit marker nor the checkpoint metadata.
    assert len(temporaries) == 1 and temporaries[0].startswith("step_000300.orbax-checkpoint-tmp")
    interrupted = run_dir / temporaries[0]
    assert not (run_dir / "step_000300").exists()
    assert not (interrupted / "commit_success.txt").exists()
    assert not (interrupted / "_CHECKPOINT_METADATA").exists()
    assert any(p.is_file() for p in (interrupted / "model").rglob("*"))
    # No staging directory is left next to the run.
    assert [p.name for p in run_dir.parent.iterdir()] == ["demo_run"]


def test_run_json_records_the_run(run_dir: Path) -> None:
    meta = _run_json(run_dir)
    assert meta["format"] == demo.RUN_FORMAT
    assert meta["config"] == demo.CONFIG
    assert meta["checkpoints"] == COMPLETE
    assert len(meta["losses"]) == demo.CONFIG["steps"] == 300
    assert all(np.isfinite(meta["losses"]))
    # The model really learns: the last 50 steps average well below the first 10.
    assert np.mean(meta["losses"][-50:]) < 0.6 * np.mean(meta["losses"][:10])


def test_run_is_small(run_dir: Path) -> None:
    total = sum(p.stat().st_size for p in run_dir.rglob("*") if p.is_file())
    assert 10_000 < total < 20_000_000


@pytest.mark.parametrize("name", COMPLETE)
def test_each_checkpoint_loads_as_a_training_checkpoint(run_dir: Path, name: str) -> None:
    meta = _run_json(run_dir)
    config = meta["config"]
    model_t, optimizer_t, rng_t = _targets(config)
    restored = load_training_checkpoint(
        run_dir / name,
        model_t,
        optimizer_t,
        rng_t,
        {"loss": 0.0, "learning_rate": 0.0},
        iter(demo.make_dataset(config)),
    )
    step = int(name.removeprefix("step_"))
    assert restored.step == step
    assert restored.auxiliary == {
        "loss": meta["losses"][step - 1],
        "learning_rate": config["learning_rate"],
    }
    # nnx.state(optimizer): the optimizer's step and optax's AdamW state.
    assert int(restored.optimizer["step"].get_value()) == step
    assert int(restored.optimizer["opt_state"][0]["count"].get_value()) == step
    assert jax.dtypes.issubdtype(restored.rng.dtype, jax.dtypes.prng_key)
    assert restored.iterator.get_state() == {"next_index": step}
    kernel = restored.model["dense1"]["kernel"].get_value()
    assert kernel.shape == (config["features"], config["hidden"])
    # BatchNorm's running statistics moved away from their initial values.
    assert float(np.abs(np.asarray(restored.model["norm"]["mean"].get_value())).max()) > 0


def test_resuming_from_the_last_checkpoint_reproduces_the_recorded_losses(
    run_dir: Path, tmp_path: Path
) -> None:
    meta = _run_json(run_dir)
    config = meta["config"]
    last = meta["checkpoints"][-1]
    restored = load_training_checkpoint(
        run_dir / last,
        *_targets(config),
        {"loss": 0.0, "learning_rate": 0.0},
        iter(demo.make_dataset(config)),
    )
    resumed = list(demo.train(tmp_path, config, start=restored))
    assert [step for step, _ in resumed] == list(range(restored.step + 1, config["steps"] + 1))
    assert [loss for _, loss in resumed] == meta["losses"][restored.step :]
    # Resumed without being killed, the final save commits.
    assert (tmp_path / demo.checkpoint_name(config["steps"]) / "commit_success.txt").is_file()


def test_a_second_invocation_reuses_the_run(run_dir: Path) -> None:
    before = {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")}
    # -X importtime lists every module the interpreter imports, on stderr.
    done = subprocess.run(
        [sys.executable, "-X", "importtime", str(SCRIPT), str(run_dir)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "reusing" in done.stdout
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:")
    }
    assert "json" in imported  # what -X importtime printed was read
    # No training, and none of its machinery loaded.
    assert not {m for m in imported if m.split(".")[0] in ("jax", "flax", "optax", "orbax")}
    assert {p: p.stat().st_mtime_ns for p in run_dir.rglob("*")} == before


def test_refuses_a_directory_that_is_not_a_demo_run(tmp_path: Path) -> None:
    foreign = tmp_path / "demo_run"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    done = _make(foreign)
    assert done.returncode != 0
    assert "not a finished demo run" in done.stderr
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]


def test_make_demo_writes_the_run_and_starts_jupyterlab_on_the_notebooks() -> None:
    done = subprocess.run(
        ["make", "-n", "demo", "DEMO_RUN=some_run", "PORT=8899"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    )
    lines = done.stdout.splitlines()
    make_run = next(i for i, line in enumerate(lines) if "demo/make_run.py some_run" in line)
    lab = next(i for i, line in enumerate(lines) if "jupyter lab" in line)
    assert make_run < lab
    assert "http://127.0.0.1:8899/lab" in done.stdout
    assert "--ServerApp.root_dir=notebooks" in done.stdout


def test_the_demo_run_stays_out_of_git() -> None:
    ignored = subprocess.run(
        ["git", "check-ignore", "-q", "demo_run/run.json"], cwd=REPO, check=False
    )
    assert ignored.returncode == 0
    tracked = subprocess.run(
        ["git", "ls-files", "demo_run"], cwd=REPO, capture_output=True, text=True, check=True
    )
    assert tracked.stdout == ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_make_demos_jupyterlab_shows_no_news_toast(tmp_path: Path) -> None:
    """The server `make demo` starts, with its settings: news is off, so no toast asks
    whether to fetch it (seen in Chromium: the toast shows without these settings and not
    with them), and no update check goes out."""
    port = _free_port()
    planned = subprocess.run(
        ["make", "-n", "demo", f"PORT={port}"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.replace("\\\n", " ")
    lab = next(line for line in planned.splitlines() if "jupyter lab " in line)
    env = dict(os.environ)
    for sub in ("config", "data", "runtime"):
        (tmp_path / sub).mkdir()
    env.update(
        JUPYTER_CONFIG_DIR=str(tmp_path / "config"),
        JUPYTER_DATA_DIR=str(tmp_path / "data"),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTER_PLATFORM_DIRS="1",
    )
    server = subprocess.Popen(
        # The very command line (it asks the shell whether it runs as root).
        ["bash", "-c", f"exec {lab} --LabApp.user_settings_dir={tmp_path / 'settings'}"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{base}/lab", timeout=5) as response:
                    page = response.read().decode()
                break
            except (urllib.error.URLError, ConnectionError):
                assert server.poll() is None, "JupyterLab exited"
                assert time.monotonic() < deadline, "JupyterLab did not start"
                time.sleep(0.5)
        data = re.search(r'id="jupyter-config-data"[^>]*>(.*?)</script>', page, re.S)
        assert data is not None
        config = json.loads(data.group(1))
        assert config["news"] == {"disabled": True}
        with urllib.request.urlopen(f"{base}/lab/api/update", timeout=10) as response:
            assert json.loads(response.read())["notification"] is None
        with urllib.request.urlopen(f"{base}/lab/api/news", timeout=10) as response:
            assert json.loads(response.read())["news"] == []
        # The toast is asked when the setting says "ask" ("none"): its default is "false".
        notification = f"{base}/lab/api/settings/@jupyterlab/apputils-extension:notification"
        with urllib.request.urlopen(notification, timeout=10) as response:
            properties = json.loads(response.read())["schema"]["properties"]
        assert properties["fetchNews"]["default"] == "false"
        assert properties["checkForUpdates"]["default"] is False
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)
