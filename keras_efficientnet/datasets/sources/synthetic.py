"""`synthetic`: random uint8 images with random labels, for smoke runs and benchmarks."""

from __future__ import annotations

import tensorflow as tf

from keras_efficientnet.datasets.sources.base import DatasetInfo, Reader, Records

SYNTHETIC_EXAMPLES = {"train": 4096, "validation": 1024}
SYNTHETIC_NUM_CLASSES = 1000
# Distinct random images cycled through: enough to look like data, cheap enough to cache.
SYNTHETIC_POOL = 64


class SyntheticReader(Reader):
    """Reads `synthetic`: `num_classes` (default 1000) random labels; images already decoded at
    the pipeline's size, the same for a given seed."""

    def info(self, split: str) -> DatasetInfo:
        if split not in SYNTHETIC_EXAMPLES:
            raise ValueError(f"split {split!r} not in source 'synthetic'; available: "
                             f"{sorted(SYNTHETIC_EXAMPLES)}")
        return DatasetInfo(self.source, split, SYNTHETIC_EXAMPLES[split],
                           self.num_classes or SYNTHETIC_NUM_CLASSES, None)

    def records(self, split, *, input_context=None, shuffle_files=False, seed=None,
                image_size=224) -> Records:
        info = self.info(split)
        num_classes = info.num_classes
        seed = 0 if seed is None else seed
        pool = tf.data.Dataset.range(SYNTHETIC_POOL).map(
            lambda i: tf.cast(tf.random.stateless_uniform(
                [image_size, image_size, 3], tf.stack([tf.constant(seed, tf.int64), i]),
                minval=0, maxval=256, dtype=tf.int32), tf.uint8))
        labels = tf.data.Dataset.range(info.num_examples).map(
            lambda i: tf.random.stateless_uniform(
                [], tf.stack([tf.constant(seed + 1, tf.int64), i]), minval=0,
                maxval=num_classes, dtype=tf.int32))
        dataset = tf.data.Dataset.zip(pool.cache().repeat(), labels).map(
            lambda image, label: {"image": image, "label": label})
        return Records(dataset, info, decoded=True, exact_count=True)
