"""`tfrecord:PATTERN`: TF-slim style Example shards (data/folder_to_tfrecord.py writes them)."""

from __future__ import annotations

import json
import logging
import os
import threading

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


# Bytes framing each record in an (uncompressed) TFRecord file: its length (8), the length's
# CRC (4) and the data's CRC (4). A shard whose records' bytes sum to less than its size
# stopped early: truncated, or a record failed its CRC.
RECORD_OVERHEAD = 16
# Read buffer of the check that each shard's first record is readable (one small read each).
PROBE_BUFFER_BYTES = 256 << 10
# Stands in for the unreadable rest of a damaged shard: an Example whose image is empty, so
# that the pipeline fails to decode it and skips it, named and counted like a bad image file.
DAMAGED = tf.train.Example(features=tf.train.Features(feature={
    TFRECORD_IMAGE_KEY: tf.train.Feature(bytes_list=tf.train.BytesList(value=[b""])),
    TFRECORD_LABEL_KEY: tf.train.Feature(int64_list=tf.train.Int64List(value=[0])),
})).SerializeToString()


def _named_records(path, size):
    """The readable records of one shard, each named `path#index`; where the shard stops before
    its `size` bytes (truncated or corrupted), one DAMAGED record named after where it stopped
    (TensorFlow's reader cannot resynchronise after a bad record: the rest is lost)."""
    records = tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER_BYTES).ignore_errors()
    marked = records.map(lambda record: (record, False)).concatenate(
        tf.data.Dataset.from_tensors((tf.constant(DAMAGED), True)))

    def count(state, element):
        index, read = state
        record, end = element
        length = tf.cast(tf.strings.length(record), tf.int64) + RECORD_OVERHEAD
        return (index + 1, read + length), (index, read, record, end)

    scanned = marked.scan((tf.constant(0, tf.int64), tf.constant(0, tf.int64)), count)
    kept = scanned.filter(lambda index, read, record, end: tf.logical_or(
        tf.logical_not(end), read < size))

    def name(index, read, record, end):
        where = tf.strings.join([path, "#", tf.strings.as_string(index)])
        damage = tf.strings.join([
            where, " (unreadable from byte ", tf.strings.as_string(read), " of ",
            tf.strings.as_string(size), ": truncated or corrupted; the rest of the shard is "
            "skipped)"])
        return tf.where(end, damage, where), record

    return kept.map(name)


def _sizes(files: list[str]) -> list[int]:
    return [int(tf.io.gfile.stat(f).length) for f in files]


def check_readable(files: list[str], where: str) -> None:
    """Fails in one line naming the shards when none of `files` (empty ones aside) has a
    readable first record: not TFRecord files, compressed ones, or all damaged."""
    sizes = _sizes(files)
    nonempty = [f for f, size in zip(files, sizes) if size > 0]
    if not nonempty:
        return
    probe = tf.data.Dataset.from_tensor_slices(nonempty).interleave(
        lambda f: tf.data.TFRecordDataset(f, buffer_size=PROBE_BUFFER_BYTES).take(1)
        .ignore_errors().map(lambda _: f), cycle_length=min(len(nonempty), CYCLE_LENGTH),
        num_parallel_calls=tf.data.AUTOTUNE)
    if next(iter(probe), None) is None:
        shown = ", ".join(nonempty[:5]) + (f" and {len(nonempty) - 5} more"
                                           if len(nonempty) > 5 else "")
        raise ValueError(f"no readable TFRecord in {where}: every shard is unreadable from its "
                         f"first record ({shown}); expected uncompressed TFRecord files of "
                         f"tf.train.Example (data/folder_to_tfrecord.py writes them)")


# Record counts of splits without a dataset_info.json, by (path, size, modification time) of
# every shard: a run asks a split's size, then opens it, and a count reads every record.
_COUNTS: dict[tuple, int] = {}
_COUNTS_LOCK = threading.Lock()
MAX_COUNTS = 4


def count_records(files: list[str]) -> int:
    """The readable records of `files` (a damaged shard counts up to where it stops), counted
    once while no shard changes size or modification time."""
    key = tuple((f, stat.length, stat.mtime_nsec)
                for f, stat in zip(files, map(tf.io.gfile.stat, files)))
    with _COUNTS_LOCK:
        if key in _COUNTS:
            return _COUNTS[key]
    log.warning("No %s beside %s: counting the records of %d files (reads them all)",
                TFRECORD_INFO_FILE, files[0], len(files))
    readable = tf.data.Dataset.from_tensor_slices(files).flat_map(
        lambda f: tf.data.TFRecordDataset(f).ignore_errors())
    count = int(readable.reduce(np.int64(0), lambda n, _: n + 1))
    with _COUNTS_LOCK:
        _COUNTS[key] = count
        while len(_COUNTS) > MAX_COUNTS:
            _COUNTS.pop(next(iter(_COUNTS)))
    return count


class TFRecordReader(Reader):
    """Reads `tfrecord:PATTERN`: split sizes and class names from the dataset_info.json beside
    the shards (else the records are counted, and `num_classes` must be given for one-hot
    labels); shards are split between workers by file where there are enough of them."""

    def info(self, split: str) -> DatasetInfo:
        files = tfrecord_files(self.argument, split)
        # Before any expensive work: a split none of whose shards can be read is refused.
        check_readable(files, f"{self.source} (split {split!r})")
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
        return DatasetInfo(self.source, split, count_records(files), self.num_classes, None)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        files = tfrecord_files(self.argument, split)
        info = self.info(split)  # checks that the shards are readable
        dataset = tf.data.Dataset.from_tensor_slices((files, np.asarray(_sizes(files), np.int64)))
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
