"""The fused inference form of the layers: each layer's `fused_call`, and the walk that chains them.

At inference a LayerNorm/GroupNorm (+ Proxy Norm) model spends most of a TensorFlow CPU's time
in element-wise passes: a norm with what follows it is six to ten ops, each a full read and write
of the feature map. Fused, each norm and its activation become:

- the norm's statistics in two reads and no write: the mean, and the mean square (TensorFlow:
  one `EuclideanNorm` reduction; `portable=True` and other backends: the mean of the squares);
- one multiply-add: `1 / sigma`, the mean and the affine (the norm's own, or Proxy Norm's
  `gamma`, `beta`) folded into one per-sample, per-channel scale and shift;
- the activation, then Proxy Norm's centring and `1 / sigma` as a per-channel affine that the
  next convolution takes into its kernel and bias (or its centring alone where the
  squeeze-excite gate takes the scale).

The protocol, which the layers implement themselves (timm's `reparameterize_model` idea: each
module knows its own fused form, nothing outside interprets it): a layer with a fused form has
`fused_call(inputs, pending=None, portable=False) -> (outputs, pending)`, where `pending` is
None or an `Affine` the value still owes (the value is `outputs * scale + shift`). Ours:
`GroupNormalization` (returns its normalization and affine pending), `ProxyNormActivation`
(takes one, returns its output affine), `GroupConv2D` (folds a per-channel one into its
kernel), `MBConvBlock` (its layers, gate and residual) and `EfficientNet` (its chain). Keras'
`Conv2D` folds through `fused_conv` here (Keras' class cannot take a method); any other layer
receives the value itself and runs its own `call`.

The pieces are plain functions of weights and `keras.ops`, so an exporter (ONNX, OpenVINO) can
reuse them: `ProxyNormActivation.output_affine()` and `fold_into_kernel` give the folded
weights as arrays.
"""

from __future__ import annotations

from typing import Any, Callable, NamedTuple, Sequence

import keras
from keras import ops

# Values of an EfficientNet's `fused_inference` setting (and of the inference paths' `serving`
# option): "auto" fuses where it is faster, "on" always, "off" never.
FUSED_INFERENCE_CHOICES = ("auto", "on", "off")


def check_choice(value, where: str = "fused_inference") -> str:
    """`value` if it is one of FUSED_INFERENCE_CHOICES, else a ValueError naming `where`."""
    if value not in FUSED_INFERENCE_CHOICES:
        raise ValueError(f"{where}={value!r}: valid values are "
                         f"{', '.join(FUSED_INFERENCE_CHOICES)}")
    return value


class Affine(NamedTuple):
    """A per-channel affine a value still owes: the value is `x * scale + shift`.

    `scale` and `shift` are `[channels]` (the same for every sample: a convolution can take
    them into its weights) or `[batch, 1, 1, channels]` (a norm's, per sample).
    """

    scale: Any
    shift: Any

    @property
    def per_channel(self) -> bool:
        return len(self.scale.shape) == 1

    def then(self, scale, shift) -> Affine:
        """This affine followed by `y * scale + shift`, as one affine."""
        return Affine(self.scale * scale, self.shift * scale + shift)


def materialize(x, pending: Affine | None):
    """The value `(x, pending)` stands for: `x`, or `x * scale + shift` (one pass)."""
    return x if pending is None else x * pending.scale + pending.shift


# ------------------------------------------------------------------------- norm statistics


def _mean_square(flat, portable: bool):
    """`E[x^2]` over the last axis of `flat`. TensorFlow: one `EuclideanNorm` reduction, which
    writes nothing; the portable path (`portable`, or another backend, where XLA fuses it) the
    mean of the squares, ops that TFLite and ONNX converters take."""
    if not portable and keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        count = ops.cast(ops.shape(flat)[-1], flat.dtype)
        return ops.square(tf.math.reduce_euclidean_norm(flat, axis=-1)) / count
    return ops.mean(ops.square(flat), axis=-1)


def group_moments(x, groups: int, epsilon: float, portable: bool = False):
    """Per sample and channel group of NHWC `x`: the mean and `1 / sqrt(var + epsilon)`, each
    `[batch, 1, 1, channels]` (a group's value on each of its channels), from two reductions
    (`var = E[x^2] - E[x]^2`, clipped at 0)."""
    batch = ops.shape(x)[0]
    channels = x.shape[-1]
    if groups == 1:
        flat = ops.reshape(x, (batch, 1, -1))
    else:  # [B, H*W, G, C/G] -> [B, G, H*W*C/G]
        flat = ops.reshape(x, (batch, -1, groups, channels // groups))
        flat = ops.reshape(ops.transpose(flat, (0, 2, 1, 3)), (batch, groups, -1))
    mean = ops.mean(flat, axis=-1)
    variance = ops.maximum(_mean_square(flat, portable) - ops.square(mean), 0.0)
    inverse_std = ops.rsqrt(variance + epsilon)

    def per_channel(values):  # [B, G] -> [B, 1, 1, C]
        if groups > 1:
            values = ops.repeat(values, channels // groups, axis=-1)
        return values[:, None, None, :]

    return per_channel(mean), per_channel(inverse_std)


# ---------------------------------------------------------------------------- convolutions


def fold_into_kernel(kernel, groups: int, pending: Affine):
    """`(kernel, bias, input_shift)` of the same bias-free convolution applied to the value
    `(x, pending)` stands for, `pending` per channel: `conv(x * s + t, K)` is
    `conv(x, K * s) + K^T t` for a 1x1 dense kernel (`bias`), and `conv(x + t / s, K * s)`
    otherwise (zero padding must see the value's zeros; `input_shift` is `t / s`). Each of
    `bias`, `input_shift` is None where unused. `kernel` is `[kh, kw, in / groups, out]`."""
    kh, kw, per_group, filters = kernel.shape
    kernel = ops.cast(kernel, pending.scale.dtype)
    scale = ops.reshape(ops.transpose(ops.reshape(pending.scale, (groups, per_group))),
                        (1, 1, per_group, groups, 1))
    grouped = ops.reshape(kernel, (kh, kw, per_group, groups, filters // groups))
    scaled = ops.reshape(grouped * scale, (kh, kw, per_group, filters))
    if (kh, kw) == (1, 1) and groups == 1:
        return scaled, ops.matmul(pending.shift[None, :], kernel[0, 0])[0], None
    return scaled, None, pending.shift / pending.scale


def fused_conv(x, pending: Affine | None, kernel, *, groups: int, conv: Callable):
    """`conv(value, kernel)` of the value `(x, pending)` stands for, a per-channel `pending`
    folded into the kernel (no pass over `x` for a 1x1 dense conv); `conv(x, kernel)` is the
    bias-free convolution itself."""
    if pending is not None and not pending.per_channel:
        x, pending = materialize(x, pending), None
    if pending is None:
        return conv(x, kernel)
    kernel, bias, input_shift = fold_into_kernel(kernel, groups, pending)
    if input_shift is not None:
        x = x + input_shift
    out = conv(x, kernel)
    return out if bias is None else out + bias


def _foldable_keras_conv(layer) -> bool:
    """A Keras `Conv2D` that `fused_conv` computes exactly (EfficientNet's stem, expand,
    project and head convolutions are)."""
    return (type(layer) is keras.layers.Conv2D and not layer.use_bias and layer.groups == 1
            and layer.activation is keras.activations.linear
            and tuple(layer.dilation_rate) == (1, 1) and layer.strides[0] == layer.strides[1]
            and layer.data_format == "channels_last")


def _keras_conv(layer: keras.layers.Conv2D, x, pending):
    def conv(inputs, kernel):
        return ops.conv(inputs, kernel, strides=layer.strides[0], padding=layer.padding)

    return fused_conv(x, pending, layer.kernel, groups=1, conv=conv)


# ----------------------------------------------------------------------------------- walk


def fused_step(layer, x, pending: Affine | None = None, portable: bool = False, **kwargs):
    """One layer's fused form: `(outputs, pending)`. `kwargs` go to the layer's call."""
    fused = getattr(layer, "fused_call", None)
    if fused is not None:
        return fused(x, pending, portable=portable, **kwargs)
    if _foldable_keras_conv(layer) and not kwargs:
        return _keras_conv(layer, x, pending), None
    return layer(materialize(x, pending), training=False, **kwargs), None


def fused_sequence(layers: Sequence[keras.Layer], x, pending: Affine | None = None,
                   portable: bool = False,
                   call_kwargs: Callable[[keras.Layer], dict] | None = None):
    """`layers` applied in order in their fused forms, each taking the one before's
    `(outputs, pending)`; `call_kwargs(layer)` gives a layer's extra call arguments."""
    for layer in layers:
        kwargs = call_kwargs(layer) if call_kwargs is not None else {}
        x, pending = fused_step(layer, x, pending, portable, **kwargs)
    return x, pending
