"""Shared test set-up: JAX on the CPU, quiet Orbax logging, and the session fixtures
(the fake-gcs-server, the demo run) every test file may use."""

import logging
import os
import sys
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
logging.getLogger("absl").setLevel(logging.ERROR)

# The suite starts Python hundreds of times (the command line, training scripts, JAX
# jobs, kernels, JupyterLab, the demo scripts), each importing JAX, flax or pandas.
# Where PYTHONDONTWRITEBYTECODE is set, each of those compiled every module from source
# again: half of a JAX import's time. Compiled modules go instead to a cache outside the
# checkout and the virtualenv (PYTHONPYCACHEPREFIX), which this process, the test
# workers and every interpreter they start share; Python checks each against its
# source, so a stale one is compiled again.
if sys.dont_write_bytecode and not os.environ.get("PYTHONPYCACHEPREFIX"):
    _PYCACHE = os.path.join(tempfile.gettempdir(), f"tinax-tests-pycache-{os.getuid()}")
    os.environ["PYTHONPYCACHEPREFIX"] = _PYCACHE
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.pycache_prefix = _PYCACHE
    sys.dont_write_bytecode = False


import fcntl  # noqa: E402
import shutil  # noqa: E402
import subprocess  # noqa: E402
import uuid  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402

# The bucket every gs:// test writes to, in the session's emulator.
BUCKET = "tinax-test"


@pytest.fixture(scope="session")
def gcs():
    """A fake-gcs-server for the session, its environment applied to this process.

    Subprocesses, kernels and Jupyter servers a test starts need
    ``gcs.environment()`` too (``os.environ`` carries it to those started plainly).
    """
    from gcs import Emulator

    emulator = Emulator()
    emulator.start()
    saved = {key: os.environ.get(key) for key in emulator.environment()}
    os.environ.update(emulator.environment())
    emulator.create_bucket(BUCKET)
    yield emulator
    emulator.stop()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


@pytest.fixture(params=["local", "gs"])
def root(request, tmp_path) -> str:
    """A fresh directory to write checkpoints in: a local one, then a gs:// prefix."""
    if request.param == "local":
        return str(tmp_path)
    request.getfixturevalue("gcs")
    return f"gs://{BUCKET}/{uuid.uuid4().hex[:12]}"


REPO = Path(__file__).resolve().parents[1]


def _shared_temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this session sees (pytest-xdist gives each its own
    base temporary directory, side by side in one parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo run ``demo/make_run.py`` writes, made once per session for every worker.

    Tests read it; a test that changes a checkpoint copies it first. The script's
    standard output is in ``demo_run_output``.
    """
    shared = _shared_temp(tmp_path_factory)
    run = shared / "demo" / "demo_run"
    output = shared / "demo-make_run-output.txt"
    with open(shared / "demo.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker makes it, the others wait
        if not output.is_file():
            if run.parent.exists():
                shutil.rmtree(run.parent)  # an earlier attempt failed halfway
            run.parent.mkdir()
            done = subprocess.run(
                [sys.executable, str(REPO / "demo" / "make_run.py"), str(run)],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-4000:]
            output.write_text(done.stdout)
    return run


@pytest.fixture(scope="session")
def demo_run_output(demo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """What ``demo/make_run.py`` printed while it made ``demo_run``."""
    return (_shared_temp(tmp_path_factory) / "demo-make_run-output.txt").read_text()


@pytest.fixture(scope="session")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The many-leaf run ``demo/make_big_run.py`` writes (a layer jump and a NaN planted
    at the steps it names), made once per session for every worker; tests read it."""
    shared = _shared_temp(tmp_path_factory)
    run = shared / "big" / "demo_big_run"
    with open(shared / "big.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the first worker makes it, the others wait
        if not run.is_dir():
            if run.parent.exists():
                shutil.rmtree(run.parent)  # an earlier attempt failed halfway
            run.parent.mkdir()
            done = subprocess.run(
                [sys.executable, str(REPO / "demo" / "make_big_run.py"), str(run)],
                capture_output=True,
                text=True,
                timeout=600,
                check=False,
            )
            assert done.returncode == 0, done.stderr[-4000:]
    return run


# What `make check` leaves to `make test` (markers registered in pyproject.toml):
# ``browser``, every test of tests/test_browser*.py (Chromium driving JupyterLab);
# ``slow``, tests that start an outside world or take tens of seconds: the files and
# tests below (Jupyter kernels, several JAX processes, a fresh virtualenv, the CLI in
# fresh interpreters, kill campaigns, real flax/optax states, runs at scale), and every
# test using the fake GCS server or the demo run.
SLOW_FILES = frozenset(
    {
        "test_binder.py",
        "test_campaigns.py",
        "test_claims.py",
        "test_demo.py",
        "test_explore_cli.py",
        "test_explore_memory.py",
        "test_explore_storages.py",
        "test_multiprocess.py",
        "test_mutants.py",
        "test_notebooks.py",
        "test_readme.py",
        "test_real_states.py",
        "test_widgets_explorer_scale.py",
    }
)
SLOW_TESTS = frozenset(
    {
        # Training scripts started, killed and resumed in fresh interpreters.
        "test_a_fresh_process_resumes_bit_exactly_and_the_iterator_continues",
        "test_two_processes_save_retain_and_stop_at_the_same_step_after_a_sigterm",
        "test_a_kill_during_removal_never_lists_a_half_removed_checkpoint_as_complete",
        "test_sigterm_mid_loop_saves_at_that_step_and_chains_the_previous_handler",
        "test_a_script_ending_with_a_save_in_flight_commits_it_and_exits_cleanly",
        "test_a_full_disk_is_enospc_naming_the_destination_with_one_log_line",
        "test_exact_resume",
        "test_google_cloud_storage_is_imported_only_for_a_gs_path",
        "test_filters_and_pages_at_ten_thousand_leaves",
        "test_the_cli_exit_status",
        "test_the_wheel_installs_tinax_widgets_and_no_top_level_widgets",
        # A preempted training script that goes on after its save, in a fresh interpreter.
        "test_a_loop_that_does_not_break_ends_as_sigterm_would_after_the_save",
        "test_a_loop_that_does_not_break_with_a_handler_chained_exits_143",
        "test_on_preemption_continue_goes_on_saving_by_the_interval",
        "test_the_readme_example_runs_twice_in_a_row_and_resumes",
        # Runs resumed past corrupt checkpoints, and saves refused, at a run's pace.
        "test_a_run_that_skipped_a_corrupt_checkpoint_sets_it_aside_and_goes_on",
        "test_a_step_the_run_has_is_refused_before_anything_is_written",
        # Real flax NNX and optax states.
        "test_an_nnx_module_or_optimizer_is_refused_at_save_naming_nnx_state",
        "test_an_nnx_module_as_target_is_a_type_error_without_orbax_traceback",
        "test_an_eval_shape_target_restores_without_orbax_warnings",
    }
)
SLOW_FIXTURES = frozenset({"gcs", "demo_run", "demo_run_output", "big_run"})


def _uses_gcs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(value, str) and value == "gs" for value in params)


# The files that take longest on two workers (``--durations`` of a fresh-clone run),
# longest first. They are handed out first, so that the short files fill the gaps
# instead of one long file running alone at the end.
LONGEST_FILES = (
    "test_multiprocess.py",
    "test_binder.py",
    "test_browser.py",
    "test_campaigns.py",
    "test_notebooks.py",
    "test_training_run.py",
    "test_gcs.py",
    "test_explore_cli.py",
    "test_readme.py",
    "test_mutants.py",
)


def _start_order(item: pytest.Item) -> int:
    name = item.path.name
    return LONGEST_FILES.index(name) if name in LONGEST_FILES else len(LONGEST_FILES)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    items.sort(key=_start_order)  # stable: each file keeps its own order
    for item in items:
        name = item.path.name
        if name.startswith("test_browser"):
            item.add_marker(pytest.mark.browser)
        function = getattr(item, "originalname", item.name)
        fixtures = set(getattr(item, "fixturenames", ()))
        if (
            name in SLOW_FILES
            or function in SLOW_TESTS
            or fixtures & SLOW_FIXTURES
            or _uses_gcs(item)
        ):
            item.add_marker(pytest.mark.slow)
