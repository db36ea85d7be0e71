"""Fast inference for EfficientNet on TensorFlow: the forward pass with its norms fused.

`serving_model(model)` wraps a trained `EfficientNet` (any preset) in a Keras model that shares
its weights and computes the same outputs (to float32 round-off) with fewer passes over memory.
On a TensorFlow CPU a norm is not one op but six to ten element-wise ones (moments, normalize,
the affine, the activation, Proxy Norm's centring and scaling), each a full read and write of the
feature map; for the LayerNorm/GroupNorm + Proxy Norm models they take more time than the convs.
Here each norm with what follows it becomes:

- its statistics in two reads and no write: the mean, and the mean square as a batched dot
  product (`var = E[x^2] - E[x]^2`, computed in float32 from centred sums per sample);
- one multiply-add: the norm's `1 / sigma`, the affine (the norm's own, or Proxy Norm's
  `gamma`, `beta`) and the mean folded into one per-sample, per-channel scale and shift;
- the activation (swish: oneDNN's fused `Swish` kernel), then Proxy Norm's centring and scale as
  a second multiply-add, or its centring alone where the squeeze-excite gate takes the scale.

The proxy's per-channel moments depend only on the weights and are computed once per call (a
`[num_samples, channels]` array, not a feature map). Grouped convolutions run as one grouped
`tf.nn.conv2d` (no split and concat: inference needs no gradient). BatchNorm models keep Keras'
layers (TensorFlow already folds an inference BatchNorm).

XLA (`jit_compile=True`) is slower on a TensorFlow CPU for every variant here (measured in
benchmarks/README.md), so the compiled function is a plain `tf.function`. `model.predict`,
`model.export` (SavedModel) and `keras_efficientnet.predict` of the wrapper all take this path.
TensorFlow only; on other backends `serving_model` returns the model unchanged.

`for_inference(model, serving)` is what the package's inference paths call (the `predict`
command and API, `--export_dir`'s SavedModel, `EfficientNet.predict`): with "auto" the fused
pass for float32 models with LayerNorm or GroupNorm layers on TensorFlow (where the norms are
most of the time), the model itself otherwise (BatchNorm already folds into the convolutions);
"on" always wraps, "off" never (the opt-out).
"""

from __future__ import annotations

import contextlib
import contextvars

import keras

from keras_efficientnet.layers.group_conv import GroupConv2D
from keras_efficientnet.layers.mbconv import MBConvBlock
from keras_efficientnet.layers.proxy_norm import ProxyNormActivation
from keras_efficientnet.layers.squeeze_excite import SqueezeExcite


def _tf():
    import tensorflow as tf

    return tf


# True while a SavedModel is traced (`ServingModel.export`): TFLite's converter and tf2onnx have
# no `EuclideanNorm` op, so the exported graph takes `E[x^2]` as the mean of the squares (one
# more pass over the feature map, ops every converter knows).
_PORTABLE_OPS = contextvars.ContextVar("portable_ops", default=False)


@contextlib.contextmanager
def portable_ops():
    """Within: the fused pass uses only ops TFLite and ONNX converters take."""
    token = _PORTABLE_OPS.set(True)
    try:
        yield
    finally:
        _PORTABLE_OPS.reset(token)


def _group_moments(x, groups: int, epsilon: float):
    """Per sample and group: the mean and `1 / sqrt(var + epsilon)`, each `[batch, groups]`,
    from two reductions that write nothing: the mean and the Euclidean norm (`E[x^2]`; under
    `portable_ops` the mean of the squares)."""
    tf = _tf()
    batch = tf.shape(x)[0]
    channels = x.shape[-1]
    if groups == 1:
        flat = tf.reshape(x, [batch, 1, -1])
    else:  # [B, H*W, G, C/G] -> [B, G, H*W*C/G]
        flat = tf.reshape(x, [batch, -1, groups, channels // groups])
        flat = tf.reshape(tf.transpose(flat, [0, 2, 1, 3]), [batch, groups, -1])
    mean = tf.reduce_mean(flat, axis=-1)
    if _PORTABLE_OPS.get():
        mean_square = tf.reduce_mean(tf.square(flat), axis=-1)
    else:
        count = tf.cast(tf.shape(flat)[-1], x.dtype)
        mean_square = tf.square(tf.math.reduce_euclidean_norm(flat, axis=-1)) / count
    variance = tf.maximum(mean_square - tf.square(mean), 0.0)
    return mean, tf.math.rsqrt(variance + epsilon)


def _per_channel(values, groups: int, channels: int):
    """`[batch, groups]` -> `[batch, 1, 1, channels]`, each group's value on its channels."""
    tf = _tf()
    repeated = tf.repeat(values, channels // groups, axis=-1) if groups > 1 else values
    return repeated[:, None, None, :]


def fused_norm(x, norm: keras.layers.GroupNormalization, activation=None):
    """`activation(norm(x))` with the affine, the mean and `1 / sigma` in one multiply-add.

    `activation` is a `ProxyNormActivation`, a Keras `Activation` or None. Returns `(y, pending)`:
    `pending` is None where `y` is the output, or, after a Proxy Norm that scales its output, its
    `(mean, inverse_std)` per channel, the output being `(y - mean) * inverse_std`: the next
    convolution takes them into its kernel and bias (`_conv`), saving two passes.
    """
    tf = _tf()
    channels = x.shape[-1]
    mean, inv = _group_moments(x, norm.groups, norm.epsilon)
    mean = _per_channel(mean, norm.groups, channels)
    inv = _per_channel(inv, norm.groups, channels)
    proxy = isinstance(activation, ProxyNormActivation)
    gamma = (activation.gamma if proxy else norm.gamma if norm.scale else None)
    beta = (activation.beta if proxy else norm.beta if norm.center else None)
    scale = inv if gamma is None else inv * tf.cast(gamma, x.dtype)
    shift = -mean * scale
    if beta is not None:
        shift = shift + tf.cast(beta, x.dtype)
    x = x * scale + shift
    if activation is None:
        return x, None
    if not proxy:
        return activation(x), None
    x = activation._activation_fn(x)
    proxy_mean, proxy_variance = activation.proxy_moments()
    proxy_mean = tf.cast(proxy_mean, x.dtype)
    if not activation.scale_output:
        return x - proxy_mean, None
    return x, (proxy_mean, tf.cast(tf.math.rsqrt(proxy_variance + activation.epsilon), x.dtype))


def materialize(x, pending):
    """The value `x` stands for: itself, or `(x - mean) * inverse_std` for a pending scale."""
    if pending is None:
        return x
    mean, inverse_std = pending
    return (x - mean) * inverse_std


def _scaled_kernel(kernel, groups: int, inverse_std):
    """`kernel` `[kh, kw, in/groups, out]` with each input channel's weights times its scale."""
    tf = _tf()
    kh, kw, per_group, filters = kernel.shape
    scale = tf.reshape(inverse_std, [groups, per_group])
    scale = tf.reshape(tf.transpose(scale), [1, 1, per_group, groups, 1])
    grouped = tf.reshape(kernel, [kh, kw, per_group, groups, filters // groups])
    return tf.reshape(grouped * scale, [kh, kw, per_group, filters])


def _conv(layer, x, pending):
    """A bias-free Conv2D or GroupConv2D of the value `(x, pending)` stands for."""
    tf = _tf()
    groups = getattr(layer, "groups", 1)
    strides = layer.strides if isinstance(layer.strides, int) else layer.strides[0]
    kernel = layer.kernel
    bias = None
    if pending is not None:
        mean, inverse_std = pending
        kernel = _scaled_kernel(tf.cast(kernel, x.dtype), groups, inverse_std)
        if tuple(kernel.shape[:2]) == (1, 1) and groups == 1:  # no padding: the mean is a bias
            bias = -tf.linalg.matvec(kernel[0, 0], mean, transpose_a=True)
        else:  # zero padding must see the centred input
            x = x - mean
    if groups == x.shape[-1] == kernel.shape[-1] and groups > 1:  # depthwise
        out = tf.nn.depthwise_conv2d(x, tf.transpose(kernel, [0, 1, 3, 2]),
                                     [1, strides, strides, 1], layer.padding.upper())
    else:  # one grouped conv where groups > 1: oneDNN's forward kernel, no split and concat
        out = tf.nn.conv2d(x, kernel, strides, layer.padding.upper())
    return out if bias is None else tf.nn.bias_add(out, bias)


def _foldable(layer) -> bool:
    """Whether `layer` is a convolution `_conv` can apply with a pending scale folded in."""
    if isinstance(layer, GroupConv2D):
        return not layer.use_bias
    return (type(layer) is keras.layers.Conv2D and not layer.use_bias and layer.groups == 1
            and layer.activation is keras.activations.linear
            and tuple(layer.dilation_rate) == (1, 1) and layer.strides[0] == layer.strides[1]
            and layer.data_format == "channels_last")


def _squeeze_excite(layer: SqueezeExcite, x, gate_scale):
    tf = _tf()
    pooled = tf.reduce_mean(x, axis=(1, 2), keepdims=True)
    gates = layer.expand(layer.reduce(pooled))
    if gate_scale is not None:
        gates = gates * tf.cast(gate_scale, gates.dtype)
    return x * gates


def _step(layer, following, x, pending, gate_source):
    """One layer (two for a norm and its activation): `(x, pending, layers consumed)`."""
    if isinstance(layer, keras.layers.GroupNormalization):
        x = materialize(x, pending)
        fuse = isinstance(following, (ProxyNormActivation, keras.layers.Activation))
        x, pending = fused_norm(x, layer, following if fuse else None)
        return x, pending, 2 if fuse else 1
    if _foldable(layer):
        return _conv(layer, x, pending), None, 1
    if isinstance(layer, MBConvBlock):
        if layer.has_residual:
            x, pending = materialize(x, pending), None
        return _block(layer, x, pending), None, 1
    x = materialize(x, pending)
    if isinstance(layer, SqueezeExcite):
        scale = gate_source.inverse_std() if gate_source is not None else None
        return _squeeze_excite(layer, x, scale), None, 1
    return layer(x, training=False), None, 1


def run_layers(layers, x, gate_source=None, pending=None):
    """Applies `layers` in order, fusing each GroupNormalization with the activation after it
    and each pending Proxy Norm scale into the convolution after it."""
    index = 0
    while index < len(layers):
        following = layers[index + 1] if index + 1 < len(layers) else None
        x, pending, consumed = _step(layers[index], following, x, pending, gate_source)
        index += consumed
    return materialize(x, pending)


def _block(block: MBConvBlock, inputs, pending=None):
    x = run_layers(block.ordered_layers, inputs, block.gate_scale_source, pending)
    return x + inputs if block.has_residual else x


def _chain(model: keras.Model) -> list[keras.Layer]:
    """The model's layers in order; a ValueError unless each takes the previous one's output."""
    layers = [layer for layer in model.layers if not isinstance(layer, keras.layers.InputLayer)]
    for previous, layer in zip(layers, layers[1:]):
        nodes = getattr(layer, "_inbound_nodes", [])
        inbound = ({id(tensor._keras_history[0]) for tensor in nodes[0].input_tensors}
                   if len(nodes) == 1 else set())
        if inbound != {id(previous)}:
            raise ValueError(f"serving_model: {model.name} is not a chain of layers (layer "
                             f"{layer.name!r} does not take {previous.name!r}'s output alone)")
    return layers


class ServingModel(keras.Model):
    """Wraps an EfficientNet: the same weights, input and outputs; the fused forward pass.

    `predict`, `predict_on_batch` and `export` (a SavedModel with the model's input signature)
    work as on the model; train and save (`.keras`) the model, not the wrapper. (The wrapper
    leaves `trainable` alone: Keras would set it on the model, its sublayer, too.)
    """

    def __init__(self, model: keras.Model, **kwargs):
        super().__init__(name=f"{model.name}_serving", **kwargs)
        compute_dtype = keras.dtype_policies.get(model.dtype_policy).compute_dtype
        if compute_dtype != "float32":
            raise ValueError(
                f"serving_model: {model.name} computes in {compute_dtype}; serve a float32 copy "
                "(keras_efficientnet.training.export.inference_model(model))")
        self.source = model
        self._layers_in_order = _chain(model)
        self.built = True  # its layers are the model's, built already
        self.jit_compile = False  # XLA is slower on a TensorFlow CPU (module docstring)

    def call(self, images, training=False):
        check = getattr(self.source, "_check_images", None)
        if check is not None:
            check(images)
        return run_layers(self._layers_in_order, images)

    def compute_output_shape(self, input_shape):
        return self.source.compute_output_shape(input_shape)

    def export(self, filepath, format="tf_saved_model", verbose=True, input_signature=None,
               **kwargs):
        """SavedModel of the fused forward pass; the signature is the source model's input."""
        if input_signature is None:
            import tensorflow as tf

            spec = self.source.inputs[0]
            input_signature = [tf.TensorSpec(spec.shape, spec.dtype, name="images")]
        with portable_ops():  # traced here: a graph TFLite's converter and tf2onnx take
            return super().export(filepath, format=format, verbose=verbose,
                                  input_signature=input_signature, **kwargs)


def serving_model(model: keras.Model) -> keras.Model:
    """`model` with the fused inference forward pass (a `ServingModel`) on TensorFlow; `model`
    itself on other backends (JAX's `jit` already fuses the norms)."""
    if keras.backend.backend() != "tensorflow":
        return model
    return ServingModel(model)


SERVING_CHOICES = ("auto", "on", "off")


def has_group_norms(model: keras.Model) -> bool:
    """Whether any layer of `model` (blocks included) is a GroupNormalization (LayerNorm is
    GroupNormalization with one group here)."""
    return any(isinstance(layer, keras.layers.GroupNormalization)
               for layer in model._flatten_layers(include_self=False, recursive=True))


def worth_serving(model: keras.Model) -> bool:
    """Whether "auto" takes the fused pass for `model`: TensorFlow, float32 compute, LayerNorm
    or GroupNorm layers, a chain of layers (`serving_model` can wrap it)."""
    if keras.backend.backend() != "tensorflow" or not has_group_norms(model):
        return False
    if keras.dtype_policies.get(model.dtype_policy).compute_dtype != "float32":
        return False
    try:
        _chain(model)
    except ValueError:
        return False
    return True


def for_inference(model: keras.Model, serving: str = "auto") -> keras.Model:
    """The model an inference path runs: `serving_model(model)` or `model` itself.

    `serving`: "auto" (the fused pass where it is faster: TensorFlow, float32, a chain of
    layers with LayerNorm or GroupNorm), "on" (always; a ValueError where it cannot be built)
    or "off" (the model's own layers).
    """
    if serving not in SERVING_CHOICES:
        raise ValueError(f"serving={serving!r}: valid values are {', '.join(SERVING_CHOICES)}")
    if serving == "off" or isinstance(model, ServingModel):
        return model
    if serving == "on" or worth_serving(model):
        return serving_model(model)
    return model
