"""Atomic checkpoints at epoch ends and mid-epoch: weights, optimizer, random-number and metric
state, trainer state; the newest N kept, and never the last good one dropped.

Each checkpoint folder carries `manifest.json`, written last inside the atomic rename: every
file's name, size and SHA-256, and the state it was written in (epoch, batch, whether the loss
was healthy). A resume verifies the newest checkpoint against it (`CheckpointManager.
resume_point`) and moves a damaged one aside to `damaged/`; nothing is followed out of the
checkpoints folder (`LATEST` and every name must resolve inside it).

`best/` is a copy of the epoch-end checkpoint whose validation scored the best top-1 so far
(`CheckpointManager.keep_best`), manifest included: its name is no position, so rotation,
`LATEST` and resume never see it; `verify_best` checks it against the epoch it was copied from.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path

import numpy as np

from keras_efficientnet import atomic
from keras_efficientnet.atomic import fsync_directory as _fsync_dir
from keras_efficientnet.atomic import open_file, write_atomically

# A checkpoint's names, its manifest and every file name of a run are runs/' (re-exported).
from keras_efficientnet.runs.manifest import (  # noqa: F401
    _NAME,
    PREFIX,
    checkpoint_folders,
    checkpoint_name,
    is_healthy,
    position_of,
    read_manifest,
    verify,
    write_manifest,
)
from keras_efficientnet.runs.record import (  # noqa: F401
    AVERAGE,
    BEST_CHECKPOINT,
    DAMAGED,
    LATEST,
    MANIFEST,
    OPTIMIZER,
    RNG,
    STATE,
    TEMPORARY,
    WEIGHTS,
    CheckpointState,
)
from keras_efficientnet.runs.record import METRIC_SUMS as METRICS

log = logging.getLogger("keras_efficientnet")

# The copy of the best-validated checkpoint (never rotated away, never resumed from).
BEST = BEST_CHECKPOINT


class CheckpointWriteError(atomic.WriteError):
    """A checkpoint could not be written (disk full, permissions); the earlier ones are intact.

    `errno` is the failed write's; the message names the checkpoint and the intact one."""


class NoIntactCheckpointError(ValueError):
    """Checkpoints were found to resume from, but none passed verification."""


def _suppressed(fn, *args) -> None:
    try:
        fn(*args)
    except OSError:
        pass


def to_numpy(variable) -> np.ndarray:
    # `numpy()` reads distributed variables too (a mirrored metric's sum over replicas).
    if hasattr(variable, "numpy"):
        return np.asarray(variable.numpy())
    import keras

    return keras.ops.convert_to_numpy(variable)


def nbytes(arrays) -> int:
    """The bytes of the values of `arrays` (variables or arrays)."""
    total = 0
    for array in arrays:
        dtype = getattr(array.dtype, "as_numpy_dtype", array.dtype)
        try:
            size = np.dtype(dtype).itemsize
        except TypeError:  # a dtype NumPy does not know (bfloat16): count 4 bytes
            size = 4
        total += int(np.prod(tuple(array.shape))) * size
    return total


def _copy_flushed(source: Path, target: Path) -> str:
    """A copy of `source` at `target`, flushed to disk (a copy, not a hard link: damage done
    to one file in place must not reach the other); returns the SHA-256 of the bytes copied."""
    digest = hashlib.sha256()
    with open_file(source, "rb") as read, open_file(target, "wb") as write:
        for block in iter(lambda: read.read(1 << 20), b""):
            digest.update(block)
            write.write(block)
        write.flush()
        os.fsync(write.fileno())
    return digest.hexdigest()


def _save_arrays(path: Path, arrays) -> None:
    with open_file(path, "wb") as f:
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

    def _entries(self) -> list[Path]:
        """Every entry named like a checkpoint (links and files too), oldest first."""
        if not self.directory.is_dir():
            return []
        return sorted((p for p in self.directory.iterdir() if position_of(p) is not None),
                      key=position_of)

    def all(self) -> list[Path]:
        """Checkpoint folders, oldest first: real folders of this directory, no links."""
        return checkpoint_folders(self.directory)

    def latest(self) -> Path | None:
        """The newest checkpoint whose manifest says the loss was healthy (not verified: see
        `resume_point`). `LATEST` names it too, for people and other tools; the choice never
        depends on it."""
        healthy = [p for p in self.all() if is_healthy(p)]
        return healthy[-1] if healthy else None

    def _outside(self, path: Path) -> str | None:
        """Why a checkpoint name does not stay inside this directory, or None."""
        if path.is_symlink():
            target = path.resolve()
            if target.parent != self.directory.resolve():
                return f"it is a link to {target}, outside {self.directory}"
            return f"it is a link (to {target})"
        return None if path.is_dir() else "it is not a folder"

    def _move_damaged(self, path: Path) -> Path:
        damaged = self.directory / DAMAGED
        atomic.check_directory(damaged)
        damaged.mkdir(exist_ok=True)
        target, n = damaged / path.name, 1
        while os.path.lexists(target):
            n += 1
            target = damaged / f"{path.name}-{n}"
        os.replace(path, target)
        return target

    def _check_pointer(self, move: bool) -> None:
        """One line when LATEST is a link, not a file, or names something outside this
        directory; a bad pointer is moved aside (with `move`) so that the next save can write
        it. The resume point never depends on it."""
        pointer = self.directory / LATEST
        found = atomic.describe_path(pointer)
        if found is None and pointer.is_file():
            with atomic.open_file(pointer, errors="replace") as f:
                name = f.read(4096).strip()
            target = self.directory / name
            if _NAME.match(name) is None or (target.exists() and self._outside(target)):
                found = f"naming {name[:200]!r}, which is not a checkpoint of {self.directory}"
        if found:
            where = f"moved to {self._move_damaged(pointer)}" if move else "ignored"
            log.warning("%s is %s: %s; resuming from the newest intact checkpoint of this run",
                        pointer, found, where)

    def resume_point(self, move_damaged: bool = True) -> Path | None:
        """The newest intact checkpoint whose manifest says the loss was healthy, or None when
        there is none (a fresh start).

        Newest first, every checkpoint is verified (`verify`, and that it is a folder of this
        directory, not a link): a damaged one is moved to `damaged/` (with `move_damaged`;
        never deleted) with one warning naming the file and the reason. Raises
        NoIntactCheckpointError naming what was found when checkpoints were found but none is
        intact."""
        self._check_pointer(move_damaged)
        found, diverged, lines = [], [], []
        for path in reversed(self._entries()):
            reason = self._outside(path) or verify(path)
            if reason:
                where = (f"moved to {self._move_damaged(path)}" if move_damaged
                         else "skipped")
                lines.append(f"checkpoint {path} is damaged: {reason}; {where}, trying the "
                             "previous one")
                found.append(f"{path.name} ({reason})")
            elif not is_healthy(path):
                diverged.append(path.name)
            else:
                if diverged:
                    lines.append(f"not resuming from {', '.join(reversed(diverged))}: written "
                                 "while the loss looked diverged (their manifests say so); "
                                 f"resuming from the last good checkpoint {path}")
                break
        else:
            path = None
        for line in lines if path is not None or not found or diverged else []:
            log.warning(line)  # without an intact one, the error below says it all at once
        if path is not None:
            return path
        if found and not diverged:
            raise NoIntactCheckpointError(
                f"no intact checkpoint in {self.directory}: found {'; '.join(found)}; "
                f"{'moved to ' + str(self.directory / DAMAGED) if move_damaged else 'kept'}. "
                "Rerun with --noresume to start afresh (or restore a checkpoint from a backup)")
        return None

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
            arrays = [*model.variables, *(optimizer.variables if optimizer is not None and
                                          optimizer.built else []), *(metrics or [])]
            atomic.require_space(self.directory, nbytes(arrays) + nbytes(average or []))
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".tmp-{final.name}-"))
        except OSError as error:
            raise self._write_error(final, error) from None
        try:
            model.save_weights(tmp / WEIGHTS)
            if optimizer is not None and optimizer.built:
                _save_arrays(tmp / OPTIMIZER, [to_numpy(v) for v in optimizer.variables])
            if average is not None:
                _save_arrays(tmp / AVERAGE, average)
            rng = rng_variables(model)
            if rng:
                _save_arrays(tmp / RNG, [to_numpy(v) for v in rng])
            if metrics:
                _save_arrays(tmp / METRICS, [to_numpy(v) for v in metrics])
            record = CheckpointState.from_dict(
                {**(state or {}), "epoch": epoch, "batch": batch, "healthy": healthy,
                 "version": CheckpointState.VERSION}, final / STATE)
            with open_file(tmp / STATE, "w") as f:
                f.write(record.to_json())
                f.flush()
                os.fsync(f.fileno())
            write_manifest(tmp, epoch, batch, healthy)  # last: it describes the rest
            self._swap_in(tmp, final)  # re-running a position: the new one replaces it
            if healthy:
                write_atomically(self.directory / LATEST, final.name)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError) and not isinstance(error, CheckpointWriteError):
                raise self._write_error(final, error) from None
            raise
        self._rotate()
        return final

    def keep_best(self, checkpoint: str | os.PathLike) -> Path:
        """Copies the intact epoch-end `checkpoint` (of this directory) to `best/`: into a
        temporary folder, flushed, then renamed over the previous best. Raises
        CheckpointWriteError when the disk refuses (the previous best is then intact)."""
        source, final = Path(checkpoint), self.directory / BEST
        # Its regular files (`verify` names anything else, or a missing folder's manifest).
        files = ([p for p in sorted(source.iterdir()) if stat.S_ISREG(os.lstat(p).st_mode)]
                 if source.is_dir() else [])
        try:
            atomic.require_space(self.directory, sum(p.stat().st_size for p in files))
            tmp = Path(tempfile.mkdtemp(dir=self.directory, prefix=f".tmp-{BEST}-"))
        except OSError as error:
            raise self._write_error(final, error) from None
        try:
            # Hashed as copied (save() read the source moments ago: one more read, not two).
            digests = {p.name: _copy_flushed(p, tmp / p.name) for p in files}
            problem = verify(source, digests=digests)
            if problem:
                raise ValueError(f"not keeping {source} as the best checkpoint: {problem}")
            self._swap_in(tmp, final)
        except BaseException as error:
            shutil.rmtree(tmp, ignore_errors=True)
            if isinstance(error, OSError):
                raise self._write_error(final, error) from None
            raise
        return final

    def verify_best(self, epoch: int) -> str | None:
        """Why `best/` cannot be trusted as the copy of the checkpoint after `epoch` epochs
        (missing, a link, or `verify`'s reasons), or None when it is intact."""
        best = self.directory / BEST
        if best.is_symlink() or not best.is_dir():
            return f"{best} is {'a link' if best.is_symlink() else 'missing or not a folder'}"
        return verify(best, position=(epoch, 0))

    def _swap_in(self, tmp: Path, final: Path) -> None:
        """Renames the written folder `tmp` to `final` (flushed both), first moving a previous
        `final` (a link too) aside and deleting it."""
        _fsync_dir(tmp)
        if os.path.lexists(final):
            trash = Path(tempfile.mkdtemp(dir=self.directory, prefix=".trash-"))
            os.replace(final, trash / final.name)
            shutil.rmtree(trash, ignore_errors=True)
        os.replace(tmp, final)
        _fsync_dir(self.directory)

    def _write_error(self, final: Path, error: OSError) -> CheckpointWriteError:
        latest = self.latest()
        intact = f"; the last checkpoint {latest} is intact" if latest else ""
        return CheckpointWriteError(
            error.errno, f"could not write checkpoint {final}: {atomic._reason(error)} "
                         f"({atomic.free_space(self.directory)} there){intact}. Fix: "
                         f"{atomic.fix_for(error, final)} to resume")

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
        """The checkpoint's `CheckpointState` as a dict (older versions migrated);
        `record.RecordError` naming the file and field when it cannot be read."""
        state = CheckpointState.read(Path(path) / STATE, missing_ok=False).to_dict()
        del state["version"]
        return state

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
            values, variables = _load_arrays(path / OPTIMIZER), optimizer.variables
            inner = getattr(optimizer, "inner_optimizer", None)
            if inner is not None and len(values) == len(inner.variables) != len(variables):
                # Written without loss scaling (float32) and resumed under mixed_float16: the
                # saved state is the inner optimizer's; the loss scale starts as a new mixed
                # run's does (it adapts within a few steps).
                variables = inner.variables
                log.info("%s was written without loss scaling: its optimizer state goes into "
                         "the LossScaleOptimizer's inner optimizer; the loss scale starts "
                         "afresh", path)
            _assign(variables, values, "optimizer variables", path / OPTIMIZER)
        state = CheckpointManager.read_state(path)
        if (path / AVERAGE).is_file():
            state["average"] = _load_arrays(path / AVERAGE)
        if (path / METRICS).is_file():
            state["metrics"] = _load_arrays(path / METRICS)
        return state
