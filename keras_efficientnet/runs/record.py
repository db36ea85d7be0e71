"""The run directory's files and records: the one owner of every file name a run writes, and of
the typed, versioned records in them (run config, checkpoint state, best record, results).

Plain Python (standard library only), so that the command line and `open_run` read a run before
any framework loads. Paths inside a run are stored relative to it, so a moved or copied run
still names its own files. A record written by an older version loads (it is migrated as it is
read); an unknown field, a field of the wrong type or a record from a newer version is refused
with one line naming the file and the field.

Example:
    >>> files = RunFiles("runs/b0")
    >>> files.best_model                      # runs/b0/best.keras
    >>> best = BestRecord.read(files.best_record)   # None when the run has no best yet
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from pathlib import Path
from typing import Any, ClassVar

from keras_efficientnet.atomic import UnsafePathError, open_file

# --- The run directory (`--model_dir`) ---
CONFIG = "config.json"  # RunConfig: the resolved configuration, classes and resolutions
CHECKPOINTS = "checkpoints"  # the checkpoint folders (training/checkpoint.py)
LOGS = "logs"  # TensorBoard
MODEL = "model.keras"  # the final model, softmax head (training/export.py)
BEST_MODEL = "best.keras"  # the best validated model (training/validation.py)
BEST_RECORD = "best.json"  # BestRecord: which epoch that was, its scores and weights
FINETUNED_WEIGHTS = "finetuned.weights.h5"  # the fine-tuned weights (logits head)
CLASS_NAMES = "class_names.json"  # the class names in label order, beside model.keras
METRICS = "metrics.csv"  # one row per epoch (training/reporting.py)
LOCK = "run.lock"  # the owner of the run (training/run_dir.py)
PREVIOUS = "previous"  # where a fresh run moves an earlier run's files
RESULTS = "results.json"  # Results of a training run; results-<mode>.json of the others
# What a run writes into its model_dir (glob patterns): a fresh run moves these aside.
RUN_ENTRIES = (CHECKPOINTS, LOGS, "results*.json", "*.weights.h5", "*.keras", CONFIG, METRICS,
               CLASS_NAMES, BEST_RECORD)

# The run's own regular files (results-<mode>.json besides): each must be a regular file or
# absent, never a link, pipe or folder (checked when a run takes its directory).
RUN_FILES = (CONFIG, METRICS, BEST_RECORD, BEST_MODEL, MODEL, CLASS_NAMES, FINETUNED_WEIGHTS,
             RESULTS, LOCK)

# --- Inside `checkpoints/` ---
LATEST = "LATEST"  # names the newest healthy checkpoint (for people; never trusted)
CHECKPOINT_PREFIX = "epoch-"  # epoch-0003, epoch-0003-batch-000017
BEST_CHECKPOINT = "best"  # the copy of the best-validated checkpoint
DAMAGED = "damaged"  # where a resume moves checkpoints that fail verification
# Left by interrupted saves: the temporary folder, a replaced folder on its way out, and the
# temporary file of the LATEST pointer. Never a checkpoint to load.
TEMPORARY = (".tmp-", ".trash-", f".{LATEST}.")

# --- Inside one checkpoint folder ---
WEIGHTS = "model.weights.h5"
OPTIMIZER = "optimizer.npz"
AVERAGE = "average.npz"
RNG = "rng.npz"  # random-generator states (dropout, stochastic depth)
METRIC_SUMS = "metrics.npz"  # the metrics' running sums mid-epoch
STATE = "state.json"  # CheckpointState
MANIFEST = "manifest.json"  # written last: every other file's size and SHA-256

# Not a run's file: the member of a `.keras` zip that holds the model's config (Keras' format).
KERAS_ARCHIVE_CONFIG = "config.json"


def results_name(mode: str, trains: bool) -> str:
    """`results.json` for a mode that trains (`training.modes.Mode.trains`);
    `results-<mode>.json` for the others (evaluate, finetune), which work on an earlier run's
    weights and must not overwrite its results."""
    return RESULTS if trains else f"results-{mode}.json"


@dataclasses.dataclass(frozen=True)
class RunFiles:
    """The paths of a run directory's files.

    Args:
        root: the run directory.
    """

    root: Path

    def __init__(self, root: str | os.PathLike):
        object.__setattr__(self, "root", Path(root))

    config = property(lambda self: self.root / CONFIG)
    checkpoints = property(lambda self: self.root / CHECKPOINTS)
    best_checkpoint = property(lambda self: self.root / CHECKPOINTS / BEST_CHECKPOINT)
    logs = property(lambda self: self.root / LOGS)
    model = property(lambda self: self.root / MODEL)
    best_model = property(lambda self: self.root / BEST_MODEL)
    best_record = property(lambda self: self.root / BEST_RECORD)
    finetuned_weights = property(lambda self: self.root / FINETUNED_WEIGHTS)
    class_names = property(lambda self: self.root / CLASS_NAMES)
    metrics = property(lambda self: self.root / METRICS)
    lock = property(lambda self: self.root / LOCK)
    previous = property(lambda self: self.root / PREVIOUS)

    def results(self, mode: str | None = None) -> Path:
        """The results file of the run's training (`mode` None), or of a `mode` that does not
        train (`results-<mode>.json`)."""
        return self.root / results_name(mode or "", trains=mode is None)

    def relative(self, path: str | os.PathLike | None) -> str | None:
        """`path` relative to the run when it lies inside it (as records store it), else as
        given (a file elsewhere, e.g. an --export_dir)."""
        if path is None:
            return None
        try:
            return Path(path).resolve().relative_to(self.root.resolve()).as_posix()
        except ValueError:
            return str(path)

    def absolute(self, stored: str | None) -> Path | None:
        """A path as a record stores it, made a path of this run (relative ones are joined)."""
        return None if stored is None else self.root / stored


class RecordError(ValueError):
    """A record file cannot be read: unreadable, not JSON, an unknown or wrong-typed field, or
    a newer version. The message is one line naming the file and the field."""


def _type_names(types: tuple) -> str:
    names = {bool: "true/false", int: "an integer", float: "a number", str: "a string",
             list: "a list", dict: "an object", type(None): "null"}
    return " or ".join(names[t] for t in types)


def _fits(value, types: tuple) -> bool:
    if isinstance(value, bool):  # JSON's true is no number
        return bool in types
    if isinstance(value, int) and float in types:
        return True
    return isinstance(value, types)


def strict(value):
    """`value` with NaN and infinities as null and NumPy scalars as Python numbers, so that
    it is strict JSON (Python's json writes NaN, which other readers reject)."""
    if isinstance(value, dict):
        return {str(k): strict(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [strict(v) for v in value]
    if hasattr(value, "item") and getattr(value, "ndim", 1) == 0:
        value = value.item()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, os.PathLike):
        return os.fspath(value)
    return value


def non_finite(values, prefix: str = "") -> list[str]:
    """The names of the numbers in `values` (a dict, list or number, nested) that are NaN or
    infinite: `loss`, `history[2].val_loss`. Strict JSON stores them as null; this says which
    nulls were not finite rather than absent."""
    if isinstance(values, dict):
        return [name for key, value in values.items()
                for name in non_finite(value, f"{prefix}.{key}" if prefix else str(key))]
    if isinstance(values, (list, tuple)):
        return [name for i, value in enumerate(values)
                for name in non_finite(value, f"{prefix}[{i}]")]
    if hasattr(values, "item") and getattr(values, "ndim", 1) == 0:
        values = values.item()
    if isinstance(values, float) and not math.isfinite(values):
        return [prefix]
    return []


class Record:
    """A typed record stored as one JSON object with a `version` field.

    Subclasses are frozen dataclasses with `FILE` (the name, for messages), `VERSION` (what this
    code writes) and `TYPES` (field -> allowed JSON types); `_migrate(data, version, path)` turns
    an older version's fields into the current ones.
    """

    FILE: ClassVar[str]
    VERSION: ClassVar[int]
    TYPES: ClassVar[dict[str, tuple]]

    @classmethod
    def _migrate(cls, data: dict, version: int, path: Path | None) -> dict:
        return data

    @classmethod
    def from_dict(cls, data: Any, path: str | os.PathLike | None = None):
        """The record from a decoded JSON object; RecordError naming `path` and the field."""
        where = str(path) if path is not None else cls.FILE
        if not isinstance(data, dict):
            raise RecordError(f"{where}: not a {cls.__name__} record (a JSON object), found "
                              f"{type(data).__name__}")
        data = dict(data)
        version = data.pop("version", 1)
        if isinstance(version, bool) or not isinstance(version, int) or version < 1:
            raise RecordError(f"{where}: field 'version' must be a positive integer, found "
                              f"{version!r}")
        if version > cls.VERSION:
            raise RecordError(f"{where}: version {version} of the {cls.__name__} record is newer "
                              f"than this keras-efficientnet reads ({cls.VERSION}); upgrade "
                              "keras-efficientnet")
        if version < cls.VERSION:
            data = cls._migrate(data, version, None if path is None else Path(path))
        known = {f.name: f for f in dataclasses.fields(cls)}
        for name, value in data.items():
            if name not in known:
                raise RecordError(f"{where}: unknown field {name!r} in a {cls.__name__} record "
                                  f"(version {version}; fields: {', '.join(known)})")
            if not _fits(value, cls.TYPES[name]):
                raise RecordError(f"{where}: field {name!r} must be "
                                  f"{_type_names(cls.TYPES[name])}, found {value!r}"[:400])
        missing = [name for name, f in known.items() if name not in data
                   and f.default is dataclasses.MISSING
                   and f.default_factory is dataclasses.MISSING]
        if missing:
            raise RecordError(f"{where}: field {missing[0]!r} is missing from the "
                              f"{cls.__name__} record")
        return cls(**data)

    def to_dict(self) -> dict:
        """The fields as JSON values (version first)."""
        return {"version": self.VERSION,
                **{f.name: strict(getattr(self, f.name)) for f in dataclasses.fields(self)}}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, allow_nan=False) + "\n"

    @classmethod
    def read(cls, path: str | os.PathLike, missing_ok: bool = True):
        """The record in `path`; None when the file does not exist (with `missing_ok`).
        RecordError (one line, naming the file) when it cannot be read or is not a record."""
        path = Path(path)
        if missing_ok and not os.path.lexists(path):
            return None
        try:
            with open_file(path) as f:
                text = f.read()
        except UnsafePathError as error:
            raise RecordError(str(error)) from None
        except (OSError, UnicodeDecodeError) as error:
            reason = getattr(error, "strerror", None) or str(error)
            raise RecordError(f"{path}: cannot be read ({reason}); restore it or remove it"
                              ) from None
        try:
            data = json.loads(text)
        except ValueError as error:
            raise RecordError(f"{path}: not JSON ({str(error).splitlines()[0]}); restore it or "
                              "remove it") from None
        return cls.from_dict(data, path)

    def write(self, path: str | os.PathLike) -> Path:
        """Writes the record to `path` atomically (never through a link); returns the path."""
        from keras_efficientnet.atomic import write_atomically

        return write_atomically(Path(path), self.to_json())


_INT, _NUM, _STR, _BOOL = (int,), (float,), (str,), (bool,)
_NONE = type(None)


@dataclasses.dataclass(frozen=True)
class RunConfig(Record):
    """`config.json`: the run's TrainConfig fields, classes and resolved resolutions.

    Version 1 (no `version` field) has the same fields."""

    FILE: ClassVar[str] = CONFIG
    VERSION: ClassVar[int] = 2
    TYPES: ClassVar[dict[str, tuple]] = {
        "config": (dict,), "num_classes": _INT, "class_names": (list, _NONE),
        "train_resolution": _INT, "test_resolution": _INT}

    config: dict
    num_classes: int
    train_resolution: int
    test_resolution: int
    class_names: list | None = None

    @classmethod
    def from_dict(cls, data: Any, path: str | os.PathLike | None = None) -> RunConfig:
        record = super().from_dict(data, path)
        if record.class_names is not None and not all(isinstance(n, str)
                                                       for n in record.class_names):
            raise RecordError(f"{path or cls.FILE}: field 'class_names' must be a list of "
                              "strings")
        return record


@dataclasses.dataclass(frozen=True)
class CheckpointState(Record):
    """`state.json` in a checkpoint folder: the position (epochs done, batches of the next),
    whether the loss looked healthy, and the trainer's state (config, classes, step, history).

    Version 1 (no `version` field) has the same fields."""

    FILE: ClassVar[str] = STATE
    VERSION: ClassVar[int] = 2
    TYPES: ClassVar[dict[str, tuple]] = {
        "epoch": _INT, "batch": _INT, "healthy": _BOOL, "global_step": (int, _NONE),
        "config": (dict, _NONE), "num_classes": (int, _NONE), "history": (list,)}

    epoch: int
    batch: int = 0
    healthy: bool = True
    global_step: int | None = None
    config: dict | None = None
    num_classes: int | None = None
    history: list = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class BestRecord(Record):
    """`best.json`: the best validation of the run so far: its phase ("train", or "finetune"
    when the fine-tuned model won), epoch, scores, which weights were scored (`weights`), the
    model file (`file`, relative to the run), the checkpoint copy (`checkpoint`, relative; null
    for a fine-tune), the checkpoint it copies (`checkpoint_of`) and which of its files hold the
    scored weights.

    Version 1 stored `file` and `checkpoint` as absolute paths, which name another run's files
    once the run is moved; its writer only ever wrote `best.keras` and `checkpoints/best`, so
    they are read as those."""

    FILE: ClassVar[str] = BEST_RECORD
    VERSION: ClassVar[int] = 2
    TYPES: ClassVar[dict[str, tuple]] = {
        "phase": _STR, "epoch": _INT, "val_top1": _NUM, "val_top5": (float, _NONE),
        "val_loss": (float, _NONE), "weights": _STR, "file": _STR, "checkpoint": (str, _NONE),
        "checkpoint_of": (str, _NONE), "scored_weights": (str, _NONE),
        "finetune_epochs": (int, _NONE)}

    phase: str
    epoch: int
    val_top1: float
    weights: str
    val_top5: float | None = None
    val_loss: float | None = None
    file: str = BEST_MODEL
    checkpoint: str | None = None
    checkpoint_of: str | None = None
    scored_weights: str | None = None
    finetune_epochs: int | None = None

    @classmethod
    def _migrate(cls, data: dict, version: int, path: Path | None) -> dict:
        data = dict(data)
        if isinstance(data.get("file"), str):
            data["file"] = BEST_MODEL
        if isinstance(data.get("checkpoint"), str):
            data["checkpoint"] = f"{CHECKPOINTS}/{BEST_CHECKPOINT}"
        if data.get("finetune_epochs", 0) is None:
            data.pop("finetune_epochs")
        return data


# Results' fields and their types. The scores come one-pass and with flip test-time
# augmentation, in the finetune modes also before the fine-tune.
_SCORES = {f"{flip}{name}{when}": (float, _NONE) for flip in ("", "flip_")
           for name in ("top1", "top5", "loss") for when in ("", "_before_finetune")}


@dataclasses.dataclass(frozen=True)
class Results(Record):
    """`results.json` (or `results-<mode>.json`): what the run measured and wrote. `checkpoint`
    and `model_file` are relative to the run; `weights` says which weights were scored. A score
    that was NaN or infinite is stored as null (strict JSON) and named in `non_finite`
    (`["loss", "history[1].val_loss"]`), so a null says "not finite" rather than "not measured".

    Version 1 stored `checkpoint` and `model_file` as absolute paths: read relative to the run
    where they lie inside it. Version 2 had no `non_finite` (its NaNs were plain nulls)."""

    FILE: ClassVar[str] = RESULTS
    VERSION: ClassVar[int] = 3
    TYPES: ClassVar[dict[str, tuple]] = {
        "mode": _STR, "model": _STR, "dataset": _STR, "global_batch_size": _INT,
        "num_classes": _INT, "train_examples": _INT, "eval_examples": _INT, "config": (dict,),
        "eval_images_scored": (int, _NONE),
        "epochs": (int, _NONE), "train_resolution": (int, _NONE),
        "test_resolution": (int, _NONE), "images_per_second": (float, _NONE),
        "history": (list, _NONE), "best": (dict, _NONE), "checkpoint": (str, _NONE),
        "weights": (str, _NONE), "finetune_epochs": (int, _NONE),
        "finetune_global_batch_size": (int, _NONE),
        "finetune_images_per_second": (float, _NONE), "model_file": (str, _NONE),
        "export_dir": (str, _NONE), "skipped_images": (int, _NONE),
        "wall_seconds": (float, _NONE), "non_finite": (list, _NONE),
        "environment": (dict, _NONE), **_SCORES}

    mode: str
    model: str
    dataset: str
    global_batch_size: int
    num_classes: int
    train_examples: int
    eval_examples: int
    config: dict
    # Of eval_examples, how many each score covers (--eval_steps batches; absent before 0.1).
    eval_images_scored: int | None = None
    epochs: int | None = None
    train_resolution: int | None = None
    test_resolution: int | None = None
    images_per_second: float | None = None
    history: list | None = None
    best: dict | None = None
    checkpoint: str | None = None
    weights: str | None = None
    finetune_epochs: int | None = None
    finetune_global_batch_size: int | None = None
    finetune_images_per_second: float | None = None
    model_file: str | None = None
    export_dir: str | None = None
    skipped_images: int | None = None
    wall_seconds: float | None = None
    non_finite: list | None = None
    # Where it ran (runs/environment.py): CPU, Keras, its backend and, under TensorFlow, whether
    # oneDNN was on. Absent from results written before the trainer recorded it (within 0.1.0).
    environment: dict | None = None
    top1: float | None = None
    top5: float | None = None
    loss: float | None = None
    flip_top1: float | None = None
    flip_top5: float | None = None
    flip_loss: float | None = None
    top1_before_finetune: float | None = None
    top5_before_finetune: float | None = None
    loss_before_finetune: float | None = None
    flip_top1_before_finetune: float | None = None
    flip_top5_before_finetune: float | None = None
    flip_loss_before_finetune: float | None = None

    @classmethod
    def _migrate(cls, data: dict, version: int, path: Path | None) -> dict:
        if path is None or version >= 2:  # version 2 differs only by the absent non_finite
            return data
        files = RunFiles(path.parent)
        return {**data, **{name: files.relative(data[name]) for name in ("checkpoint",
                                                                          "model_file")
                           if isinstance(data.get(name), str)}}

    @classmethod
    def of(cls, values: dict, path: str | os.PathLike) -> Results:
        """The record of a results dict as the trainer builds it, to be written to `path` in
        the run (absolute paths inside the run made relative); RecordError naming the field
        when one does not fit."""
        files = RunFiles(Path(path).parent)
        values = {**values, "non_finite": non_finite(
            {k: v for k, v in values.items() if k != "non_finite"}) or None}
        values = strict({**values, **{name: files.relative(values[name])
                                      for name in ("checkpoint", "model_file")
                                      if values.get(name) is not None}})
        return cls.from_dict({**values, "version": cls.VERSION}, path)

    def scores(self) -> dict:
        """The scores present (`_SCORES` names that are not null)."""
        return {name: getattr(self, name) for name in _SCORES if getattr(self, name) is not None}


def read_metrics(path: str | os.PathLike) -> list[dict]:
    """The rows of a run's metrics.csv (METRICS), as dicts of floats (None for empty cells)."""
    with open_file(path, newline="") as f:
        return [{k: (float(v) if v != "" else None) for k, v in row.items()}
                for row in csv.DictReader(f)]
