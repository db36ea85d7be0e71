"""The hand-written norm gradients (layers/fused_gradients.py) against TensorFlow's autodiff of
the op-by-op formulas: Keras' own GroupNormalization and Proxy Norm written out."""

import sys

import keras
import numpy as np
import pytest

import keras_efficientnet as ke
from keras_efficientnet.layers import fused_gradients

pytestmark = pytest.mark.tf_only

normalization = sys.modules["keras_efficientnet.layers.normalization"]


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
