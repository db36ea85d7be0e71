"""An EfficientNet of ours as an ONNX graph written for CPU runtimes (ONNX Runtime, OpenVINO).

We own the architecture, so the exporter walks our layers and writes the graph a runtime wants
instead of converting a TensorFlow graph (tf2onnx gave G16-LN+PN B0 1,760 nodes: 98 Transpose,
147 Slice, 49 Shape ... around 81 Conv; issue 33):

- uint8 images `[batch, height, width, 3]` in (dynamic batch, static spatial size), as the
  SavedModel's `serving_default` takes them; ONE transpose to NCHW, then NCHW throughout;
- the input normalization, every BatchNorm and every per-channel affine the fused Keras path
  leaves pending (`layers/fusion.py`: a norm's affine, Proxy Norm's output affine
  `ProxyNormActivation.output_affine()`, the squeeze-excite gate's proxy scale) folded into a
  convolution or the classifier: into the producing conv's output channels where the value is
  a conv's unread output, else into the consuming conv's kernel (`fusion.fold_into_kernel`'s
  rule: a 1x1 dense conv takes the shift into its bias, another conv as an input shift);
- a grouped conv is one `Conv` with `group`; each LayerNorm is one ONNX `LayerNormalization`
  node carrying the affine that follows it, a GroupNorm one over each group between two
  `Reshape`s (or, with `norm_form="reduce"`, the statistics as two reductions, measured
  against it below);
- the output is the model's own: class probabilities for a softmax classifier.

A layer the exporter does not know raises a ValueError naming it.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, NamedTuple

import keras
import numpy as np

from keras_efficientnet.deploy.onnx_graph import FLOAT, UINT8, Graph
from keras_efficientnet.layers import fusion
from keras_efficientnet.layers.group_conv import GroupConv2D
from keras_efficientnet.layers.image_normalization import ImageNormalization
from keras_efficientnet.layers.mbconv import MBConvBlock
from keras_efficientnet.layers.proxy_norm import ProxyNormActivation
from keras_efficientnet.layers.squeeze_excite import SqueezeExcite
from keras_efficientnet.layers.stochastic_depth import StochasticDepth

# Opset 18: LayerNormalization (17) and reductions taking their axes as an input (18); ONNX
# Runtime 1.14+ and OpenVINO 2023+ read it.
OPSET = 18
MIN_OPSET = 18
# "op": one LayerNormalization node per norm (a GroupNorm: Reshape, LayerNormalization over
# each group, Reshape, its affine); "reduce": the statistics as ReduceMean and ReduceSumSquare,
# then one per-sample multiply-add. G16-LN+PN B0, 224 px, batch 32, images/s, best of 3
# interleaved rounds on the project's 2-core AMD EPYC under load 16-20 (other sessions'
# training and tests: about a tenth of the quiet rates, so read the ratios), onnxruntime 1.32,
# OpenVINO 2026.4:
#                       ONNX Runtime   OpenVINO f32   OpenVINO bf16 (its default here)
#   op                       6.2           10.4           11.4
#   reduce                   5.8            4.8           10.9
# An earlier loaded run gave ONNX Runtime 3.9 (op) and 5.7 (reduce), OpenVINO f32 13.5 and 6.3:
# OpenVINO takes a LayerNormalization node into one MVN kernel and runs "reduce" op by op;
# ONNX Runtime is within the noise either way. "op" also keeps the graph small (324 nodes
# against about 900) and its statistics exact (E[x^2] - E[x]^2 loses digits on flat images).
NORM_FORMS = ("op", "reduce")
DEFAULT_NORM_FORM = "op"
INPUT_NAME = "images"
# A GroupNorm is not ONNX's GroupNormalization node (opset 21): ONNX Runtime's computes its
# statistics with a cancellation, 3e-5 of the output scale off Keras on a white image
# (G16-GN+PN tiny), where Reshape + LayerNormalization keeps 1e-5 (tests/deploy).


def _numpy(value) -> np.ndarray:
    return np.asarray(keras.ops.convert_to_numpy(value), dtype="float32")


class NormPending(NamedTuple):
    """A value that still owes a per-sample normalization over `groups` channel groups, then
    the per-channel `affine` (None: none)."""

    groups: int
    epsilon: float
    affine: fusion.Affine | None

    def then(self, scale, shift) -> NormPending:
        affine = (fusion.Affine(scale, shift) if self.affine is None
                  else self.affine.then(scale, shift))
        return self._replace(affine=affine)


@dataclass
class ConvRecord:
    """A Conv node whose weights stay editable until the graph is written: an affine applied
    to its unread output folds into them."""

    kernel: np.ndarray  # OIHW
    bias: np.ndarray | None
    kernel_name: str
    bias_name: str  # reserved; the input is dropped where the conv ends without a bias


@dataclass
class Value:
    """An NCHW tensor `name` of `shape` (C, H, W), or (C,) after pooling, standing for
    `name` with `pending` applied; `conv`: the Conv that produced it, while nothing has read
    it (so an affine can go into its weights)."""

    name: str
    shape: tuple
    pending: Any = None  # fusion.Affine with NumPy [C] arrays, NormPending, or None
    conv: ConvRecord | None = None


def _activation_name(activation) -> str:
    if isinstance(activation, str):
        return activation
    return getattr(activation, "__name__", type(activation).__name__)


class _Writer:
    """Walks the layers, emitting nodes into `graph`."""

    def __init__(self, graph: Graph, norm_form: str):
        self.graph = graph
        self.norm_form = norm_form
        self.convs: list[ConvRecord] = []
        self.prefix = ""  # the enclosing block's name, for node names

    # ------------------------------------------------------------------------- elementwise

    def node(self, op: str, inputs: list[str], hint: str, **attributes) -> str:
        return self.graph.node(op, inputs, hint, **attributes)

    def per_channel(self, array: np.ndarray, value: Value, hint: str) -> str:
        """A [C] array as a constant broadcasting over `value`'s NCHW (or NC) tensor."""
        shape = (-1, 1, 1) if len(value.shape) == 3 else (-1,)
        return self.graph.constant(np.reshape(array, shape), hint)

    def activation(self, value: Value, activation, where: str) -> Value:
        name = _activation_name(activation)
        x = value.name
        if name in ("silu", "swish"):
            y = self.node("Mul", [x, self.node("Sigmoid", [x], f"{where}/sigmoid")],
                          f"{where}/swish")
        elif name in ("relu", "sigmoid", "tanh", "elu", "selu", "softplus", "softsign"):
            y = self.node({"relu": "Relu", "sigmoid": "Sigmoid", "tanh": "Tanh", "elu": "Elu",
                           "selu": "Selu", "softplus": "Softplus",
                           "softsign": "Softsign"}[name], [x], f"{where}/{name}")
        elif name in ("hard_silu", "hard_swish"):
            y = self.node("HardSwish", [x], f"{where}/hard_swish")
        elif name == "softmax":
            y = self.node("Softmax", [x], f"{where}/softmax", axis=-1)
        elif name == "linear":
            y = x
        else:
            raise ValueError(f"export_onnx: {where}: no ONNX form for activation {name!r}")
        return Value(y, value.shape)

    def materialize(self, value: Value, affine: fusion.Affine | None = None,
                    where: str = "") -> Value:
        """The value itself (nothing pending), with `affine` applied after what is pending."""
        pending = value.pending
        if affine is not None:
            pending = affine if pending is None else pending.then(*affine)
        if pending is None:
            return value
        if isinstance(pending, NormPending):
            return self.normalize(replace(value, pending=None, conv=None), pending, where)
        scale, shift = (np.asarray(v, "float32") for v in pending)
        if value.conv is not None:  # into the producing conv's weights: no pass at all
            conv = value.conv
            conv.kernel = conv.kernel * scale[:, None, None, None]
            conv.bias = shift if conv.bias is None else conv.bias * scale + shift
            return Value(value.name, value.shape)
        x = value.name
        if not np.all(scale == 1):
            x = self.node("Mul", [x, self.per_channel(scale, value, f"{where}/scale")],
                          f"{where}/mul")
        if np.any(shift != 0):
            x = self.node("Add", [x, self.per_channel(shift, value, f"{where}/shift")],
                          f"{where}/add")
        return Value(x, value.shape)

    # -------------------------------------------------------------------------------- norms

    def normalize(self, value: Value, norm: NormPending, where: str) -> Value:
        channels = value.shape[0]
        if norm.affine is None:
            scale, shift = np.ones(channels, "float32"), np.zeros(channels, "float32")
        else:
            scale, shift = (np.asarray(v, "float32") for v in norm.affine)
        if self.norm_form == "reduce":
            return self._normalize_reduce(value, norm, scale, shift, where)
        x = value.name
        if norm.groups == 1:  # over C, H and W, as Keras' GroupNormalization(groups=1)
            inputs = [x, self.per_channel(scale, value, f"{where}/gamma")]
            if np.any(shift != 0):
                inputs.append(self.per_channel(shift, value, f"{where}/beta"))
            y = self.node("LayerNormalization", inputs, f"{where}/layer_norm", axis=1,
                          epsilon=float(norm.epsilon))
        else:  # per group: [N, G, C/G * H * W]; the affine per channel after it
            shape = self.graph.constant([0, norm.groups, -1], f"{where}/grouped", "int64")
            grouped = self.node("Reshape", [x, shape], f"{where}/grouped")
            standardized = self.node("LayerNormalization", [grouped, self.graph.constant(
                [1.0], f"{where}/one")], f"{where}/layer_norm", axis=2,
                epsilon=float(norm.epsilon))
            y = self.node("Reshape", [standardized, self.graph.constant(
                [0, *value.shape], f"{where}/ungrouped", "int64")], f"{where}/ungrouped")
            return self.materialize(Value(y, value.shape, fusion.Affine(scale, shift)),
                                    where=where)
        return Value(y, value.shape)

    def _normalize_reduce(self, value: Value, norm: NormPending, scale, shift,
                          where: str) -> Value:
        """The statistics as two reductions that write nothing (the mean, and the sum of
        squares), `var = E[x^2] - E[x]^2` clipped at 0, then one multiply-add per element
        (`fusion.group_moments`' arithmetic)."""
        channels, height, width = value.shape
        groups = norm.groups
        x = value.name
        count = channels // groups * height * width
        if groups > 1:  # [N, G, C/G * H * W]
            x = self.node("Reshape", [x, self.graph.constant([0, groups, -1], f"{where}/grouped",
                                                             "int64")], f"{where}/grouped")
            axes = self.graph.constant([2], f"{where}/axes", "int64")
        else:
            axes = self.graph.constant([1, 2, 3], f"{where}/axes", "int64")
        mean = self.node("ReduceMean", [x, axes], f"{where}/mean", keepdims=1)
        square_sum = self.node("ReduceSumSquare", [x, axes], f"{where}/square_sum", keepdims=1)
        mean_square = self.node("Mul", [square_sum, self.graph.constant(1.0 / count,
                                                                        f"{where}/count")],
                                f"{where}/mean_square")
        variance = self.node("Relu", [self.node("Sub", [mean_square, self.node(
            "Mul", [mean, mean], f"{where}/mean_2")], f"{where}/var")], f"{where}/var_clip")
        inverse_std = self.node("Reciprocal", [self.node("Sqrt", [self.node(
            "Add", [variance, self.graph.constant(norm.epsilon, f"{where}/epsilon")],
            f"{where}/var_eps")], f"{where}/std")], f"{where}/inverse_std")
        if groups > 1:  # normalize the grouped view, then the affine per channel
            standardized = self.node("Sub", [self.node("Mul", [x, inverse_std],
                                                       f"{where}/scaled"),
                                             self.node("Mul", [mean, inverse_std],
                                                       f"{where}/mean_scaled")],
                                     f"{where}/standardized")
            y = self.node("Reshape", [standardized, self.graph.constant(
                [0, channels, height, width], f"{where}/ungrouped", "int64")],
                f"{where}/ungrouped")
            return self.materialize(Value(y, value.shape, fusion.Affine(scale, shift)),
                                    where=where)
        sample_scale = self.node("Mul", [inverse_std, self.per_channel(scale, value,
                                                                       f"{where}/gamma")],
                                 f"{where}/sample_scale")  # [N, C, 1, 1]
        sample_shift = self.node("Sub", [self.per_channel(shift, value, f"{where}/beta"),
                                         self.node("Mul", [mean, sample_scale],
                                                   f"{where}/mean_scale")],
                                 f"{where}/sample_shift")
        y = self.node("Add", [self.node("Mul", [x, sample_scale], f"{where}/scaled"),
                              sample_shift], f"{where}/normalized")
        return Value(y, value.shape)

    # ------------------------------------------------------------------------ convolutions

    def conv(self, value: Value, kernel: np.ndarray, *, strides: int, padding: str,
             groups: int, bias: np.ndarray | None, where: str) -> Value:
        """`kernel` ([kh, kw, in / groups, out], Keras') applied to the value, a per-channel
        pending affine folded in (`fusion.fold_into_kernel`)."""
        pending = value.pending
        if isinstance(pending, NormPending) or (
                pending is not None and np.any(np.abs(pending.scale) < 1e-30)):
            value, pending = self.materialize(value, where=f"{where}/input"), None
        if pending is not None and value.conv is not None and kernel.shape[:2] != (1, 1):
            # Into the producer's outputs: cheaper than an input shift before this conv.
            value, pending = self.materialize(value, where=f"{where}/input"), None
        x = value.name
        if pending is not None:
            scale, shift = (np.asarray(v, "float32") for v in pending)
            kernel, folded_bias, input_shift = (
                None if v is None else _numpy(v)
                for v in fusion.fold_into_kernel(kernel, groups, fusion.Affine(scale, shift)))
            if folded_bias is not None and np.any(folded_bias != 0):
                bias = folded_bias if bias is None else bias + folded_bias
            if input_shift is not None and np.any(input_shift != 0):
                x = self.node("Add", [x, self.per_channel(input_shift, value,
                                                          f"{where}/input_shift")],
                              f"{where}/input_shift")
        kh, kw = kernel.shape[:2]
        _, height, width = value.shape
        out_h, pads_h = _same_or_valid(height, kh, strides, padding)
        out_w, pads_w = _same_or_valid(width, kw, strides, padding)
        record = ConvRecord(np.ascontiguousarray(np.transpose(kernel, (3, 2, 0, 1))),
                            None if bias is None else np.asarray(bias, "float32"),
                            self.graph.unique(f"{where}/kernel"),
                            self.graph.unique(f"{where}/bias"))
        self.convs.append(record)
        y = self.node("Conv", [x, record.kernel_name, record.bias_name], f"{where}/conv",
                      kernel_shape=[kh, kw], strides=[strides, strides], group=groups,
                      pads=[pads_h[0], pads_w[0], pads_h[1], pads_w[1]])
        return Value(y, (kernel.shape[3], out_h, out_w), conv=record)

    def finish_convs(self) -> None:
        """Writes each conv's final weights; a conv that took no bias has its input dropped."""
        for record in self.convs:
            self.graph.constants[record.kernel_name] = record.kernel.astype("float32")
            if record.bias is not None:
                self.graph.constants[record.bias_name] = record.bias.astype("float32")
        for node in self.graph.nodes:
            if node.op == "Conv" and node.inputs[2] not in self.graph.constants:
                node.inputs = node.inputs[:2]

    # ------------------------------------------------------------------------------ layers

    def layer(self, layer, value: Value, **kwargs) -> Value:
        """`layer` applied to `value` (our layers and the Keras ones EfficientNet uses)."""
        where = self.prefix + layer.name
        if isinstance(layer, ImageNormalization):  # into the stem conv
            mean, std = np.asarray(layer.mean, "float32"), np.asarray(layer.std, "float32")
            return _pend(value, fusion.Affine(1.0 / std, -mean / std))
        if isinstance(layer, MBConvBlock):
            return self.block(layer, value)
        if isinstance(layer, GroupConv2D):
            out = self.conv(value, _numpy(layer.kernel), strides=layer.strides,
                            padding=layer.padding, groups=layer.groups,
                            bias=_numpy(layer.bias) if layer.use_bias else None, where=where)
            return out
        if type(layer) is keras.layers.Conv2D:
            return self.keras_conv(layer, value)
        if isinstance(layer, keras.layers.BatchNormalization):
            if layer.axis not in (-1, 3, [3], [-1]):
                raise ValueError(f"export_onnx: {where}: BatchNormalization over axis "
                                 f"{layer.axis} (only the channel axis, -1, is exported)")
            channels = value.shape[0]
            gamma = _numpy(layer.gamma) if layer.scale else np.ones(channels, "float32")
            beta = _numpy(layer.beta) if layer.center else np.zeros(channels, "float32")
            scale = gamma / np.sqrt(_numpy(layer.moving_variance) + layer.epsilon)
            shift = beta - _numpy(layer.moving_mean) * scale
            return _pend(value, fusion.Affine(scale, shift))
        if isinstance(layer, keras.layers.GroupNormalization):
            if layer.axis not in (-1, 3) or len(value.shape) != 3:
                raise ValueError(f"export_onnx: {where}: GroupNormalization over axis "
                                 f"{layer.axis} (only the channel axis, -1, is exported)")
            channels = value.shape[0]
            value = self.materialize(value, where=f"{where}/input")
            gamma = _numpy(layer.gamma) if layer.scale else np.ones(channels, "float32")
            beta = _numpy(layer.beta) if layer.center else np.zeros(channels, "float32")
            return Value(value.name, value.shape, NormPending(
                layer.groups, float(layer.epsilon), fusion.Affine(gamma, beta)), value.conv)
        if isinstance(layer, ProxyNormActivation):
            value = self.materialize(value, fusion.Affine(_numpy(layer.gamma),
                                                          _numpy(layer.beta)), where)
            out = self.activation(value, layer._activation_fn, where)
            scale, shift = (_numpy(v) for v in layer.output_affine())
            return replace(out, pending=fusion.Affine(scale, shift))
        if isinstance(layer, keras.layers.Activation):
            return self.activation(self.materialize(value, where=where), layer.activation,
                                   where)
        if isinstance(layer, SqueezeExcite):
            return self.squeeze_excite(layer, value, **kwargs)
        if isinstance(layer, (keras.layers.Dropout, StochasticDepth)):
            return value  # the identity at inference
        if isinstance(layer, keras.layers.GlobalAveragePooling2D):
            if isinstance(value.pending, NormPending) or len(value.shape) != 3:
                value = self.materialize(value, where=where)
            # A per-channel affine commutes with the mean: it stays pending for the classifier.
            pooled = self.node("GlobalAveragePool", [value.name], f"{where}/pool")
            flat = self.node("Flatten", [pooled], f"{where}/flatten", axis=1)
            return Value(flat, value.shape[:1], value.pending)
        if isinstance(layer, keras.layers.GlobalMaxPooling2D):
            value = self.materialize(value, where=where)
            pooled = self.node("GlobalMaxPool", [value.name], f"{where}/pool")
            return Value(self.node("Flatten", [pooled], f"{where}/flatten", axis=1),
                         value.shape[:1])
        if isinstance(layer, keras.layers.Dense):
            return self.dense(layer, value)
        raise ValueError(f"export_onnx: no ONNX form for layer {where!r} "
                         f"({type(layer).__module__}.{type(layer).__name__})")

    def keras_conv(self, layer: keras.layers.Conv2D, value: Value) -> Value:
        where = self.prefix + layer.name
        if (layer.data_format != "channels_last" or tuple(layer.dilation_rate) != (1, 1)
                or layer.strides[0] != layer.strides[1]):
            raise ValueError(f"export_onnx: {where}: Conv2D with data_format="
                             f"{layer.data_format}, dilation {layer.dilation_rate}, strides "
                             f"{layer.strides} (exported: channels_last, no dilation, equal "
                             "strides)")
        out = self.conv(value, _numpy(layer.kernel), strides=layer.strides[0],
                        padding=layer.padding, groups=layer.groups,
                        bias=_numpy(layer.bias) if layer.use_bias else None, where=where)
        if _activation_name(layer.activation) == "linear":
            return out
        return self.activation(out, layer.activation, where)

    def squeeze_excite(self, layer: SqueezeExcite, value: Value, gate_scale=None) -> Value:
        where = self.prefix + layer.name
        value = replace(self.materialize(value, where=f"{where}/input"), conv=None)  # read twice
        pooled = Value(self.node("GlobalAveragePool", [value.name], f"{where}/pool"),
                       (value.shape[0], 1, 1))
        gates = self.keras_conv(layer.expand, self.keras_conv(layer.reduce, pooled))
        out = Value(self.node("Mul", [value.name, gates.name], f"{where}/gate"), value.shape)
        if gate_scale is not None:  # per channel: into the projection's kernel
            scale = _numpy(gate_scale)
            out.pending = fusion.Affine(scale, np.zeros_like(scale))
        return out

    def block(self, block: MBConvBlock, value: Value) -> Value:
        if block.has_residual:  # the skip adds the value itself
            value = replace(self.materialize(value, where=f"{block.name}/input"), conv=None)
        x, self.prefix = value, f"{block.name}/"
        for layer in block.ordered_layers:
            x = self.layer(layer, x, **block._call_kwargs(layer))
        self.prefix = ""
        if not block.has_residual:
            return x
        x = self.materialize(x, where=f"{block.name}/output")
        return Value(self.node("Add", [x.name, value.name], f"{block.name}/residual"),
                     x.shape)

    def dense(self, layer: keras.layers.Dense, value: Value) -> Value:
        where = layer.name
        if len(value.shape) != 1:
            raise ValueError(f"export_onnx: {where}: Dense on a {len(value.shape) + 1}-D "
                             "input (exported: after global pooling)")
        kernel = _numpy(layer.kernel)
        bias = _numpy(layer.bias) if layer.use_bias else np.zeros(kernel.shape[1], "float32")
        if isinstance(value.pending, fusion.Affine):  # x * s + t: W' = diag(s) W, b' = b + t W
            scale, shift = (np.asarray(v, "float32") for v in value.pending)
            bias = bias + shift @ kernel
            kernel = kernel * scale[:, None]
            value = Value(value.name, value.shape)
        value = self.materialize(value, where=where)
        y = self.node("Gemm", [value.name, self.graph.constant(kernel, f"{where}/kernel"),
                               self.graph.constant(bias, f"{where}/bias")], f"{where}/gemm")
        return self.activation(Value(y, (kernel.shape[1],)), layer.activation, where)


def _pend(value: Value, affine: fusion.Affine) -> Value:
    """`value` with `affine` applied after what it owes, left pending."""
    pending = affine if value.pending is None else value.pending.then(*affine)
    return replace(value, pending=pending)


def _same_or_valid(size: int, kernel: int, stride: int, padding: str) -> tuple[int, tuple]:
    """Output size and (begin, end) padding of Keras' "same" (TensorFlow's rule: the odd
    pixel at the end) or "valid"."""
    if padding == "valid":
        return (size - kernel) // stride + 1, (0, 0)
    out = -(-size // stride)
    total = max((out - 1) * stride + kernel - size, 0)
    return out, (total // 2, total - total // 2)


def _chain(model) -> list:
    """The model's layers in forward order (an EfficientNet is a chain by construction)."""
    source = getattr(model, "source", model)  # a serving.ServingModel: its model
    layers = [layer for layer in getattr(source, "layers", ())
              if not isinstance(layer, keras.layers.InputLayer)]
    if not layers or not hasattr(source, "inputs"):
        raise ValueError(f"export_onnx: expected a built EfficientNet (a Keras model of "
                         f"keras_efficientnet's layers), received {type(model).__name__}")
    return layers


def _spatial_size(model, image_size) -> tuple[int, int]:
    source = getattr(model, "source", model)
    _, height, width, channels = tuple(source.inputs[0].shape)
    if image_size is not None:
        size = (image_size, image_size) if isinstance(image_size, int) else tuple(image_size)
        if len(size) != 2 or not all(isinstance(s, int) and s >= 32 for s in size) or any(
                m is not None and m != s for m, s in zip((height, width), size)):
            raise ValueError(f"export_onnx: image_size={image_size!r}: give (height, width) "
                             f">= 32 matching the model's input {(height, width)}")
        return size
    if height is None or width is None:
        raise ValueError(f"export_onnx: {source.name} takes any image size (input "
                         f"{(height, width, channels)}): pass image_size=(height, width); the "
                         "graph has static spatial shapes")
    return int(height), int(width)


def onnx_model(model: keras.Model, *, batch: int | None = None, opset: int = OPSET,
               norm_form: str = DEFAULT_NORM_FORM, image_size=None):
    """The `onnx.ModelProto` of `model` (an EfficientNet, or a `serving.ServingModel` of
    one): uint8 `images [batch, height, width, 3]` in, the model's output out. `batch`: None
    for a dynamic batch. See the module docstring and `export_onnx`."""
    if norm_form not in NORM_FORMS:
        raise ValueError(f"export_onnx: norm_form={norm_form!r}: valid values are "
                         f"{', '.join(NORM_FORMS)}")
    if not isinstance(opset, int) or opset < MIN_OPSET:
        raise ValueError(f"export_onnx: opset={opset!r}: give {MIN_OPSET} or newer "
                         "(LayerNormalization, reductions with axes as an input)")
    if batch is not None and (not isinstance(batch, int) or batch < 1):
        raise ValueError(f"export_onnx: batch={batch!r}: give a positive int, or None for a "
                         "dynamic batch")
    layers = _chain(model)
    height, width = _spatial_size(model, image_size)
    graph = Graph()
    writer = _Writer(graph, norm_form)
    # One transpose, of the uint8 images (a quarter of the float bytes), then NCHW.
    nchw = graph.node("Transpose", [INPUT_NAME], "images_nchw", perm=[0, 3, 1, 2])
    value = Value(graph.node("Cast", [nchw], "images_float", to=FLOAT), (3, height, width))
    for layer in layers:
        value = writer.layer(layer, value)
    value = writer.materialize(value, where="output")
    writer.finish_convs()
    output = value.name
    if len(value.shape) == 3:  # a headless model without pooling: NHWC, as Keras gives it
        output = graph.node("Transpose", [output], "features_nhwc", perm=[0, 2, 3, 1])
        out_shape = [batch or "batch", value.shape[1], value.shape[2], value.shape[0]]
    else:
        out_shape = [batch or "batch", *value.shape]
    producer = next(node for node in graph.nodes if output in node.outputs)
    producer.outputs = ["outputs"]  # the graph's output: nothing else reads it
    source = getattr(model, "source", model)
    return graph.model_proto(
        [(INPUT_NAME, UINT8, [batch or "batch", height, width, 3])],
        [("outputs", FLOAT, out_shape)], opset, source.name,
        doc=f"keras-efficientnet export of {source.name}: uint8 images NHWC in, the model's "
            "outputs out")


def export_onnx(model: keras.Model, path: str | os.PathLike, *, batch: int | None = None,
                opset: int = OPSET, norm_form: str = DEFAULT_NORM_FORM,
                image_size=None) -> Path:
    """Writes `model` as an ONNX file at `path` (atomically) and returns the path.

    The graph takes uint8 images `images [batch, height, width, 3]` (NHWC, pixel values in
    [0, 255], as the SavedModel's `serving_default`) and returns the model's output `outputs`
    (class probabilities for the default softmax classifier), equal to Keras' to float32
    round-off. See the module docstring for what is folded.

    Args:
        model: a built EfficientNet (or a `serving.ServingModel` of one).
        path: the `.onnx` file to write.
        batch: a fixed batch size, or None (default) for a dynamic one.
        opset: ONNX opset, 18 or newer. Default 18.
        norm_form: "op" (LayerNormalization / GroupNormalization nodes) or "reduce" (the
            statistics as reductions). Default "op", the faster one measured.
        image_size: (height, width) for a model built with `input_shape=(None, None, 3)`.

    Example:
        >>> model = EfficientNet.from_preset("efficientnet-tiny-g16-lnpn", classes=10)
        >>> export_onnx(model, "tiny.onnx")
        PosixPath('tiny.onnx')
    """
    from keras_efficientnet.atomic import atomic_file

    proto = onnx_model(model, batch=batch, opset=opset, norm_form=norm_form,
                       image_size=image_size)
    path = Path(path)
    with atomic_file(path) as tmp:
        tmp.write_bytes(proto.SerializeToString())
    return path

