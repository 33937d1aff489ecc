"""The ``tinax`` command as scripts use it: exit statuses that survive a closed pipe,
Ctrl-C, ``--version``, usage errors, one exit-status table, quick ``--help``, a
folder of runs, a typed PRNG key shown as a key.

What only a process shows (its exit status, its streams, a signal) runs
``python -m tinax.explore`` in a real subprocess; the rest calls ``main`` here.
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import jax
import numpy as np
import pytest

from tinax._cli.args import EXIT_STATUSES
from tinax._cli.main import COMMANDS, main
from tinax.checkpointing import TrainingRun, save_checkpointables


def _process(
    *args: str | Path, stdout: int | None = subprocess.PIPE, code: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m tinax.explore ARGS`` (or ``code``, a script) as a script runs it."""
    command = [sys.executable, "-c", code] if code else [sys.executable, "-m", "tinax.explore"]
    return subprocess.run(
        [*command, *map(str, args)],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        timeout=120,
        env={k: v for k, v in os.environ.items() if k != "COLUMNS"},
    )


def _here(*args: str | Path) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    status = main([str(a) for a in args], out, err)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Two checkpoints of many leaves (output longer than a pipe holds) that differ."""
    root = tmp_path_factory.mktemp("pair")
    leaves = {f"layer_{i}": {"w": np.full((2,), i, np.float32)} for i in range(400)}
    save_checkpointables(root / "a", {"model": leaves}).result()
    changed = {**leaves, "layer_7": {"w": np.zeros((2,), np.float32)}}
    save_checkpointables(root / "b", {"model": changed}).result()
    return root / "a", root / "b"


def _closed_pipe_run(*args: str | Path) -> subprocess.CompletedProcess[str]:
    """The command writing into a pipe whose reader has gone already (``| head`` that
    has read its line): every write fails with EPIPE."""
    read, write = os.pipe()
    os.close(read)
    try:
        return _process(*args, stdout=write)
    finally:
        os.close(write)


def test_the_exit_status_is_kept_when_the_reader_stops_early(pair, tmp_path):
    a, b = pair
    differ = _closed_pipe_run("diff", a, b)
    assert differ.returncode == 1, differ.stderr  # diff's own status: they differ
    assert differ.stderr == ""  # no traceback, no "Exception ignored"
    same = _closed_pipe_run("diff", a, a)
    assert same.returncode == 0 and same.stderr == ""
    # The same through a shell, as people type it.
    shell = subprocess.run(
        [
            "bash",
            "-c",
            f'set -o pipefail; "{sys.executable}" -m tinax.explore diff "{a}" "{b}" | head -1',
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert shell.returncode == 1 and shell.stdout.startswith("from ")
    assert shell.stderr == ""
    # verify of a run: sound, whoever stops reading.
    run = tmp_path / "run"
    it = iter(__import__("grain").MapDataset.range(8).to_iter_dataset())
    with TrainingRun(run, save_every=1) as training:
        for step in (1, 2):
            next(it)
            training.save(step, {"w": np.ones(3)}, {}, jax.random.key(0), {}, it)
    sound = _closed_pipe_run("verify", run)
    assert sound.returncode == 0 and sound.stderr == ""


def test_ctrl_c_exits_130_with_one_line():
    # SIGINT arrives while the command works (the diff is made to wait for it). The
    # command starts as a terminal starts it, SIGINT at its default and not blocked: a
    # child inherits both from the test process, and a suite run as a background job
    # of a non-interactive shell has SIGINT ignored (bash starts such jobs so), where
    # the child slept its 30 s through the signal and exited 0.
    code = textwrap.dedent(
        """
        import os, signal, sys, time
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        from tinax._cli import commands, main

        def waits(args, out):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(30)

        commands.diff = waits
        sys.argv = ["tinax", "diff", "a", "b"]
        main.console()
        """
    )
    result = _process(code=code)
    assert result.returncode == 130
    assert result.stderr == "tinax: interrupted\n"
    assert signal.SIGINT == 2  # the status is 128 + SIGINT, as shells report it


def test_version_usage_errors_and_one_exit_table(tmp_path):
    from tinax import __version__

    status, out, _ = _here("--version")
    assert status == 0 and out == f"tinax {__version__}\n"
    # A command without its path is a usage error: status 2 and the usage.
    for command, *rest in (
        ("verify",),
        ("diff", "a"),
        ("export", "a"),
        ("run",),
        ("ls",),
        ("set-aside",),
    ):
        status, out, err = _here(command, *rest)
        assert status == 2 and err.startswith(f"usage: tinax {command}"), (command, err)
        assert "error: the following arguments are required" in err
    # A path that does not exist: the same status for every command, one line.
    missing = tmp_path / "absent"
    for args in (
        ("ls", missing),
        ("show", missing),
        (missing,),
        ("diff", missing, missing),
        ("verify", missing),
        ("export", missing, tmp_path / "out"),
        ("run", missing),
    ):
        status, _, err = _here(*args)
        assert status == 2 and err.count("\n") == 1 and "does not exist" in err, args
    # Every command's --help ends with the one table of exit statuses.
    for command in (None, *COMMANDS):
        status, out, _ = _here(*([command] if command else []), "--help")
        assert status == 0 and out.rstrip().endswith(EXIT_STATUSES.rstrip()), command
    assert "130" in EXIT_STATUSES and "diverged" in EXIT_STATUSES


def test_help_and_usage_errors_import_no_table_machinery():
    code = textwrap.dedent(
        """
        import io, sys
        from tinax._cli.main import main
        for args in (["--help"], ["verify", "--help"], ["verify"], ["run", "--help"]):
            main(args, io.StringIO(), io.StringIO())
        heavy = [m for m in ("pandas", "numpy", "tensorstore", "ml_dtypes") if m in sys.modules]
        print(",".join(heavy))
        """
    )
    result = _process(code=code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_the_safetensors_format_and_the_key_display_do_not_load_ml_dtypes():
    # ml_dtypes takes about a second to import; the widgets reach these modules.
    code = (
        "import sys, tinax._format.safetensors, tinax.explore.display; "
        "print('ml_dtypes' in sys.modules)"
    )
    assert _process(code=code).stdout.strip() == "False"


def test_ls_of_a_folder_of_runs_lists_the_runs(tmp_path):
    it = iter(__import__("grain").MapDataset.range(8).to_iter_dataset())
    (tmp_path / "runs").mkdir()
    for name, steps in (("exp1", (1, 2)), ("exp2", (5,))):
        with TrainingRun(tmp_path / "runs" / name, save_every=1) as run:
            for step in steps:
                run.save(step, {"w": np.ones(3)}, {}, jax.random.key(0), {}, it)
    (tmp_path / "runs" / "notes.txt").write_text("not a run")
    (tmp_path / "runs" / "empty").mkdir()
    status, out, _ = _here("ls", tmp_path / "runs")
    assert status == 0 and "(no rows)" not in out
    lines = out.splitlines()
    assert lines[0].endswith(": 2 runs")
    rows = {line.split()[0]: line.split() for line in lines[2:]}
    assert rows["exp1"][1] == "2" and rows["exp2"][1] == "1"
    import json

    status, out, _ = _here("ls", tmp_path / "runs", "--json")
    runs = {r["name"]: r for r in json.loads(out)}
    assert runs["exp1"]["newest_step"] == 2 and runs["exp2"]["checkpoints"] == 1
    (tmp_path / "nothing").mkdir()
    status, out, err = _here("ls", tmp_path / "nothing")
    assert status == 0 and out == "" and "no checkpoint and no run" in err


def test_a_typed_prng_key_is_shown_as_a_key(tmp_path):
    save_checkpointables(
        tmp_path / "c",
        {"rng": jax.random.key(3), "data": {"k": jax.random.key_data(jax.random.key(3))}},
    ).result()
    status, out, _ = _here("show", tmp_path / "c")
    assert status == 0
    typed = out.split("rng: ", 1)[1].splitlines()[2].split()
    assert typed[:4] == ["(root)", "PRNG", "key", "()"] and typed[4].startswith("key<")
    assert "(2,)" not in out.split("rng: ", 1)[1].split("\n\n", 1)[0]
    # Raw key data stays what it is: a uint32 array.
    raw = out.split("data: ", 1)[1].splitlines()[2].split()
    assert "(2,)" in raw and "uint32" in raw


def test_repeated_options_repeat_or_are_refused(tmp_path):
    import tinax.explore as ex

    source = tmp_path / "src"
    state = {
        "model": {"a": {"w": np.ones(3, np.float32)}, "b": {"w": np.zeros(2, np.float32)}},
        "optimizer": {"mu": np.ones(3, np.float32)},
        "rng": {"key": np.arange(2, dtype=np.uint32)},
    }
    save_checkpointables(source, state).result()
    # An option that takes several values gathers them from every time it is given.
    status, _, err = _here(
        "derive", source, tmp_path / "d1", "--rename", "^a=x", "--rename", "^b=y",
        "--only", "model", "--only", "optimizer",
    )  # fmt: skip
    assert status == 0, err
    made = ex.checkpoint_table(tmp_path / "d1")
    assert set(made["checkpointable"]) == {"model", "optimizer"}
    keys = set(made.loc[made["checkpointable"] == "model", "key"])
    assert keys == {"['x']['w']", "['y']['w']"}
    # One that takes one value is refused when given twice: nothing is written.
    for args in (
        ("derive", source, tmp_path / "d2", "--keys", "a", "--keys", "b"),
        ("derive", source, tmp_path / "d2", "--cast", "bfloat16", "--cast", "float16"),
        ("run", tmp_path, "--top", "3", "--top", "4"),
        ("show", source, "--leaf", "model.a.w", "--leaf", "model.b.w"),
    ):
        status, _, err = _here(*args)
        assert status == 2 and err.startswith(f"usage: tinax {args[0]}"), args
        assert "given more than once" in err, args
    assert not (tmp_path / "d2").exists()


def _interrupted_at(run: Path, imports: int, then: float) -> tuple[int, list[str]]:
    """``tinax ls RUN`` interrupted (SIGINT, as Ctrl-C sends it) once it has finished
    ``imports`` imports after the command's entry (``python -X importtime`` says each
    import as it ends), ``then`` seconds later: its status and what it said on stderr
    besides the import times."""
    command = [sys.executable, "-X", "importtime", "-m", "tinax.explore", "ls", str(run)]
    # SIGINT at its default, as a terminal starts a command (see the test above): set
    # by a launcher that then becomes the command (exec keeps it).
    launch = (
        "import os, signal, sys; signal.signal(signal.SIGINT, signal.SIG_DFL); "
        "signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT}); "
        "os.execv(sys.argv[1], sys.argv[1:])"
    )
    child = subprocess.Popen(
        [sys.executable, "-c", launch, *command],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stderr is not None
    said: list[str] = []
    counting, seen = False, 0
    for line in child.stderr:
        if not line.startswith("import time:"):
            said.append(line.rstrip("\n"))
            continue
        counting = counting or line.rstrip().endswith("tinax._cli.entry")
        seen += counting
        if counting and seen > imports:
            break
    time.sleep(then)
    child.send_signal(signal.SIGINT)
    rest = child.stderr.read()
    said += [line for line in rest.splitlines() if not line.startswith("import time:")]
    return child.wait(timeout=120), said


def test_ctrl_c_at_any_moment_is_one_line_and_status_130(tmp_path):
    it = iter(__import__("grain").MapDataset.range(8).to_iter_dataset())
    with TrainingRun(tmp_path / "run", save_every=1) as run:
        for step in (1, 2):
            run.save(step, {"w": np.ones(3)}, {}, jax.random.key(0), {}, it)
    # The moment swept over the command's imports (about a hundred after its entry, as
    # `tinax ls` imports only what listing needs), then its work.
    moments = [(n, 0.0) for n in (0, 1, 5, 20, 40, 60, 80)] + [(10**6, 0.0)]
    interrupted = 0
    for imports, then in moments:
        status, said = _interrupted_at(tmp_path / "run", imports, then)
        if status == 0 and said == []:
            continue  # it had ended before the signal came: nothing to say
        assert status == 130, (imports, status, said)
        assert said == ["python -m tinax.explore: interrupted"], (imports, said)
        interrupted += 1
    assert interrupted >= 5, interrupted


def test_ls_of_a_run_imports_no_table_machinery(tmp_path):
    # pandas, tensorstore (with ml_dtypes) and NumPy are most of the time a fresh
    # process takes: listing a run needs none of them.
    it = iter(__import__("grain").MapDataset.range(8).to_iter_dataset())
    with TrainingRun(tmp_path / "run", save_every=1, keep=1, best_by="loss") as run:
        for step in (1, 2):
            run.save(step, {"w": np.ones(3)}, {}, jax.random.key(0), {"loss": 0.5}, it)
    code = textwrap.dedent(
        f"""
        import io, sys
        from tinax._cli.main import main
        out = io.StringIO()
        assert main(["ls", {str(tmp_path / "run")!r}], out, io.StringIO()) == 0
        assert "step_000002" in out.getvalue() and "newest 1" in out.getvalue()
        heavy = ("pandas", "numpy", "tensorstore", "ml_dtypes", "jax")
        print(",".join(m for m in heavy if m in sys.modules))
        """
    )
    result = _process(code=code)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""
