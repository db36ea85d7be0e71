"""The hand-written norm gradients (layers/fused_gradients.py) against TensorFlow's autodiff of
the op-by-op formulas: Keras' own GroupNormalization and Proxy Norm written out."""

import importlib

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.layers import fused_gradients

pytestmark = pytest.mark.tf_only

# The module (the layers package's `normalization` attribute is the factory function).
normalization = importlib.import_module("keras_efficientnet.layers.normalization")


def op_by_op_proxy_swish(layer, y):
    """Proxy Norm from its definition, differentiated by the tape."""
    mean, variance = layer.proxy_moments()
    z = keras.activations.swish(layer.gamma * y + layer.beta) - mean
    return z * keras.ops.rsqrt(variance + layer.epsilon) if layer.scale_output else z


@pytest.mark.parametrize("groups,scale_output", [(1, True), (1, False), (4, True)])
def test_fused_norm_gradients_equal_autodiff(groups, scale_output):
    import tensorflow as tf

    x = tf.constant(np.random.default_rng(0).standard_normal((2, 6, 6, 32)).astype("float32")
                    * 2 + 0.5)
    ours = normalization.GroupNormalization(groups, epsilon=1e-3, center=False, scale=False)
    keras_norm = keras.layers.GroupNormalization(groups, epsilon=1e-3, center=False,
                                                 scale=False)
    proxy = ke.layers.ProxyNormActivation("swish", scale_output=scale_output)
    affine = normalization.GroupNormalization(groups, epsilon=1e-3)  # gamma and beta too
    for layer in (ours, keras_norm, proxy, affine):
        layer.build(x.shape)
    rng = np.random.default_rng(1)
    for weight in proxy.weights + affine.weights:
        weight.assign(0.3 * rng.standard_normal(weight.shape).astype("float32"))
    weights = [w.value for w in proxy.trainable_weights + affine.trainable_weights]

    def gradients(fn):
        with tf.GradientTape() as tape:
            tape.watch(x)
            y = fn(x)
            loss = tf.reduce_sum(tf.sin(3.0 * y))  # a gradient that differs per element
        return [y, *tape.gradient(loss, [x, *weights])]

    assert fused_gradients.enabled()
    fused = gradients(lambda v: affine(proxy(ours(v))))
    reference = gradients(lambda v: keras.layers.GroupNormalization.call(
        affine, op_by_op_proxy_swish(proxy, keras_norm(v))))
    assert len(fused) == 8  # output, input, 4 proxy weights, the affine norm's gamma and beta
    for got, expected in zip(fused, reference):
        scale = float(np.abs(expected).max())
        assert scale > 1e-3
        # float32 round-off, relative to the largest value
        np.testing.assert_allclose(got.numpy(), expected.numpy(), rtol=0, atol=1e-5 * scale)


def test_group_normalization_keeps_keras_config_and_outputs():
    x = np.random.default_rng(2).standard_normal((2, 4, 4, 8)).astype("float32")
    layer = normalization.normalization("group", 8, norm_groups=2, name="n")
    assert isinstance(layer, keras.layers.GroupNormalization)
    copy = keras.layers.deserialize(keras.layers.serialize(layer))
    assert type(copy) is normalization.GroupNormalization and copy.groups == 2
    keras_layer = keras.layers.GroupNormalization(2, epsilon=layer.epsilon)
    np.testing.assert_allclose(layer(x), keras_layer(x), rtol=0, atol=1e-5)


def _swish(u):
    return u / (1.0 + np.exp(-u))


def _proxy_norm_float64(y, gamma, beta, proxy_beta, proxy_gamma, layer):
    """Proxy Norm from its definition (arXiv 2106.03743, eq. 7-8) in float64 NumPy."""
    quantiles = ke.layers.proxy_norm.normal_quantiles(layer.num_samples).astype("float64")
    proxy = _swish(gamma * (proxy_beta + (1.0 + proxy_gamma) * quantiles[:, None]) + beta)
    mean, variance = proxy.mean(axis=0), proxy.var(axis=0)
    return (_swish(gamma * y + beta) - mean) / np.sqrt(variance + layer.epsilon)


def _group_norm_float64(x, gamma, beta, groups, epsilon):
    grouped = x.reshape(*x.shape[:3], groups, -1)
    mean = grouped.mean(axis=(1, 2, 4), keepdims=True)
    variance = grouped.var(axis=(1, 2, 4), keepdims=True)
    return ((grouped - mean) / np.sqrt(variance + epsilon)).reshape(x.shape) * gamma + beta


def _central_differences(loss, params: list[np.ndarray], step: float = 1e-5) -> list:
    """d loss / d each element of each per-channel parameter vector, in float64."""
    grads = []
    for k, p in enumerate(params):
        grad = np.zeros_like(p)
        for c in range(p.size):
            shifted = [q.copy() for q in params], [q.copy() for q in params]
            shifted[0][k][c] += step
            shifted[1][k][c] -= step
            grad[c] = (loss(shifted[0]) - loss(shifted[1])) / (2 * step)
        grads.append(grad)
    return grads


def _mixed_norms(how: str, shape):
    """A LayerNorm and a Proxy Norm under mixed_float16, as a model built under that global
    policy (how training builds them) or as layers called on their own."""
    if how == "layers":
        norm = normalization.GroupNormalization(1, epsilon=1e-3, dtype="mixed_float16")
        proxy = ke.layers.ProxyNormActivation("swish", dtype="mixed_float16")
        norm.build(shape)
        proxy.build(shape)
        return norm, proxy, lambda x: proxy(norm(x))
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("mixed_float16")
    try:
        inputs = keras.Input(shape[1:])
        norm = normalization.GroupNormalization(1, epsilon=1e-3)
        proxy = ke.layers.ProxyNormActivation("swish")
        model = keras.Model(inputs, proxy(norm(inputs)))
    finally:
        keras.config.set_dtype_policy(previous)
    return norm, proxy, model


@pytest.mark.parametrize("how", ["model", "layers"])
def test_under_mixed_float16_the_norm_gradients_equal_float64_numpy(how):
    # Loss-scaled float16 gradients (about 1e3 each, all positive) over 2 x 48 x 48 positions:
    # each per-channel sum is about 1e6, beyond float16's 65504. Graphcore sums them in float32.
    import tensorflow as tf

    rng = np.random.default_rng(3)
    channels = 4
    x = rng.standard_normal((2, 48, 48, channels)).astype("float16")
    upstream = (1024.0 * rng.uniform(0.5, 1.0, x.shape)).astype("float16")
    norm, proxy, forward = _mixed_norms(how, x.shape)
    for weight in norm.weights + proxy.weights:
        weight.assign(1.0 * (weight.path.endswith("gamma") and "proxy" not in weight.path)
                      + 0.3 * rng.standard_normal(weight.shape).astype("float32"))
    variables = [norm.gamma, norm.beta, proxy.gamma, proxy.beta, proxy.proxy_beta,
                 proxy.proxy_gamma]
    assert fused_gradients.enabled() and proxy.compute_dtype == "float16"
    inputs = tf.constant(x)
    with tf.GradientTape() as tape:
        tape.watch(inputs)
        out = forward(inputs)
        loss = tf.reduce_sum(tf.cast(out, "float32") * tf.cast(upstream, "float32"))
    assert out.dtype == tf.float16
    got = [g.numpy().astype("float64") for g in tape.gradient(loss, [inputs, *variables])]

    def reference(params, x64=x.astype("float64")):
        y = _group_norm_float64(x64, params[0], params[1], 1, 1e-3)
        return float(np.sum(upstream.astype("float64") * _proxy_norm_float64(
            y, *params[2:], layer=proxy)))

    start = [np.asarray(v.numpy(), "float64") for v in variables]
    expected = _central_differences(reference, start)
    for variable, g, e in zip(variables, got[1:], expected):
        assert np.all(np.isfinite(g)), (variable.path, g)
        scale = float(np.abs(e).max())
        assert scale > 1e5  # far past float16's range: the test would catch a float16 sum
        # float16 element-wise passes: about 1e-3 of the largest per-channel value
        np.testing.assert_allclose(g, e, rtol=0, atol=5e-3 * scale, err_msg=variable.path)
    # The input gradient: a directional derivative of the float64 definition.
    direction = rng.standard_normal(x.shape)
    step = 1e-6
    along = [reference(start, x.astype("float64") + s * direction) for s in (step, -step)]
    expected_along = (along[0] - along[1]) / (2 * step)
    assert np.isfinite(got[0]).all()
    assert float(np.sum(got[0] * direction)) == pytest.approx(expected_along, rel=1e-2)
