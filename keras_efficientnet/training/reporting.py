"""`<model_dir>/metrics.csv`: one row per epoch with the training and validation figures."""

from __future__ import annotations

import csv
import math
import os
from pathlib import Path

import keras

COLUMNS = ("epoch", "loss", "top1", "top5", "val_loss", "val_top1", "val_top5",
           "learning_rate")
METRICS_FILE = "metrics.csv"


class MetricsCSV(keras.callbacks.Callback):
    """Appends each epoch's row to `path` (header first when the file is new); an epoch without
    validation leaves its `val_*` cells empty. A resumed run appends after the rows it has."""

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        logs["epoch"] = epoch + 1
        if "learning_rate" not in logs and getattr(self.model, "optimizer", None) is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate))
        new = not self.path.is_file() or self.path.stat().st_size == 0
        with open(self.path, "a", newline="") as f:
            writer = csv.writer(f)
            if new:
                writer.writerow(COLUMNS)
            writer.writerow([_cell(logs.get(name)) for name in COLUMNS])


def _cell(value) -> str:
    if value is None:
        return ""
    value = float(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value) if math.isfinite(value) else ""


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a metrics.csv, as dicts of floats (None for empty cells)."""
    with open(path, newline="") as f:
        return [{k: (float(v) if v != "" else None) for k, v in row.items()}
                for row in csv.DictReader(f)]
