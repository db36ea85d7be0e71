"""What every source gives the pipeline (`DatasetInfo`, `Records`) and the `Reader` interface."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import tensorflow as tf

# Overrides the default root of generated data (the `digits` folder), like `data_dir` does.
DATA_DIR_ENV = "KERAS_EFFICIENTNET_DATA_DIR"
CACHE_NAME = "keras_efficientnet"


@dataclasses.dataclass(frozen=True)
class DatasetInfo:
    """What a trainer needs before reading: split size (for steps per epoch) and classes.

    Args:
      source: the source string it describes.
      split: the split name.
      num_examples: examples in the split (for image folders, files listed, before any bad file
        is skipped).
      num_classes: number of classes, or None where the source does not record it.
      class_names: class names in label order, or None where unknown.
    """

    source: str
    split: str
    num_examples: int
    num_classes: int | None
    class_names: tuple[str, ...] | None = None


@dataclasses.dataclass(frozen=True)
class Records:
    """A split opened for reading, before decoding.

    `dataset` yields dicts `{"name": file name or record id, "data": file path or encoded
    bytes, "label": int32}`, or `{"image": uint8, "label": int32}` when `decoded`
    (synthetic). Sources that carry object boxes add `"boxes"`: a `tf.io.serialize_tensor` of
    float32 `[N, 4]` normalized `[ymin, xmin, ymax, xmax]` (serialized, so that records with
    different N batch together), which the training crop must overlap. `sharded` says the
    reader already split its files between input pipelines.

    `exact_count` says every one of `info.num_examples` records decodes, because the library
    wrote or verified the data itself (digits, Fashion-MNIST, synthetic): the pipeline then
    gives one pass a known number of batches, and an image that fails to decode anyway is
    damaged library data, an error that says how to `repair` it, never a silent skip. User
    data (folders, TFRecords, tfds) leaves it False: a corrupt photo is skipped and counted.
    """

    dataset: tf.data.Dataset
    info: DatasetInfo
    data_is_path: bool = False
    decoded: bool = False
    sharded: bool = False
    exact_count: bool = False
    repair: str = ""


class Reader:
    """One kind of source, e.g. `folder:PATH`: what a split holds and how to read it.

    A new source is a subclass in its own module and one row in `source_table.SOURCE_TABLE`. Readers
    are cheap to build (no I/O in `__init__`); `info` and `records` check that the split exists
    and fail in one line naming what is valid.

    Args:
      source: the whole source string (for messages and `DatasetInfo`).
      argument: what follows `kind:` ('' for kinds that take none).
      data_dir: where generated or installed data lives (tfds data_dir, digits root, the
        Fashion-MNIST files), None for the reader's default.
      num_classes: classes where the source does not record them (TFRecords without
        dataset_info.json; the label range of 'synthetic').
      label_offset: subtracted from stored labels (1 for TF-slim style ImageNet TFRecords).
      allow_empty_classes: keep a class folder without images as a class (with a warning)
        instead of refusing it (image folder sources).
      hold_out: a `folder_layout.HoldOut`: where an image folder has no held-out split, its
        held-out split is this share of the pool split's classes, and the pool the rest
        (image folder sources; None: no hold-out).
    """

    def __init__(self, source: str, argument: str = "", *,
                 data_dir: str | os.PathLike | None = None, num_classes: int | None = None,
                 label_offset: int = 0, allow_empty_classes: bool = False,
                 hold_out=None):
        self.source = source
        self.argument = argument
        self.data_dir = data_dir
        self.num_classes = num_classes
        self.label_offset = label_offset
        self.allow_empty_classes = allow_empty_classes
        self.hold_out = hold_out

    def info(self, split: str) -> DatasetInfo:
        """Size and classes of `split`, without building a pipeline."""
        raise NotImplementedError

    def records(self, split: str, *, input_context: tf.distribute.InputContext | None = None,
                shuffle_files: bool = False, seed: int | None = None,
                image_size: int = 224) -> Records:
        """`split` opened for the pipeline (see `Records`). Unshuffled reads come in a fixed
        order that samples every class from the start (what `--eval_steps` reads)."""
        raise NotImplementedError


def default_data_dir() -> Path:
    """Root for generated data: $KERAS_EFFICIENTNET_DATA_DIR, else `$XDG_CACHE_HOME/
    keras_efficientnet`, else `~/.cache/keras_efficientnet`. Never inside the installed
    package or a source checkout."""
    if os.environ.get(DATA_DIR_ENV):
        return Path(os.environ[DATA_DIR_ENV])
    cache = os.environ.get("XDG_CACHE_HOME")
    # XDG: a relative value is invalid and must be ignored.
    base = Path(cache) if cache and os.path.isabs(cache) else Path.home() / ".cache"
    return base / CACHE_NAME


def serialized_boxes(boxes: tf.Tensor) -> tf.Tensor:
    """Object boxes as `Records` carries them: a serialized float32 `[N, 4]` tensor."""
    return tf.io.serialize_tensor(tf.reshape(tf.cast(boxes, tf.float32), [-1, 4]))
