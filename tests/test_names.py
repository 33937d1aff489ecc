"""validate_checkpointable_name and name distinctness."""

import pytest

from tinax.checkpointing import TrainingCheckpointNames, validate_checkpointable_name

GOOD = ["model", "opt_state", "rng-0", "Ünïcode", "a.b", "x" * 255, "é" * 127, "metrics2", "NULL"]


@pytest.mark.parametrize("name", GOOD)
def test_valid_names_are_returned_unchanged(name):
    assert validate_checkpointable_name(name) is name


@pytest.mark.parametrize("name", [None, 1, 1.5, b"model", True, ["model"]])
def test_non_strings_are_type_errors(name):
    with pytest.raises(TypeError, match="must be strings"):
        validate_checkpointable_name(name)


BAD = {
    "": "empty",
    ".": "dot",
    "..": "dot",
    "a/b": "reserved character",
    "a\\b": "reserved character",
    "a:b": "reserved character",
    "a*b": "reserved character",
    "a?b": "reserved character",
    'a"b': "reserved character",
    "a<b": "reserved character",
    "a>b": "reserved character",
    "a|b": "reserved character",
    "a\x00b": "control character",
    "a\nb": "control character",
    "a\x7fb": "control character",
    "tab\t": "control character",
    "trailing ": "ends with a space or a dot",
    "trailing.": "ends with a space or a dot",
    "x" * 256: "256 UTF-8 bytes",
    "é" * 128: "256 UTF-8 bytes",
    "CON": "device",
    "con": "device",
    "Nul.txt": "device",
    "COM1": "device",
    "com9.tar.gz": "device",
    "LPT3": "device",
    "aux": "device",
    "prn.json": "device",
    "_CHECKPOINT_METADATA": "reserved",
    "_checkpoint_metadata": "reserved",
    "orbax.checkpoint": "reserved",
    "commit_success.txt": "reserved",
    "metrics": "reserved",
    "METRICS": "reserved",
    "_METADATA": "reserved",
}


@pytest.mark.parametrize(("name", "reason"), list(BAD.items()))
def test_invalid_names_are_value_errors_that_say_why(name, reason):
    with pytest.raises(ValueError, match=reason):
        validate_checkpointable_name(name)


def test_com0_and_lpt0_are_not_device_names():
    assert validate_checkpointable_name("COM0") == "COM0"
    assert validate_checkpointable_name("console") == "console"


def test_orbax_root_entries_are_reserved(tmp_path):
    """Every entry Orbax writes at a checkpoint's root is refused as a name."""
    import numpy as np

    from tinax.checkpointing import save_checkpointables

    save_checkpointables(tmp_path / "c", {"x": {"a": np.ones(2)}}).result()
    for entry in (tmp_path / "c").iterdir():
        if entry.name == "x":
            continue
        with pytest.raises(ValueError, match="reserved"):
            validate_checkpointable_name(entry.name)


def test_names_clash_after_nfc_and_case_folding():
    with pytest.raises(ValueError, match="must be portable and distinct"):
        TrainingCheckpointNames(model="Model", optimizer="model")
    # "é" precomposed vs "e" + combining acute accent.
    with pytest.raises(ValueError, match="must be portable and distinct"):
        TrainingCheckpointNames(model="caf\u00e9", optimizer="cafe\u0301")
    with pytest.raises(ValueError, match="must be portable and distinct"):
        TrainingCheckpointNames(model="STRASSE", optimizer="straße")


def test_training_names_are_validated():
    names = TrainingCheckpointNames(model="params")
    assert (names.model, names.optimizer, names.rng, names.auxiliary, names.iterator) == (
        "params",
        "optimizer",
        "rng",
        "auxiliary",
        "iterator",
    )
    with pytest.raises(TypeError):
        TrainingCheckpointNames(model=3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="reserved"):
        TrainingCheckpointNames(auxiliary="metrics")
    with pytest.raises(ValueError):
        TrainingCheckpointNames(rng="a/b")
    import dataclasses

    with pytest.raises(dataclasses.FrozenInstanceError):
        names.model = "x"  # type: ignore[misc]


@pytest.mark.parametrize("name", ["AUTO", "auto", "Metrics"])
def test_names_orbax_reserves_for_itself_are_refused(name):
    with pytest.raises(ValueError, match="is reserved"):
        validate_checkpointable_name(name)


def test_argument_errors_use_the_seed_words(tmp_path):
    import grain
    import numpy as np

    from tinax.checkpointing import (
        load_checkpointables,
        save_checkpointables,
        save_training_checkpoint,
    )

    it = iter(grain.MapDataset.range(3).to_iter_dataset())
    with pytest.raises(TypeError, match="names must be strings"):
        save_checkpointables(tmp_path / "a", {1: np.zeros(1)})
    with pytest.raises(ValueError, match="names must be portable and distinct"):
        save_checkpointables(tmp_path / "a", {"x": np.zeros(1), "X": np.zeros(1)})
    with pytest.raises(ValueError, match="explicit non-None target"):
        load_checkpointables(tmp_path, {"x": None})
    with pytest.raises(TypeError, match="step must be an integer"):
        save_training_checkpoint(tmp_path / "b", True, {}, {}, {}, {}, it)
    with pytest.raises(ValueError, match="reserved"):
        save_checkpointables(tmp_path / "a", {"AUTO": np.zeros(1)})
    assert not list(tmp_path.iterdir())
