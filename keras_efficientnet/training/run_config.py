"""`<model_dir>/config.json`: a run's resolved configuration, so that `--mode=evaluate
--model_dir=RUN` (and anyone reading the run later) needs no flag repeated.

Written by the chief when a training run starts (atomically; plain Python, no TensorFlow): the
TrainConfig's fields, the classes (count and names, where the source records them) and both
resolutions as resolved (0 = native becomes the number).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from keras_efficientnet.runs.record import RecordError, RunConfig, RunFiles

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
    ValueError naming the file when it cannot be read."""
    path = run_config_path(model_dir)
    if not path.is_file():
        return None
    try:
        record = RunConfig.read(path)
    except RecordError as error:
        raise RecordError(f"{error}; delete it, or give the model, dataset and resolution "
                          "flags") from None
    return dataclasses.asdict(record)


def evaluation_config(config, given: set[str]):
    """`config` (a --mode=evaluate TrainConfig) with the run's fields from config.json in its
    model_dir, except OWN_FIELDS and the flags in `given` (those set on the command line or a
    flagfile); the config unchanged when the run has no config.json."""
    record = read_run_config(config.model_dir)
    if record is None:
        return config
    fields = {f.name for f in dataclasses.fields(config)}
    saved = record["config"]
    changes = {name: saved[name] for name in fields & set(saved)
               if name not in OWN_FIELDS and name not in given}
    # The run's resolved resolutions: the same numbers even if a preset's native one changed.
    for name in ("train_resolution", "test_resolution"):
        if name not in given and record.get(name):
            changes[name] = record[name]
    try:
        return config.replace(**changes)
    except ValueError as error:
        raise ValueError(f"{run_config_path(config.model_dir)}: {error}") from None
