"""Squeeze-and-excitation: channel gates computed from the globally pooled features."""

from __future__ import annotations

import math

import keras
from keras import ops

from keras_efficientnet.layers.activation import activation_config
from keras_efficientnet.layers.group_conv import conv_kernel_initializer


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class SqueezeExcite(keras.layers.Layer):
    """Squeeze-and-excitation (Hu et al. 2018) as used in EfficientNet's MBConv blocks.

    Pools globally, reduces to `filters_se` channels with `activation`, expands back to the input
    channels with a sigmoid and multiplies the input by the result. `call(x, gate_scale=s)`
    multiplies the gates by a per-channel `s` first: with Proxy Norm before it, the proxy's
    `1 / sigma` (Graphcore's EfficientNet pools the unscaled features and scales the gate).

    Args:
        filters_se: channels of the squeezed representation (EfficientNet: a quarter of the
            block's *input* channels).
        activation: activation of the squeeze. Default "swish".

    Example:
        >>> se = SqueezeExcite(4)
        >>> se(np.ones((2, 8, 8, 16), "float32")).shape
        (2, 8, 8, 16)
    """

    def __init__(self, filters_se: int, activation="swish", **kwargs):
        super().__init__(**kwargs)
        if not isinstance(filters_se, int) or filters_se < 1:
            raise ValueError(
                f"SqueezeExcite: filters_se must be a positive int, received {filters_se!r}")
        self.filters_se = filters_se
        self.activation = activation

    def build(self, input_shape):
        channels = input_shape[-1]
        self.reduce = keras.layers.Conv2D(
            self.filters_se, 1, activation=self.activation, use_bias=True,
            kernel_initializer=conv_kernel_initializer(), name="reduce")
        self.expand = keras.layers.Conv2D(
            channels, 1, activation="sigmoid", use_bias=True,
            kernel_initializer=conv_kernel_initializer(), name="expand")
        pooled = (input_shape[0], 1, 1, channels)
        self.reduce.build(pooled)
        self.expand.build(self.reduce.compute_output_shape(pooled))

    def call(self, inputs, gate_scale=None):
        gates = self.expand(self.reduce(ops.mean(inputs, axis=(1, 2), keepdims=True)))
        if gate_scale is not None:
            gates = gates * ops.cast(gate_scale, gates.dtype)
        return inputs * gates

    def compute_output_shape(self, input_shape):
        return input_shape

    def count_macs(self, input_shape, count_layer):
        pooled = (input_shape[0], 1, 1, input_shape[-1])
        gating = math.prod(input_shape[1:])  # one multiply per element of the gated features
        return (count_layer(self.reduce, pooled)
                + count_layer(self.expand, self.reduce.compute_output_shape(pooled)) + gating)

    def get_config(self):
        config = super().get_config()
        config.update(filters_se=self.filters_se, activation=activation_config(self.activation))
        return config
