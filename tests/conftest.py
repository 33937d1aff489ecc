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


# Each of those processes also compiled the same small XLA programs again (JAX compiles
# every operation it runs, eager ones too): about half of a short training script's
# CPU. They share one persistent compilation cache instead, every program cached
# however quick its compile. Its size bound turns on JAX's file lock around each
# read and write of an entry, so that no process reads an entry another is writing
# (the processes of one JAX job compile the same programs at the same moment).
if not os.environ.get("JAX_COMPILATION_CACHE_DIR"):
    os.environ.update(
        JAX_COMPILATION_CACHE_DIR=os.path.join(
            tempfile.gettempdir(), f"tinax-tests-jax-cache-{os.getuid()}"
        ),
        JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
        JAX_COMPILATION_CACHE_MAX_SIZE=str(4 << 30),
    )


import fcntl  # noqa: E402
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


@pytest.fixture
def durable(root: str) -> str:
    """A two-tier run's durable directory: a gs:// prefix, or a directory beside the
    local tier."""
    return root if root.startswith("gs://") else f"{root}/durable"


REPO = Path(__file__).resolve().parents[1]


def _shared_temp(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory every worker of this session sees (pytest-xdist gives each its own
    base temporary directory, side by side in one parent)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


# The demo runs every worker may read, each written once per session by its demo script
# in a process of its own. Both start as the session's first test starts (if a test of
# the session reads them), beside the first test files, instead of when a test first
# asks: the test that asked first sat idle for the whole build, and the other worker
# too once it asked. A run's builder holds a lock until it has written the script's
# exit status; a test that asks waits for that lock.
_BUILDER = """
import os, subprocess, sys
script, run, out, err, status, timeout = sys.argv[1:]
try:
    done = subprocess.run(
        [sys.executable, script, run], capture_output=True, text=True, timeout=float(timeout)
    )
    code, stdout, stderr = str(done.returncode), done.stdout, done.stderr
except subprocess.TimeoutExpired as e:
    code, stdout, stderr = f"timed out after {timeout} s", "", str(e.stderr or "")
with open(out, "w") as f:
    f.write(stdout)
with open(err, "w") as f:
    f.write(stderr)
with open(status + ".tmp", "w") as f:
    f.write(code)
os.replace(status + ".tmp", status)
"""

_BUILDERS: list[subprocess.Popen[bytes]] = []


class _DemoBuild:
    """One demo script's run in the session's shared directory, built in the background."""

    def __init__(self, shared: Path, name: str, script: str, run: str, timeout: float) -> None:
        self.script = REPO / "demo" / script
        self.run = shared / name / run
        self.output = shared / f"{name}-{self.script.stem}-output.txt"
        self.errors = shared / f"{name}-{self.script.stem}-stderr.txt"
        self.status = shared / f"{name}.status"
        self.started = shared / f"{name}.started"
        self.lock = shared / f"{name}.lock"
        self.building = shared / f"{name}.building"
        self.timeout = timeout

    def start(self) -> None:
        """Starts the build unless a worker of this session already has."""
        with open(self.lock, "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            if self.started.exists():
                return
            self.run.parent.mkdir(exist_ok=True)
            building = os.open(self.building, os.O_RDWR | os.O_CREAT)
            try:
                # Taken before the builder starts, which keeps it (the descriptor is
                # passed on) until it exits: no test can slip in before it.
                fcntl.flock(building, fcntl.LOCK_EX)
                builder = subprocess.Popen(
                    [
                        sys.executable,
                        "-c",
                        _BUILDER,
                        *map(str, (self.script, self.run, self.output, self.errors)),
                        *map(str, (self.status, self.timeout)),
                    ],
                    pass_fds=(building,),
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            finally:
                os.close(building)
            _BUILDERS.append(builder)  # this worker's, not waited for: others may read
            self.started.touch()

    def wait(self) -> Path:
        """The finished run (started now if it was not yet)."""
        self.start()
        with open(self.building) as building:
            fcntl.flock(building, fcntl.LOCK_EX)  # held by the builder until it ends
        status = self.status.read_text() if self.status.exists() else None
        errors = self.errors.read_text()[-4000:] if self.errors.exists() else ""
        assert status == "0", f"{self.script.name} ended with status {status}:\n{errors}"
        return self.run


def _demo_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, _DemoBuild]:
    shared = _shared_temp(tmp_path_factory)
    return {
        "demo_run": _DemoBuild(shared, "demo", "make_run.py", "demo_run", 300),
        "big_run": _DemoBuild(shared, "big", "make_big_run.py", "demo_big_run", 600),
    }


@pytest.fixture(scope="session", autouse=True)
def _demo_runs_start_with_the_session(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> None:
    asked: set[str] = set()
    for item in request.session.items:
        asked.update(getattr(item, "fixturenames", ()))
    if "demo_run_output" in asked:
        asked.add("demo_run")
    for name, build in _demo_builds(tmp_path_factory).items():
        if name in asked:
            build.start()


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo run ``demo/make_run.py`` writes, made once per session for every worker.

    Tests read it; a test that changes a checkpoint copies it first. The script's
    standard output is in ``demo_run_output``.
    """
    return _demo_builds(tmp_path_factory)["demo_run"].wait()


@pytest.fixture(scope="session")
def demo_run_output(demo_run: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    """What ``demo/make_run.py`` printed while it made ``demo_run``."""
    return _demo_builds(tmp_path_factory)["demo_run"].output.read_text()


@pytest.fixture(scope="session")
def big_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The many-leaf run ``demo/make_big_run.py`` writes (a layer jump and a NaN planted
    at the steps it names), made once per session for every worker; tests read it."""
    return _demo_builds(tmp_path_factory)["big_run"].wait()


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
        "test_cli_scripting.py",
        "test_demo.py",
        "test_divergence.py",
        "test_explore_cli.py",
        "test_explore_memory.py",
        "test_explore_storages.py",
        "test_multiprocess.py",
        "test_mutants.py",
        "test_notebooks.py",
        "test_pod.py",
        "test_process_waits.py",
        "test_readme.py",
        "test_real_states.py",
        "test_two_tier_run.py",
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
        "test_a_training_script_preempted_between_save_and_check_loses_nothing",
        # Runs resumed past corrupt checkpoints, and saves refused, at a run's pace.
        "test_a_run_that_skipped_a_corrupt_checkpoint_sets_it_aside_and_goes_on",
        "test_a_step_the_run_has_is_refused_before_anything_is_written",
        # Real flax NNX and optax states.
        "test_an_nnx_module_or_optimizer_is_refused_at_save_naming_nnx_state",
        "test_an_nnx_module_as_target_is_a_type_error_without_orbax_traceback",
        "test_an_eval_shape_target_restores_without_orbax_warnings",
    }
)
# ``syscall_counts``: a run written and every read of it traced with strace.
SLOW_FIXTURES = frozenset({"gcs", "demo_run", "demo_run_output", "big_run", "syscall_counts"})


def _uses_gcs(item: pytest.Item) -> bool:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    return any(isinstance(value, str) and value == "gs" for value in params)


# The files that take longest on two workers (``--durations`` of a fresh-clone run),
# longest first. They are handed out first, so that the short files fill the gaps
# instead of one long file running alone at the end.
LONGEST_FILES = (
    "test_multiprocess.py",
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
