"""`tfrecord:PATTERN`: TF-slim style Example shards (data/folder_to_tfrecord.py writes them)."""

from __future__ import annotations

import json
import logging
import os

import numpy as np
import tensorflow as tf

from keras_efficientnet.datasets.sources.base import (
    DatasetInfo,
    Reader,
    Records,
    serialized_boxes,
)

log = logging.getLogger(__name__)

TFRECORD_IMAGE_KEY = "image/encoded"
TFRECORD_LABEL_KEY = "image/class/label"
# Object boxes of TF-slim style ImageNet records (normalized; absent keys read as no boxes).
TFRECORD_BOX_KEYS = tuple(f"image/object/bbox/{k}" for k in ("ymin", "xmin", "ymax", "xmax"))
# Written next to TFRecord shards by data/folder_to_tfrecord.py: class names and split sizes.
TFRECORD_INFO_FILE = "dataset_info.json"
# Shards read at once, and each one's read buffer.
CYCLE_LENGTH = 16
READ_BUFFER_BYTES = 8 << 20


def tfrecord_files(pattern: str, split: str) -> list[str]:
    """The sorted files of `split`: `pattern` with `{split}` filled in, `pattern/<split>-*` when
    `pattern` is a directory, else the glob `pattern` itself."""
    if "{split}" in pattern:
        glob = pattern.replace("{split}", split)
    elif tf.io.gfile.isdir(pattern):
        glob = os.path.join(pattern, f"{split}-*")
    else:
        glob = pattern
    files = sorted(tf.io.gfile.glob(glob))
    if not files:
        raise FileNotFoundError(
            f"no TFRecord files match {glob!r} (source 'tfrecord:{pattern}', split {split!r}); "
            f"give a directory holding {split}-* shards, a glob, or a pattern with '{{split}}'")
    return files


def _parse_fn(label_offset: int):
    features = {
        TFRECORD_IMAGE_KEY: tf.io.FixedLenFeature([], tf.string),
        TFRECORD_LABEL_KEY: tf.io.FixedLenFeature([], tf.int64),
        **{key: tf.io.VarLenFeature(tf.float32) for key in TFRECORD_BOX_KEYS},
    }

    def parse(name, record):
        example = tf.io.parse_single_example(record, features)
        label = tf.cast(example[TFRECORD_LABEL_KEY] - label_offset, tf.int32)
        boxes = tf.stack([example[key].values for key in TFRECORD_BOX_KEYS], axis=1)
        return {"name": name, "data": example[TFRECORD_IMAGE_KEY], "label": label,
                "boxes": serialized_boxes(boxes)}

    return parse


def _named_records(path):
    """The records of one shard, each named `path#index`."""
    records = tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES)
    return records.enumerate().map(
        lambda i, record: (tf.strings.join([path, "#", tf.strings.as_string(i)]), record))


class TFRecordReader(Reader):
    """Reads `tfrecord:PATTERN`: split sizes and class names from the dataset_info.json beside
    the shards (else the records are counted, and `num_classes` must be given for one-hot
    labels); shards are split between workers by file where there are enough of them."""

    usage = "'tfrecord:PATTERN'"
    example = "tfrecord:/data/imagenet-tfrecords"

    def info(self, split: str) -> DatasetInfo:
        files = tfrecord_files(self.argument, split)
        sidecar = os.path.join(os.path.dirname(files[0]), TFRECORD_INFO_FILE)
        if tf.io.gfile.exists(sidecar):
            with tf.io.gfile.GFile(sidecar) as f:
                meta = json.load(f)
            names = meta.get("class_names")
            if split in meta.get("splits", {}):
                count = int(meta["splits"][split]["num_examples"])
                return DatasetInfo(self.source, split, count,
                                   len(names) if names else self.num_classes,
                                   tuple(names) if names else None)
        log.warning("No %s beside %s: counting the records of %d files (reads them all)",
                    TFRECORD_INFO_FILE, files[0], len(files))
        count = int(tf.data.TFRecordDataset(files).reduce(np.int64(0), lambda n, _: n + 1))
        return DatasetInfo(self.source, split, count, self.num_classes, None)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        files = tfrecord_files(self.argument, split)
        info = self.info(split)
        dataset = tf.data.Dataset.from_tensor_slices(files)
        sharded = False
        if input_context is not None and len(files) >= input_context.num_input_pipelines:
            # Shard files, not records, so that each worker reads only its own files.
            dataset = dataset.shard(input_context.num_input_pipelines,
                                    input_context.input_pipeline_id)
            sharded = True
        if shuffle_files:
            dataset = dataset.shuffle(len(files), seed=seed, reshuffle_each_iteration=True)
        dataset = dataset.interleave(_named_records, cycle_length=min(len(files), CYCLE_LENGTH),
                                     num_parallel_calls=tf.data.AUTOTUNE)
        dataset = dataset.map(_parse_fn(self.label_offset), num_parallel_calls=tf.data.AUTOTUNE)
        return Records(dataset, info, sharded=sharded)
