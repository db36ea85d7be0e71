"""Factory for the normalization layers EfficientNet can use: batch, group or layer norm."""

from __future__ import annotations

import keras
from keras import ops

from keras_efficientnet.layers import fused_gradients, fusion

NORMS = ("batch", "group", "layer")
EPSILON = 1e-3
BATCH_NORM_MOMENTUM = 0.99


def check_norm(norm: str, norm_groups: int = 4, proxy_norm: bool = False) -> None:
    """Raises a ValueError naming the argument when the norm configuration is invalid."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {list(NORMS)}, received {norm!r}")
    if not isinstance(norm_groups, int) or isinstance(norm_groups, bool) or norm_groups < 1:
        raise ValueError(f"norm_groups must be a positive int, received {norm_groups!r}")
    if proxy_norm and norm == "batch":
        raise ValueError(
            "proxy_norm=True needs a batch-independent norm: use norm='layer' or norm='group' "
            "(received norm='batch'); Proxy Norm replaces what BatchNorm's batch statistics do")


def normalization(norm: str, channels: int, *, norm_groups: int = 4, center: bool = True,
                  scale: bool = True, name: str | None = None, where: str = "") -> keras.Layer:
    """Returns a Keras normalization layer for `channels` channels (NHWC).

    Args:
        norm: "batch" (BatchNormalization), "group" (GroupNormalization, `norm_groups` groups)
            or "layer" (GroupNormalization with one group, i.e. over H, W and C).
        channels: channels to normalize; group norms need them divisible by the group count.
        norm_groups: groups of the group norm. Default 4.
        center, scale: whether the norm carries its own shift and scale.
        name: layer name.
        where: the block name, used in error messages.
    """
    check_norm(norm, norm_groups)
    if norm == "batch":
        return keras.layers.BatchNormalization(
            axis=-1, momentum=BATCH_NORM_MOMENTUM, epsilon=EPSILON, center=center, scale=scale,
            name=name)
    groups = 1 if norm == "layer" else norm_groups
    if channels % groups:
        raise ValueError(
            f"{where or name}: norm_groups={groups} does not divide its {channels} channels")
    return GroupNormalization(
        groups=groups, axis=-1, epsilon=EPSILON, center=center, scale=scale, name=name)


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class GroupNormalization(keras.layers.GroupNormalization):
    """Keras' GroupNormalization (same arguments, weights and outputs) whose standardization
    has a hand-written gradient on TensorFlow (`fused_gradients.group_standardize`): a
    G16-LN+PN training step spends most of its time in the norms' op-by-op backward pass."""

    def call(self, inputs):
        if not fused_gradients.enabled() or self.axis not in (-1, len(inputs.shape) - 1) \
                or len(inputs.shape) != 4:
            return super().call(inputs)
        x = ops.cast(inputs, "float32")  # statistics in float32, as Keras' layer computes them
        y = fused_gradients.group_standardize(x, self.groups, self.epsilon)
        if self.scale:
            y = y * ops.cast(self.gamma, "float32")
        if self.center:
            y = y + ops.cast(self.beta, "float32")
        return ops.cast(y, self.compute_dtype)

    def fused_call(self, inputs, pending=None, portable: bool = False):
        """Inference (`layers.fusion`): `(inputs, affine)`, the normalization and this layer's
        own affine left pending as one per-sample, per-channel `fusion.Affine` for the layer
        after it to apply (an activation takes it into its own multiply-add). Statistics in
        two reductions that write nothing (`fusion.group_moments`)."""
        x = fusion.materialize(inputs, pending)
        if self.axis not in (-1, len(x.shape) - 1) or len(x.shape) != 4:
            return self(x, training=False), None
        mean, inverse_std = fusion.group_moments(x, self.groups, self.epsilon, portable)
        scale = inverse_std * ops.cast(self.gamma, x.dtype) if self.scale else inverse_std
        shift = -mean * scale
        if self.center:
            shift = shift + ops.cast(self.beta, x.dtype)
        return x, fusion.Affine(scale, shift)
