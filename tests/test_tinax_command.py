"""The ``tinax`` command on a real-shape run: a flax NNX model of 24 blocks with optax's
AdamW (about 1,200 leaves), written by ``TrainingRun`` with a planted layer jump and NaN
(``demo/make_big_run.py``, the session's ``big_run``)."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
from run_view_fixtures import big_run_script
from safetensors.numpy import load_file

import tinax.explore as ex

DEMO = big_run_script()
TINAX = Path(sys.executable).parent / "tinax"


def tinax(*args: str | Path, columns: int = 80) -> subprocess.CompletedProcess[str]:
    """``main`` run in this process, as ``tinax ARGS`` at a terminal ``columns`` wide.

    Like a command in a fresh process, it knows nothing of what this process read
    before: the health that other tests' reads of the session's runs found is
    forgotten first (else a verdict read from data, longer, replaces the metadata's).
    """
    from tinax._cli.main import main
    from tinax._format.integrity import health

    health.forget()

    saved = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = str(columns)
    try:
        out, err = io.StringIO(), io.StringIO()
        status = main([str(a) for a in args], out, err)
    finally:
        if saved is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = saved
    return subprocess.CompletedProcess(list(args), status, out.getvalue(), err.getvalue())


def tables(text: str, header: str) -> list[list[str]]:
    """The first cell of each row of each table in ``text`` whose heading starts with
    ``header``; a table ends at a blank line or at a line that is not a row."""
    found: list[list[str]] = []
    rows: list[str] | None = None
    for line in text.splitlines():
        if line.split()[:1] == [header]:
            rows = []
            found.append(rows)
        elif rows is not None and line and not line.startswith(("every row:", "… ", " ")):
            rows.append(line.split()[0])
        else:
            rows = None
    return found


def without_last_line(text: str) -> str:
    """``text`` without its last line (the counts under a diff)."""
    return text.rstrip("\n").rsplit("\n", 1)[0]


def fits(result: subprocess.CompletedProcess[str], columns: int) -> None:
    assert result.stdout.strip(), result.stderr
    for line in result.stdout.splitlines():
        assert len(line) <= columns, f"{len(line)} > {columns}: {line!r}"


@pytest.fixture(scope="module")
def newest(big_run: Path) -> Path:
    return big_run / f"step_{DEMO.CHECKPOINT_STEPS[-1]:06d}"


def step(big_run: Path, number: int) -> Path:
    return big_run / f"step_{number:06d}"


def test_the_console_command_is_python_m_tinax_explore(big_run):
    assert TINAX.is_file(), "the editable install has no tinax command: run make install"
    env = {**os.environ, "COLUMNS": "80"}
    command = subprocess.run(
        [TINAX, "ls", big_run], capture_output=True, text=True, timeout=120, env=env
    )
    module = subprocess.run(
        [sys.executable, "-m", "tinax.explore", "ls", big_run],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert command.returncode == module.returncode == 0, command.stderr + module.stderr
    assert tables(command.stdout, "name") == tables(module.stdout, "name")
    helped = subprocess.run([TINAX, "--help"], capture_output=True, text=True, timeout=120)
    assert helped.stdout.startswith("usage: tinax ")
    said = " ".join(helped.stdout.split())
    for word in ("ls", "show", "diff", "verify", "export", "run"):
        assert f"tinax {word}" in said


@pytest.mark.parametrize("columns", [80, 120])
def test_every_key_shown_is_told_apart_and_in_natural_order(big_run, newest, columns):
    shown = tinax("show", newest, columns=columns)
    assert shown.returncode == 0, shown.stderr
    fits(shown, columns)
    table = ex.checkpoint_table(newest)
    blocks = tables(shown.stdout, "key")
    counts = table.groupby("checkpointable", sort=False).size()
    # One table per checkpointable; as many distinct key texts as rows in each.
    assert [len(b) for b in blocks] == list(counts)
    assert [len(set(b)) for b in blocks] == [len(b) for b in blocks]
    model = blocks[0]
    assert "blocks.2.q.kernel" in model and "blocks.10.q.kernel" in model
    assert model.index("blocks.2.q.kernel") < model.index("blocks.10.q.kernel")
    assert not any(key.endswith(".value") or "['" in key for b in blocks for key in b)
    # A column with one value in every row gives its room and is said once.
    assert "every row: kind: jax.Array" in shown.stdout
    assert all("jax.Array" not in line for line in shown.stdout.splitlines()[:5])

    a, b = step(big_run, DEMO.JUMP_STEP - DEMO.CHECKPOINT_EVERY), step(big_run, DEMO.JUMP_STEP)
    diff = tinax("diff", a, b, columns=columns)
    assert diff.returncode == 1, diff.stderr  # they differ
    fits(diff, columns)
    (keys,) = tables(without_last_line(diff.stdout), "key")
    assert len(keys) == len(set(keys)) == len(ex.diff_table(a, b))
    # Model and optimizer rows alike keep mu/nu and their block indices.
    assert any(".mu." in k and ".7." in k for k in keys)
    assert any(".nu." in k and ".7." in k for k in keys)
    ordered = tinax("diff", a, b, "--key-order", columns=columns)
    (by_key,) = tables(without_last_line(ordered.stdout), "key")
    assert sorted(by_key) == sorted(keys)
    block_rows = [k for k in by_key if k.startswith("model.blocks.") and k.endswith(".q.kernel")]
    assert block_rows[:3] == [f"model.blocks.{i}.q.kernel" for i in range(3)]


def test_diff_exits_as_diff_does(big_run, newest, tmp_path):
    assert tinax("diff", newest, newest).returncode == 0
    assert tinax("diff", step(big_run, 10), newest, "--json").returncode == 1
    missing = tinax("diff", newest, tmp_path / "absent")
    assert missing.returncode == 2 and "does not exist" in missing.stderr
    assert tinax("diff", newest).returncode == 2  # a usage error


def test_a_leaf_is_named_as_the_table_shows_it(newest):
    model = "['blocks']['7']['q']['kernel']['value']"
    ways = [
        ("model", model),
        ("model", "blocks.7.q.kernel"),
        ("model", "blocks.7.q.kernel.value"),
        ("model", "['blocks'][7]['q']['kernel']"),
        ("model.blocks.7.q.kernel",),
        ("blocks.7.q.kernel",),  # names the model's leaf in full
    ]
    for way in ways:
        result = tinax("show", newest, "--leaf", *way, "--json")
        assert result.returncode == 0, (way, result.stderr)
        record = json.loads(result.stdout)
        assert (record["checkpointable"], record["key"]) == ("model", model), way
    # The optimizer's rows leave out what all of them share; that label works too.
    shown = tinax("show", newest, columns=200).stdout
    label = next(k for k in tables(shown, "key")[1] if k.endswith("mu.blocks.7.q.kernel"))
    record = json.loads(tinax("show", newest, "--leaf", "optimizer", label, "--json").stdout)
    assert record["key"].endswith("['mu']['blocks']['7']['q']['kernel']['value']")
    # Middle parts left out, as a narrow table shows them.
    narrow = tables(tinax("show", newest, columns=40).stdout, "key")[1]
    label = next(k for k in narrow if "…" in k and k.endswith("mu.blocks.7.q.kernel"))
    elided = tinax("show", newest, "--leaf", "optimizer", label, "--json")
    assert json.loads(elided.stdout)["key"] == record["key"]


def test_a_miss_suggests_the_nearest_keys(newest):
    result = tinax("show", newest, "--leaf", "model", "blocks.7.q.kernl")
    assert result.returncode == 2
    message = result.stderr
    assert "no leaf 'blocks.7.q.kernl'" in message
    nearest = message.split("the nearest: ", 1)[1].strip().split(", ")
    assert nearest[0] == "blocks.7.q.kernel"
    assert "blocks.0.attn_norm.bias" not in nearest  # not the first keys alphabetically
    several = tinax("show", newest, "--leaf", "q.kernel")
    assert several.returncode == 2 and "names 72 leaves" in several.stderr
    subtree = tinax("show", newest, "--leaf", "model", "blocks.7.q")
    assert "is a subtree" in subtree.stderr and "blocks.7.q.kernel" in subtree.stderr
    wrong = tinax("show", newest, "--leaf", "optimiser", "step")
    assert "no checkpointable 'optimiser'" in wrong.stderr and "optimizer" in wrong.stderr


def test_a_prng_key_is_shown_as_a_key(newest):
    result = tinax("show", newest, "--leaf", "rng", "(root)")
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert fields["kind"] == "PRNG key" and fields["keys"] == "1"
    assert not {"min", "max", "mean", "std"} & set(fields)
    words = fields["key data"].split()
    assert len(words) == 2 and all(len(w) == 8 for w in words)
    record = json.loads(tinax("show", newest, "--leaf", "rng", "", "--json").stdout)
    assert record["kind"] == "PRNG key" and "mean" not in record
    assert [f"{w:08x}" for w in record["key_data"][0]] == words
    assert record["key_data_complete"] is True
    table = tinax("show", newest).stdout.split("\nrng: ", 1)[1].split("\n\n", 1)[0]
    assert table.splitlines()[2].split()[:3] == ["(root)", "PRNG", "key"]


def test_verify_checks_every_checkpoint_of_a_run(big_run, tmp_path):
    # Its loss is NaN from FIRST_NONFINITE_STEP on, in each checkpoint's metadata: those
    # are diverged without a byte of data read, never "sound", and the exit status is 1.
    result = tinax("verify", big_run)
    assert result.returncode == 1, result.stdout + result.stderr
    fits(result, 80)
    (names,) = tables(without_last_line(result.stdout), "name")
    assert names == [f"step_{s:06d}" for s in DEMO.CHECKPOINT_STEPS]
    bad = [s for s in DEMO.CHECKPOINT_STEPS if s >= DEMO.FIRST_NONFINITE_STEP]
    good = len(names) - len(bad)
    summary = " ".join(result.stdout.split("\n\n")[-1].split())
    assert summary == (
        f"{good} of {len(names)} checkpoints sound, {len(bad)} diverged (metadata checked; "
        f"the health of {good} not yet known: --data reads their data)"
    )
    rows = pd.read_csv(io.StringIO(tinax("verify", big_run, "--csv").stdout))
    assert sorted(set(rows["step"])) == list(DEMO.CHECKPOINT_STEPS)
    by_step = rows.drop_duplicates("step").set_index("step")
    assert (by_step["integrity"] == "sound").all()
    for step, row in by_step.iterrows():
        if step in bad:
            assert not row["ok"] and row["health"] == "diverged", step
            assert row["verdict"].startswith("diverged: its logged loss is NaN")
        else:
            assert row["ok"] and row["health"] == "not yet known", step
            assert row["verdict"].startswith("sound")
    record = json.loads(tinax("verify", big_run, "--json").stdout)
    assert not record["ok"] and len(record["checkpoints"]) == len(names)
    # With data read, the NaN checkpoints warn; --strict fails for them.
    strict = tinax("verify", big_run, "--data", "--strict")
    assert strict.returncode == 1 and "NaN" in strict.stdout
    empty = tmp_path / "empty"
    empty.mkdir()
    nothing = tinax("verify", empty)
    assert nothing.returncode == 2 and nothing.stderr.count("\n") == 1
    assert "holds no checkpoint" in nothing.stderr


def test_the_listing_says_the_metric_and_why_each_is_kept(big_run):
    result = tinax("ls", big_run)
    assert result.returncode == 0, result.stderr
    fits(result, 80)
    lines = result.stdout.splitlines()
    assert {"loss", "kept"} <= set(lines[0].split())
    best = next(line for line in lines if "best loss" in line)
    assert best.startswith(f"step_{DEMO.JUMP_STEP:06d}")  # the lowest loss before the jump
    records = json.loads(tinax("ls", big_run, "--json").stdout)
    assert all(r["kept"].startswith("newest") for r in records)
    assert isinstance(records[0]["metric"], float)


def test_export_names_files_after_the_checkpointable_and_keeps_the_umask(newest, tmp_path):
    old = os.umask(0o027)
    try:
        result = tinax("export", newest, tmp_path / "opt", "--checkpointable", "optimizer")
        split = tinax(
            "export",
            newest,
            tmp_path / "split",
            "--checkpointable",
            "optimizer",
            "--max-file-size",
            "200KiB",
            "--json",
        )
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    assert sorted(p.name for p in (tmp_path / "opt").iterdir()) == ["optimizer.safetensors"]
    assert (tmp_path / "opt").stat().st_mode & 0o777 == 0o750
    tensors = load_file(tmp_path / "opt" / "optimizer.safetensors")
    assert "opt_state.0.mu.blocks.7.q.kernel" in tensors
    record = json.loads(split.stdout)
    names = [f["file"] for f in record["files"]]
    assert names[-1] == "optimizer.safetensors.index.json" and len(names) > 2
    assert all(n.startswith("optimizer-") for n in names[:-1])
    assert sum(f["nbytes"] for f in record["files"]) > 0
    assert (tmp_path / "split").stat().st_mode & 0o777 == 0o750


def test_the_run_at_a_glance(big_run):
    result = tinax("run", big_run)
    assert result.returncode == 0, result.stderr
    fits(result, 80)
    (names,) = tables(result.stdout, "name")
    assert names == [f"step_{s:06d}" for s in DEMO.CHECKPOINT_STEPS]
    assert {"loss", "kept"} <= set(result.stdout.splitlines()[0].split())
    drift = tinax("run", big_run, "--drift", "--scan")
    assert drift.returncode == 0, drift.stderr
    fits(drift, 80)
    previous = DEMO.JUMP_STEP - DEMO.CHECKPOINT_EVERY
    assert (
        f"drift: {DEMO.JUMP_LAYER} moved most, by 2 of its norm, "
        f"from step {previous} to {DEMO.JUMP_STEP}" in drift.stdout
    )
    assert (
        f"NaN/Inf from step {DEMO.FIRST_NONFINITE_STEP} on; "
        f"roll back to step {DEMO.ROLLBACK_STEP}" in drift.stdout
    )
    record = json.loads(tinax("run", big_run, "--scan", "--json").stdout)
    assert record["rollback_step"] == DEMO.ROLLBACK_STEP
    assert len(record["checkpoints"]) == len(record["scan"]) == len(names)
    rows = pd.read_csv(io.StringIO(tinax("run", big_run, "--drift", "--csv").stdout))
    assert list(rows.columns) == list(ex.drift_table(big_run).columns)
    both = tinax("run", big_run, "--drift", "--scan", "--csv")
    assert both.returncode == 2 and "one table" in both.stderr
    # --top cuts both drift tables and counts what it left out.
    table = ex.drift_table(big_run)
    nonfinite = (table["nan"].fillna(0) > 0) | (table["inf"].fillna(0) > 0)
    pairs = table[nonfinite].groupby(["previous_step", "step"]).ngroups
    top = tinax("run", big_run, "--drift", "--top", "1", columns=200).stdout
    assert f"… {int((~nonfinite).sum()) - 1} more (--top 0 shows all, --csv prints all)" in top
    assert pairs >= 2 and f"… {pairs - 1} more pairs (--top 0 shows all)" in top
    assert "more" not in tinax("run", big_run, "--drift", "--top", "0", columns=200).stdout


def test_every_command_speaks_json(big_run, newest, tmp_path):
    for args in (
        ("ls", big_run),
        ("show", newest),
        ("show", newest, "--leaf", "model.head.kernel"),
        ("diff", newest, newest),
        ("verify", newest),
        ("verify", big_run),
        ("export", newest, tmp_path / "weights"),
        ("run", big_run),
    ):
        result = tinax(*args, "--json")
        # The newest checkpoint diverged (its loss is NaN): verify says so with 1.
        assert result.returncode == (1 if args[0] == "verify" else 0), (args, result.stderr)
        assert json.loads(result.stdout), args
