"""`<model_dir>/metrics.csv`: one row per epoch with the training and validation figures."""

from __future__ import annotations

import csv
import io
import math
import os
import time
from pathlib import Path

import keras

from keras_efficientnet.atomic import append_text, open_file
from keras_efficientnet.runs.record import read_metrics

# train_seconds: the run's training time so far (each epoch from its start to its last batch,
# so validation and checkpoints are left out); wall_seconds: the run's time so far, all of it.
# Both continue across resumes, so that accuracy can be drawn against time (benchmarks).
COLUMNS = ("epoch", "loss", "top1", "top5", "val_loss", "val_top1", "val_top5",
           "learning_rate", "train_seconds", "wall_seconds")


class MetricsCSV(keras.callbacks.Callback):
    """Appends each epoch's row to `path` (header first when the file is new); an epoch without
    validation leaves its `val_*` cells empty. A resumed run appends after the rows it has, its
    seconds counted on from the last row's, in the columns that file began with."""

    def __init__(self, path: str | os.PathLike):
        super().__init__()
        self.path = Path(path)
        self._clock = time.perf_counter
        self._train_seconds = self._wall_seconds = 0.0
        self._began = self._epoch_began = self._last_batch = None

    def on_train_begin(self, logs=None):
        # Checked before the first epoch, not at its end: a link, pipe or folder at the path
        # is one UnsafePathError line now (the run directory's check usually said so before).
        append_text(self.path, "")
        if self.path.stat().st_size:
            rows = read_metrics(self.path)
            last = rows[-1] if rows else {}
            self._train_seconds = last.get("train_seconds") or 0.0
            self._wall_seconds = last.get("wall_seconds") or 0.0
        self._began = self._clock()

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_began = self._last_batch = self._clock()

    def on_train_batch_end(self, batch, logs=None):
        self._last_batch = self._clock()

    def on_epoch_end(self, epoch, logs=None):
        logs = dict(logs or {})
        logs["epoch"] = epoch + 1
        if "learning_rate" not in logs and getattr(self.model, "optimizer", None) is not None:
            logs["learning_rate"] = float(keras.ops.convert_to_numpy(
                self.model.optimizer.learning_rate))
        now = self._clock()
        if self._epoch_began is not None:
            self._train_seconds += self._last_batch - self._epoch_began
        if self._began is not None:
            self._wall_seconds, self._began = self._wall_seconds + now - self._began, now
        logs["train_seconds"] = round(self._train_seconds, 3)
        logs["wall_seconds"] = round(self._wall_seconds, 3)
        new = not os.path.lexists(self.path) or self.path.stat().st_size == 0
        columns = COLUMNS if new else _header(self.path)
        text = io.StringIO()
        writer = csv.writer(text)
        if new:
            writer.writerow(columns)
        writer.writerow([_cell(logs.get(name)) for name in columns])
        # One checked append (never through a link or into a pipe); a full disk is one line
        # naming metrics.csv, the free space and the fix, and leaves no half row.
        append_text(self.path, text.getvalue())


def _header(path: Path) -> tuple[str, ...]:
    """The columns a metrics.csv began with (a run resumed from an older version keeps them)."""
    with open_file(path, newline="") as f:
        return tuple(next(csv.reader(f), COLUMNS))


def _cell(value) -> str:
    """A figure as text: empty when there is none (an epoch without validation); `nan`, `inf`
    or `-inf` when it was not finite (Python's float() and every CSV reader read them back),
    so a non-finite validation is told from a missing one."""
    if value is None:
        return ""
    value = float(value)
    if not math.isfinite(value):
        return repr(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return repr(value)


