"""Batch-level Mixup and CutMix: mix images with a partner in the same batch, and their labels."""

from __future__ import annotations

import tensorflow as tf


def _blend_dtype_like(blended: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    if like.dtype.is_integer:
        # A convex mix of values in [0, 255] stays in range: rounding is the only step needed.
        return tf.cast(tf.round(blended), like.dtype)
    return tf.cast(blended, like.dtype)


def sample_beta(alpha: float, seed: tf.Tensor) -> tf.Tensor:
    """One draw of Beta(alpha, alpha) as a float32 scalar, from a stateless shape-[2] seed."""
    seed_a, seed_b = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    # float64: with alpha = 0.1 a float32 Gamma draw underflows to 0 about once in 6,000.
    a = tf.random.stateless_gamma([], seed_a, alpha=alpha, dtype=tf.float64)
    b = tf.random.stateless_gamma([], seed_b, alpha=alpha, dtype=tf.float64)
    total = a + b
    lam = tf.where(total > 0.0, a / tf.where(total > 0.0, total, 1.0), 0.5)
    return tf.cast(lam, tf.float32)


def mixup(
    images: tf.Tensor, labels: tf.Tensor, alpha: float, seed: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """Mixup (Zhang et al. 2018) of a batch with the batch reversed, one lambda per batch.

    Args:
      images: `[batch, h, w, c]`, uint8 (rounded after mixing) or float.
      labels: `[batch, classes]` float one-hot (or already mixed) labels.
      alpha: Beta(alpha, alpha) parameter, > 0 (the paper's recipe: 0.1 for b0-b2, 0.2 for b3-b5;
        docs/recipes.md).
      seed: shape-[2] integer tensor; same seed, same lambda.

    Returns:
      `(lam * images + (1 - lam) * partner, lam * labels + (1 - lam) * partner_labels)`.

    Example:
      >>> images, labels = mixup(images, tf.one_hot(labels, 10), alpha=0.2, seed=[0, 3])
    """
    lam = sample_beta(alpha, seed)
    partner = tf.reverse(images, axis=[0])
    mixed = lam * tf.cast(images, tf.float32) + (1.0 - lam) * tf.cast(partner, tf.float32)
    labels = tf.cast(labels, tf.float32)
    mixed_labels = lam * labels + (1.0 - lam) * tf.reverse(labels, axis=[0])
    return _blend_dtype_like(mixed, images), mixed_labels


def cutmix_box(height: int, width: int, lam: float, seed: tf.Tensor) -> tf.Tensor:
    """A box `[y0, x0, y1, x1]` (int32, exclusive ends) of nominal area `(1 - lam) * h * w`.

    The centre is uniform over the image and the box is clipped to it, so the real area can be
    smaller than nominal; callers weight labels by the real area.
    """
    cut = tf.sqrt(1.0 - tf.cast(lam, tf.float32))
    cut_h = tf.cast(tf.round(cut * height), tf.int32)
    cut_w = tf.cast(tf.round(cut * width), tf.int32)
    centre = tf.random.stateless_uniform(
        [2], seed, minval=0, maxval=tf.int32.max, dtype=tf.int32
    ) % tf.constant([height, width], tf.int32)
    y0 = centre[0] - cut_h // 2
    x0 = centre[1] - cut_w // 2
    return tf.stack(
        [
            tf.clip_by_value(y0, 0, height),
            tf.clip_by_value(x0, 0, width),
            tf.clip_by_value(y0 + cut_h, 0, height),
            tf.clip_by_value(x0 + cut_w, 0, width),
        ]
    )


def cutmix(
    images: tf.Tensor, labels: tf.Tensor, lam: float, seed: tf.Tensor
) -> tuple[tf.Tensor, tf.Tensor]:
    """CutMix (Yun et al. 2019) with a fixed nominal lambda, partner = the batch rolled by one.

    One box per batch is pasted from image `i - 1` into image `i`; labels are weighted by the
    pasted box's real area fraction `a`: `(1 - a) * labels + a * rolled_labels`.

    Args:
      images: `[batch, h, w, c]` with static `h` and `w`.
      labels: `[batch, classes]` float labels.
      lam: nominal fraction of each image kept, in (0, 1) (the paper's recipe: 0.95 for b1 ... 0.8
        for b5; docs/recipes.md).
      seed: shape-[2] integer tensor.

    Example:
      >>> images, labels = cutmix(images, tf.one_hot(labels, 10), lam=0.9, seed=[0, 4])
    """
    height, width = int(images.shape[1]), int(images.shape[2])
    y0, x0, y1, x1 = tf.unstack(cutmix_box(height, width, lam, seed))
    rows = tf.range(height)
    cols = tf.range(width)
    inside = ((rows >= y0) & (rows < y1))[:, None] & ((cols >= x0) & (cols < x1))[None, :]
    partner = tf.roll(images, shift=1, axis=0)
    mixed = tf.where(inside[None, :, :, None], partner, images)
    area = tf.cast((y1 - y0) * (x1 - x0), tf.float32) / float(height * width)
    labels = tf.cast(labels, tf.float32)
    mixed_labels = (1.0 - area) * labels + area * tf.roll(labels, shift=1, axis=0)
    return mixed, mixed_labels


def mix_batch(
    images: tf.Tensor,
    labels: tf.Tensor,
    seed: tf.Tensor,
    mixup_alpha: float = 0.0,
    cutmix_lambda: float | None = None,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Mixup (if `mixup_alpha > 0`) then CutMix (if `cutmix_lambda` is set), as Graphcore's
    EfficientNet recipes combine them; labels must already be float one-hot."""
    mixup_seed, cutmix_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if mixup_alpha > 0.0:
        images, labels = mixup(images, labels, mixup_alpha, mixup_seed)
    if cutmix_lambda:
        images, labels = cutmix(images, labels, cutmix_lambda, cutmix_seed)
    return images, labels
