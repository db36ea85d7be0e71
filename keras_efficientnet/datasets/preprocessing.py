"""Per-example image ops of the host pipeline: encoded bytes in, uint8 [size, size, 3] out."""

from __future__ import annotations

import tensorflow as tf

# The crop constants (training area and aspect bounds, the evaluation resize ratio).
from keras_efficientnet.datasets.options import AREA_RANGE, ASPECT_RANGE, EVAL_RESIZE_RATIO

# Tries before sample_distorted_bounding_box falls back to the whole image.
MAX_ATTEMPTS = 100
# A crop must cover at least this fraction of one of the image's labelled boxes; an image with
# no boxes counts as one box (the whole image), so its crops cover at least 10% of it.
MIN_OBJECT_COVERED = 0.1
# Bilinear without antialiasing: the cheapest TF resize that does not alias badly at the
# crop-to-224 scale factors (~0.5x to 2x); antialias=True costs about 4x as much on the host.
RESIZE_METHOD = "bilinear"
CHANNELS = 3


def _boxes(boxes) -> tf.Tensor:
    """`[1, N, 4]` float32 boxes for sample_distorted_bounding_box (`[1, 0, 4]` for None)."""
    if boxes is None:
        return tf.zeros([1, 0, 4], tf.float32)
    return tf.reshape(tf.cast(boxes, tf.float32), [1, -1, 4])


def random_crop_window(
    image_shape: tf.Tensor,
    seed: tf.Tensor,
    area_range: tuple[float, float] = AREA_RANGE,
    aspect_range: tuple[float, float] = ASPECT_RANGE,
    boxes: tf.Tensor | None = None,
    min_object_covered: float = MIN_OBJECT_COVERED,
) -> tf.Tensor:
    """Samples a crop window `[y, x, height, width]` (int32) inside an image of `image_shape`.

    Area is a uniform fraction of the image in `area_range`, aspect (width / height) uniform in
    `aspect_range`, and the window covers at least `min_object_covered` of one of `boxes`
    (`[N, 4]` normalized `[ymin, xmin, ymax, xmax]`, e.g. ImageNet's annotations; None or
    N = 0: the whole image is the box). After `MAX_ATTEMPTS` misses the whole image is used.
    `seed` is a shape-[2] integer tensor (stateless: the same seed gives the same window).
    """
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.cast(image_shape, tf.int32),
        bounding_boxes=_boxes(boxes),
        seed=seed,
        min_object_covered=min_object_covered,
        aspect_ratio_range=aspect_range,
        area_range=area_range,
        max_attempts=MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.concat([begin[:2], size[:2]], axis=0)


def to_uint8(image: tf.Tensor) -> tf.Tensor:
    """Rounds a float image whose values lie in [0, 255] (any resize output) to uint8."""
    # Bilinear weights are convex, so values stay within [0, 255]: +0.5 and truncate rounds
    # without the extra clip a saturate_cast would spend.
    return tf.cast(image + 0.5, tf.uint8)


def resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    """Resizes a uint8 `[h, w, 3]` image to `[image_size, image_size, 3]` uint8."""
    resized = tf.image.resize(image, [image_size, image_size], method=RESIZE_METHOD)
    return to_uint8(resized)


def decode(image_bytes: tf.Tensor) -> tf.Tensor:
    """Decodes JPEG, PNG, BMP or GIF (first frame) bytes to uint8 RGB `[h, w, 3]`."""
    image = tf.io.decode_image(image_bytes, channels=CHANNELS, expand_animations=False)
    image.set_shape([None, None, CHANNELS])
    return image


def _decode_window(image_bytes: tf.Tensor, window_fn) -> tf.Tensor:
    """Decodes only the window `window_fn(shape)` picks: fused for JPEG, crop-after for others."""

    def jpeg():
        # The fused op skips the IDCT of blocks outside the window: most of the decode saving.
        shape = tf.io.extract_jpeg_shape(image_bytes)
        return tf.io.decode_and_crop_jpeg(image_bytes, window_fn(shape), channels=CHANNELS)

    def other():
        image = decode(image_bytes)
        window = window_fn(tf.shape(image))
        return tf.slice(image, [window[0], window[1], 0], [window[2], window[3], CHANNELS])

    image = tf.cond(tf.io.is_jpeg(image_bytes), jpeg, other)
    image.set_shape([None, None, CHANNELS])
    return image


def decode_and_random_crop(
    image_bytes: tf.Tensor,
    image_size: int,
    seed: tf.Tensor,
    area_range: tuple[float, float] = AREA_RANGE,
    aspect_range: tuple[float, float] = ASPECT_RANGE,
    boxes: tf.Tensor | None = None,
    min_object_covered: float = MIN_OBJECT_COVERED,
) -> tf.Tensor:
    """Training crop: decodes a random window of the encoded image, resized to uint8 `image_size`.

    Args:
      image_bytes: scalar string tensor, an encoded JPEG/PNG/BMP/GIF.
      image_size: output height and width.
      seed: shape-[2] integer tensor for the stateless window sampler.
      area_range, aspect_range, boxes, min_object_covered: see `random_crop_window`.

    Example:
      >>> image = decode_and_random_crop(tf.io.read_file("cat.jpg"), 224, seed=[0, 1])
      >>> image.dtype, image.shape
      (tf.uint8, TensorShape([224, 224, 3]))
    """
    image = _decode_window(
        image_bytes, lambda shape: random_crop_window(shape, seed, area_range, aspect_range,
                                                      boxes, min_object_covered)
    )
    return resize(image, image_size)


def center_crop_window(
    image_shape: tf.Tensor, image_size: int, resize_ratio: float = EVAL_RESIZE_RATIO
) -> tf.Tensor:
    """The window `[y, x, h, w]` that "resize short side to size*ratio, centre crop size" keeps.

    Cropping that window first and resizing it to `image_size` gives the same picture as resizing
    the whole image first, but decodes and resizes fewer pixels.
    """
    height, width = tf.unstack(tf.cast(image_shape[:2], tf.float32))
    resized_short = tf.round(image_size * resize_ratio)
    side = tf.round(tf.minimum(height, width) * image_size / resized_short)
    side = tf.clip_by_value(side, 1.0, tf.minimum(height, width))
    side = tf.cast(side, tf.int32)
    height, width = tf.unstack(tf.cast(image_shape[:2], tf.int32))
    # Floor, like cropping (resized - image_size) // 2 after a resize: odd pixel bottom/right.
    offset_y = (height - side) // 2
    offset_x = (width - side) // 2
    return tf.stack([offset_y, offset_x, side, side])


def center_crop(
    image_bytes: tf.Tensor, image_size: int, resize_ratio: float = EVAL_RESIZE_RATIO
) -> tf.Tensor:
    """Eval crop: the centre `image_size` square after resizing the short side to
    `image_size * resize_ratio`, uint8.

    Example:
      >>> center_crop(tf.io.read_file("cat.jpg"), 224).shape
      TensorShape([224, 224, 3])
    """
    image = _decode_window(
        image_bytes, lambda shape: center_crop_window(shape, image_size, resize_ratio)
    )
    return resize(image, image_size)


def flip(image: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """Mirrors `image` left-right with probability 1/2 (stateless: same seed, same choice)."""
    return tf.image.stateless_random_flip_left_right(image, seed)
