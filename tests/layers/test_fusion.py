"""Each layer's fused inference form (keras_efficientnet/layers/fusion.py) against NumPy and
against the same layers called one by one. Runs on TensorFlow (the EuclideanNorm fast path and
the portable one) and under JAX (the portable one)."""

import keras
import numpy as np
import pytest
from keras import ops

from keras_efficientnet.layers import GroupConv2D, MBConvBlock, ProxyNormActivation, fusion
from keras_efficientnet.layers.normalization import GroupNormalization

PORTABLE = (False, True) if keras.backend.backend() == "tensorflow" else (True,)


def _numpy(value) -> np.ndarray:
    return np.asarray(ops.convert_to_numpy(value))


def _perturb(layer, seed: int, size: float = 0.3) -> None:
    """Moves every weight off its initial value (ones and zeros hide a misplaced gamma)."""
    rng = np.random.default_rng(seed)
    for weight in layer.weights:
        noise = size * rng.standard_normal(weight.shape).astype("float32")
        value = _numpy(weight) + noise
        weight.assign(np.abs(value) + 0.1 if "variance" in weight.path else value)


def _swish(v):
    return v / (1 + np.exp(-v))


@pytest.mark.parametrize("portable", PORTABLE)
@pytest.mark.parametrize("groups", [1, 4])
def test_norm_then_proxy_norm_fused_equals_the_paper_formula_in_numpy(groups, portable):
    """GroupNorm (LayerNorm at one group) without affine, then Proxy Norm, written out in
    NumPy: the fused pair leaves the proxy's 1 / sigma pending and applies everything else."""
    x = np.random.default_rng(1).standard_normal((2, 5, 5, 8)).astype("float32") * 3 + 1
    norm = GroupNormalization(groups, epsilon=1e-3, center=False, scale=False)
    act = ProxyNormActivation("swish")
    norm.build(x.shape)
    act.build(x.shape)
    _perturb(act, 2)
    y, pending = norm.fused_call(x, portable=portable)
    assert pending is not None and not pending.per_channel  # per sample: nothing folds it
    y, pending = act.fused_call(y, pending)
    assert pending.per_channel  # the proxy's: a convolution can take it
    actual = _numpy(fusion.materialize(y, pending))

    grouped = x.reshape(2, 5, 5, groups, 8 // groups)
    mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
    variance = grouped.var(axis=(1, 2, 4), keepdims=True)
    normalized = ((grouped - mean) / np.sqrt(variance + 1e-3)).reshape(x.shape)
    gamma, beta, proxy_beta, proxy_gamma = (_numpy(w) for w in (
        act.gamma, act.beta, act.proxy_beta, act.proxy_gamma))
    z = _swish(gamma * normalized + beta)
    proxy = _swish(gamma * (proxy_beta + (1 + proxy_gamma) * act._quantiles) + beta)
    expected = (z - proxy.mean(0)) / np.sqrt(proxy.var(0) + act.epsilon)
    np.testing.assert_allclose(actual, expected, rtol=0, atol=2e-5)
    np.testing.assert_allclose(_numpy(act(norm(x))), expected, rtol=0, atol=2e-5)


@pytest.mark.parametrize("portable", PORTABLE)
def test_the_statistics_keep_their_digits_on_flat_and_offset_maps(portable):
    """`var = E[x^2] - E[x]^2` loses digits when the mean dwarfs the spread: a constant map
    has variance 0 (never negative), and an offset one keeps its normalized values."""
    flat = np.full((1, 4, 4, 8), 255.0, "float32")
    mean, inverse_std = fusion.group_moments(flat, 2, 1e-3, portable)
    np.testing.assert_allclose(_numpy(mean), 255.0)
    np.testing.assert_allclose(_numpy(inverse_std), 1 / np.sqrt(1e-3), rtol=1e-3)
    x = 100.0 + np.random.default_rng(3).standard_normal((2, 6, 6, 4)).astype("float32")
    mean, inverse_std = fusion.group_moments(x, 1, 1e-3, portable)
    expected = (x - x.mean(axis=(1, 2, 3), keepdims=True)) / np.sqrt(
        x.var(axis=(1, 2, 3), keepdims=True) + 1e-3)
    np.testing.assert_allclose(_numpy((x - mean) * inverse_std), expected, rtol=0, atol=2e-3)


def test_output_affine_and_then_are_the_affines_they_name():
    act = ProxyNormActivation("swish")
    act.build((None, 4))
    _perturb(act, 4)
    y = np.random.default_rng(5).standard_normal((3, 4)).astype("float32")
    scale, shift = (_numpy(v) for v in act.output_affine())
    z = _swish(_numpy(act.gamma) * y + _numpy(act.beta))
    np.testing.assert_allclose(_numpy(act(y)), z * scale + shift, rtol=0, atol=1e-5)
    a = fusion.Affine(np.float32([2.0, -1.0]), np.float32([0.5, 3.0]))
    both = a.then(np.float32([3.0, 4.0]), np.float32([1.0, -2.0]))
    v = np.float32([[1.5, -0.5]])
    np.testing.assert_allclose(fusion.materialize(v, both), (v * a.scale + a.shift)
                               * np.float32([3.0, 4.0]) + np.float32([1.0, -2.0]))


@pytest.mark.parametrize("kernel_size,group_size,strides", [
    (1, 24, 1),  # dense 1x1: the pending shift becomes a bias
    (3, 12, 2),  # two groups, zero padding at stride 2: the shift goes before the conv
    (3, 1, 1),   # depthwise
])
def test_group_conv_folds_a_per_channel_affine_into_its_kernel(kernel_size, group_size, strides):
    x = np.random.default_rng(6).standard_normal((2, 9, 9, 24)).astype("float32")
    conv = GroupConv2D(24, kernel_size, strides, group_size=group_size)
    conv.build(x.shape)
    rng = np.random.default_rng(7)
    pending = fusion.Affine(rng.uniform(0.5, 2.0, 24).astype("float32"),
                            rng.standard_normal(24).astype("float32"))
    expected = _numpy(conv(x * pending.scale + pending.shift))
    outputs, after = conv.fused_call(x, pending)
    assert after is None
    np.testing.assert_allclose(_numpy(outputs), expected, rtol=0, atol=1e-4)
    np.testing.assert_allclose(_numpy(conv.fused_call(x)[0]), _numpy(conv(x)), rtol=0,
                               atol=1e-5)


def test_keras_conv_folds_through_fused_step_and_other_layers_get_the_value():
    x = np.random.default_rng(8).standard_normal((2, 6, 6, 8)).astype("float32")
    pending = fusion.Affine(np.linspace(0.5, 1.5, 8).astype("float32"),
                            np.linspace(-1, 1, 8).astype("float32"))
    value = x * pending.scale + pending.shift
    for layer in (keras.layers.Conv2D(5, 1, use_bias=False),
                  keras.layers.Conv2D(5, 3, strides=2, padding="same", use_bias=False),
                  keras.layers.Activation("swish")):
        layer.build(x.shape)
        outputs, after = fusion.fused_step(layer, x, pending)
        assert after is None
        np.testing.assert_allclose(_numpy(outputs), _numpy(layer(value)), rtol=0, atol=1e-4)


@pytest.mark.parametrize("portable", PORTABLE)
@pytest.mark.parametrize("norm,proxy_norm,strides,filters_out", [
    ("layer", True, 1, 16),   # G16-LN+PN: residual, the gate takes the proxy 1 / sigma
    ("group", False, 2, 24),  # G16-GN: no residual, the norms' own affines
    ("batch", False, 1, 16),  # G1-BN's layers pass through as they are
])
def test_block_fused_call_equals_its_layers(norm, proxy_norm, strides, filters_out, portable):
    x = np.random.default_rng(9).standard_normal((2, 8, 8, 16)).astype("float32")
    block = MBConvBlock(16, filters_out, 3, strides, expand_ratio=4, group_size=16, norm=norm,
                        proxy_norm=proxy_norm, drop_rate=0.2, name="block")
    block.build(x.shape)
    _perturb(block, 10, size=0.2)
    expected = _numpy(block(x, training=False))
    # A pending per-channel affine from the layer before (the stem's Proxy Norm) folds in,
    # or is applied first where the residual needs the value itself.
    pending = fusion.Affine(np.linspace(0.5, 1.5, 16).astype("float32"),
                            np.linspace(-0.3, 0.3, 16).astype("float32"))
    outputs, after = block.fused_call(x, portable=portable)
    assert after is None
    scale = max(1.0, float(np.abs(expected).max()))
    np.testing.assert_allclose(_numpy(outputs), expected, rtol=0, atol=1e-5 * scale)
    shifted = _numpy(block(x * pending.scale + pending.shift, training=False))
    np.testing.assert_allclose(_numpy(block.fused_call(x, pending, portable=portable)[0]),
                               shifted, rtol=0, atol=1e-5 * scale)
