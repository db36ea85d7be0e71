"""runs.record: the one owner of a run's file names, and its typed, versioned records. Records
written by the previous version (the JSON below is what that code wrote, byte for byte in
structure) load; unknown and wrong-typed fields are one line naming the file and the field."""

from __future__ import annotations

import ast
import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from keras_efficientnet.runs import record
from keras_efficientnet.runs.record import (
    BestRecord,
    CheckpointState,
    RecordError,
    Results,
    RunConfig,
    RunFiles,
)

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "keras_efficientnet"


def test_no_run_file_name_is_written_as_a_literal_outside_the_record_module():
    # Every name the record module owns, as an exact string constant anywhere else in the
    # package ("best" and "damaged" are also ordinary words: --evaluate_weights=best).
    names = {value for key, value in vars(record).items()
             if key.isupper() and isinstance(value, str)} - {"best", "damaged"}
    assert {"checkpoints", "finetuned.weights.h5", "class_names.json", "best.json",
            "state.json", "results.json", "config.json", "model.keras"} <= names
    found = []
    for path in PACKAGE.rglob("*.py"):
        if path == PACKAGE / "runs" / "record.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in names:
                found.append(f"{path.relative_to(PACKAGE)}:{node.lineno} {node.value!r}")
    assert found == []


def test_the_record_module_loads_no_framework():
    # environment() asks only the frameworks already loaded: none here, so no oneDNN state.
    code = ("import sys; from keras_efficientnet.runs import record, weights, run; "
            "from keras_efficientnet.runs.environment import environment; "
            "env = environment(); "
            "heavy = {'keras', 'tensorflow', 'numpy', 'jax'} & set(sys.modules); "
            "assert not heavy, heavy; "
            "assert 'onednn' not in env and 'keras' not in env and env['cores'] >= 1, env")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=PACKAGE.parent)


def test_run_files_name_every_file_and_store_paths_relative(tmp_path):
    files = RunFiles(tmp_path / "run")
    assert files.best_checkpoint == tmp_path / "run" / "checkpoints" / "best"
    assert files.results("evaluate") == tmp_path / "run" / "results-evaluate.json"
    assert files.results() == tmp_path / "run" / "results.json"
    assert files.relative(tmp_path / "run" / "checkpoints" / "best") == "checkpoints/best"
    assert files.relative(tmp_path / "elsewhere" / "x") == str(tmp_path / "elsewhere" / "x")
    assert files.absolute("best.keras") == tmp_path / "run" / "best.keras"


# What the previous version wrote (training/validation.py, run_config.py, checkpoint.py,
# results.py before the record module), for a run at /old/place/run since moved.
V1_BEST = {"phase": "train", "epoch": 2, "val_top1": 0.5, "val_top5": 0.875, "val_loss": 1.25,
           "weights": "the weight average", "file": "/old/place/run/best.keras",
           "checkpoint": "/old/place/run/checkpoints/best", "checkpoint_of": "epoch-0002",
           "scored_weights": "average.npz (the weight average; model.weights.h5 holds the "
                             "raw weights)"}
V1_STATE = {"batch": 0, "config": {"model": "efficientnet-tiny-g16-lnpn"}, "epoch": 3,
            "global_step": 12, "healthy": True, "history": [{"loss": 2.0, "top1": 0.25}],
            "num_classes": 10}
V1_CONFIG = {"config": {"model": "efficientnet-tiny-g16-lnpn", "dataset": "digits"},
             "num_classes": 10, "class_names": ["0", "1"], "train_resolution": 32,
             "test_resolution": 64}


def test_a_moved_runs_old_best_record_names_its_own_files(tmp_path):
    path = tmp_path / "moved" / "best.json"
    path.parent.mkdir()
    path.write_text(json.dumps(V1_BEST, indent=1))
    best = BestRecord.read(path)
    # The v1 writer only ever wrote these two paths under its model_dir.
    assert (best.file, best.checkpoint) == ("best.keras", "checkpoints/best")
    assert RunFiles(path.parent).absolute(best.checkpoint) == (
        tmp_path / "moved" / "checkpoints" / "best")
    assert (best.epoch, best.val_top1, best.checkpoint_of) == (2, 0.5, "epoch-0002")
    # Written again: version 2, relative, strict JSON.
    best.write(path)
    stored = json.loads(path.read_text())
    assert stored["version"] == 2 and stored["file"] == "best.keras"
    assert BestRecord.read(path) == best


def test_old_state_and_run_config_load_and_round_trip(tmp_path):
    state = CheckpointState.from_dict(V1_STATE, tmp_path / "state.json")
    assert (state.epoch, state.batch, state.global_step, state.num_classes) == (3, 0, 12, 10)
    assert state.history == [{"loss": 2.0, "top1": 0.25}]
    assert CheckpointState.from_dict(json.loads(state.to_json())) == state
    config = RunConfig.from_dict(V1_CONFIG)
    assert (config.num_classes, config.test_resolution) == (10, 64)
    assert RunConfig.from_dict(json.loads(config.to_json())) == config


def test_old_results_read_their_paths_relative_to_the_run(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    old = {"mode": "train", "model": "m", "dataset": "digits", "global_batch_size": 16,
           "num_classes": 10, "train_examples": 100, "eval_examples": 20, "config": {},
           "checkpoint": str(run / "checkpoints" / "epoch-0001"),
           "model_file": str(run / "model.keras"), "export_dir": "/exports/b0",
           "top1": 0.5, "top5": None, "history": []}
    (run / "results.json").write_text(json.dumps(old))
    results = Results.read(run / "results.json")
    assert results.checkpoint == "checkpoints/epoch-0001"
    assert results.model_file == "model.keras"
    assert results.export_dir == "/exports/b0"  # outside the run: as it was
    assert results.scores() == {"top1": 0.5}


def test_results_of_the_trainer_are_strict_and_relative(tmp_path):
    values = {"mode": "evaluate", "model": "m", "dataset": "digits", "global_batch_size": 16,
              "num_classes": 10, "train_examples": 100, "eval_examples": 20, "config": {},
              "checkpoint": str(tmp_path / "checkpoints" / "epoch-0002"),
              "loss": float("nan"), "top1": 0.25, "wall_seconds": 3,
              "history": [{"loss": 2.0}, {"loss": 1.5, "val_loss": float("inf")}]}
    results = Results.of(values, tmp_path / "results-evaluate.json")
    text = results.to_json()
    assert "NaN" not in text and "Infinity" not in text
    stored = json.loads(text, parse_constant=lambda name: pytest.fail(f"not strict: {name}"))
    assert stored["checkpoint"] == "checkpoints/epoch-0002" and stored["loss"] is None
    # The nulls that were not finite are named (a null alone would read as "not measured").
    assert stored["non_finite"] == ["loss", "history[1].val_loss"]
    assert stored["history"][1]["val_loss"] is None
    assert Results.read(results.write(tmp_path / "results-evaluate.json")) == results
    assert stored["wall_seconds"] == 3 and stored["version"] == Results.VERSION


@pytest.mark.parametrize("change,field,words", [
    ({"colour": "red"}, "colour", "unknown field 'colour'"),
    ({"epoch": "2"}, "epoch", "field 'epoch' must be an integer, found '2'"),
    ({"epoch": True}, "epoch", "field 'epoch' must be an integer, found True"),
    ({"val_top1": None}, "val_top1", "field 'val_top1' must be a number, found None"),
    ({"checkpoint": 3}, "checkpoint", "field 'checkpoint' must be a string or null, found 3"),
    ({"version": 3}, "version", "version 3 of the BestRecord record is newer"),
])
def test_a_bad_field_is_one_line_naming_the_file_and_the_field(tmp_path, change, field, words):
    path = tmp_path / "best.json"
    path.write_text(json.dumps({**V1_BEST, "version": 2, "file": "best.keras",
                                "checkpoint": "checkpoints/best", **change}))
    with pytest.raises(RecordError) as error:
        BestRecord.read(path)
    line = str(error.value)
    assert line.startswith(f"{path}: ") and words in line and "\n" not in line


def test_a_missing_field_and_an_unreadable_file_are_one_line(tmp_path):
    path = tmp_path / "config.json"
    path.write_text(json.dumps({k: v for k, v in V1_CONFIG.items() if k != "num_classes"}))
    with pytest.raises(RecordError, match=r"config.json: field 'num_classes' is missing"):
        RunConfig.read(path)
    path.write_text("{not json")
    with pytest.raises(RecordError, match=r"config.json: not JSON \(Expecting"):
        RunConfig.read(path)
    path.write_text(json.dumps({**V1_CONFIG, "class_names": ["a", 2]}))
    with pytest.raises(RecordError, match="'class_names' must be a list of strings"):
        RunConfig.read(path)
    assert RunConfig.read(tmp_path / "none.json") is None
    with pytest.raises(RecordError, match="none.json: cannot be read"):
        RunConfig.read(tmp_path / "none.json", missing_ok=False)


def test_the_record_types_name_every_field():
    for cls in (RunConfig, CheckpointState, BestRecord, Results):
        fields = [f.name for f in dataclasses.fields(cls)]
        assert sorted(fields) == sorted(cls.TYPES), cls.__name__


def test_every_json_writer_of_the_package_refuses_nan():
    # Python's json writes NaN and Infinity, which strict readers reject: every json.dump(s)
    # call of the package passes allow_nan=False (and strict() where a value may be a NaN).
    package = pathlib.Path(record.__file__).parents[1]
    calls = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and node.func.attr in ("dump", "dumps")
                    and getattr(node.func.value, "id", None) == "json"):
                strict_ = any(k.arg == "allow_nan" and getattr(k.value, "value", True) is False
                              for k in node.keywords)
                calls.append((f"{path.relative_to(package)}:{node.lineno}", strict_))
    assert len(calls) >= 7  # the records, manifest, lock, class names, export mark, ...
    assert [where for where, ok in calls if not ok] == []
