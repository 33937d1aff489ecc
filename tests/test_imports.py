"""Import boundaries between the layers."""

import subprocess
import sys

import pytest


def _modules_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return set(out.stdout.split())


def test_import_tinax_is_inert():
    loaded = _modules_after("import tinax")
    assert not {"jax", "numpy", "pandas", "ipywidgets", "orbax", "grain"} & loaded


def test_checkpointing_imports_no_pandas_widgets_or_legacy():
    loaded = _modules_after("import tinax.checkpointing")
    assert "jax" in loaded and "orbax.checkpoint" in loaded
    assert "pandas" not in loaded
    assert "ipywidgets" not in loaded
    assert "tinax.checkpointing.legacy.v0" not in loaded


def test_public_names_match_the_contract():
    import tinax.checkpointing as tc
    import tinax.checkpointing.legacy.v0 as v0

    for name in (
        "save_checkpointables",
        "load_checkpointables",
        "abstract_restore_target",
        "TrainingCheckpoint",
        "TrainingCheckpointNames",
        "save_training_checkpoint",
        "load_training_checkpoint",
        "validate_checkpointable_name",
    ):
        assert name in tc.__all__ and callable(getattr(tc, name))
    for name in (
        "save_legacy_v0_pytree",
        "load_legacy_v0_pytree",
        "save_legacy_v0_grain_iterator",
        "load_legacy_v0_grain_iterator",
    ):
        assert name in v0.__all__


def test_signatures_follow_the_seed():
    import inspect

    import tinax.checkpointing as tc

    def params(fn):
        return [
            (p.name, p.kind.name, p.default is inspect.Parameter.empty)
            for p in inspect.signature(fn).parameters.values()
        ]

    assert params(tc.save_checkpointables) == [
        ("path", "POSITIONAL_OR_KEYWORD", True),
        ("checkpointables", "POSITIONAL_OR_KEYWORD", True),
    ]
    assert [p[0] for p in params(tc.save_training_checkpoint)] == [
        "path",
        "step",
        "model",
        "optimizer",
        "rng",
        "auxiliary",
        "iterator",
        "names",
    ]
    assert params(tc.save_training_checkpoint)[-1] == ("names", "KEYWORD_ONLY", False)
    assert [p[0] for p in params(tc.load_training_checkpoint)] == [
        "path",
        "model_target",
        "optimizer_target",
        "rng_target",
        "auxiliary_target",
        "iterator",
        "names",
    ]
    assert params(tc.load_training_checkpoint)[-1] == ("names", "KEYWORD_ONLY", False)
    assert [f for f in tc.TrainingCheckpoint.__dataclass_fields__] == [
        "step",
        "model",
        "optimizer",
        "rng",
        "auxiliary",
        "iterator",
    ]
    assert tc.TrainingCheckpoint.__dataclass_params__.frozen
    assert tc.TrainingCheckpointNames.__dataclass_params__.frozen


def test_google_cloud_storage_is_imported_only_for_a_gs_path(tmp_path):
    listed = f"tinax.explore.list_checkpoints({str(tmp_path)!r})"
    loaded = _modules_after(f"import tinax.explore; {listed}")
    assert not {"gcsfs", "tinax._format.storage.gcs", "jax"} & loaded
    # A gs:// path that names no bucket is refused before anything connects.
    refused = "try:\n tinax.explore.list_checkpoints('gs://')\nexcept ValueError: pass"
    code = f"import sys, tinax.explore\n{refused}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = set(out.stdout.split())
    assert "tinax._format.storage.gcs" in loaded and "gcsfs" not in loaded and "jax" not in loaded


def _small_run(root) -> None:
    import numpy as np

    from tinax.checkpointing import save_checkpointables

    for step in (1, 2):
        state = {
            "model": {
                f"layer_{i}": {"w": np.full((8, 8), step + i, np.float32)} for i in range(12)
            },
            "step": np.asarray(step, np.int32),
        }
        save_checkpointables(root / f"step_{step}", state).result()


_EXPLORER_SCRIPT = """
import sys
from tinax.widgets import CheckpointExplorer

explorer = CheckpointExplorer(sys.argv[1])
explorer.open_checkpoint("step_2")
{then}
"""


def test_widgets_and_an_open_checkpoint_import_no_jax_orbax_grain_or_flax(tmp_path):
    _small_run(tmp_path)
    then = (
        "explorer.open_leaf('model', \"['layer_3']['w']\")\n"
        "explorer.wait()\n"
        "assert explorer.statistics is not None and explorer.statistics.mean == 5.0\n"
        "print('\\n'.join(sorted(sys.modules)))"
    )
    script = tmp_path / "open.py"
    script.write_text(_EXPLORER_SCRIPT.format(then=then))
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path)], check=True, capture_output=True, text=True
    )
    loaded = set(out.stdout.split())
    assert "tinax.widgets" in loaded and "tinax.explore" in loaded
    heavy = {"jax", "orbax", "orbax.checkpoint", "grain", "flax", "optax", "tinax.checkpointing"}
    assert not heavy & loaded, heavy & loaded
    # Plots are drawn by matplotlib, which is imported for the first plot only.
    assert "matplotlib" in loaded
    assert "matplotlib" not in _modules_after("import tinax.widgets")


def test_naming_the_builder_imports_what_it_needs():
    loaded = _modules_after("import tinax.widgets")
    assert not {"jax", "orbax", "grain", "flax", "tinax.checkpointing"} & loaded
    loaded = _modules_after("from tinax.widgets import RestoreTargetBuilder, SavePanel")
    assert {"tinax.widgets._restore", "tinax.widgets._save"} <= loaded
    import tinax.widgets

    assert {"RestoreTargetBuilder", "SavePanel"} <= set(dir(tinax.widgets))
    try:
        tinax.widgets.NoSuchWidget  # noqa: B018
    except AttributeError as e:
        assert "NoSuchWidget" in str(e)
    else:
        raise AssertionError("a misspelt widget name must raise AttributeError")


@pytest.mark.slow  # ten fresh interpreters
def test_a_script_that_opens_a_checkpoint_in_the_explorer_always_exits_cleanly(tmp_path):
    # Its background threads (the verdict's reads) are still running when the script
    # ends: the exit must wait for them, or the process aborts in tensorstore.
    _small_run(tmp_path)
    script = tmp_path / "open_and_exit.py"
    script.write_text(_EXPLORER_SCRIPT.format(then="explorer.data_check.start()"))
    runs = [
        subprocess.Popen(
            [sys.executable, str(script), str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(10)
    ]
    ends = [(p.wait(timeout=300), p.communicate()[1]) for p in runs]
    failed = [(code, err[-300:]) for code, err in ends if code != 0 or "terminate" in err]
    assert not failed, f"{len(failed)} of 10 exits failed: {failed[:2]}"
