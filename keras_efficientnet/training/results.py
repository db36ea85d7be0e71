"""The results file of a run (`results.json`, or `results-<mode>.json`): a `record.Results`,
strict JSON, paths inside the run relative to it, written atomically into model_dir."""

from __future__ import annotations

from pathlib import Path

from keras_efficientnet.runs.record import Results, RunFiles, strict
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.modes import MODE_TABLE

json_safe = strict  # NaN and infinities as null, NumPy scalars as numbers


def results_path(config: TrainConfig) -> Path:
    trains = MODE_TABLE[config.mode].trains
    return RunFiles(config.model_dir).results(None if trains else config.mode)


def write_results(config: TrainConfig, results: dict) -> Path:
    path = results_path(config)
    return Results.of(results, path).write(path)
