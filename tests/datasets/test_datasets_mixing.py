"""Mixup and CutMix (Graphcore's draws and partners) against NumPy references on fixed seeds,
closed-form statistics of the draws, eagerly and inside tf.data."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tensorflow as tf
from scipy import stats

from keras_efficientnet.datasets import mixing

BATCH, HEIGHT, WIDTH, CLASSES = 6, 20, 30, 8
LEVELS = np.array([10, 60, 100, 150, 200, 250], np.uint8)


def flat_batch():
    """Image i is flat at LEVELS[i] with label i: every mixed pixel and label is traceable."""
    images = np.broadcast_to(LEVELS[:, None, None, None], (BATCH, HEIGHT, WIDTH, 3)).copy()
    labels = np.eye(CLASSES, dtype=np.float32)[:BATCH]
    return tf.constant(images), tf.constant(labels)


def random_batch(dtype="uint8", seed=0):
    rng = np.random.default_rng(seed)
    images = rng.integers(0, 256, (BATCH, HEIGHT, WIDTH, 3)).astype(dtype)
    labels = np.eye(CLASSES, dtype=np.float32)[rng.integers(0, CLASSES, BATCH)]
    return images, labels


def seed(i):
    return tf.constant([5, i], tf.int64)


# ---------------------------------------------------------------------------- NumPy references


def np_mixup(images, labels, mix):
    """Graphcore's mixup_image: example i with example i - 1, by mix[i] (float32 arithmetic)."""
    mix = mix.astype(np.float32)
    w = mix[:, None, None, None]
    mixed = w * images.astype(np.float32) + (np.float32(1) - w) * np.roll(images, 1, 0).astype(
        np.float32)
    if images.dtype == np.uint8:
        mixed = np.round(mixed).astype(np.uint8)
    return mixed, mix[:, None] * labels + (1 - mix[:, None]) * np.roll(labels, 1, 0)


def np_box(height, width, lam, cy, cx):
    """Graphcore's cutmix box: sides sqrt(1 - lam) of the image, centre clipped inside."""
    cut = np.sqrt(np.float32(1) - np.float32(lam))
    ch, cw = cut * np.float32(height), cut * np.float32(width)
    cy = np.clip(np.float32(cy), ch / 2, np.float32(height) - ch / 2)
    cx = np.clip(np.float32(cx), cw / 2, np.float32(width) - cw / 2)
    return [int(np.round(v)) for v in (cy - ch / 2, cx - cw / 2, cy + ch / 2, cx + cw / 2)]


def np_cutmix(images, labels, lam, cy, cx):
    y0, x0, y1, x1 = np_box(images.shape[1], images.shape[2], lam, cy, cx)
    mask = np.zeros(images.shape[1:3], bool)
    mask[y0:y1, x0:x1] = True
    shift = 2 if len(images) > 2 else 1
    mixed = np.where(mask[None, :, :, None], np.roll(images, shift, 0), images)
    kept = 1 - mask.mean()
    return mixed, kept * labels + (1 - kept) * np.roll(labels, shift, 0), kept


# ---------------------------------------------------------------------------- mixup


def test_sample_beta_matches_beta_moments():
    alpha = 0.2
    draws = mixing.sample_beta(alpha, seed(1), [4000]).numpy()
    assert np.all((draws >= 0) & (draws <= 1)) and np.all(np.isfinite(draws))
    # Beta(a, a): mean 1/2, variance 1 / (4 (2a + 1)); standard errors ~0.007 and ~0.002.
    assert abs(draws.mean() - 0.5) < 0.03
    assert abs(draws.var() - 1 / (4 * (2 * alpha + 1))) < 0.01
    tiny = mixing.sample_beta(0.01, seed(2), [3000]).numpy()
    assert np.all(np.isfinite(tiny)) and np.all((tiny >= 0) & (tiny <= 1))


@pytest.mark.parametrize("alpha", [0.1, 0.2])
def test_mixup_coefficients_are_folded_beta_draws_one_per_example(alpha):
    ours = mixing.mixup_coefficients(20_000, alpha, seed(3)).numpy()
    draws = np.random.default_rng(0).beta(alpha, alpha, 20_000)
    # Graphcore's fold of NumPy's draws, in float32 as Graphcore casts them (at alpha 0.1 many
    # draws lie within float32's resolution of 1).
    reference = np.maximum(draws, 1 - draws).astype(np.float32)
    assert ours.shape == (20_000,) and ours.min() >= 0.5 and ours.max() <= 1.0
    # Same distribution: two-sample Kolmogorov-Smirnov distance well inside sampling noise.
    assert stats.ks_2samp(ours, reference).statistic < 0.02
    assert len(np.unique(ours[:BATCH])) == BATCH  # a coefficient per example, not per batch


@pytest.mark.parametrize("dtype", ["uint8", "float32"])
def test_mixup_matches_numpy_on_fixed_seeds(dtype):
    images, labels = random_batch(dtype)
    for i in range(3):
        mix = mixing.mixup_coefficients(BATCH, 0.4, seed(i)).numpy()
        mixed, mixed_labels = mixing.mixup(tf.constant(images), tf.constant(labels), 0.4, seed(i))
        expected, expected_labels = np_mixup(images, labels, mix)
        assert mixed.dtype == tf.as_dtype(dtype)
        np.testing.assert_allclose(mixed.numpy().astype(float), expected.astype(float),
                                   atol=1 if dtype == "uint8" else 1e-4)
        np.testing.assert_allclose(mixed_labels.numpy(), expected_labels, rtol=1e-6, atol=1e-7)


def test_mixup_inside_tf_data_equals_eager():
    images, labels = flat_batch()
    eager = mixing.mixup(images, labels, 0.4, seed(9))
    in_data = next(iter(tf.data.Dataset.from_tensors((images, labels)).map(
        lambda x, y: mixing.mixup(x, y, 0.4, seed(9)))))
    np.testing.assert_array_equal(eager[0].numpy(), in_data[0].numpy())
    np.testing.assert_array_equal(eager[1].numpy(), in_data[1].numpy())


# ---------------------------------------------------------------------------- cutmix


def test_cutmix_v1_lambda_formula_against_numpy():
    rng = np.random.default_rng(1)
    u_cut = rng.uniform(size=1000).astype(np.float32)
    u_size = rng.uniform(math.exp(-4), 1, 1000).astype(np.float32)
    for nominal in (0.95, 0.85, 0.8):
        expected = np.where(u_cut < 1.55 * nominal - 0.96, 1.0, 1 + np.log(u_size) / 4)
        np.testing.assert_allclose(mixing.cutmix_v1_lambda(nominal, u_cut, u_size).numpy(),
                                   expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("nominal", [0.95, 0.85, 0.8])
def test_cutmix_v1_draws_have_graphcores_distribution(nominal):
    lam = mixing.sample_cutmix_lambda(nominal, seed(4), version=1, shape=[40_000]).numpy()
    uncut = lam == 1.0
    # P(no cut) = 1.55 lambda - 0.96; the standard error at 40,000 draws is < 0.0025.
    assert uncut.mean() == pytest.approx(1.55 * nominal - 0.96, abs=0.01)
    # Cut: lambda = 1 + ln(u) / 4, u ~ U(a, 1), a = e^-4: E ln u = (5a - 1) / (1 - a).
    a = math.exp(-4)
    cut = lam[~uncut]
    assert cut.min() >= 0.0 and cut.max() < 1.0
    assert cut.mean() == pytest.approx(1 + (5 * a - 1) / (1 - a) / 4, abs=0.005)
    fixed = mixing.sample_cutmix_lambda(nominal, seed(4), version=2, shape=[3]).numpy()
    np.testing.assert_allclose(fixed, nominal)


@pytest.mark.parametrize("lam", [0.9, 0.6, 0.05, 1.0])
def test_cutmix_box_matches_numpy_and_stays_inside(lam):
    centres = [(0.0, 0.0), (19.99, 29.99), (10.0, 15.0), (3.3, 27.1), (17.2, 1.4)]
    for cy, cx in centres:
        box = mixing.cutmix_box(HEIGHT, WIDTH, lam, tf.constant([cy, cx])).numpy().tolist()
        assert box == np_box(HEIGHT, WIDTH, lam, cy, cx)
        y0, x0, y1, x1 = box
        assert 0 <= y0 <= y1 <= HEIGHT and 0 <= x0 <= x1 <= WIDTH
        # Inside the image the box keeps its nominal sides (to rounding): no clipping loss.
        assert abs((y1 - y0) - HEIGHT * math.sqrt(1 - lam)) <= 1
        assert abs((x1 - x0) - WIDTH * math.sqrt(1 - lam)) <= 1


@pytest.mark.parametrize("batch", [BATCH, 2])
def test_cutmix_matches_numpy_with_the_batch_rolled_by_two(batch):
    images, labels = random_batch()
    images, labels = images[:batch], labels[:batch]
    for lam, (cy, cx) in ((0.7, (4.2, 25.3)), (0.85, (10.0, 3.0)), (1.0, (5.0, 5.0))):
        mixed, mixed_labels = mixing.cutmix_with(tf.constant(images), tf.constant(labels),
                                                 tf.constant(lam), tf.constant([cy, cx]))
        expected, expected_labels, kept = np_cutmix(images, labels, lam, cy, cx)
        np.testing.assert_array_equal(mixed.numpy(), expected)
        np.testing.assert_allclose(mixed_labels.numpy(), expected_labels, rtol=1e-6, atol=1e-7)
        if lam == 1.0:  # v1's "no cut"
            assert kept == 1.0 and np.array_equal(mixed.numpy(), images)


def test_cutmix_draws_one_box_per_batch_and_is_reproducible_inside_tf_data():
    images, labels = flat_batch()
    eager = mixing.cutmix(images, labels, 0.8, seed(3))
    in_data = next(iter(tf.data.Dataset.from_tensors((images, labels)).map(
        lambda x, y: mixing.cutmix(x, y, 0.8, seed(3)))))
    np.testing.assert_array_equal(eager[0].numpy(), in_data[0].numpy())
    np.testing.assert_array_equal(eager[1].numpy(), in_data[1].numpy())
    # Over seeds, v1 leaves about 1.55 * 0.8 - 0.96 = 28% of the batches uncut.
    uncut = [np.array_equal(mixing.cutmix(images, labels, 0.8, seed(i))[0].numpy(),
                            images.numpy()) for i in range(100)]
    assert 0.14 < np.mean(uncut) < 0.42  # 3 standard errors either side


# ---------------------------------------------------------------------------- both


def test_mix_batch_gives_graphcores_four_label_weights():
    # Graphcore's loss labels with Mixup and CutMix: m_i a y_i + (1 - m_i) a y_{i-1}
    # + m_{i-2} (1 - a) y_{i-2} + (1 - m_{i-2}) (1 - a) y_{i-3}, a the area kept.
    images, labels = random_batch("float32", seed=2)
    batch_seed = seed(7)
    mixed, mixed_labels = mixing.mix_batch(tf.constant(images), tf.constant(labels), batch_seed,
                                           mixup_alpha=0.2, cutmix_lambda=0.6,
                                           cutmix_version=2)
    # The draws mix_batch makes, from the same seeds (mixup first, then cutmix).
    mixup_seed, cutmix_seed = tf.unstack(tf.random.experimental.stateless_split(batch_seed, 2))
    mix = mixing.mixup_coefficients(BATCH, 0.2, mixup_seed).numpy()
    _, centre_seed = tf.unstack(tf.random.experimental.stateless_split(cutmix_seed, 2))
    cy, cx = mixing.sample_centre(HEIGHT, WIDTH, centre_seed).numpy()
    mixed_images, _ = np_mixup(images, labels, mix)
    expected, _, kept = np_cutmix(mixed_images, labels, 0.6, cy, cx)
    np.testing.assert_allclose(mixed.numpy(), expected, rtol=1e-5, atol=1e-3)
    four = (mix[:, None] * kept * labels
            + (1 - mix[:, None]) * kept * np.roll(labels, 1, 0)
            + np.roll(mix, 2)[:, None] * (1 - kept) * np.roll(labels, 2, 0)
            + (1 - np.roll(mix, 2))[:, None] * (1 - kept) * np.roll(labels, 3, 0))
    np.testing.assert_allclose(mixed_labels.numpy(), four, rtol=1e-5, atol=1e-6)
    assert 0 < kept < 1


def test_mix_batch_off_is_identity_and_a_bad_version_is_named():
    images, labels = flat_batch()
    mixed, mixed_labels = mixing.mix_batch(images, labels, seed(0))
    np.testing.assert_array_equal(mixed.numpy(), images.numpy())
    np.testing.assert_array_equal(mixed_labels.numpy(), labels.numpy())
    with pytest.raises(ValueError, match=r"cutmix_version must be one of \[1, 2\], received 3"):
        mixing.mix_batch(images, labels, seed(0), cutmix_lambda=0.8, cutmix_version=3)
