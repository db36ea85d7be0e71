"""Atomic checkpoints at epoch ends and mid-epoch: weights, optimizer, random-number and metric
state, trainer state; the newest N kept, and never the last good one dropped."""

from __future__ import annotations

import json
import os
import re
import shutil
import tempfile
from pathlib import Path

import numpy as np

from keras_efficientnet.atomic import fsync_directory as _fsync_dir
from keras_efficientnet.atomic import write_atomically

LATEST = "LATEST"
PREFIX = "epoch-"
WEIGHTS = "model.weights.h5"
OPTIMIZER = "optimizer.npz"
AVERAGE = "average.npz"
# Model variables outside the weights file: the random-number generators' states (Keras'
# `SeedGenerator`s of dropout and stochastic depth), so that a resumed run draws the same masks.
RNG = "rng.npz"
# The running sums of the loss and metrics mid-epoch, so that a resumed epoch reports the same
# mean as the uninterrupted one.
METRICS = "metrics.npz"
STATE = "state.json"
# Left by interrupted saves: the temporary folder, a replaced folder on its way out, and the
# temporary file of the LATEST pointer.
TEMPORARY = (".tmp-", ".trash-", f".{LATEST}.")
_NAME = re.compile(rf"^{PREFIX}(\d+)(?:-batch-(\d+))?$")


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, permissions); the earlier ones are intact.

    `errno` is the failed write's; the message names the checkpoint and the intact one."""

    def __init__(self, errno: int | None, message: str):
        super().__init__(errno, message)
        self.message = message

    def __str__(self) -> str:
        return self.message


def _reason(error: OSError) -> str:
    # h5py puts the OS error inside a long report: "... error message = 'No space left ...'".
    found = re.search(r"error message = '([^']*)'", str(error))
    if error.strerror and not found:
        return error.strerror
    return found[1] if found else str(error)[:200]


def checkpoint_name(epoch: int, batch: int = 0) -> str:
    """`epoch-0003` after 3 epochs; `epoch-0003-batch-000017` after 3 epochs and 17 batches of
    the fourth (a mid-epoch save)."""
    return f"{PREFIX}{epoch:04d}" + (f"-batch-{batch:06d}" if batch else "")


def position_of(path: str | os.PathLike) -> tuple[int, int] | None:
    """(epochs, batches) done at a checkpoint folder, from its name; None for other names."""
    match = _NAME.match(Path(path).name)
    return (int(match[1]), int(match[2] or 0)) if match else None


def _suppressed(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def _numpy(variable) -> np.ndarray:
    # `numpy()` reads distributed variables too (a mirrored metric's sum over replicas).
    if hasattr(variable, "numpy"):
        return np.asarray(variable.numpy())
    import keras

    return keras.ops.convert_to_numpy(variable)


def _save_arrays(path: Path, arrays) -> None:
    with open(path, "wb") as f:
        np.savez(f, *[np.asarray(a) for a in arrays])
        f.flush()
        os.fsync(f.fileno())


def _load_arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def rng_variables(model) -> list:
    """The model's variables that its weights file leaves out: random-generator states."""
    weights = {id(w) for w in model.weights}
    return [v for v in model.variables if id(v) not in weights]


def _assign(variables, values, what: str, path: Path) -> None:
    if len(values) != len(variables):
        raise ValueError(f"{path} holds {len(values)} {what} but the model has "
                         f"{len(variables)}: was it written by another model, optimizer or "
                         "precision?")
    for variable, value in zip(variables, values):
        variable.assign(value)


class CheckpointManager:
    """Writes checkpoint folders atomically; keeps the newest `keep` and the last good one.

    Folders are named by position (`checkpoint_name`). A checkpoint is written into a hidden
    temporary folder, flushed to disk and renamed into place; only then does `LATEST` (replaced
    by rename too) name it. A crash at any point leaves the previous checkpoint and `LATEST`
    intact, and `clean_interrupted` removes the leftovers at the next start.

    A save marked `healthy=False` (written while the loss looked diverged) is kept for
    inspection but `LATEST` goes on naming the last healthy one, which rotation never deletes:
    a resumed or evaluated run starts from weights that were good.

    Args:
        directory: where the checkpoint folders live.
        keep: how many of the newest checkpoints to keep (besides the last good one). Default 3.
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
        found = [p for p in self.directory.iterdir()
                 if position_of(p) is not None and (p / STATE).is_file()]
        return sorted(found, key=position_of)

    def latest(self) -> Path | None:
        """The checkpoint `LATEST` names; without a valid pointer, the newest healthy one."""
        pointer = self.directory / LATEST
        if pointer.is_file():
            path = self.directory / pointer.read_text().strip()
            if position_of(path) is not None and (path / STATE).is_file():
                return path
        healthy = [p for p in self.all() if self.read_state(p).get("healthy", True)]
        return healthy[-1] if healthy else None

    def clean_interrupted(self) -> int:
        """Removes what interrupted saves left (TEMPORARY names); returns how many. Call it only
        while no other process saves here (the run directory's lock)."""
        if not self.directory.is_dir():
            return 0
        removed = 0
        for entry in self.directory.iterdir():
            if entry.name.startswith(TEMPORARY):
                if entry.is_dir():
                    shutil.rmtree(entry, ignore_errors=True)
                else:
                    _suppressed(os.unlink, entry)
                removed += 1
        return removed

    def save(self, epoch: int, model, optimizer=None, state: dict | None = None,
             average: list | None = None, *, batch: int = 0, healthy: bool = True,
             metrics: list | None = None) -> Path:
        """Saves the state after `epoch` epochs and `batch` batches of the next one.

        `metrics`: the model's metric variables mid-epoch. Raises CheckpointWriteError (an
        OSError) naming the folder and the intact previous checkpoint when the disk refuses.
        """
        final = self.directory / checkpoint_name(epoch, batch)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".tmp-{final.name}-"))
        except OSError as error:
            raise self._write_error(final, error) from None
        try:
            model.save_weights(tmp / WEIGHTS)
            if optimizer is not None and optimizer.built:
                _save_arrays(tmp / OPTIMIZER, [_numpy(v) for v in optimizer.variables])
            if average is not None:
                _save_arrays(tmp / AVERAGE, average)
            rng = rng_variables(model)
            if rng:
                _save_arrays(tmp / RNG, [_numpy(v) for v in rng])
            if metrics:
                _save_arrays(tmp / METRICS, [_numpy(v) for v in metrics])
            with open(tmp / STATE, "w") as f:
                json.dump({"epoch": epoch, "batch": batch, "healthy": healthy, **(state or {})},
                          f, indent=2, sort_keys=True)
                f.flush()
                os.fsync(f.fileno())
            _fsync_dir(tmp)
            if final.exists():  # re-running a position: the new one replaces it
                trash = Path(tempfile.mkdtemp(dir=self.directory, prefix=".trash-"))
                os.replace(final, trash / final.name)
                shutil.rmtree(trash, ignore_errors=True)
            os.replace(tmp, final)
            _fsync_dir(self.directory)
            if healthy:
                write_atomically(self.directory / LATEST, final.name)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError) and not isinstance(error, CheckpointWriteError):
                raise self._write_error(final, error) from None
            raise
        self._rotate()
        return final

    def _write_error(self, final: Path, error: OSError) -> CheckpointWriteError:
        latest = self.latest()
        intact = f"; the last checkpoint {latest} is intact" if latest else ""
        return CheckpointWriteError(
            error.errno, f"could not write checkpoint {final}: {_reason(error)}{intact}. Free "
                         "space (or fix permissions, quotas), then rerun the same command to "
                         "resume")

    def _rotate(self) -> None:
        complete = self.all()
        keep = set(complete[-self.keep:])
        latest = self.latest()
        if latest is not None:
            keep.add(latest)
        for old in complete:
            if old not in keep:
                shutil.rmtree(old, ignore_errors=True)

    @staticmethod
    def read_state(path: str | os.PathLike) -> dict:
        with open(Path(path) / STATE) as f:
            return json.load(f)

    @staticmethod
    def restore(path: str | os.PathLike, model, optimizer=None) -> dict:
        """Loads the weights from a checkpoint; to resume training (`optimizer` given) the
        optimizer and random-generator states too. Returns its state, with "average" and
        "metrics" arrays where saved."""
        path = Path(path)
        model.load_weights(path / WEIGHTS)
        if optimizer is not None and (path / RNG).is_file():
            _assign(rng_variables(model), _load_arrays(path / RNG), "random-generator states",
                    path / RNG)
        if optimizer is not None and (path / OPTIMIZER).is_file():
            if not optimizer.built:
                optimizer.build(model.trainable_variables)
            _assign(optimizer.variables, _load_arrays(path / OPTIMIZER), "optimizer variables",
                    path / OPTIMIZER)
        state = CheckpointManager.read_state(path)
        state.setdefault("batch", 0)
        if (path / AVERAGE).is_file():
            state["average"] = _load_arrays(path / AVERAGE)
        if (path / METRICS).is_file():
            state["metrics"] = _load_arrays(path / METRICS)
        return state
