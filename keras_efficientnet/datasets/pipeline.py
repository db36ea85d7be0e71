"""The host input pipeline: one composer from a source string to batches of uint8 images."""

from __future__ import annotations

import logging
import os
import threading

import numpy as np
import tensorflow as tf

from keras_efficientnet.datasets import mixing, preprocessing, sources
from keras_efficientnet.datasets.options import InputOptions

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


class DamagedDataError(ValueError):
    """An image of a dataset the library wrote or verified itself (digits, Fashion-MNIST)
    failed to decode: damaged library data, reported with its repair instead of skipped."""


class SkipCounter:
    """Counts unreadable images the pipeline skipped, and logs each one once, by name.

    Thread-safe (tf.data calls it from its own threads). `count` is the number of distinct
    images skipped and `names` the first `max_names` of them; a file that fails again in a later
    pass is neither logged nor counted again. `error` holds the `NoReadableImagesError` or
    `DamagedDataError` a dataset raised through it, for the trainer to report without
    TensorFlow's wrapping.

    Example:
      >>> counter = SkipCounter()
      >>> dataset = make_dataset("folder:/photos", "train", ..., skip_counter=counter)
      >>> model.fit(dataset); print(counter.count, counter.names[:5])
    """

    def __init__(self, max_names: int = 1000):
        self.max_names = max_names
        self.count = 0
        self.names: list[str] = []
        self.error: NoReadableImagesError | DamagedDataError | None = None
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
    failed while none succeeded, instead of looping over them forever.

    With a `repair` (sources whose count is exact: `sources.Records.exact_count`) the first
    failure raises DamagedDataError naming the file and the repair instead: skipping it would
    break the batch count the pipeline promised, in a less clear error one pass later."""

    def __init__(self, counter: SkipCounter, share: int, where: str, repair: str = ""):
        self.counter = counter
        self.share = max(1, share)
        self.where = where
        self.repair = repair
        self.succeeded = 0
        self.failed: set[bytes] = set()
        self._lock = threading.Lock()

    def report(self, names, succeeded) -> np.int64:
        values = names.numpy() if hasattr(names, "numpy") else names
        values = [bytes(v) for v in np.atleast_1d(values)]
        if values and self.repair:
            error = DamagedDataError(
                f"unreadable image {min(values).decode('utf-8', 'replace')} in {self.where}, "
                f"data the library wrote or checked itself, so it is damaged: {self.repair}")
            self.counter.error = error
            raise error
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


def make_dataset(
    options: InputOptions | str,
    split: str | None = None,
    *,
    input_context: tf.distribute.InputContext | None = None,
    skip_counter: SkipCounter | None = None,
    **fields,
) -> tf.data.Dataset:
    """A `tf.data.Dataset` of `(images, labels)` batches as `options` (an `InputOptions`) says:
    images uint8 `[b, size, size, 3]`, labels int32 `[b]`, or float32 one-hot `[b, classes]`
    when mixing (or `one_hot`) is on.

    The host only decodes, crops, flips and batches; normalization belongs to the model, so a
    quarter of float32's bytes crosses to the device. The stages run in a fixed order: read ->
    shard -> cache -> shuffle/repeat -> decode and crop -> batch -> mix -> prefetch.

    Args:
      options: what to read and how. A source string instead, with `split` and the other
        `InputOptions` fields as keywords, builds the options here.
      input_context: from `tf.distribute`; shards the data between input pipelines.
      skip_counter: where unreadable images are counted and reported (default `SKIPPED`).

    Example:
      >>> train = make_dataset("digits", "train", image_size=32, batch_size=64, training=True)
      >>> model.fit(train, epochs=3)
    """
    if isinstance(options, str):
        options = InputOptions(options, split, **fields)
    elif split is not None or fields:
        raise TypeError("make_dataset(options) takes no other fields: use options.replace()")
    batch_size = (options.batch_size if input_context is None
                  else input_context.get_per_replica_batch_size(options.batch_size))
    records = read(options, input_context)
    num_classes = _resolve_num_classes(records.info, options)
    guard = _guard_for(records, options, input_context,
                       SKIPPED if skip_counter is None else skip_counter)
    dataset = shard(records, input_context)
    dataset, data_is_path = cache(dataset, records, options, guard)
    dataset = shuffle_and_repeat(dataset, records, options)
    dataset = decode_and_crop(dataset, records, options, guard, data_is_path)
    dataset = batch(dataset, records, options, batch_size)
    dataset = known_cardinality(dataset, records, options, input_context, batch_size)
    dataset = mix(dataset, options, num_classes)
    return finish(dataset, options)


def read(options: InputOptions, input_context) -> sources.Records:
    """File names (folders) or encoded records (tfds, TFRecord), labels beside them."""
    return sources.read_records(
        options.source, options.split, data_dir=options.data_dir, input_context=input_context,
        shuffle_files=options.training, seed=_seed(options.seed, 0),
        image_size=options.image_size, num_classes=options.num_classes,
        label_offset=options.label_offset, allow_empty_classes=options.allow_empty_classes,
        hold_out=options.hold_out)


def _guard_for(records, options: InputOptions, input_context, counter: SkipCounter):
    pipelines = input_context.num_input_pipelines if input_context is not None else 1
    return _PassGuard(counter, records.info.num_examples // pipelines,
                      f"{options.source} (split {options.split!r})",
                      records.repair if records.exact_count else "")


def shard(records: sources.Records, input_context) -> tf.data.Dataset:
    """Shards before shuffling, so that the shards are disjoint and together complete."""
    if input_context is not None and not records.sharded:
        return records.dataset.shard(input_context.num_input_pipelines,
                                     input_context.input_pipeline_id)
    return records.dataset


def cache(dataset, records, options: InputOptions, guard) -> tuple[tf.data.Dataset, bool]:
    """Caches the encoded images when asked; returns the dataset and whether it still holds
    file paths (rather than bytes)."""
    if not options.cache:
        return dataset, records.data_is_path
    if records.data_is_path:
        # Cache bytes, not names: reading the files is what caching should save.
        dataset = _guarded_map(
            dataset, lambda r: {"name": r["name"], "data": tf.io.read_file(r["data"]),
                                "label": r["label"]}, guard, options.keeps_order, seed=False,
            count_successes=False).unbatch()
    return dataset.cache("" if options.cache is True else os.fspath(options.cache)), False


def shuffle_and_repeat(dataset, records, options: InputOptions) -> tf.data.Dataset:
    if options.training and not records.decoded:
        buffer = options.shuffle_buffer
        if buffer is None:
            whole = records.data_is_path or bool(options.cache)
            buffer = records.info.num_examples if whole else DEFAULT_SHUFFLE_BUFFER
        dataset = dataset.shuffle(buffer, seed=_seed(options.seed, 1),
                                  reshuffle_each_iteration=True)
    return dataset.repeat() if options.repeat else dataset


def _crop_fn(options: InputOptions, data_is_path: bool):
    """The per-record op: bytes (or a file) -> a random crop and flip, or the centre crop."""
    size = options.image_size

    def crop(record):
        data = tf.io.read_file(record["data"]) if data_is_path else record["data"]
        if not options.augments:
            return preprocessing.center_crop(data, size, options.eval_resize_ratio), record[
                "label"]
        crop_seed, flip_seed = tf.unstack(
            tf.random.experimental.stateless_split(record["seed"], 2))
        # Labelled object boxes, where the source has them (sources.Records).
        boxes = tf.io.parse_tensor(record["boxes"], tf.float32) if "boxes" in record else None
        image = preprocessing.decode_and_random_crop(
            data, size, crop_seed, options.area_range, options.aspect_range, boxes)
        if options.random_flip:
            image = preprocessing.flip(image, flip_seed)
        return image, record["label"]

    return crop


def decode_and_crop(dataset, records, options: InputOptions, guard,
                    data_is_path: bool) -> tf.data.Dataset:
    """Decoded `(image, label)` pairs; for encoded sources, blocks of them that skip the
    unreadable images (see _guarded_map)."""
    if records.decoded:
        return dataset.map(lambda r: (r["image"], r["label"]), num_parallel_calls=AUTOTUNE)
    return _guarded_map(dataset, _crop_fn(options, data_is_path), guard, options.keeps_order,
                        seed=_seed(options.seed, 2) if options.augments else False)


def batch(dataset, records, options: InputOptions, batch_size: int) -> tf.data.Dataset:
    if records.decoded:
        return dataset.batch(batch_size, drop_remainder=options.drops_remainder)
    # Blocks of survivors -> fixed-size batches, copying each image once.
    return dataset.rebatch(batch_size, drop_remainder=options.drops_remainder)


def batches_per_pass(records: sources.Records, options: InputOptions, input_context,
                     batch_size: int) -> int | None:
    """Batches in one pass of this input pipeline, where the source's count is exact
    (`Records.exact_count`) and the pipeline knows its share; None otherwise.

    User sources (folders, TFRecords, tfds) answer None: a corrupt image there is skipped and
    counted, so the count is known only after the pass, and asserting one would turn every
    skip into a crash. A reader that shards by itself (`Records.sharded`) gives each pipeline
    a share only it knows, so the count is asserted only without sharding there.
    """
    if not records.exact_count:
        return None
    examples = records.info.num_examples
    if input_context is not None:
        if records.sharded:
            return None
        # Dataset.shard(n, i) keeps records i, i + n, i + 2n, ...
        examples = len(range(input_context.input_pipeline_id, examples,
                             input_context.num_input_pipelines))
    if options.drops_remainder:
        return examples // batch_size
    return -(-examples // batch_size)


def known_cardinality(dataset, records, options: InputOptions, input_context,
                      batch_size: int) -> tf.data.Dataset:
    """States the batch count of one pass where it is exact (see `batches_per_pass`), so that
    `model.fit` shows steps from its first epoch instead of "Unknown" and "ran out of data".
    Skipping unreadable images (`_guarded_map`, `rebatch`) hides the count from tf.data even
    where no image can be skipped. A repeating one is infinite (`rebatch` fills batches across
    passes, so this holds even for a split smaller than a batch)."""
    if dataset.cardinality() != tf.data.UNKNOWN_CARDINALITY:
        return dataset
    batches = batches_per_pass(records, options, input_context, batch_size)
    if batches is None:
        return dataset
    if options.repeat:
        batches = tf.data.INFINITE_CARDINALITY
    return dataset.apply(tf.data.experimental.assert_cardinality(batches))


def mix(dataset, options: InputOptions, num_classes: int | None) -> tf.data.Dataset:
    """One-hot labels, then batch-level mixing: a Beta draw per example and one CutMix box
    per batch."""
    order = options.keeps_order
    if options.one_hot_labels:
        dataset = dataset.map(lambda images, labels: (images, tf.one_hot(labels, num_classes)),
                              num_parallel_calls=AUTOTUNE, deterministic=order)
    if not options.mixes:
        return dataset
    batch_seeds = tf.data.Dataset.random(
        _seed(options.seed, 3), rerandomize_each_iteration=True).batch(2)
    return tf.data.Dataset.zip(dataset, batch_seeds).map(
        lambda pair, seed: mixing.mix_batch(
            pair[0], pair[1], seed, options.mixup_alpha, options.cutmix_lambda,
            options.cutmix_version),
        num_parallel_calls=AUTOTUNE, deterministic=order)


def finish(dataset, options: InputOptions) -> tf.data.Dataset:
    """Thread settings, then prefetch: overlap host preprocessing of the next batches with the
    device's work on this one."""
    settings = tf.data.Options()
    settings.deterministic = options.keeps_order
    if options.private_threadpool_size is not None:
        settings.threading.private_threadpool_size = options.private_threadpool_size
    if options.max_intra_op_parallelism is not None:
        settings.threading.max_intra_op_parallelism = options.max_intra_op_parallelism
    return dataset.with_options(settings).prefetch(AUTOTUNE)


def _resolve_num_classes(info: sources.DatasetInfo, options: InputOptions) -> int | None:
    num_classes, source = options.num_classes, options.source
    if num_classes is not None and info.num_classes is not None and (
            num_classes != info.num_classes):
        raise ValueError(f"num_classes={num_classes} but source {source!r} has "
                         f"{info.num_classes} classes")
    resolved = info.num_classes if num_classes is None else num_classes
    if options.one_hot_labels and resolved is None:
        raise ValueError(f"one-hot labels need num_classes, and source {source!r} does not "
                         f"record it (no {sources.TFRECORD_INFO_FILE}); pass num_classes")
    return resolved
