"""Mixup and CutMix against hand-computed mixes, eagerly and inside tf.data."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.datasets import mixing

BATCH, HEIGHT, WIDTH, CLASSES = 6, 20, 30, 8
LEVELS = np.array([10, 60, 100, 150, 200, 250], np.uint8)


def flat_batch():
    """Image i is flat at LEVELS[i] with label i: every mixed pixel and label is traceable."""
    images = np.broadcast_to(LEVELS[:, None, None, None], (BATCH, HEIGHT, WIDTH, 3)).copy()
    labels = np.eye(CLASSES, dtype=np.float32)[:BATCH]
    return tf.constant(images), tf.constant(labels)


def seed(i):
    return tf.constant([5, i], tf.int64)


# ---------------------------------------------------------------------------- mixup


def test_sample_beta_matches_beta_moments():
    alpha = 0.2
    draws = np.array(list(tf.data.Dataset.range(4000).map(
        lambda i: mixing.sample_beta(alpha, tf.stack([tf.constant(1, tf.int64), i])))
        .as_numpy_iterator()))
    assert np.all((draws >= 0) & (draws <= 1)) and np.all(np.isfinite(draws))
    # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); standard errors ~0.007 and ~0.002.
    assert abs(draws.mean() - 0.5) < 0.03
    assert abs(draws.var() - 1 / (4 * (2 * alpha + 1))) < 0.01
    eager = [mixing.sample_beta(alpha, tf.constant([1, i], tf.int64)).numpy() for i in range(3)]
    np.testing.assert_array_equal(eager, draws[:3])


def test_sample_beta_never_nan_for_tiny_alpha():
    draws = np.array(list(tf.data.Dataset.range(3000).map(
        lambda i: mixing.sample_beta(0.01, tf.stack([tf.constant(2, tf.int64), i])))
        .as_numpy_iterator()))
    assert np.all(np.isfinite(draws)) and np.all((draws >= 0) & (draws <= 1))


def check_mixup(images, labels):
    images, labels = np.asarray(images), np.asarray(labels)
    np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-6)
    lam = labels[0, 0]  # image 0 keeps lam of itself, 1 - lam of image BATCH - 1
    for i in range(BATCH):
        partner = BATCH - 1 - i
        expected_label = np.zeros(CLASSES)
        expected_label[i] += lam
        expected_label[partner] += 1 - lam
        np.testing.assert_allclose(labels[i], expected_label, atol=1e-6)
        value = lam * float(LEVELS[i]) + (1 - lam) * float(LEVELS[partner])
        assert np.all(np.abs(images[i].astype(np.float64) - value) <= 0.5 + 1e-4)
    return lam


def test_mixup_mixes_images_and_labels_by_the_same_lambda():
    images, labels = flat_batch()
    lams = []
    for i in range(5):
        mixed, mixed_labels = mixing.mixup(images, labels, 0.4, seed(i))
        assert mixed.dtype == tf.uint8 and mixed_labels.dtype == tf.float32
        lams.append(check_mixup(mixed, mixed_labels))
    assert len(set(np.round(lams, 6))) == 5  # a new lambda per seed


def test_mixup_inside_tf_data_equals_eager():
    images, labels = flat_batch()
    eager = mixing.mixup(images, labels, 0.4, seed(9))
    dataset = tf.data.Dataset.from_tensors((images, labels)).map(
        lambda x, y: mixing.mixup(x, y, 0.4, seed(9)))
    in_data = next(iter(dataset))
    check_mixup(*in_data)
    np.testing.assert_array_equal(eager[0].numpy(), in_data[0].numpy())
    np.testing.assert_array_equal(eager[1].numpy(), in_data[1].numpy())


# ---------------------------------------------------------------------------- cutmix


def pasted_mask(mixed):
    """Where image i shows its partner (image i - 1) instead of itself; checks nothing else."""
    mixed = np.asarray(mixed)[..., 0]
    own = LEVELS[:, None, None]
    partner = np.roll(LEVELS, 1)[:, None, None]
    assert np.all((mixed == own) | (mixed == partner))
    return mixed == partner


def check_cutmix(mixed, labels):
    mask = pasted_mask(mixed)
    box = mask[0]
    assert all(np.array_equal(m, box) for m in mask)  # one box for the whole batch
    rows, cols = np.nonzero(box.any(axis=1))[0], np.nonzero(box.any(axis=0))[0]
    if box.any():  # the pasted region is one solid rectangle
        assert box[rows.min():rows.max() + 1, cols.min():cols.max() + 1].all()
    area = box.mean()
    labels = np.asarray(labels)
    np.testing.assert_allclose(labels.sum(axis=1), 1.0, atol=1e-6)
    for i in range(BATCH):
        expected = np.zeros(CLASSES)
        expected[i] += 1 - area
        expected[(i - 1) % BATCH] += area
        np.testing.assert_allclose(labels[i], expected, atol=1e-6)
    return area


@pytest.mark.parametrize("lam", [0.9, 0.6])
def test_cutmix_label_weight_is_the_pasted_area(lam):
    images, labels = flat_batch()
    areas = []
    for i in range(30):
        box = mixing.cutmix_box(HEIGHT, WIDTH, lam, seed(i)).numpy()
        mixed, mixed_labels = mixing.cutmix(images, labels, lam, seed(i))
        area = check_cutmix(mixed, mixed_labels)
        y0, x0, y1, x1 = box
        assert area == pytest.approx((y1 - y0) * (x1 - x0) / (HEIGHT * WIDTH))
        areas.append(area)
    nominal = (round(HEIGHT * np.sqrt(1 - lam)) * round(WIDTH * np.sqrt(1 - lam))
               / (HEIGHT * WIDTH))
    areas = np.array(areas)
    # Clipping only ever shrinks the box; unclipped boxes have exactly the nominal area.
    assert np.all(areas <= nominal + 1e-9)
    assert np.any(np.isclose(areas, nominal)) and np.any(areas < nominal)


def test_cutmix_inside_tf_data_equals_eager():
    images, labels = flat_batch()
    eager = mixing.cutmix(images, labels, 0.7, seed(3))
    in_data = next(iter(tf.data.Dataset.from_tensors((images, labels)).map(
        lambda x, y: mixing.cutmix(x, y, 0.7, seed(3)))))
    check_cutmix(*in_data)
    np.testing.assert_array_equal(eager[0].numpy(), in_data[0].numpy())
    np.testing.assert_array_equal(eager[1].numpy(), in_data[1].numpy())


def test_mix_batch_combines_both_and_labels_sum_to_one():
    images, labels = flat_batch()
    for i in range(5):
        mixed, mixed_labels = mixing.mix_batch(images, labels, seed(i), mixup_alpha=0.2,
                                               cutmix_lambda=0.8)
        assert mixed.dtype == tf.uint8 and mixed.shape == images.shape
        np.testing.assert_allclose(mixed_labels.numpy().sum(axis=1), 1.0, atol=1e-6)
        assert np.all(mixed_labels.numpy() >= 0)
    same = mixing.mix_batch(images, labels, seed(1), mixup_alpha=0.2, cutmix_lambda=0.8)
    again = mixing.mix_batch(images, labels, seed(1), mixup_alpha=0.2, cutmix_lambda=0.8)
    np.testing.assert_array_equal(same[1].numpy(), again[1].numpy())


def test_mix_batch_off_is_identity():
    images, labels = flat_batch()
    mixed, mixed_labels = mixing.mix_batch(images, labels, seed(0))
    np.testing.assert_array_equal(mixed.numpy(), images.numpy())
    np.testing.assert_array_equal(mixed_labels.numpy(), labels.numpy())
