"""Atomic per-epoch checkpoints: model weights, optimizer state and trainer state, last N kept."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import keras
import numpy as np

from keras_efficientnet.atomic import fsync_directory as _fsync_dir
from keras_efficientnet.atomic import write_atomically

LATEST = "LATEST"
PREFIX = "epoch-"
WEIGHTS = "model.weights.h5"
OPTIMIZER = "optimizer.npz"
AVERAGE = "average.npz"
STATE = "state.json"


def _save_arrays(path: Path, arrays) -> None:
    np.savez(path, *[np.asarray(a) for a in arrays])


def _load_arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


class CheckpointManager:
    """Writes `<directory>/epoch-NNNN/` folders atomically and keeps the newest `keep`.

    A checkpoint is written into a hidden temporary folder, flushed to disk and renamed into
    place; only then is `LATEST` replaced (also by rename). A crash at any point leaves the
    previous checkpoint and `LATEST` intact, and a half-written folder is never picked up.

    Args:
        directory: where the checkpoint folders live.
        keep: how many of the newest checkpoints to keep. Default 3.
    """

    def __init__(self, directory: str | os.PathLike, keep: int = 3):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, received {keep}")
        self.directory = Path(directory)
        self.keep = keep

    def all(self) -> list[Path]:
        """Complete checkpoints, oldest first."""
        if not self.directory.is_dir():
            return []
        found = [p for p in self.directory.glob(f"{PREFIX}*") if (p / STATE).is_file()]
        return sorted(found, key=lambda p: int(p.name[len(PREFIX):]))

    def latest(self) -> Path | None:
        pointer = self.directory / LATEST
        if pointer.is_file():
            path = self.directory / pointer.read_text().strip()
            if (path / STATE).is_file():
                return path
        complete = self.all()
        return complete[-1] if complete else None

    def save(self, epoch: int, model: keras.Model, optimizer=None, state: dict | None = None,
             average: list | None = None) -> Path:
        """Saves the state after `epoch` completed epochs and returns the checkpoint folder."""
        self.directory.mkdir(parents=True, exist_ok=True)
        final = self.directory / f"{PREFIX}{epoch:04d}"
        tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".tmp-{final.name}-"))
        try:
            model.save_weights(tmp / WEIGHTS)
            if optimizer is not None and optimizer.built:
                _save_arrays(tmp / OPTIMIZER, [v.numpy() if hasattr(v, "numpy") else
                                               keras.ops.convert_to_numpy(v)
                                               for v in optimizer.variables])
            if average is not None:
                _save_arrays(tmp / AVERAGE, average)
            with open(tmp / STATE, "w") as f:
                json.dump({"epoch": epoch, **(state or {})}, f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if final.exists():  # re-running an epoch: the new one replaces it
                trash = Path(tempfile.mkdtemp(dir=self.directory, prefix=".trash-"))
                os.replace(final, trash / final.name)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        write_atomically(self.directory / LATEST, final.name)
        for old in self.all()[:-self.keep]:
            shutil.rmtree(old, ignore_errors=True)
        return final

    @staticmethod
    def read_state(path: str | os.PathLike) -> dict:
        with open(Path(path) / STATE) as f:
            return json.load(f)

    @staticmethod
    def restore(path: str | os.PathLike, model: keras.Model, optimizer=None) -> dict:
        """Loads weights (and optimizer state when given) from a checkpoint; returns its state."""
        path = Path(path)
        model.load_weights(path / WEIGHTS)
        if optimizer is not None and (path / OPTIMIZER).is_file():
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            values = _load_arrays(path / OPTIMIZER)
            if len(values) != len(optimizer.variables):
                raise ValueError(
                    f"{path / OPTIMIZER} holds {len(values)} optimizer variables but the "
                    f"optimizer has {len(optimizer.variables)}: was it written by another "
                    "optimizer or precision?")
            for variable, value in zip(optimizer.variables, values):
                variable.assign(value)
        state = CheckpointManager.read_state(path)
        if (path / AVERAGE).is_file():
            state["average"] = _load_arrays(path / AVERAGE)
        return state
