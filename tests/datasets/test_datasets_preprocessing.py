"""Per-example ops against NumPy references, each run eagerly and inside tf.data."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import preprocessing as pp


def numpy_bilinear(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Bilinear resize with half-pixel centres and edge clamping, in float64."""
    image = image.astype(np.float64)
    h, w = image.shape[:2]

    def axis(out, size):
        src = np.clip((np.arange(out) + 0.5) * size / out - 0.5, 0, size - 1)
        low = np.floor(src).astype(int)
        high = np.minimum(low + 1, size - 1)
        return low, high, src - low

    y0, y1, wy = axis(out_h, h)
    x0, x1, wx = axis(out_w, w)
    wy, wx = wy[:, None, None], wx[None, :, None]
    top = image[y0][:, x0] * (1 - wx) + image[y0][:, x1] * wx
    bottom = image[y1][:, x0] * (1 - wx) + image[y1][:, x1] * wx
    return top * (1 - wy) + bottom * wy


def gradient(height=96, width=128) -> np.ndarray:
    """An exactly linear integer image: bilinear resampling of it has a closed form."""
    y, x = np.mgrid[:height, :width]
    return np.stack([2 * x, 2 * y, x + y], axis=-1).astype(np.uint8)


def seeds(count, base=0):
    return [tf.constant([base, i], tf.int64) for i in range(count)]


# ---------------------------------------------------------------------------- crop window


def _windows(shape, count, **kwargs):
    dataset = tf.data.Dataset.range(count).map(
        lambda i: pp.random_crop_window(tf.constant(shape), tf.stack([tf.constant(7, tf.int64), i]),
                                        **kwargs))
    return np.stack(list(dataset.as_numpy_iterator())).T


@pytest.mark.parametrize("min_object_covered", [pp.MIN_OBJECT_COVERED, 0.0])
def test_random_crop_window_area_and_aspect_within_bounds(min_object_covered):
    y, x, h, w = _windows([480, 640, 3], 3000, min_object_covered=min_object_covered)
    assert np.all((y >= 0) & (x >= 0) & (y + h <= 480) & (x + w <= 640))
    whole = (h == 480) & (w == 640)  # sample_distorted_bounding_box's fallback after 100 misses
    area = h * w / (480 * 640)
    aspect = w / h
    # Without boxes the whole image is the object: Graphcore's 0.1 raises the smallest area.
    lo_area, hi_area = max(pp.AREA_RANGE[0], min_object_covered), pp.AREA_RANGE[1]
    lo_aspect, hi_aspect = pp.ASPECT_RANGE
    # Integer rounding of h and w moves area and aspect by at most about 1 / min(h, w).
    assert area.min() >= lo_area - 0.005 and area.max() <= hi_area
    crops = ~whole
    assert crops.mean() > 0.95  # 100 attempts leave few fallbacks to the whole image
    assert aspect[crops].min() >= lo_aspect - 0.02 and aspect[crops].max() <= hi_aspect + 0.02
    # The samples cover the ranges rather than sitting in one corner.
    assert area[crops].min() < lo_area + 0.03 and area[crops].max() > 0.9
    assert aspect[crops].min() < 0.78 and aspect[crops].max() > 1.28


def test_random_crop_window_covers_a_tenth_of_a_labelled_box():
    # A small box in the lower right corner: every window overlaps at least 10% of it, so the
    # windows crowd towards it (TensorFlow's sample_distorted_bounding_box semantics).
    box = np.array([0.7, 0.75, 0.95, 1.0])  # ymin, xmin, ymax, xmax
    y, x, h, w = _windows([400, 400, 3], 2000, boxes=tf.constant([box], tf.float32))
    top, left, bottom, right = box * 400
    overlap = (np.clip(np.minimum(y + h, bottom) - np.maximum(y, top), 0, None)
               * np.clip(np.minimum(x + w, right) - np.maximum(x, left), 0, None))
    covered = overlap / ((bottom - top) * (right - left))
    assert covered.min() >= 0.1 - 0.01
    free = _windows([400, 400, 3], 2000, min_object_covered=0.0)
    # Pulled down towards the box (the mean centre moves ~18 px; its noise is ~2 px).
    assert np.mean(y + h / 2) > np.mean(free[0] + free[2] / 2) + 10


def test_random_crop_window_eager_equals_tf_data_and_is_seeded():
    shape = tf.constant([100, 150, 3])
    eager = [pp.random_crop_window(shape, s).numpy() for s in seeds(5)]
    in_data = list(tf.data.Dataset.from_tensor_slices(tf.stack(seeds(5))).map(
        lambda s: pp.random_crop_window(shape, s)).as_numpy_iterator())
    np.testing.assert_array_equal(np.stack(eager), np.stack(in_data))
    assert len({tuple(w) for w in eager}) > 1


# ---------------------------------------------------------------------------- training crop


@pytest.mark.parametrize("fmt", ["png", "jpg"])
def test_decode_and_random_crop_matches_numpy_crop_and_resize(fmt, encode_image):
    data = encode_image(gradient(), fmt)
    # The reference crops the fully decoded image (for JPEG: TF's own full decode, as the
    # fused op must give the same pixels) and resizes it with NumPy.
    full = tf.io.decode_image(data, channels=3).numpy()
    for seed in seeds(6):
        y, x, h, w = pp.random_crop_window(tf.shape(full), seed).numpy()
        expected = numpy_bilinear(full[y:y + h, x:x + w], 40, 40)
        image = pp.decode_and_random_crop(tf.constant(data), 40, seed)
        assert image.dtype == tf.uint8 and image.shape == (40, 40, 3)
        np.testing.assert_allclose(image.numpy(), expected, atol=0.5 + 1e-3)


def test_decode_and_random_crop_inside_tf_data_equals_eager(encode_image):
    blobs = [encode_image(gradient(64 + 8 * i, 80), "jpg" if i % 2 else "png") for i in range(4)]
    seed_list = seeds(4, base=3)
    eager = [pp.decode_and_random_crop(tf.constant(b), 24, s).numpy()
             for b, s in zip(blobs, seed_list)]
    dataset = tf.data.Dataset.from_tensor_slices((blobs, tf.stack(seed_list))).map(
        lambda b, s: pp.decode_and_random_crop(b, 24, s), num_parallel_calls=2)
    np.testing.assert_array_equal(np.stack(eager), np.stack(list(dataset.as_numpy_iterator())))


# ---------------------------------------------------------------------------- eval crop


def test_center_crop_window_hand_computed():
    # 375x500, 224 -> short side 256: the kept square is 375 * 224 / 256 = 328.1 -> 328.
    window = pp.center_crop_window(tf.constant([375, 500, 3]), 224).numpy()
    np.testing.assert_array_equal(window, [(375 - 328) // 2, (500 - 328) // 2, 328, 328])
    window = pp.center_crop_window(tf.constant([600, 300, 3]), 100, resize_ratio=1.0).numpy()
    np.testing.assert_array_equal(window, [150, 0, 300, 300])


@pytest.mark.parametrize("shape", [(96, 128), (128, 90)])
def test_center_crop_is_the_centre_square_resized(shape, encode_image):
    image = gradient(*shape)
    size, ratio = 36, 256 / 224
    short = min(shape)
    side = round(short * size / round(size * ratio))  # the square a resize-then-crop keeps
    top, left = (shape[0] - side) // 2, (shape[1] - side) // 2
    expected = numpy_bilinear(image[top:top + side, left:left + side], size, size)
    result = pp.center_crop(tf.constant(encode_image(image, "png")), size, ratio).numpy()
    np.testing.assert_allclose(result, expected, atol=0.5 + 1e-3)


@pytest.mark.parametrize("shape", [(96, 128), (128, 90)])
def test_center_crop_approximates_resize_short_side_then_crop(shape, encode_image):
    image = gradient(*shape)
    size, ratio = 36, 256 / 224
    short = min(shape)
    resized_short = round(size * ratio)
    out_h = round(shape[0] * resized_short / short)
    out_w = round(shape[1] * resized_short / short)
    resized = numpy_bilinear(image, out_h, out_w)
    top, left = (out_h - size) // 2, (out_w - size) // 2
    expected = resized[top:top + size, left:left + size]
    result = pp.center_crop(tf.constant(encode_image(image, "png")), size, ratio).numpy()
    # Cropping first rounds the offset in source pixels instead of resized ones: sampling points
    # move by at most half a resized pixel plus half a source pixel, and the gradient rises by
    # at most 2 levels per source pixel.
    shift = 0.5 * short / resized_short + 0.5
    np.testing.assert_allclose(result, expected, atol=2 * shift + 0.5)


def test_center_crop_at_ratio_one_is_identity_on_a_square(encode_image):
    image = np.random.default_rng(0).integers(0, 256, (32, 32, 3), dtype=np.uint8)
    result = pp.center_crop(tf.constant(encode_image(image, "png")), 32, resize_ratio=1.0)
    np.testing.assert_array_equal(result.numpy(), image)


def test_center_crop_inside_tf_data_equals_eager(encode_image):
    blobs = [encode_image(gradient(60 + 10 * i, 70), "jpg" if i % 2 else "png") for i in range(4)]
    eager = np.stack([pp.center_crop(tf.constant(b), 28).numpy() for b in blobs])
    dataset = tf.data.Dataset.from_tensor_slices(blobs).map(lambda b: pp.center_crop(b, 28))
    np.testing.assert_array_equal(eager, np.stack(list(dataset.as_numpy_iterator())))


# ---------------------------------------------------------------------------- flip and decode


def test_flip_mirrors_half_the_time_eagerly_and_in_tf_data():
    image = tf.constant(np.random.default_rng(1).integers(0, 256, (5, 7, 3), dtype=np.uint8))
    mirrored = image.numpy()[:, ::-1]
    seed_list = seeds(40, base=11)
    eager = np.stack([pp.flip(image, s).numpy() for s in seed_list])
    in_data = np.stack(list(tf.data.Dataset.from_tensor_slices(tf.stack(seed_list)).map(
        lambda s: pp.flip(image, s)).as_numpy_iterator()))
    np.testing.assert_array_equal(eager, in_data)
    flipped = np.array([np.array_equal(e, mirrored) for e in eager])
    kept = np.array([np.array_equal(e, image.numpy()) for e in eager])
    assert np.all(flipped ^ kept)
    assert 8 <= flipped.sum() <= 32  # Binomial(40, 1/2): outside this range p < 1e-4


@pytest.mark.parametrize("mode", ["L", "RGBA"])
def test_decode_gives_rgb_for_grey_and_alpha_png(mode):
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new(mode, (6, 4), 200 if mode == "L" else (10, 20, 30, 128)).save(buffer, "PNG")
    image = pp.decode(tf.constant(buffer.getvalue())).numpy()
    expected = [200, 200, 200] if mode == "L" else [10, 20, 30]
    assert image.shape == (4, 6, 3)
    assert np.all(image == expected)


def test_resize_keeps_flat_colour_exactly():
    image = tf.fill([17, 23, 3], tf.constant(201, tf.uint8))
    out = pp.resize(image, 9)
    assert out.dtype == tf.uint8
    assert np.all(out.numpy() == 201)


def test_decode_and_resize_inside_tf_data_equal_eager(encode_image):
    blobs = [encode_image(gradient(30 + 4 * i, 40), "jpg" if i % 2 else "png") for i in range(4)]
    eager = np.stack([pp.resize(pp.decode(tf.constant(b)), 10).numpy() for b in blobs])
    dataset = tf.data.Dataset.from_tensor_slices(blobs).map(lambda b: pp.resize(pp.decode(b), 10))
    np.testing.assert_array_equal(eager, np.stack(list(dataset.as_numpy_iterator())))
