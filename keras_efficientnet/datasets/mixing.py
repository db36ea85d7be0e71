"""Batch-level Mixup and CutMix as Graphcore's EfficientNet recipes draw and combine them."""

from __future__ import annotations

import math

import tensorflow as tf

from keras_efficientnet.datasets.options import CUTMIX_VERSIONS

# CutMix v1 (Graphcore's `cutmix_version: 1`): with probability 1.55 * nominal - 0.96 the batch
# is not cut; otherwise lambda = 1 + ln(u) / 4, u uniform on [e^-4, 1), so lambda lies in
# [0, 1). Version 2 uses the nominal lambda itself for every batch.
CUTMIX_V1_SLOPE, CUTMIX_V1_OFFSET, CUTMIX_V1_DENOMINATOR = 1.55, 0.96, 4.0
# Partners: Mixup takes the batch rolled by 1 and CutMix by 2, so that with both on no image
# is cut *and* mixed with the same partner.
MIXUP_SHIFT, CUTMIX_SHIFT = 1, 2


def _blend_dtype_like(blended: tf.Tensor, like: tf.Tensor) -> tf.Tensor:
    if like.dtype.is_integer:
        # A convex mix of values in [0, 255] stays in range: rounding is the only step needed.
        return tf.cast(tf.round(blended), like.dtype)
    return tf.cast(blended, like.dtype)


def sample_beta(alpha: float, seed: tf.Tensor, shape=()) -> tf.Tensor:
    """Draws of Beta(alpha, alpha) as float32 of `shape`, from a stateless shape-[2] seed."""
    seed_a, seed_b = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    # float64: with alpha = 0.1 a float32 Gamma draw underflows to 0 about once in 6,000.
    a = tf.random.stateless_gamma(shape, seed_a, alpha=alpha, dtype=tf.float64)
    b = tf.random.stateless_gamma(shape, seed_b, alpha=alpha, dtype=tf.float64)
    total = a + b
    lam = tf.where(total > 0.0, a / tf.where(total > 0.0, total, 1.0), 0.5)
    return tf.cast(lam, tf.float32)


def mixup_coefficients(batch_size, alpha: float, seed: tf.Tensor) -> tf.Tensor:
    """One Beta(alpha, alpha) draw per example, folded to `max(lam, 1 - lam)`: `[batch]` float32.

    Folding keeps each image the larger part of its own mix (Graphcore's choice).
    """
    lam = sample_beta(alpha, seed, tf.reshape(batch_size, [1]))
    return tf.maximum(lam, 1.0 - lam)


def mixup_with(images: tf.Tensor, labels: tf.Tensor,
               coefficients: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mixes example i with example i - 1 (the batch rolled by 1) by `coefficients[i]`."""
    mix = tf.cast(coefficients, tf.float32)
    partner = tf.roll(images, shift=MIXUP_SHIFT, axis=0)
    weight = mix[:, None, None, None]
    mixed = weight * tf.cast(images, tf.float32) + (1.0 - weight) * tf.cast(partner, tf.float32)
    labels = tf.cast(labels, tf.float32)
    mixed_labels = (mix[:, None] * labels
                    + (1.0 - mix[:, None]) * tf.roll(labels, shift=MIXUP_SHIFT, axis=0))
    return _blend_dtype_like(mixed, images), mixed_labels


def mixup(images: tf.Tensor, labels: tf.Tensor, alpha: float,
          seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Mixup (Zhang et al. 2018) with one folded Beta(alpha, alpha) draw per example.

    Args:
      images: `[batch, h, w, c]`, uint8 (rounded after mixing) or float.
      labels: `[batch, classes]` float one-hot labels.
      alpha: Beta(alpha, alpha) parameter, > 0 (Graphcore: 0.1 for b0-b2, 0.2 for b3-b5;
        docs/recipes.md).
      seed: shape-[2] integer tensor; same seed, same coefficients.

    Returns:
      `(m * x + (1 - m) * x_rolled, m * y + (1 - m) * y_rolled)`, `m = mixup_coefficients`.

    Example:
      >>> images, labels = mixup(images, tf.one_hot(labels, 10), alpha=0.2, seed=[0, 3])
    """
    return mixup_with(images, labels, mixup_coefficients(tf.shape(images)[0], alpha, seed))


def cutmix_v1_lambda(nominal: float, u_cut: tf.Tensor, u_size: tf.Tensor) -> tf.Tensor:
    """CutMix v1's lambda from two uniforms: 1 (no cut) when `u_cut < 1.55 * nominal - 0.96`,
    else `1 + ln(u_size) / 4`, where `u_size` is uniform on [e^-4, 1)."""
    threshold = CUTMIX_V1_SLOPE * nominal - CUTMIX_V1_OFFSET
    cut = 1.0 + tf.math.log(u_size) / CUTMIX_V1_DENOMINATOR
    return tf.where(u_cut < threshold, tf.ones_like(cut), cut)


def sample_cutmix_lambda(nominal: float, seed: tf.Tensor, version: int = 1,
                         shape=()) -> tf.Tensor:
    """The fraction of each image CutMix keeps (float32 of `shape`): v1 draws it, v2 is
    `nominal`."""
    if version == 2:
        return tf.fill(shape, tf.constant(nominal, tf.float32))
    seed_cut, seed_size = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    u_cut = tf.random.stateless_uniform(shape, seed_cut)
    u_size = tf.random.stateless_uniform(shape, seed_size,
                                         minval=math.exp(-CUTMIX_V1_DENOMINATOR), maxval=1.0)
    return cutmix_v1_lambda(nominal, u_cut, u_size)


def cutmix_box(height: int, width: int, lam: tf.Tensor, centre: tf.Tensor) -> tf.Tensor:
    """The pasted box `[y0, x0, y1, x1]` (int32, exclusive ends) for a kept fraction `lam`.

    The box has the image's aspect ratio and sides `sqrt(1 - lam)` of the image's; its centre
    `(cy, cx)` (floats, uniform over the image) is clipped so that the box lies inside the
    image, and the corners are rounded (half to even, as `tf.round`).
    """
    cut = tf.sqrt(1.0 - tf.cast(lam, tf.float32))
    cut_h, cut_w = cut * height, cut * width
    cy = tf.clip_by_value(tf.cast(centre[0], tf.float32), cut_h / 2, height - cut_h / 2)
    cx = tf.clip_by_value(tf.cast(centre[1], tf.float32), cut_w / 2, width - cut_w / 2)
    corners = tf.stack([cy - cut_h / 2, cx - cut_w / 2, cy + cut_h / 2, cx + cut_w / 2])
    return tf.cast(tf.round(corners), tf.int32)


def cutmix_with(images: tf.Tensor, labels: tf.Tensor, lam: tf.Tensor,
                centre: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """Pastes one box (see `cutmix_box`) from the batch rolled by 2 (by 1 for batches of 2)
    into every image; labels are weighted by the real area fraction `a` the box covers:
    `(1 - a) * labels + a * rolled_labels`."""
    height, width = int(images.shape[1]), int(images.shape[2])
    y0, x0, y1, x1 = tf.unstack(cutmix_box(height, width, lam, centre))
    rows, cols = tf.range(height), tf.range(width)
    inside = ((rows >= y0) & (rows < y1))[:, None] & ((cols >= x0) & (cols < x1))[None, :]
    shift = CUTMIX_SHIFT if images.shape[0] is None or images.shape[0] > 2 else 1
    partner = tf.roll(images, shift=shift, axis=0)
    mixed = tf.where(inside[None, :, :, None], partner, images)
    area = tf.reduce_mean(tf.cast(inside, tf.float32))
    labels = tf.cast(labels, tf.float32)
    mixed_labels = (1.0 - area) * labels + area * tf.roll(labels, shift=shift, axis=0)
    return mixed, mixed_labels


def sample_centre(height: int, width: int, seed: tf.Tensor) -> tf.Tensor:
    """A box centre `(cy, cx)` uniform over a `height x width` image (float32)."""
    return tf.random.stateless_uniform([2], seed) * tf.constant([height, width], tf.float32)


def cutmix(images: tf.Tensor, labels: tf.Tensor, nominal: float, seed: tf.Tensor,
           version: int = 1) -> tuple[tf.Tensor, tf.Tensor]:
    """CutMix (Yun et al. 2019) as Graphcore's recipes run it: one box per batch, its kept
    fraction drawn by `version` 1 (or fixed at `nominal` by version 2), pasted from the batch
    rolled by 2.

    Args:
      images: `[batch, h, w, c]` with static `h` and `w`.
      labels: `[batch, classes]` float labels.
      nominal: Graphcore's `cutmix_lambda` in (0, 1) (0.95 ... 0.8 for b1-b5; docs/recipes.md).
      seed: shape-[2] integer tensor.
      version: 1 (draw lambda, Graphcore's presets) or 2 (lambda = nominal).

    Example:
      >>> images, labels = cutmix(images, tf.one_hot(labels, 10), nominal=0.9, seed=[0, 4])
    """
    seed_lambda, seed_centre = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    lam = sample_cutmix_lambda(nominal, seed_lambda, version)
    centre = sample_centre(int(images.shape[1]), int(images.shape[2]), seed_centre)
    return cutmix_with(images, labels, lam, centre)


def mix_batch(
    images: tf.Tensor,
    labels: tf.Tensor,
    seed: tf.Tensor,
    mixup_alpha: float = 0.0,
    cutmix_lambda: float | None = None,
    cutmix_version: int = 1,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Mixup (if `mixup_alpha > 0`) then CutMix (if `cutmix_lambda` is set), as Graphcore's
    EfficientNet recipes combine them; labels must already be float one-hot.

    CutMix then pastes from an image that is itself a mix, so each label ends up with the four
    weights of Graphcore's loss: `m_i a`, `(1 - m_i) a`, `m_{i-2} (1 - a)`, `(1 - m_{i-2})(1 - a)`
    for examples i, i - 1, i - 2 and i - 3 (`a` the kept area).
    """
    if cutmix_version not in CUTMIX_VERSIONS:
        raise ValueError(f"cutmix_version must be one of {list(CUTMIX_VERSIONS)}, received "
                         f"{cutmix_version!r}")
    mixup_seed, cutmix_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    if mixup_alpha > 0.0:
        images, labels = mixup(images, labels, mixup_alpha, mixup_seed)
    if cutmix_lambda:
        images, labels = cutmix(images, labels, cutmix_lambda, cutmix_seed, cutmix_version)
    return images, labels
