"""Counts multiply-accumulates of a Keras model's forward pass at batch 1."""

from __future__ import annotations

import math

import keras

from keras_efficientnet.layers.group_conv import GroupConv2D
from keras_efficientnet.layers.groups import num_groups


def _spatial(shape) -> int:
    sizes = shape[1:-1]
    if any(size is None for size in sizes):
        raise ValueError(
            f"count_macs needs a fixed resolution; received a layer input of shape {shape}. "
            "Build the model with input_shape=(height, width, 3).")
    return math.prod(sizes)


def layer_macs(layer: keras.Layer, input_shape) -> int:
    """Multiply-accumulates of one layer for one example of `input_shape` (batch dim first).

    Convolutions and dense layers count `kernel elements x output positions`, and the product
    of two tensors (the squeeze-excite gating) one per output element; a composite layer that
    defines `count_macs(input_shape, count_layer)` is walked recursively. Norms, activations,
    pooling and residual additions are not counted, as in the usual tables for EfficientNet.
    """
    if hasattr(layer, "count_macs"):
        return int(layer.count_macs(tuple(input_shape), layer_macs))
    if isinstance(layer, GroupConv2D):
        output = layer.compute_output_shape(tuple(input_shape))
        kh, kw = layer.kernel_size
        depth = input_shape[-1] // num_groups(input_shape[-1], layer.group_size, layer.name)
        return kh * kw * depth * layer.filters * _spatial(output)
    if isinstance(layer, keras.layers.DepthwiseConv2D):
        output = layer.compute_output_shape(tuple(input_shape))
        kh, kw = layer.kernel_size
        return kh * kw * output[-1] * _spatial(output)
    if isinstance(layer, keras.layers.Conv2D):
        output = layer.compute_output_shape(tuple(input_shape))
        kh, kw = layer.kernel_size
        return kh * kw * (input_shape[-1] // layer.groups) * layer.filters * _spatial(output)
    if isinstance(layer, keras.layers.Multiply):
        return math.prod(layer.output.shape[1:])
    if isinstance(layer, keras.layers.Dense):
        positions = math.prod(input_shape[1:-1]) if len(input_shape) > 2 else 1
        return input_shape[-1] * layer.units * positions
    return 0


def count_macs(model: keras.Model) -> int:
    """Multiply-accumulates of one forward pass of a functional `model` at batch 1.

    Works for this package's models and for `keras.applications` ones, which makes the two
    comparable. Example: `count_macs(EfficientNet("b0"))` is about 0.39e9.
    """
    total = 0
    for layer in model.layers:
        if isinstance(layer, keras.layers.InputLayer):
            continue
        node_inputs = layer.input
        if isinstance(node_inputs, (list, tuple)):
            node_inputs = node_inputs[0]
        total += layer_macs(layer, (1, *node_inputs.shape[1:]))
    return total
