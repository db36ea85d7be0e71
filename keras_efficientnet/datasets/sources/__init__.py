"""Dataset sources named by one string (`kind` or `kind:argument`), one module per kind.

`source_table.SOURCE_TABLE` (plain Python) names each kind's `Reader` (see `base.Reader`);
`create_reader` parses a source string and builds the reader, which `dataset_info` and
`read_records` (the pipeline's entry) ask. Adding a source is one module with a `Reader`
subclass and one row in `SOURCE_TABLE`.
"""

from __future__ import annotations

import os

import tensorflow as tf

from keras_efficientnet.datasets.folder_layout import HoldOut
from keras_efficientnet.datasets.source_table import SOURCE_TABLE, parse_source
from keras_efficientnet.datasets.sources.base import (
    DATA_DIR_ENV,
    DatasetInfo,
    Reader,
    Records,
    default_data_dir,
)
from keras_efficientnet.datasets.sources.digits import prepare_digits
from keras_efficientnet.datasets.sources.folder import IMAGE_EXTENSIONS, list_image_folder
from keras_efficientnet.datasets.sources.synthetic import (
    SYNTHETIC_EXAMPLES,
    SYNTHETIC_NUM_CLASSES,
)
from keras_efficientnet.datasets.sources.tfrecord import (
    TFRECORD_BOX_KEYS,
    TFRECORD_IMAGE_KEY,
    TFRECORD_INFO_FILE,
    TFRECORD_LABEL_KEY,
    tfrecord_files,
)


def create_reader(source: str, *, data_dir: str | os.PathLike | None = None,
                  num_classes: int | None = None, label_offset: int = 0,
                  allow_empty_classes: bool = False, hold_out: HoldOut | None = None
                  ) -> Reader:
    """The reader of `source` (see `base.Reader` for the arguments).

    Example:
      >>> reader = create_reader("folder:/data/photos")
      >>> reader.info("train").num_classes
    """
    kind, argument = parse_source(source)
    reader = SOURCE_TABLE[kind].reader_class()
    return reader(source, argument, data_dir=data_dir, num_classes=num_classes,
                  label_offset=label_offset, allow_empty_classes=allow_empty_classes,
                  hold_out=hold_out)


def dataset_info(source: str, split: str, data_dir: str | os.PathLike | None = None,
                 num_classes: int | None = None, allow_empty_classes: bool = False,
                 hold_out: HoldOut | None = None) -> DatasetInfo:
    """Size and classes of `split` of `source`, without building a pipeline.

    Example:
      >>> info = dataset_info("digits", "train")
      >>> steps_per_epoch = info.num_examples // batch_size
    """
    return create_reader(source, data_dir=data_dir, num_classes=num_classes,
                         allow_empty_classes=allow_empty_classes, hold_out=hold_out).info(split)


def read_records(source: str, split: str, *, data_dir: str | os.PathLike | None = None,
                 input_context: tf.distribute.InputContext | None = None,
                 shuffle_files: bool = False, seed: int | None = None, image_size: int = 224,
                 num_classes: int | None = None, label_offset: int = 0,
                 allow_empty_classes: bool = False, hold_out: HoldOut | None = None
                 ) -> Records:
    """Opens `split` of `source` for the pipeline (see `Records`); checks it exists first.

    Unshuffled reads (`shuffle_files=False`, evaluation) of image folders come in a fixed
    random order rather than sorted by class, so that reading only the first batches samples
    every class; tfds and TFRecord splits keep the order they were written in (shuffled at
    preparation: data/folder_to_tfrecord.py and tfds both do).
    """
    reader = create_reader(source, data_dir=data_dir, num_classes=num_classes,
                           label_offset=label_offset, allow_empty_classes=allow_empty_classes,
                           hold_out=hold_out)
    return reader.records(split, input_context=input_context, shuffle_files=shuffle_files,
                          seed=seed, image_size=image_size)


__all__ = [
    "DATA_DIR_ENV", "IMAGE_EXTENSIONS", "SOURCE_TABLE", "SYNTHETIC_EXAMPLES",
    "SYNTHETIC_NUM_CLASSES", "TFRECORD_BOX_KEYS", "TFRECORD_IMAGE_KEY", "TFRECORD_INFO_FILE",
    "TFRECORD_LABEL_KEY", "DatasetInfo", "HoldOut", "Reader", "Records", "create_reader",
    "dataset_info", "default_data_dir", "list_image_folder", "parse_source", "prepare_digits",
    "read_records", "tfrecord_files",
]
