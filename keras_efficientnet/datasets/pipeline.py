"""The host input pipeline: one composer from a source string to batches of uint8 images."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import tensorflow as tf

from keras_efficientnet.datasets import mixing, preprocessing, sources

log = logging.getLogger(__name__)

AUTOTUNE = tf.data.AUTOTUNE
# Images decoded per guarded call: big enough that the per-call cost of the nested dataset
# that catches decode errors is ~1% of the decode time, small enough to keep every core busy.
GUARD_BLOCK = 32
# Records (encoded images) held for shuffling tfds/TFRecord sources: ~1 GB of ImageNet JPEGs.
# Folder sources shuffle their whole file list instead (file names are small).
DEFAULT_SHUFFLE_BUFFER = 10_000


class NoReadableImagesError(ValueError):
    """A whole pass over a split's records yielded no image: every one failed to decode."""


class SkipCounter:
    """Counts unreadable images the pipeline skipped, and logs each one once, by name.

    Thread-safe (tf.data calls it from its own threads). `count` is the number of distinct
    images skipped and `names` the first `max_names` of them; a file that fails again in a later
    pass is neither logged nor counted again. `error` holds the `NoReadableImagesError` a
    dataset raised through it, for the trainer to report without TensorFlow's wrapping.

    Example:
      >>> counter = SkipCounter()
      >>> dataset = make_dataset("folder:/photos", "train", ..., skip_counter=counter)
      >>> model.fit(dataset); print(counter.count, counter.names[:5])
    """

    def __init__(self, max_names: int = 1000):
        self.max_names = max_names
        self.count = 0
        self.names: list[str] = []
        self.error: NoReadableImagesError | None = None
        self._seen: set[str] = set()
        self._lock = threading.Lock()

    def report(self, names) -> np.int64:
        """Records `names` (a string tensor or iterable) as skipped; returns the running count."""
        values = names.numpy() if hasattr(names, "numpy") else names
        with self._lock:
            for name in np.atleast_1d(values):
                name = name.decode("utf-8", "replace") if isinstance(name, bytes) else str(name)
                if name in self._seen:
                    continue
                self._seen.add(name)
                self.count += 1
                if len(self.names) < self.max_names:
                    self.names.append(name)
                log.warning("Skipped unreadable image %s (%d skipped so far)", name, self.count)
            return np.int64(self.count)

    def reset(self) -> None:
        with self._lock:
            self.count = 0
            self.names = []
            self.error = None
            self._seen = set()


class _PassGuard:
    """One dataset's reports: forwards skipped names to the counter and raises
    NoReadableImagesError once `share` distinct records (one pass over this pipeline's records)
    failed while none succeeded, instead of looping over them forever."""

    def __init__(self, counter: SkipCounter, share: int, where: str):
        self.counter = counter
        self.share = max(1, share)
        self.where = where
        self.succeeded = 0
        self.failed: set[bytes] = set()
        self._lock = threading.Lock()

    def report(self, names, succeeded) -> np.int64:
        values = names.numpy() if hasattr(names, "numpy") else names
        values = [bytes(v) for v in np.atleast_1d(values)]
        count = self.counter.report(values) if values else np.int64(self.counter.count)
        with self._lock:
            self.succeeded += int(succeeded)
            self.failed.update(values)
            if self.succeeded == 0 and len(self.failed) >= self.share:
                first = min(self.failed).decode("utf-8", "replace")
                error = NoReadableImagesError(
                    f"no readable images in {self.where} ({len(self.failed)} skipped, e.g. "
                    f"{first}): check that the files are images (.jpg/.png) and not truncated")
                self.counter.error = error
                raise error
        return count


# The counter make_dataset reports to unless given another.
SKIPPED = SkipCounter()


def _seed(seed: int | None, stream: int) -> int | None:
    # Independent streams (shuffle, per-image, per-batch) from one user seed.
    return None if seed is None else seed * 7919 + stream


def _guarded_map(dataset, fn, guard: _PassGuard, deterministic: bool | None,
                 seed: int | None | bool = False, count_successes: bool = True):
    """`dataset.map(fn)` that skips the records `fn` fails on and reports each one by name.

    tf.data has no per-element try/except, and `ignore_errors` drops failures silently. So each
    block of GUARD_BLOCK records runs through its own small dataset with `ignore_errors`; the
    positions that come out of it tell which records failed, and their names (and how many
    succeeded, unless `count_successes` is False) go to `guard`. Labels travel inside the
    records, so a skip never shifts them. Returns batches (blocks) of up to GUARD_BLOCK outputs.
    Unless `seed` is False each record also gets a stateless seed (shape-[2] int64, key "seed")
    from a stream seeded by `seed` (None: nondeterministic).
    """
    probe = dataset.map(lambda r: fn(dict(r, seed=tf.zeros([2], tf.int64))))
    # A block where every record failed has no batch to carry its (no) positions: an empty
    # batch stands in. Zero-size, so appending it copies nothing.
    empty = tf.nest.map_structure(
        lambda spec: tf.zeros([0, *spec.shape], spec.dtype), probe.element_spec)
    blocks = dataset.batch(GUARD_BLOCK)
    if seed is not False:
        # One seed per record, drawn after shuffle/repeat so every epoch gets fresh crops.
        seeds = tf.data.Dataset.random(seed, rerandomize_each_iteration=True)
        blocks = tf.data.Dataset.zip(blocks, seeds.batch(2 * GUARD_BLOCK))
    else:
        blocks = blocks.map(lambda block: (block, tf.zeros([2 * GUARD_BLOCK], tf.int64)))

    def run_block(block, block_seeds):
        size = tf.shape(block["label"])[0]
        block = dict(block, seed=tf.reshape(block_seeds, [GUARD_BLOCK, 2])[:size])
        inner = tf.data.Dataset.from_tensor_slices((tf.range(size), block))
        inner = inner.map(lambda i, record: (i, fn(record))).ignore_errors()
        inner = inner.batch(GUARD_BLOCK).concatenate(
            tf.data.Dataset.from_tensors((tf.zeros([0], tf.int32), empty))).take(1)
        positions, outputs = inner.get_single_element()
        done = tf.reduce_any(tf.equal(tf.range(size)[:, None], positions[None, :]), axis=1)
        failed = tf.boolean_mask(block["name"], tf.logical_not(done))
        succeeded = tf.size(positions) if count_successes else tf.constant(0)
        # Every block reports, successes too: that is how a pass of only unreadable files is
        # told apart from a slow one (one Python call per block: ~1% of decoding 32 images).
        reported = tf.py_function(guard.report, [failed, succeeded], tf.int64)
        with tf.control_dependencies([reported]):
            return tf.nest.map_structure(tf.identity, outputs)

    return blocks.map(run_block, num_parallel_calls=AUTOTUNE, deterministic=deterministic)


def _check_arguments(image_size, batch_size, mixup_alpha, cutmix_lambda, eval_resize_ratio,
                     shuffle_buffer, private_threadpool_size, max_intra_op_parallelism):
    if not isinstance(image_size, (int, np.integer)) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
    if mixup_alpha is None or mixup_alpha < 0:
        raise ValueError(f"mixup_alpha must be >= 0 (0 = off), got {mixup_alpha!r}")
    if cutmix_lambda is not None and not (cutmix_lambda == 0 or 0 < cutmix_lambda < 1):
        raise ValueError(f"cutmix_lambda must be in (0, 1), or None/0 for off, got "
                         f"{cutmix_lambda!r}")
    if eval_resize_ratio < 1:
        raise ValueError(f"eval_resize_ratio must be >= 1 (short side resized to at least "
                         f"image_size before the centre crop), got {eval_resize_ratio!r}")
    if shuffle_buffer is not None and shuffle_buffer < 1:
        raise ValueError(f"shuffle_buffer must be >= 1 or None (auto), got {shuffle_buffer!r}")
    for name, value in (("private_threadpool_size", private_threadpool_size),
                        ("max_intra_op_parallelism", max_intra_op_parallelism)):
        if value is not None and value < 1:
            raise ValueError(f"{name} must be >= 1 or None (TF default), got {value!r}")


def make_dataset(
    source: str,
    split: str,
    *,
    image_size: int,
    batch_size: int,
    training: bool,
    augment: bool | None = None,
    random_flip: bool = True,
    data_dir: str | os.PathLike | None = None,
    num_classes: int | None = None,
    mixup_alpha: float = 0.0,
    cutmix_lambda: float | None = None,
    cutmix_version: int = 1,
    mix: bool | None = None,
    one_hot: bool | None = None,
    shuffle_buffer: int | None = None,
    cache: bool | str = False,
    repeat: bool = False,
    drop_remainder: bool | None = None,
    seed: int | None = None,
    deterministic: bool | None = None,
    input_context: tf.distribute.InputContext | None = None,
    private_threadpool_size: int | None = None,
    max_intra_op_parallelism: int | None = None,
    eval_resize_ratio: float = preprocessing.EVAL_RESIZE_RATIO,
    area_range: tuple[float, float] = preprocessing.AREA_RANGE,
    aspect_range: tuple[float, float] = preprocessing.ASPECT_RANGE,
    label_offset: int = 0,
    skip_counter: SkipCounter | None = None,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of `(images, labels)` batches: images uint8 `[b, size, size, 3]`,
    labels int32 `[b]`, or float32 one-hot `[b, classes]` when mixing (or `one_hot`) is on.

    The host only decodes, crops, flips and batches; normalization belongs to the model, so a
    quarter of float32's bytes crosses to the device.

    Args:
      source: 'synthetic', 'digits', 'folder:PATH', 'tfds:NAME' or 'tfrecord:PATTERN'.
      split: split name, e.g. 'train' or 'validation'.
      image_size: output height and width.
      batch_size: global batch size; with `input_context` each pipeline yields
        `input_context.get_per_replica_batch_size(batch_size)`.
      training: shuffle (and augment) if True; evaluation order and preprocessing otherwise.
      augment: random crop + flip + mixing if True, else resize + centre crop; None = `training`.
        `training=True, augment=False` is the fine-tune input: shuffled training images with
        evaluation preprocessing.
      random_flip: random horizontal flips when augmenting (off for digits and text).
      data_dir: tfds data dir, or the root `digits` is written under (default: see
        `sources.default_data_dir`).
      num_classes: needed for one-hot labels where the source does not record it (tfrecord
        without dataset_info.json); for 'synthetic' it sets the label range (default 1000).
      mixup_alpha: Beta(alpha, alpha) Mixup per example, 0 = off.
      cutmix_lambda: CutMix nominal kept fraction in (0, 1), None or 0 = off.
      cutmix_version: 1 draws each batch's kept fraction from `cutmix_lambda` (Graphcore's
        presets), 2 keeps it fixed (see `mixing.cutmix`).
      mix: apply the configured Mixup/CutMix to the batches; None = `augment`. Graphcore's
        fine-tune mixes images that had evaluation preprocessing (`augment=False, mix=True`).
      one_hot: one-hot float labels; None = on when mixing is configured, in both training and
        evaluation, so that both feed the same loss.
      shuffle_buffer: records in the shuffle buffer; None = the whole file list for folder
        sources, DEFAULT_SHUFFLE_BUFFER for tfds/tfrecord.
      cache: cache the encoded images after reading, in memory (True) or in a file (a path).
      repeat: repeat forever (trainers with steps_per_epoch); False gives one epoch per
        iteration, reshuffled and re-cropped each time (`model.fit(dataset, epochs=3)`).
      drop_remainder: drop the last partial batch; None = `training`.
      seed: seed for shuffling, crops, flips and mixing; same seed, same batches.
      deterministic: keep element order fixed; None = True when `seed` is given and for
        evaluation (`training=False`), whose first batches are what `--eval_steps` reads.
      input_context: from `tf.distribute`; shards the data between input pipelines.
      private_threadpool_size, max_intra_op_parallelism: tf.data host thread settings
        (None = TF defaults).
      eval_resize_ratio: evaluation resizes the short side to `image_size * eval_resize_ratio`.
      area_range, aspect_range: training crop bounds (defaults: the paper's, docs/recipes.md).
      label_offset: subtracted from TFRecord labels (1 for TF-slim style 1-based ImageNet).
      skip_counter: where unreadable images are counted and reported (default `SKIPPED`).

    Example:
      >>> train = make_dataset("digits", "train", image_size=32, batch_size=64, training=True)
      >>> model.fit(train, epochs=3)
    """
    _check_arguments(image_size, batch_size, mixup_alpha, cutmix_lambda, eval_resize_ratio,
                     shuffle_buffer, private_threadpool_size, max_intra_op_parallelism)
    if cutmix_version not in mixing.CUTMIX_VERSIONS:
        raise ValueError(f"cutmix_version must be one of {list(mixing.CUTMIX_VERSIONS)}, got "
                         f"{cutmix_version!r}")
    augment = training if augment is None else augment
    mixing_configured = mixup_alpha > 0 or bool(cutmix_lambda)
    mixing_on = (augment if mix is None else mix) and mixing_configured
    one_hot = mixing_configured if one_hot is None else one_hot
    drop_remainder = training if drop_remainder is None else drop_remainder
    # Evaluation keeps its order: a fixed sample of every class under --eval_steps.
    deterministic = (seed is not None or not training) if deterministic is None else deterministic
    counter = SKIPPED if skip_counter is None else skip_counter
    if input_context is not None:
        batch_size = input_context.get_per_replica_batch_size(batch_size)

    # Read: file names (folders) or encoded records (tfds, TFRecord), labels beside them.
    records = sources.read_records(
        source, split, data_dir=data_dir, input_context=input_context, shuffle_files=training,
        seed=_seed(seed, 0), image_size=image_size, num_classes=num_classes,
        label_offset=label_offset)
    num_classes = _resolve_num_classes(records.info, num_classes, one_hot, source)
    dataset = records.dataset
    pipelines = input_context.num_input_pipelines if input_context is not None else 1
    guard = _PassGuard(counter, records.info.num_examples // pipelines,
                       f"{source} (split {split!r})")

    # Shard before shuffling so that the shards are disjoint and together complete.
    if input_context is not None and not records.sharded:
        dataset = dataset.shard(input_context.num_input_pipelines,
                                input_context.input_pipeline_id)

    data_is_path = records.data_is_path
    if cache:
        if data_is_path:
            # Cache bytes, not names: reading the files is what caching should save.
            dataset = _guarded_map(
                dataset, lambda r: {"name": r["name"], "data": tf.io.read_file(r["data"]),
                                    "label": r["label"]}, guard, deterministic, seed=False,
                count_successes=False)
            dataset = dataset.unbatch()
            data_is_path = False
        dataset = dataset.cache("" if cache is True else os.fspath(cache))

    if training and not records.decoded:
        if shuffle_buffer is None:
            whole = records.info.num_examples
            shuffle_buffer = whole if (records.data_is_path or cache) else DEFAULT_SHUFFLE_BUFFER
        dataset = dataset.shuffle(shuffle_buffer, seed=_seed(seed, 1),
                                  reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()

    # Decode and augment, skipping unreadable images (see _guarded_map), and batch.
    if records.decoded:
        dataset = dataset.map(lambda r: (r["image"], r["label"]), num_parallel_calls=AUTOTUNE)
        dataset = dataset.batch(batch_size, drop_remainder=drop_remainder)
    else:
        def process(record):
            data = tf.io.read_file(record["data"]) if data_is_path else record["data"]
            if augment:
                crop_seed, flip_seed = tf.unstack(
                    tf.random.experimental.stateless_split(record["seed"], 2))
                # Labelled object boxes, where the source has them (sources.Records).
                boxes = (tf.io.parse_tensor(record["boxes"], tf.float32)
                         if "boxes" in record else None)
                image = preprocessing.decode_and_random_crop(
                    data, image_size, crop_seed, area_range, aspect_range, boxes)
                if random_flip:
                    image = preprocessing.flip(image, flip_seed)
            else:
                image = preprocessing.center_crop(data, image_size, eval_resize_ratio)
            return image, record["label"]

        dataset = _guarded_map(dataset, process, guard, deterministic,
                               seed=_seed(seed, 2) if augment else False)
        # Blocks of survivors -> fixed-size batches, copying each image once.
        dataset = dataset.rebatch(batch_size, drop_remainder=drop_remainder)

    # Batch-level mixing: a Beta draw per example and one CutMix box per batch.
    if one_hot:
        dataset = dataset.map(lambda images, labels: (images, tf.one_hot(labels, num_classes)),
                              num_parallel_calls=AUTOTUNE, deterministic=deterministic)
    if mixing_on:
        batch_seeds = tf.data.Dataset.random(
            _seed(seed, 3), rerandomize_each_iteration=True).batch(2)
        dataset = tf.data.Dataset.zip(dataset, batch_seeds).map(
            lambda batch, batch_seed: mixing.mix_batch(
                batch[0], batch[1], batch_seed, mixup_alpha, cutmix_lambda, cutmix_version),
            num_parallel_calls=AUTOTUNE, deterministic=deterministic)

    options = tf.data.Options()
    options.deterministic = deterministic
    if private_threadpool_size is not None:
        options.threading.private_threadpool_size = private_threadpool_size
    if max_intra_op_parallelism is not None:
        options.threading.max_intra_op_parallelism = max_intra_op_parallelism
    # Overlap host preprocessing of the next batches with the device's work on this one.
    return dataset.with_options(options).prefetch(AUTOTUNE)


def _resolve_num_classes(info: sources.DatasetInfo, num_classes, one_hot: bool, source: str):
    if num_classes is not None and info.num_classes is not None and (
            num_classes != info.num_classes):
        raise ValueError(f"num_classes={num_classes} but source {source!r} has "
                         f"{info.num_classes} classes")
    resolved = info.num_classes if num_classes is None else num_classes
    if one_hot and resolved is None:
        raise ValueError(f"one-hot labels need num_classes, and source {source!r} does not "
                         f"record it (no {sources.TFRECORD_INFO_FILE}); pass num_classes")
    return resolved
