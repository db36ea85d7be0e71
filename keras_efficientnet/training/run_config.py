"""`<model_dir>/config.json`: a run's resolved configuration, so that `--mode=evaluate
--model_dir=RUN` (and anyone reading the run later) needs no flag repeated.

Written by the chief when a training run starts (atomically; plain Python, no TensorFlow): the
TrainConfig's fields, the classes (count and names, where the source records them) and both
resolutions as resolved (0 = native becomes the number).
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

from keras_efficientnet.runs.record import RecordError, RunConfig, RunFiles
from keras_efficientnet.training.modes import MODE_TABLE

# Fields an evaluation keeps from its own command line: what to do, where, which weights, and
# how much it prints. Every other field comes from the run unless the command line gives it.
OWN_FIELDS = ("mode", "model_dir", "resume", "init_checkpoint", "evaluate_weights", "verbose",
              "export_dir")


def run_config_path(model_dir: str | Path) -> Path:
    return RunFiles(model_dir).config


def write_run_config(config, *, num_classes: int, class_names, train_resolution: int,
                     test_resolution: int) -> Path:
    """Writes `<model_dir>/config.json`; returns its path."""
    record = RunConfig(config=config.to_dict(), num_classes=int(num_classes),
                       class_names=list(class_names) if class_names else None,
                       train_resolution=int(train_resolution),
                       test_resolution=int(test_resolution))
    return record.write(run_config_path(config.model_dir))


def read_run_config(model_dir: str | Path) -> dict | None:
    """The record `write_run_config` wrote in `model_dir`, or None when there is none;
    ValueError naming the file when it cannot be read (a link, a pipe or a folder there
    included: those are not "no config.json")."""
    path = run_config_path(model_dir)
    try:
        record = RunConfig.read(path)  # None only when nothing is at the path
    except RecordError as error:
        raise RecordError(f"{error}; delete it, or give the model, dataset and resolution "
                          "flags") from None
    return None if record is None else dataclasses.asdict(record)


# The JSON types a TrainConfig field takes, by the type of its default (an int is a number).
_JSON_TYPES = {bool: ("true or false", (bool,)), int: ("an integer", (int,)),
               float: ("a number", (int, float)), str: ("a string", (str,))}


def _type_problem(name: str, value, default) -> str | None:
    what, types = _JSON_TYPES[type(default)]
    if isinstance(value, bool) and bool not in types:  # JSON's true is no number
        return f"must be {what}, found {value!r}"
    if isinstance(value, types):
        return None
    found = "null" if value is None else repr(value)[:80]
    return f"must be {what}, found {found}"


def named_from_run(config, name: str, flag: str | None = None) -> str:
    """Field `name` of `config` and its value as a message should name them, by where the value
    came from: in a mode that reads the run's config.json (`--mode=evaluate`),
    `model 'x' from RUN/config.json` when that file holds it, and `--model=x (the default:
    RUN/config.json is missing)` when there is none; else `flag` (default `--model=x`), as the
    message names a value the command line gave."""
    value = getattr(config, name)
    flag = flag if flag is not None else f"--{name}={value}"
    if not MODE_TABLE[config.mode].scores_only or name in OWN_FIELDS:
        return flag
    path = run_config_path(config.model_dir)
    try:
        record = read_run_config(config.model_dir)
    except ValueError:
        return flag
    if record is None:
        default = {f.name: f.default for f in dataclasses.fields(config)}[name]
        return f"{flag} (the default: {path} is missing)" if value == default else flag
    if record["config"].get(name) == value:
        return f"{name} {value!r} from {path}"
    return flag


def evaluation_config(config, given: set[str]):
    """`config` (a --mode=evaluate TrainConfig) with the run's fields from config.json in its
    model_dir, except OWN_FIELDS and the flags in `given` (those set on the command line or a
    flagfile); the config unchanged when the run has no config.json."""
    record = read_run_config(config.model_dir)
    if record is None:
        return config
    path = run_config_path(config.model_dir)
    defaults = {f.name: f.default for f in dataclasses.fields(config)}
    saved = record["config"]
    changes = {name: saved[name] for name in defaults.keys() & set(saved)
               if name not in OWN_FIELDS and name not in given}
    for name in sorted(changes):  # a wrong type or a null: one line, not a TypeError
        problem = _type_problem(name, changes[name], defaults[name])
        if problem:
            raise RecordError(f"{path}: field 'config.{name}' {problem}; fix it there, or give "
                              f"--{name} on the command line")
    # The run's resolved resolutions: the same numbers even if a preset's native one changed.
    for name in ("train_resolution", "test_resolution"):
        if name not in given and record.get(name):
            changes[name] = record[name]
    try:
        return config.replace(**changes)
    except ValueError as error:
        # The message names flags ("--micro_batch_size must be >= 1"); the values it speaks of
        # came from config.json, not from a flag the user gave.
        message = str(error)
        for name in sorted(changes, key=len, reverse=True):
            message = re.sub(rf"--{re.escape(name)}\b", f"{name} (from {path.name})",
                             message, count=1)
        raise ValueError(f"{path}: {message}; fix it there, or give the flag on the command "
                         "line") from None
