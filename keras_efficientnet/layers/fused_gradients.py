"""Hand-written gradients for the norms of the batch-independent models (TensorFlow training).

Differentiated op by op, a LayerNorm/GroupNorm and a Proxy Norm swish cost TensorFlow about
twenty element-wise passes over the feature map in the backward pass (the tape keeps each
intermediate and reduces every broadcast operand separately); on a CPU they took about 70% of a
G16-LN+PN training step, against about 20% for the convolutions (benchmarks/README.md). The two
functions here compute the same values with the closed-form gradients:

- `group_standardize(x, groups, epsilon)`: `(x - mean) / sqrt(var + epsilon)` per sample and
  group; its input gradient is `r * (dy - mean(dy) - y * mean(dy * y))` (`r = 1 / sigma`,
  means over the group), from the output `y` alone;
- `proxy_swish(y, gamma, beta, mean, scale)`: `(swish(gamma * y + beta) - mean) * scale` with
  the gradients for `y`, `gamma`, `beta` and the per-channel `mean` and `scale` (the proxy's
  statistics, whose own small gradient the tape takes as before).

Under mixed precision the element-wise passes run in the compute dtype (float16), but every
statistic and every per-channel gradient is a sum over all positions of the batch, and those
accumulate in float32, as Graphcore's implementation casts them: a float16 sum of loss-scaled
gradients over a feature map overflows (65504) or rounds away its small terms.

Plain `keras.ops`, so they import without TensorFlow; the layers use them on the TensorFlow
backend only (XLA under JAX fuses the op-by-op gradient itself).
"""

from __future__ import annotations

import keras
from keras import ops


def enabled() -> bool:
    """Whether the layers use these gradients: on the TensorFlow backend."""
    return keras.backend.backend() == "tensorflow"


def group_standardize(x, groups: int, epsilon: float):
    """`x` `[batch, height, width, channels]` standardized per sample and channel group."""
    shape = ops.shape(x)
    channels = x.shape[-1]
    grouped = ops.reshape(x, (shape[0], shape[1], shape[2], groups, channels // groups))
    return ops.reshape(_standardize(grouped, epsilon), shape)


@ops.custom_gradient
def _standardize_grouped(x, epsilon):
    axes = (1, 2, 4)
    mean = ops.mean(x, axis=axes, keepdims=True)
    centred = x - mean
    inverse_std = ops.rsqrt(ops.mean(ops.square(centred), axis=axes, keepdims=True) + epsilon)
    y = centred * inverse_std

    def grad(*args, upstream=None):
        dy = args[0] if upstream is None else upstream
        mean_dy = ops.mean(dy, axis=axes, keepdims=True)
        mean_dy_y = ops.mean(dy * y, axis=axes, keepdims=True)
        return inverse_std * (dy - mean_dy - y * mean_dy_y), ops.zeros_like(epsilon)

    return y, grad


def _standardize(grouped, epsilon: float):
    # Statistics and the gradient's means in float32 whatever the input's dtype (a no-op for
    # the norm layer, which standardizes in float32).
    x = ops.cast(grouped, "float32")
    y = _standardize_grouped(x, ops.convert_to_tensor(epsilon, "float32"))
    return ops.cast(y, grouped.dtype)


def _channel_sums(*factors):
    """The product of `factors`, summed in float32 over every axis but the last, as one
    `ones @ x` matrix product (a single read of `x`; TensorFlow's CPU reduction over the
    leading axes is about 2x slower). Each factor is cast to float32 before the product, so
    neither the product nor the sum is taken in float16."""
    x = ops.cast(factors[0], "float32")
    for factor in factors[1:]:
        x = x * ops.cast(factor, "float32")
    rows = ops.reshape(x, (-1, x.shape[-1]))
    return ops.matmul(ops.ones((1, ops.shape(rows)[0]), "float32"), rows)[0]


@ops.custom_gradient
def proxy_swish(y, gamma, beta, mean, scale):
    """`(swish(gamma * y + beta) - mean) * scale`, per channel (the last axis; any rank).

    `y` in the compute dtype; `gamma`, `beta`, `mean` and `scale` per channel in float32, and
    their gradients (sums over every position) are accumulated and returned in float32."""
    dtype = y.dtype
    gamma_, beta_, mean_, scale_ = (ops.cast(p, dtype) for p in (gamma, beta, mean, scale))
    u = gamma_ * y + beta_
    sigmoid = ops.sigmoid(u)
    z = u * sigmoid

    def grad(*args, upstream=None):
        d = args[0] if upstream is None else upstream
        sum_d = _channel_sums(d)
        d_scale = _channel_sums(d, z) - mean * sum_d
        du = d * (scale_ * sigmoid * (1.0 + u * (1.0 - sigmoid)))
        return (du * gamma_, _channel_sums(du, y), _channel_sums(du), -scale * sum_d, d_scale)

    return (z - mean_) * scale_, grad
