"""The results file of a run (`results.json`, or `results-<mode>.json`): strict JSON, written
atomically into model_dir."""

from __future__ import annotations

import json
import math
from pathlib import Path

from keras_efficientnet.atomic import write_atomically
from keras_efficientnet.training import run_dir
from keras_efficientnet.training.config import TrainConfig


def results_path(config: TrainConfig) -> Path:
    return Path(config.model_dir) / run_dir.results_name(config.mode)


def json_safe(value):
    """`value` with NaN and infinities as null and NumPy scalars as Python numbers (strict
    JSON: Python's json writes NaN, which other readers reject)."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value



def write_results(config: TrainConfig, results: dict) -> Path:
    return write_atomically(results_path(config),
                            json.dumps(json_safe(results), indent=2, sort_keys=True,
                                       allow_nan=False))
