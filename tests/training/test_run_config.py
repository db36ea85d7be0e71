"""config.json as --mode=evaluate reads it (issue 36): a field of the wrong type or a null is
one line naming config.json, the field and the type; a value it supplies is named as coming
from it, never as a flag the user did not give; a missing, linked or non-regular config.json is
reported as what it is."""

from __future__ import annotations

import json
import os
import signal

import pytest

from keras_efficientnet.cli import errors
from keras_efficientnet.runs.record import RecordError, RunConfig
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.resume import check_architecture
from keras_efficientnet.training.run_config import evaluation_config, named_from_run
from tests.reliability.clitools import assert_one_line, run_cli

TRAINED = TrainConfig(model="efficientnet-tiny-g16-gn", dataset="digits", micro_batch_size=16)


def _run(tmp_path, **changes) -> tuple:
    run = tmp_path / "run"
    run.mkdir(exist_ok=True)
    record = json.loads(RunConfig(config=TRAINED.to_dict(), num_classes=10,
                                  train_resolution=32, test_resolution=64).to_json())
    record["config"].update(changes)
    (run / "config.json").write_text(json.dumps(record))
    return run, TrainConfig(mode="evaluate", model_dir=str(run))


@pytest.mark.parametrize("field,value,expected", [
    ("micro_batch_size", "x", "an integer, found 'x'"),
    ("micro_batch_size", None, "an integer, found null"),
    ("micro_batch_size", 2.5, "an integer, found 2.5"),
    ("learning_rate", "fast", "a number, found 'fast'"),
    ("learning_rate", True, "a number, found True"),
    ("model", 3, "a string, found 3"),
    ("eval_flip", "yes", "true or false, found 'yes'"),
])
def test_a_wrong_type_or_a_null_is_one_line_naming_the_file_and_field(tmp_path, field, value,
                                                                      expected):
    run, config = _run(tmp_path, **{field: value})
    with pytest.raises(RecordError) as raised:  # was a TypeError traceback
        evaluation_config(config, given=set())
    assert str(raised.value) == (
        f"{run / 'config.json'}: field 'config.{field}' must be {expected}; fix it there, or "
        f"give --{field} on the command line")
    assert errors.describe(raised.value)[1] == 2
    # A flag given on the command line replaces the bad value: no error.
    assert getattr(evaluation_config(config, given={field}), field) == getattr(config, field)


def test_a_bad_value_from_config_json_is_named_as_its_not_as_a_flag(tmp_path):
    run, config = _run(tmp_path, micro_batch_size=-3)
    with pytest.raises(ValueError) as raised:
        evaluation_config(config, given=set())
    assert str(raised.value).startswith(
        f"{run / 'config.json'}: micro_batch_size (from config.json) must be >= 1")
    assert "--micro_batch_size must" not in str(raised.value)


def test_values_are_named_by_where_they_came_from(tmp_path):
    run, config = _run(tmp_path)
    config = evaluation_config(config, given=set())
    assert named_from_run(config, "model") == (
        f"model 'efficientnet-tiny-g16-gn' from {run / 'config.json'}")
    # Given on the command line (another value than the run's): the flag.
    assert named_from_run(config.replace(model="efficientnet-tiny-g1-bn"), "model") == (
        "--model=efficientnet-tiny-g1-bn")
    # A training mode: the value is the flag's, though config.json holds the same.
    assert named_from_run(config.replace(mode="train"), "model") == (
        "--model=efficientnet-tiny-g16-gn")
    # No config.json: the flag's default, and that the file is missing.
    (run / "config.json").unlink()
    assert named_from_run(TrainConfig(mode="evaluate", model_dir=str(run)), "model") == (
        f"--model=efficientnet-b0-g16-lnpn (the default: {run / 'config.json'} is missing)")


def test_an_architecture_mismatch_names_config_json_not_a_flag(tmp_path):
    run, config = _run(tmp_path)
    config = evaluation_config(config, given=set())
    with pytest.raises(ValueError) as raised:
        check_architecture({**TRAINED.to_dict(), "model": "efficientnet-tiny-g16-lnpn"},
                           config, run / "checkpoints" / "epoch-0001", "Fix it.")
    assert (f"model (checkpoint 'efficientnet-tiny-g16-lnpn', now model "
            f"'efficientnet-tiny-g16-gn' from {run / 'config.json'})") in str(raised.value)


@pytest.mark.parametrize("kind", ["symlink", "dangling symlink", "directory", "fifo"])
def test_a_linked_or_non_regular_config_json_is_reported_as_such(tmp_path, kind):
    run, config = _run(tmp_path)
    path = run / "config.json"
    real = tmp_path / "elsewhere.json"
    os.replace(path, real)
    {"symlink": lambda: path.symlink_to(real),
     "dangling symlink": lambda: path.symlink_to(tmp_path / "gone.json"),
     "directory": path.mkdir, "fifo": lambda: os.mkfifo(path)}[kind]()
    found = {"symlink": "a symbolic link", "dangling symlink": "a symbolic link",
             "directory": "a directory", "fifo": "a named pipe (FIFO)"}[kind]
    signal.alarm(10)  # a blocked open fails the test instead of hanging the suite
    try:
        with pytest.raises(RecordError) as raised:  # never taken for "no config.json"
            evaluation_config(config, given=set())
    finally:
        signal.alarm(0)
    assert str(raised.value).startswith(f"{path} is {found}")
    assert errors.describe(raised.value)[1] == 2


def test_the_command_line_says_it_in_one_line_before_tensorflow(tmp_path):
    run, _ = _run(tmp_path, micro_batch_size=None)
    result = run_cli("--mode=evaluate", f"--model_dir={run}", timeout=120)
    assert_one_line(result, 2, rf"^error: {run / 'config.json'}: field 'config.micro_batch_size' "
                               r"must be an integer, found null")
