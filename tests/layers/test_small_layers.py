"""SqueezeExcite, StochasticDepth, ImageNormalization and MBConvBlock against NumPy."""

import keras
import numpy as np
import pytest

from keras_efficientnet.layers import (
    ImageNormalization,
    MBConvBlock,
    SqueezeExcite,
    StochasticDepth,
)
from tests.helpers import assert_config_round_trip


def _np(x):
    return keras.ops.convert_to_numpy(x)


def test_squeeze_excite_matches_numpy():
    rng = np.random.default_rng(0)
    x = rng.standard_normal((2, 5, 5, 8)).astype("float32")
    se = SqueezeExcite(2, activation="swish")
    se.build(x.shape)
    w1, b1 = (_np(v) for v in se.reduce.weights)
    w2, b2 = (_np(v) for v in se.expand.weights)
    pooled = x.mean(axis=(1, 2))
    hidden = pooled @ w1[0, 0] + b1
    hidden = hidden / (1 + np.exp(-hidden))
    gates = 1 / (1 + np.exp(-(hidden @ w2[0, 0] + b2)))
    np.testing.assert_allclose(_np(se(x)), x * gates[:, None, None, :], rtol=1e-5, atol=1e-6)


def test_stochastic_depth_drops_whole_samples_and_keeps_the_mean():
    drop = StochasticDepth(0.25, seed=3)
    x = np.ones((4000, 2, 2, 3), "float32")
    y = _np(drop(x, training=True))
    per_sample = y.reshape(4000, -1)
    # Each sample is either all zero or all 1 / 0.75.
    values = np.unique(per_sample)
    assert len(values) == 2
    np.testing.assert_allclose(values, [0.0, 1 / 0.75], rtol=1e-6)
    assert np.all(per_sample.min(1) == per_sample.max(1))
    kept = (per_sample[:, 0] > 0).mean()
    assert kept == pytest.approx(0.75, abs=0.03)
    np.testing.assert_array_equal(_np(drop(x, training=False)), x)


def test_image_normalization_of_uint8_matches_numpy():
    x = np.random.default_rng(0).integers(0, 256, (2, 3, 3, 3)).astype("uint8")
    layer = ImageNormalization()
    mean = np.array([0.485, 0.456, 0.406]) * 255
    std = np.array([0.229, 0.224, 0.225]) * 255
    np.testing.assert_allclose(_np(layer(x)), (x - mean) / std, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="4 channels"):
        ImageNormalization()(np.zeros((1, 2, 2, 4), "uint8"))


def test_mbconv_residual_and_parameter_count():
    block = MBConvBlock(16, 16, kernel_size=3, expand_ratio=4, group_size=16, norm="group",
                        name="block2b")
    x = np.random.default_rng(0).standard_normal((2, 8, 8, 16)).astype("float32")
    y = block(x)
    assert y.shape == (2, 8, 8, 16) and block.has_residual
    # expand 16*64; 2 GN (gamma, beta) of 64; group conv 3*3*16*64; SE 64*4+4 + 4*64+64;
    # project 64*16; GN of 16.
    expected = 16 * 64 + 2 * 64 * 2 + 9 * 16 * 64 + (64 * 4 + 4) + (4 * 64 + 64) + 64 * 16 + 32
    assert sum(int(np.prod(w.shape)) for w in block.trainable_weights) == expected
    # Zeroing the projection leaves only the skip connection.
    project = next(layer for layer in block.ordered_layers if layer.name == "project_conv")
    project.kernel.assign(np.zeros(project.kernel.shape, "float32"))
    norm = next(layer for layer in block.ordered_layers if layer.name == "project_norm")
    norm.beta.assign(np.zeros(norm.beta.shape, "float32"))
    np.testing.assert_allclose(_np(block(x)), x, atol=1e-6)


def test_mbconv_errors_name_the_block():
    with pytest.raises(ValueError, match=r"block3a: group_size=16 gives .* 3 groups, which do "
                                         r"not split its 56 channels"):
        MBConvBlock(56, 40, expand_ratio=1, group_size=16, name="block3a")
    with pytest.raises(ValueError, match="block3a: proxy_norm=True needs"):
        MBConvBlock(16, 16, proxy_norm=True, norm="batch", name="block3a")
    with pytest.raises(ValueError, match="block3a: norm must be one of"):
        MBConvBlock(16, 16, norm="instance", name="block3a")


@pytest.mark.parametrize("layer", [
    SqueezeExcite(4, "relu"), StochasticDepth(0.1, seed=1),
    ImageNormalization((1, 2, 3), (4, 5, 6)),
    MBConvBlock(16, 24, 5, 2, expand_ratio=4, se_ratio=0.25, group_size=16, norm="layer",
                norm_groups=4, proxy_norm=True, activation="swish", drop_rate=0.1, name="block4a"),
])
def test_config_round_trip(layer):
    assert_config_round_trip(layer)


def _swish(v):
    return v / (1.0 + np.exp(-v))


def _layer_norm(v, eps=1e-3):
    mean = v.mean(axis=(1, 2, 3), keepdims=True)
    return (v - mean) / np.sqrt(v.var(axis=(1, 2, 3), keepdims=True) + eps)


def test_mbconv_with_proxy_norm_folds_the_proxy_scale_into_the_se_gate():
    # NumPy reference of one LN+PN block as Graphcore builds it: expand -> LN -> PN; group conv
    # -> LN -> act(gamma y + beta) - mu, unscaled; SE pools that, and its gate is multiplied by
    # the proxy's 1 / sigma; project -> scale-only LN; residual.
    from scipy import stats

    from tests.layers.test_group_conv import reference_conv

    rng = np.random.default_rng(3)
    block = MBConvBlock(16, 16, kernel_size=3, expand_ratio=2, group_size=16, norm="layer",
                        proxy_norm=True, name="block2b")
    x = rng.standard_normal((2, 6, 6, 16)).astype("float32")
    block.build(x.shape)
    for weight in block.trainable_weights:  # every weight off its initial value
        weight.assign(rng.uniform(0.2, 1.2, weight.shape).astype("float32")
                      * rng.choice([-1.0, 1.0], weight.shape).astype("float32"))
    layers = {layer.name: layer for layer in block.ordered_layers}
    u = stats.norm.ppf((np.arange(200) + 0.5) / 200)[:, None]

    def proxy_norm(v, layer, scaled):
        gamma, beta, pb, pg = (_np(w).astype("float64") for w in (
            layer.gamma, layer.beta, layer.proxy_beta, layer.proxy_gamma))
        proxy = _swish(gamma * (pb + (1 + pg) * u) + beta)
        centred = _swish(gamma * v + beta) - proxy.mean(0)
        inv_std = 1 / np.sqrt(proxy.var(0) + 0.03)
        return (centred * inv_std if scaled else centred), inv_std

    h = x.astype("float64") @ _np(layers["expand_conv"].kernel)[0, 0]
    h, _ = proxy_norm(_layer_norm(h), layers["expand_act"], scaled=True)
    h = reference_conv(h, _np(layers["spatial_conv"].kernel), 1, "same")
    h, inv_std = proxy_norm(_layer_norm(h), layers["spatial_act"], scaled=False)
    se = layers["se"]
    (w1, b1), (w2, b2) = (tuple(_np(v) for v in conv.weights) for conv in (se.reduce, se.expand))

    def gated(features, scale):
        hidden = _swish(features.mean(axis=(1, 2)) @ w1[0, 0] + b1)
        gate = 1 / (1 + np.exp(-(hidden @ w2[0, 0] + b2))) * scale
        return features * gate[:, None, None, :]

    def finish(features):
        out = features @ _np(layers["project_conv"].kernel)[0, 0]
        return _np(layers["project_norm"].gamma) * _layer_norm(out) + x

    expected = finish(gated(h, inv_std))
    np.testing.assert_allclose(_np(block(x)), expected, rtol=2e-4, atol=2e-4)
    # Scaling the features before the squeeze (the unfolded order) is a different function.
    unfolded = finish(gated(h * inv_std, 1.0))
    assert np.abs(unfolded - expected).max() > 1e-2
