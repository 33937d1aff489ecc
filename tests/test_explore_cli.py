"""``python -m tinax.explore``, run as a terminal or a script would run it."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

import jax.numpy as jnp
import numpy as np
import pandas as pd
import pytest
from explore_fixtures import iterator, save_v1, save_v1_run


def explore_script(
    *args: str | Path, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The command line as a script runs it: output to a pipe, ``COLUMNS`` as given
    (unset: 80, the width of a terminal that says nothing)."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if columns is not None:
        env["COLUMNS"] = str(columns)
    return subprocess.run(
        [sys.executable, "-m", "tinax.explore", *map(str, args)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )


def explore(*args: str | Path, columns: int | None = None) -> subprocess.CompletedProcess[str]:
    """``main`` run here, its output written to text buffers as to a pipe: the views'
    tests. Each new interpreter costs seconds of imports, so a few tests
    (``explore_script``) run the command as a script does, for what only a process
    shows: its exit status, its streams, and argparse's own exits."""
    from tinax._cli.main import main

    with mock.patch.dict(os.environ):  # restored as it was on the way out
        for name in ("COLUMNS", "LINES"):
            os.environ.pop(name, None)
        if columns is not None:
            os.environ["COLUMNS"] = str(columns)
        out, err = io.StringIO(), io.StringIO()
        status = main([str(a) for a in args], out, err)
    return subprocess.CompletedProcess(list(args), status, out.getvalue(), err.getvalue())


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    root = save_v1_run(tmp_path_factory.mktemp("cli") / "run", steps=(0, 5))
    (root / "9").mkdir()  # Looks like a step, holds nothing: invalid.
    return root


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    values = np.array([[1.0, 2.0], [np.nan, 4.0]], np.float32)
    state = {
        "model": {"dense": {"w": jnp.asarray(values)}, "step": 3, "name": "tiny"},
        "iterator": iterator(2),
    }
    return save_v1(tmp_path_factory.mktemp("cli") / "ckpt", state)


def test_a_run_directory_prints_its_checkpoints(run):
    result = explore(run)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # The steps read as the names do: a column that repeats another gives way.
    assert lines[0].split() == ["name", "status", "size", "committed", "checkpointables"]
    assert lines[1].split()[:2] == ["0", "complete"]
    assert lines[1].split()[3] == "KiB" and " ago " in lines[1]
    assert lines[3].split() == ["9", "invalid"]
    assert f"invalid: {run / '9'}:" in result.stderr
    wide = explore(run, columns=200).stdout.splitlines()
    assert wide[0].split() == ["name", "status", "size", "committed", "checkpointables", "path"]
    assert str(run / "0") in wide[1] and "iterator, pytree" in wide[1]
    listed = explore("ls", run).stdout.splitlines()
    assert [line.split()[:2] for line in listed] == [line.split()[:2] for line in lines]


def test_a_run_directory_as_json(run):
    result = explore(run, "--json")
    assert result.returncode == 0, result.stderr
    records = json.loads(result.stdout)
    assert [r["step"] for r in records] == [0, 5, 9]
    assert records[0]["checkpointables"] == ["iterator", "pytree"]
    assert records[0]["status"] == "complete" and records[0]["error"] is None
    assert records[0]["committed"].endswith("+00:00")
    assert records[2]["status"] == "invalid" and records[2]["error"]
    assert records[2]["committed"] is None
    # Age in seconds since the commit; unknown for what cannot be read.
    assert 0 <= records[0]["age"] < 600 and records[2]["age"] is None


def test_a_checkpoint_prints_its_leaves(checkpoint):
    result = explore(checkpoint)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "model: 3 leaves, 24 B"
    assert lines[1].split()[:4] == ["key", "kind", "shape", "dtype"]
    # Keys read dotted; the chunks repeat the shapes and give way.
    w = next(line for line in lines if line.startswith("dense.w "))
    assert w.split()[1:6] == ["jax.Array", "(2,", "2)", "float32", "16"]
    assert "chunks" not in lines[1]
    assert any(line.split()[:2] == ["name", "string"] and "tiny" in line for line in lines)
    assert any(line.startswith("iterator: 1 leaf") for line in lines)
    assert any("(root)" in line and "next_index" in line for line in lines)
    assert explore("show", checkpoint).stdout == result.stdout


def test_a_checkpoint_as_json(checkpoint):
    result = explore(checkpoint, "--json")
    assert result.returncode == 0, result.stderr
    records = {(r["checkpointable"], r["key"]): r for r in json.loads(result.stdout)}
    w = records[("model", "['dense']['w']")]
    assert (w["shape"], w["dtype"], w["nbytes"], w["value"]) == ([2, 2], "float32", 16, None)
    assert records[("model", "['step']")]["value"] == 3
    assert records[("iterator", "")]["value"]["next_index"] == 2


def test_one_leaf_summary(checkpoint):
    result = explore(checkpoint, "--leaf", "model", "['dense']['w']")
    assert result.returncode == 0, result.stderr
    fields = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert (fields["key"], fields["keystr"]) == ("dense.w", "['dense']['w']")
    assert fields["shape"] == "(2, 2)"
    assert fields["dtype"] == "float32" and fields["elements"] == "4"
    assert (fields["min"], fields["max"], fields["nan_count"]) == ("1", "4", "1")
    assert fields["mean"] == "2.333"


def test_one_leaf_as_json(checkpoint):
    result = explore(checkpoint, "--leaf", "model", "['dense']['w']", "--json")
    summary = json.loads(result.stdout)
    assert summary["shape"] == [2, 2] and summary["inf_count"] == 0
    assert "value" not in summary
    result = explore(checkpoint, "--leaf", "model", "['name']", "--json")
    assert json.loads(result.stdout)["value"] == "tiny"
    result = explore(checkpoint, "--leaf", "iterator", "")
    assert "next_index" in result.stdout
    # The key as the table shows it names the same leaf.
    assert explore(checkpoint, "--leaf", "iterator", "(root)").stdout == result.stdout
    shown = json.loads(explore(checkpoint, "--leaf", "model", "dense.w", "--json").stdout)
    assert shown == summary and shown["key"] == "['dense']['w']" and shown["name"] == "dense.w"
    assert json.loads(explore(checkpoint, "--leaf", "model.dense.w", "--json").stdout) == summary


def test_errors_go_to_stderr_with_status_2(tmp_path, checkpoint):
    result = explore_script(tmp_path / "absent")
    assert result.returncode == 2
    assert "does not exist" in result.stderr and not result.stdout
    result = explore(checkpoint, "--leaf", "model", "['nope']")
    assert result.returncode == 2
    assert "no leaf" in result.stderr and "name" in result.stderr
    (checkpoint.parent / "broken").mkdir()
    (checkpoint.parent / "broken" / "_CHECKPOINT_METADATA").write_text("{")
    result = explore(checkpoint.parent / "broken")
    assert result.returncode == 2 and "not valid JSON" in result.stderr
    assert explore_script().returncode == 2


# -- every view at a terminal's width -------------------------------------------------------

# What a person should never have to read: pandas' and numpy's raw spellings.
RAW = {
    "a missing time": re.compile(r"\bNaT\b"),
    "a missing value": re.compile(r"<NA>|\bNone\b"),
    "a raw timestamp": re.compile(r"\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d"),
    "a raw duration": re.compile(r"\bdays\b"),
    "a float at full precision": re.compile(r"[1-9]\d*\.\d{5,}|0\.0*[1-9]\d{6,}"),
    "a byte count without a unit": re.compile(r"(?<![\w.(\[-])\d{5,}(?![\w.,)\]-])"),
}


def assert_fits(result: subprocess.CompletedProcess[str], columns: int) -> None:
    assert result.returncode in (0, 1), result.stderr
    assert result.stdout.strip()
    quoting = False  # Grain's own words for a pipeline (num_epochs=None) are quoted as is
    for line in result.stdout.splitlines():
        assert len(line) <= columns, f"{len(line)} > {columns}: {line!r}"
        quoting = "saved from the pipeline" in line or (quoting and bool(line.strip()))
        if quoting:
            continue
        for what, pattern in RAW.items():
            assert not pattern.search(line), f"{what} in {line!r}"


@pytest.fixture(scope="module")
def linen_optax(tmp_path_factory) -> Path:
    """A Linen model with long keys and its optax state, saved by tinax."""
    import flax.linen as linen
    import jax
    import optax

    from tinax.checkpointing import save_checkpointables

    class Block(linen.Module):
        @linen.compact
        def __call__(self, x):
            x = linen.Dense(8, name="attention_query_projection_with_a_long_name")(x)
            return linen.LayerNorm(name="post_attention_layer_norm")(x)

    class Model(linen.Module):
        @linen.compact
        def __call__(self, x):
            for i in range(3):
                x = Block(name=f"transformer_encoder_block_{i}")(x)
            return x

    params = Model().init(jax.random.key(0), jnp.ones((1, 4)))["params"]
    opt = optax.adamw(1e-3).init(params)
    path = tmp_path_factory.mktemp("linen") / "step_7"
    save_checkpointables(path, {"params": params, "opt_state": opt}).result()
    return path


@pytest.mark.parametrize("columns", [80, 132])
def test_every_view_fits_the_terminal_in_human_units(demo_run, linen_optax, tmp_path, columns):
    a, b = demo_run / "step_000200", demo_run / "step_000250"
    views = [
        (demo_run,),
        (b,),
        (b, "--leaf", "model", "['dense1']['kernel']['value']"),
        (b, "--leaf", "auxiliary", "['state']['loss']"),
        ("diff", a, b),
        ("diff", a, b, "--changed", "--stored-order"),
        ("verify", b, "--data"),
        ("verify", demo_run / "step_000300.orbax-checkpoint-tmp"),
        (linen_optax.parent,),
        (linen_optax,),
        ("diff", linen_optax, b),
        ("export", b, tmp_path / f"out{columns}", "--max-file-size", "20KiB"),
        ("ls", demo_run),
        ("verify", demo_run),
        ("run", demo_run, "--scan"),
    ]
    for view in views:
        assert_fits(explore(*view, columns=columns), columns)
    # Long keys are shortened by leaving out middle parts, never into look-alikes.
    shown = explore(linen_optax, columns=columns).stdout
    blocks = key_columns(shown)
    assert [len(b) for b in blocks] == [len(set(b)) for b in blocks] and len(blocks) == 2
    full = "transformer_encoder_block_0.attention_query_projection_with_a_long_name.kernel"
    if columns == 80:
        assert full not in shown and any("…" in key for key in blocks[0])
    else:
        assert full in blocks[0]


def key_columns(text: str, header: str = "key") -> list[list[str]]:
    """The first cell of each row of each table in ``text`` whose heading starts
    with ``header`` (a table ends at a blank line or a line that is not a row)."""
    blocks: list[list[str]] = []
    rows: list[str] | None = None
    for line in text.splitlines():
        if line.split()[:1] == [header]:
            rows = []
            blocks.append(rows)
        elif rows is not None and line and not line.startswith("every row:"):
            if line.startswith(" "):
                continue  # a wrapped cell
            rows.append(line.split()[0])
        else:
            rows = None
    return blocks


def test_without_columns_a_pipe_gets_80(demo_run):
    result = explore_script(demo_run / "step_000250")
    assert_fits(result, 80)
    assert max(len(line) for line in result.stdout.splitlines()) > 60
    wide = explore_script(demo_run / "step_000250", columns=200)
    assert_fits(wide, 200)
    assert max(map(len, wide.stdout.splitlines())) >= max(map(len, result.stdout.splitlines()))


def _table_cells(table: pd.DataFrame) -> list[dict[str, object]]:
    from tinax._cli.output import _records

    return _records(table)


def test_json_round_trips_the_tables(demo_run, linen_optax):
    import tinax.explore as ex

    for path in (demo_run / "step_000250", linen_optax):
        table = ex.checkpoint_table(path)
        records = json.loads(explore(path, "--json").stdout)
        assert records == _table_cells(table)
        assert list(pd.DataFrame(records).columns) == list(table.columns)
    listing = ex.list_checkpoints(demo_run)
    records = json.loads(explore(demo_run, "--json").stdout)
    assert [r["name"] for r in records] == list(listing["name"])
    assert [r["nbytes"] for r in records] == list(listing["nbytes"])


def test_csv_parses_with_the_tables_columns(demo_run):
    import tinax.explore as ex

    path = demo_run / "step_000250"
    table = ex.checkpoint_table(path)
    parsed = pd.read_csv(io.StringIO(explore(path, "--csv").stdout), keep_default_na=False)
    assert list(parsed.columns) == list(table.columns)
    assert list(parsed["key"]) == list(table["key"])
    assert [str(n) for n in parsed["nbytes"]] == [
        "" if pd.isna(n) else str(n) for n in table["nbytes"]
    ]
    assert [json.loads(s) if s else None for s in parsed["shape"]] == [
        list(t) if isinstance(t, tuple) else None for t in table["shape"]
    ]
    listing = pd.read_csv(io.StringIO(explore(demo_run, "--csv").stdout))
    # A TrainingRun's listing says why each checkpoint is kept, and its metric.
    columns = [*ex.list_checkpoints(demo_run).columns, "metric", "kept", "error"]
    assert list(listing.columns) == columns
    diff = pd.read_csv(io.StringIO(explore("diff", path, path, "--csv").stdout))
    assert set(diff["status"]) == {"same"} and len(diff) == len(table)
    findings = explore("verify", demo_run / "step_000300.orbax-checkpoint-tmp", "--csv")
    parsed = pd.read_csv(io.StringIO(findings.stdout))
    assert findings.returncode == 1
    assert list(parsed.columns) == [
        "path",
        "step",
        "ok",
        "status",
        "integrity",
        "health",
        "verdict",
        "severity",
        "part",
        "message",
    ]
    assert "error" in set(parsed["severity"]) and not parsed["ok"].any()
    # A sound checkpoint's CSV says so: one row with its verdict and no finding.
    sound = pd.read_csv(io.StringIO(explore("verify", path, "--csv").stdout))
    assert len(sound) == 1 and sound["ok"][0] and sound["verdict"][0].startswith("sound")
    assert sound["severity"].isna().all()


def test_export_writes_safetensors_quietly_into_a_pipe(demo_run, tmp_path):
    from safetensors.numpy import load_file

    out = tmp_path / "weights"
    result = explore_script(
        "export",
        demo_run / "step_000250",
        out,
        "--keys",
        "dense1",
        "norm",
        "--max-file-size",
        "5KB",
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == ""
    files = sorted(p.name for p in out.iterdir())
    assert "model.safetensors.index.json" in files and len(files) > 2
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert sorted(index["weight_map"]) == [
        "dense1.bias",
        "dense1.kernel",
        "norm.bias",
        "norm.mean",
        "norm.scale",
        "norm.var",
    ]
    assert load_file(out / index["weight_map"]["dense1.kernel"])["dense1.kernel"].shape == (16, 256)
    assert all(name in result.stdout for name in files)
    bad = explore_script(
        "export", demo_run / "step_000250", tmp_path / "x", "--max-file-size", "lots"
    )
    assert bad.returncode == 2 and "is not a size" in bad.stderr
    taken = explore_script("export", demo_run / "step_000250", out)
    assert taken.returncode == 2 and "not empty" in taken.stderr
    assert not (tmp_path / "x").exists()


def test_human_units_and_middle_cuts():
    from tinax._cli import terminal as term

    assert [term.human_bytes(n) for n in (0, 1023, 89531, 3 << 30, None)] == [
        "0 B",
        "1023 B",
        "87.4 KiB",
        "3.0 GiB",
        "",
    ]
    now = pd.Timestamp("2026-12-03 12:00:00", tz="UTC")
    ages = [now - pd.Timedelta(seconds=s) for s in (5, 190, 7300, 3 * 86400)]
    assert [term.human_age(t, now) for t in ages] == [
        "5 s ago",
        "3 min ago",
        "2 h ago",
        "2026-11-30 12:00",
    ]
    assert term.human_age(pd.NaT, now) == "" and term.number(pd.NA) == ""
    assert term.number(-0.6278967261314392) == "-0.6279" and term.number(np.int64(89531)) == "89531"
    cut = term.shorten_middle("['opt_state']['0']['mu']['dense1']['kernel']['value']", 30)
    assert len(cut) == 30 and cut.startswith("['opt_state']") and cut.endswith("['value']")


def test_help_fits_80_columns():
    for args in (("--help",), ("export", "--help"), ("diff", "--help", "x")):
        result = explore_script(*args, columns=80)
        assert result.returncode == 0 and "usage:" in result.stdout
        assert max(len(line) for line in result.stdout.splitlines()) <= 80, args
