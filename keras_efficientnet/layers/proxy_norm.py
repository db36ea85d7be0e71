"""Proxy Norm activation: an activation whose output is normalized by a data-free Gaussian proxy."""

from __future__ import annotations

import statistics

import keras
import numpy as np
from keras import ops

from keras_efficientnet.layers import fused_gradients, fusion
from keras_efficientnet.layers.activation import activation_config


def normal_quantiles(num_samples: int) -> np.ndarray:
    """The fixed proxy samples u_i = Phi^-1((i + 0.5) / N), i = 0..N-1, as float32."""
    dist = statistics.NormalDist()
    return np.array([dist.inv_cdf((i + 0.5) / num_samples) for i in range(num_samples)],
                    dtype="float32")


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class ProxyNormActivation(keras.layers.Layer):
    """Affine + activation, normalized with the statistics of a Gaussian proxy (per channel).

    For an input `y` already normalized by a norm without affine (LayerNorm or GroupNorm), each
    channel c computes `z = act(gamma * y + beta)` and returns `(z - mu) / sqrt(var + epsilon)`,
    where `mu`, `var` are the mean and population variance of `act(gamma * Y + beta)` for the proxy
    `Y = proxy_beta + (1 + proxy_gamma) * U`, `U ~ N(0, 1)` represented by `num_samples` fixed
    quantiles. No batch statistics are used: training and inference agree at any batch size.
    Labatie et al. 2021, "Proxy-Normalizing Activations to Match Batch Normalization while
    Removing Batch Dependence" (arXiv 2106.03743).

    With `scale_output=False` the layer returns `z - mu` and leaves the division to its
    consumer, which reads `inverse_std()`: Graphcore's EfficientNet folds it into the
    squeeze-excite gate after the spatial conv (the squeeze pools the unscaled features) and
    drops it at the head, where the classifier absorbs any per-channel scale.

    Args:
        activation: activation name or callable. Default "swish".
        num_samples: number of fixed proxy quantiles. Default 200.
        epsilon: added to the proxy variance. Default 0.03.
        scale_output: divide by the proxy standard deviation here. Default True.

    Example:
        >>> norm = keras.layers.GroupNormalization(1, center=False, scale=False)
        >>> pn = ProxyNormActivation("swish")
        >>> out = pn(norm(np.random.randn(2, 8, 8, 16).astype("float32")))
    """

    def __init__(self, activation="swish", num_samples: int = 200, epsilon: float = 0.03,
                 scale_output: bool = True, **kwargs):
        # Statistics are computed in float32 from the float32 parameters, so the parameters are
        # not auto-cast under mixed precision; the main path casts them explicitly.
        kwargs.setdefault("autocast", False)
        super().__init__(**kwargs)
        if not isinstance(num_samples, int) or num_samples < 2:
            raise ValueError(
                f"ProxyNormActivation: num_samples must be an int >= 2, received {num_samples!r}")
        if not float(epsilon) >= 0:
            raise ValueError(f"ProxyNormActivation: epsilon must be >= 0, received {epsilon!r}")
        if not isinstance(scale_output, bool):
            raise ValueError(f"ProxyNormActivation: scale_output must be a bool, received "
                             f"{scale_output!r}")
        self.activation = activation
        self.num_samples = num_samples
        self.epsilon = float(epsilon)
        self.scale_output = scale_output
        self._activation_fn = keras.activations.get(activation)
        self._quantiles = normal_quantiles(num_samples)[:, None]

    def build(self, input_shape):
        channels = input_shape[-1]
        if channels is None:
            raise ValueError(f"{self.name}: the channel dimension must be known")
        # autocast=False on each variable too: Keras autocasts the variables of a mixed-policy
        # layer called outside a model whatever the layer's `autocast`, and a float16 read
        # would round the statistics and pass each per-channel gradient through float16.
        def weight(name, initializer):
            return self.add_weight(name=name, shape=(channels,), initializer=initializer,
                                   autocast=False)

        self.gamma = weight("gamma", "ones")
        self.beta = weight("beta", "zeros")
        self.proxy_beta = weight("proxy_beta", "zeros")
        self.proxy_gamma = weight("proxy_gamma", "zeros")

    def proxy_moments(self):
        """Mean and variance, per channel and in float32, of the activated proxy."""
        gamma = ops.cast(self.gamma, "float32")
        beta = ops.cast(self.beta, "float32")
        proxy = (ops.cast(self.proxy_beta, "float32")
                 + (1.0 + ops.cast(self.proxy_gamma, "float32")) * self._quantiles)
        activated = self._activation_fn(gamma * proxy + beta)  # [num_samples, channels]
        mean = ops.mean(activated, axis=0)
        variance = ops.mean(ops.square(activated - mean), axis=0)
        return mean, variance

    def inverse_std(self):
        """`1 / sqrt(var + epsilon)` per channel, in float32: the scale `scale_output` applies."""
        _, variance = self.proxy_moments()
        return ops.rsqrt(variance + self.epsilon)

    def call(self, inputs):
        mean, variance = self.proxy_moments()
        dtype = self.compute_dtype  # autocast is off, so inputs are cast here
        inputs = ops.cast(inputs, dtype)
        if fused_gradients.enabled() and self.activation in ("swish", "silu"):
            # The same values with a closed-form gradient (fused_gradients' docstring).
            # Per-channel operands in float32: their gradients are sums over every position.
            scale = (ops.rsqrt(variance + self.epsilon) if self.scale_output
                     else ops.ones_like(variance))
            return fused_gradients.proxy_swish(
                inputs, ops.cast(self.gamma, "float32"), ops.cast(self.beta, "float32"),
                mean, scale)
        z = self._activation_fn(ops.cast(self.gamma, dtype) * inputs + ops.cast(self.beta, dtype))
        centred = z - ops.cast(mean, dtype)
        if not self.scale_output:
            return centred
        return centred * ops.cast(ops.rsqrt(variance + self.epsilon), dtype)

    def output_affine(self):
        """`(scale, shift)` per channel, float32, with `call(y) == act(gamma * y + beta) * scale
        + shift`: `1 / sigma` and `-mu / sigma` of the proxy, or 1 and `-mu` when
        `scale_output=False`. Weights only: an exporter folds them into the next layer."""
        mean, variance = self.proxy_moments()
        if not self.scale_output:
            return ops.ones_like(mean), -mean
        inverse_std = ops.rsqrt(variance + self.epsilon)
        return inverse_std, -mean * inverse_std

    def fused_call(self, inputs, pending=None, portable: bool = False):
        """Inference (`layers.fusion`): a pending affine (the norm's) and `gamma`, `beta` in one
        multiply-add, the activation, then the proxy's `1 / sigma` and centring left pending for
        the next convolution's kernel (with `scale_output=False`, the centring applied)."""
        dtype = inputs.dtype
        gamma, beta = ops.cast(self.gamma, dtype), ops.cast(self.beta, dtype)
        affine = fusion.Affine(gamma, beta) if pending is None else pending.then(gamma, beta)
        z = self._activation_fn(fusion.materialize(inputs, affine))
        scale, shift = (ops.cast(value, dtype) for value in self.output_affine())
        if not self.scale_output:
            return z + shift, None
        return z, fusion.Affine(scale, shift)

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        config = super().get_config()
        config.update(activation=activation_config(self.activation),
                      num_samples=self.num_samples, epsilon=self.epsilon,
                      scale_output=self.scale_output)
        return config
