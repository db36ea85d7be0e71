"""Grouped 2-D convolution with a fast TensorFlow path and a portable `keras.ops` path."""

from __future__ import annotations

import functools
import logging

import keras
from keras import ops

from keras_efficientnet.layers import fusion
from keras_efficientnet.layers.groups import num_groups

log = logging.getLogger("keras_efficientnet")

# Up to this many groups, one convolution per group (split and concat) beat the single grouped
# `tf.nn.conv2d` on CPU with oneDNN (by 15-20% at 9 groups, 56x56x144); past about 12 the grouped
# kernel wins (1.6x at 72 groups) and the graph stays small. `benchmarks/bench_model.py` measures
# both paths.
MAX_SPLIT_GROUPS = 10

# The TensorFlow paths `tf_conv_path` chooses between.
DEPTHWISE, PER_GROUP, GROUPED = "depthwise", "per_group", "grouped"


@functools.cache
def grouped_gradient_available(device_type: str = "CPU", dtype: str = "float32") -> bool:
    """Whether TensorFlow can differentiate one grouped `tf.nn.conv2d` on `device_type`.

    On CPU the grouped kernel's backward pass exists only inside oneDNN, which TensorFlow turns
    on by default for some CPUs (AVX-512 and newer x86, Arm) and leaves off for others (AVX2-only
    x86), or as `TF_ENABLE_ONEDNN_OPTS` says. Rather than guess from the CPU, this runs the
    gradient of a one-pixel grouped conv once per process, device type and dtype, outside any
    graph, and remembers the answer.
    """
    import tensorflow as tf

    # The two ops of the conv's gradient, run directly: `init_scope` (which lifts the probe out
    # of a graph being traced) also pauses gradient tapes.
    with tf.init_scope(), tf.device(f"/{device_type}:0"):
        ones = tf.ones((1, 1, 1, 2), dtype)
        kernel = tf.ones((1, 1, 1, 2), dtype)
        try:
            dx = tf.raw_ops.Conv2DBackpropInput(input_sizes=[1, 1, 1, 2], filter=kernel,
                                                out_backprop=ones, strides=[1, 1, 1, 1],
                                                padding="SAME")
            dk = tf.raw_ops.Conv2DBackpropFilter(input=ones, filter_sizes=[1, 1, 1, 2],
                                                 out_backprop=ones, strides=[1, 1, 1, 1],
                                                 padding="SAME")
            available = bool(tf.reduce_all(tf.equal(dx, 1)).numpy()
                             and tf.reduce_all(tf.equal(dk, 1)).numpy())
        except tf.errors.OpError as error:  # any kernel refusal: the per-group path is safe
            log.debug("GroupConv2D: no grouped conv gradient on %s (%s): %s", device_type,
                      dtype, str(error).splitlines()[0])
            available = False
    log.debug("GroupConv2D: grouped tf.nn.conv2d gradient on %s (%s): %s; groups > %d use %s",
              device_type, dtype, "available" if available else "missing", MAX_SPLIT_GROUPS,
              GROUPED if available else PER_GROUP)
    return available


def _device_type(x) -> str:
    """The device type `x` is placed on, or the default one (a GPU when TensorFlow sees one)."""
    import tensorflow as tf

    placed = (getattr(x, "device", "") or "").upper()
    for kind in ("GPU", "CPU"):
        if f"{kind}:" in placed:
            return kind
    return "GPU" if tf.config.list_logical_devices("GPU") else "CPU"


def tf_conv_path(groups: int, in_channels: int, filters: int, device_type: str = "CPU",
                 dtype: str = "float32", inference: bool = False) -> str:
    """Which TensorFlow kernel a grouped conv uses: `depthwise`, `per_group` or `grouped`.

    One grouped `tf.nn.conv2d` for `inference` (no gradient: oneDNN's or Eigen's forward
    kernel, no split and concat), or where its gradient exists (see
    `grouped_gradient_available`) and there are more than `MAX_SPLIT_GROUPS` groups; otherwise
    one convolution per group, the fastest differentiable path measured without oneDNN.
    """
    if groups == in_channels and filters == in_channels:
        return DEPTHWISE
    if inference:
        return GROUPED
    if groups <= MAX_SPLIT_GROUPS or not grouped_gradient_available(device_type, dtype):
        return PER_GROUP
    return GROUPED


def _tf_grouped_conv(x, kernel, strides: int, padding: str, groups: int,
                     inference: bool = False):
    """TensorFlow fast path: a depthwise conv, per-group convs, or one grouped `tf.nn.conv2d`.

    Keras' own grouped `Conv2D` is jit-compiled through XLA on the TensorFlow backend, whose
    backward pass is about 100x slower on CPU. `tf.nn.conv2d` accepts a grouped kernel natively
    (oneDNN on CPU, cuDNN on GPU).
    """
    import tensorflow as tf  # only reached on the TensorFlow backend

    path = tf_conv_path(groups, x.shape[-1], kernel.shape[-1], _device_type(x), x.dtype.name,
                        inference)
    if path == DEPTHWISE:
        # [kh, kw, 1, C] -> [kh, kw, C, 1] for the dedicated kernel.
        dw_kernel = tf.transpose(kernel, [0, 1, 3, 2])
        return tf.nn.depthwise_conv2d(x, dw_kernel, [1, strides, strides, 1], padding.upper())
    if path == PER_GROUP and groups > 1:
        pieces = zip(tf.split(x, groups, axis=-1), tf.split(kernel, groups, axis=-1))
        return tf.concat([tf.nn.conv2d(xs, ks, strides, padding.upper()) for xs, ks in pieces],
                         axis=-1)
    return tf.nn.conv2d(x, kernel, strides, padding.upper())


def _portable_grouped_conv(x, kernel, strides: int, padding: str, groups: int):
    """Portable path: `keras.ops.conv` infers the group count from the kernel's input depth."""
    in_channels = x.shape[-1]
    if groups == in_channels and kernel.shape[-1] == in_channels:
        dw_kernel = ops.transpose(kernel, (0, 1, 3, 2))
        return ops.depthwise_conv(x, dw_kernel, strides=strides, padding=padding)
    return ops.conv(x, kernel, strides=strides, padding=padding)


def grouped_conv2d(x, kernel, strides: int = 1, padding: str = "same", groups: int = 1,
                   use_fast_path: bool = True, inference: bool = False):
    """Applies a grouped convolution with kernel `[kh, kw, in_channels // groups, filters]`;
    `inference`: no gradient will be taken (TensorFlow: one grouped kernel, `tf_conv_path`)."""
    if use_fast_path and keras.backend.backend() == "tensorflow":
        return _tf_grouped_conv(x, kernel, strides, padding, groups, inference)
    return _portable_grouped_conv(x, kernel, strides, padding, groups)


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class GroupConv2D(keras.layers.Layer):
    """2-D convolution whose input channels are split into groups of about `group_size` each.

    `group_size=1` is a depthwise convolution; `group_size=16` is the G16 convolution of Masters
    et al. 2021 ("Making EfficientNet More Efficient"). As in Graphcore's implementation the
    layer forms `groups = max(channels // group_size, 1)` equal groups (`num_groups`): 40
    channels at group size 16 are 2 groups of 20, 24 channels one dense group. The kernel has
    shape `[kh, kw, channels // groups, filters]`, as in Keras' `Conv2D(groups=...)`, so weights
    are interchangeable with it, but the computation avoids Keras' XLA-compiled grouped path.

    Args:
        filters: output channels; must be a multiple of the number of groups.
        kernel_size: int or pair, the spatial size of the kernel.
        strides: int, the stride in both spatial dimensions. Default 1.
        group_size: nominal input channels per group (see `num_groups`). Default 1 (depthwise).
        padding: "same" or "valid". Default "same".
        use_bias: whether to add a bias. Default False (a norm follows in EfficientNet).
        kernel_initializer: default `conv_kernel_initializer` (EfficientNet's fan-out normal).
        use_fast_path: use the TensorFlow kernel when the backend is TensorFlow. Default True.

    Example:
        >>> conv = GroupConv2D(144, 3, group_size=16)
        >>> conv(np.zeros((1, 56, 56, 144), "float32")).shape
        (1, 56, 56, 144)
    """

    def __init__(self, filters: int, kernel_size=3, strides: int = 1, group_size: int = 1,
                 padding: str = "same", use_bias: bool = False,
                 kernel_initializer="conv_kernel_initializer", bias_initializer="zeros",
                 kernel_regularizer=None, use_fast_path: bool = True, **kwargs):
        super().__init__(**kwargs)
        if not isinstance(filters, int) or filters < 1:
            raise ValueError(f"GroupConv2D: `filters` must be a positive int, received {filters!r}")
        if isinstance(kernel_size, int):
            kernel_size = (kernel_size, kernel_size)
        kernel_size = tuple(int(k) for k in kernel_size)
        if len(kernel_size) != 2 or min(kernel_size) < 1:
            raise ValueError("GroupConv2D: `kernel_size` must be a positive int or pair, "
                             f"received {kernel_size}")
        if not isinstance(strides, int) or strides < 1:
            raise ValueError(f"GroupConv2D: `strides` must be a positive int, received {strides!r}")
        if not isinstance(group_size, int) or group_size < 1:
            raise ValueError(
                f"GroupConv2D: `group_size` must be a positive int, received {group_size!r}")
        if padding not in ("same", "valid"):
            raise ValueError(
                f"GroupConv2D: `padding` must be 'same' or 'valid', received {padding!r}")
        self.filters = filters
        self.kernel_size = kernel_size
        self.strides = strides
        self.group_size = group_size
        self.padding = padding
        self.use_bias = use_bias
        self.kernel_initializer = kernel_initializer
        self.bias_initializer = bias_initializer
        self.kernel_regularizer = kernel_regularizer
        self.use_fast_path = use_fast_path

    def build(self, input_shape):
        in_channels = input_shape[-1]
        self.groups = num_groups(in_channels, self.group_size, where=self.name)
        if self.filters % self.groups:
            raise ValueError(
                f"{self.name}: filters={self.filters} is not a multiple of the {self.groups} "
                f"groups formed by {in_channels} channels at group_size {self.group_size}")
        initializer = self.kernel_initializer
        if initializer == "conv_kernel_initializer":
            initializer = conv_kernel_initializer(self.groups)
        self.kernel = self.add_weight(
            name="kernel", shape=(*self.kernel_size, in_channels // self.groups, self.filters),
            initializer=initializer, regularizer=self.kernel_regularizer)
        if self.use_bias:
            self.bias = self.add_weight(name="bias", shape=(self.filters,),
                                        initializer=self.bias_initializer)

    def call(self, inputs):
        outputs = grouped_conv2d(inputs, self.kernel, self.strides, self.padding, self.groups,
                                 use_fast_path=self.use_fast_path)
        if self.use_bias:
            outputs = outputs + self.bias
        return outputs

    def fused_call(self, inputs, pending=None, portable: bool = False):
        """Inference (`layers.fusion`): the convolution of the value `(inputs, pending)` stands
        for, a per-channel `pending` folded into the kernel; one grouped kernel on TensorFlow.
        Returns `(outputs, None)`."""
        def conv(x, kernel):
            return grouped_conv2d(x, kernel, self.strides, self.padding, self.groups,
                                  use_fast_path=self.use_fast_path, inference=True)

        outputs = fusion.fused_conv(inputs, pending, ops.convert_to_tensor(self.kernel),
                                    groups=self.groups, conv=conv)
        if self.use_bias:
            outputs = outputs + self.bias
        return outputs, None

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape

        def out(size, k):
            if size is None:
                return None
            if self.padding == "same":
                return -(-size // self.strides)
            return (size - k) // self.strides + 1

        return (batch, out(height, self.kernel_size[0]), out(width, self.kernel_size[1]),
                self.filters)

    def get_config(self):
        config = super().get_config()
        config.update(
            filters=self.filters, kernel_size=self.kernel_size, strides=self.strides,
            group_size=self.group_size, padding=self.padding, use_bias=self.use_bias,
            kernel_initializer=_serialize(self.kernel_initializer),
            bias_initializer=_serialize(self.bias_initializer),
            kernel_regularizer=_serialize(self.kernel_regularizer),
            use_fast_path=self.use_fast_path)
        return config

    @classmethod
    def from_config(cls, config):
        config = dict(config)
        for key in ("kernel_initializer", "bias_initializer"):
            if isinstance(config.get(key), dict):
                config[key] = keras.initializers.deserialize(config[key])
        if isinstance(config.get("kernel_regularizer"), dict):
            config["kernel_regularizer"] = keras.regularizers.deserialize(
                config["kernel_regularizer"])
        return cls(**config)


def conv_kernel_initializer(groups: int = 1):
    """EfficientNet's conv initializer, variance 2 / fan_out, with fan_out counted per group.

    Each input channel of a grouped conv feeds `filters / groups` outputs, so the fan-out is
    `kh * kw * filters / groups`; for a depthwise conv this is `kh * kw`, as in EfficientNet.
    """
    return keras.initializers.VarianceScaling(scale=2.0 * groups, mode="fan_out",
                                              distribution="truncated_normal")


def _serialize(obj):
    if obj is None or isinstance(obj, str):
        return obj
    return keras.saving.serialize_keras_object(obj)
