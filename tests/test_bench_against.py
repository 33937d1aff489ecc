"""bench/against.py's reading of the benchmarks' output and its verdict on each figure."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench" / "against.py"


@pytest.fixture(scope="module")
def against() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_against", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    return module


def test_save_load_output_gives_each_sides_median_and_the_goal_ratios(
    against: ModuleType,
) -> None:
    out = "\n".join(
        [
            "(a) 16 arrays: 128 MiB of float32",
            "side    op      best MiB/s  median MiB/s  range MiB/s       size MiB",
            "tinax   save           487           414      340-487          128.0",
            "orbax   load           402           324      122-402     ",
            "(b) 1000 arrays: 128 MiB of float32",
            "tinax   load           104           100       95-104     ",
            "save_training_checkpoint with (a) as the model: returns after 131 ms "
            "(range 105-156); committed after 737 ms (median of 2)",
            "  (b) tinax/orbax load           1.31  (>= 0.95)  ok",
        ]
    )
    assert against._save_load(out) == {
        "(a) tinax save MiB/s": (414.0, True),
        "(a) orbax load MiB/s": (324.0, True),
        "(b) tinax load MiB/s": (100.0, True),
        "save_training_checkpoint returns, ms": (131.0, False),
        "save_training_checkpoint committed, ms": (737.0, False),
        "(b) tinax/orbax load": (1.31, True),
    }


def test_a_figure_is_worse_only_past_the_noise_and_with_every_round_apart(
    against: ModuleType, capsys: pytest.CaptureFixture[str]
) -> None:
    base = [{"slow s": (1.0, False), "rate": (100.0, True), "noisy s": (1.0, False)}] * 2
    head = [
        {"slow s": (1.5, False), "rate": (80.0, True), "noisy s": (0.6, False)},
        {"slow s": (1.6, False), "rate": (81.0, True), "noisy s": (1.8, False)},
    ]
    assert against.report("b", base, head) == ["b: slow s", "b: rate"]
    assert "noisy s" in capsys.readouterr().out
    # Better is never called worse; one round gives no noise to judge by.
    assert against.report("b", head, base) == []
    assert against.report("b", base[:1], head[:1]) == []
