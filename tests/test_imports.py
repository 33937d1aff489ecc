"""Import boundaries between the layers."""

import subprocess
import sys


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
    assert not {"gcsfs", "tinax._format.gcs", "jax"} & loaded
    # A gs:// path that names no bucket is refused before anything connects.
    refused = "try:\n tinax.explore.list_checkpoints('gs://')\nexcept ValueError: pass"
    code = f"import sys, tinax.explore\n{refused}\nprint('\\n'.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    loaded = set(out.stdout.split())
    assert "tinax._format.gcs" in loaded and "gcsfs" not in loaded and "jax" not in loaded
