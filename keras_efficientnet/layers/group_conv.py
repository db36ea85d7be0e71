"""Grouped 2-D convolution with a fast TensorFlow path and a portable `keras.ops` path."""

from __future__ import annotations

import keras
from keras import ops

from keras_efficientnet.layers.groups import num_groups


# Up to this many groups, one convolution per group (split and concat) beat the single grouped
# `tf.nn.conv2d` on CPU (by 15-20% at 9 groups, 56x56x144); past about 12 the grouped kernel
# wins (1.6x at 72 groups) and the graph stays small.
MAX_SPLIT_GROUPS = 10


def _tf_grouped_conv(x, kernel, strides: int, padding: str, groups: int):
    """TensorFlow fast path: a depthwise conv, per-group convs, or one grouped `tf.nn.conv2d`.

    Keras' own grouped `Conv2D` is jit-compiled through XLA on the TensorFlow backend, whose
    backward pass is about 100x slower on CPU. `tf.nn.conv2d` accepts a grouped kernel natively
    (oneDNN on CPU, cuDNN on GPU).
    """
    import tensorflow as tf  # only reached on the TensorFlow backend

    in_channels = x.shape[-1]
    if groups == in_channels and kernel.shape[-1] == in_channels:
        # Depthwise: [kh, kw, 1, C] -> [kh, kw, C, 1] for the dedicated kernel.
        dw_kernel = tf.transpose(kernel, [0, 1, 3, 2])
        return tf.nn.depthwise_conv2d(x, dw_kernel, [1, strides, strides, 1], padding.upper())
    if 1 < groups <= MAX_SPLIT_GROUPS:
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
                   use_fast_path: bool = True):
    """Applies a grouped convolution with kernel `[kh, kw, in_channels // groups, filters]`."""
    if use_fast_path and keras.backend.backend() == "tensorflow":
        return _tf_grouped_conv(x, kernel, strides, padding, groups)
    return _portable_grouped_conv(x, kernel, strides, padding, groups)


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class GroupConv2D(keras.layers.Layer):
    """2-D convolution whose input channels are split into groups of `group_size` channels.

    `group_size=1` is a depthwise convolution; `group_size=16` is the G16 convolution of Masters
    et al. 2021 ("Making EfficientNet More Efficient"). The kernel has shape
    `[kh, kw, group_size, filters]`, as in Keras' `Conv2D(groups=...)`, so weights are
    interchangeable with it, but the computation avoids Keras' XLA-compiled grouped path.

    Args:
        filters: output channels; must be a multiple of the number of groups.
        kernel_size: int or pair, the spatial size of the kernel.
        strides: int, the stride in both spatial dimensions. Default 1.
        group_size: input channels per group. Default 1 (depthwise).
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
                f"groups formed by {in_channels} channels / group_size {self.group_size}")
        initializer = self.kernel_initializer
        if initializer == "conv_kernel_initializer":
            initializer = conv_kernel_initializer(self.groups)
        self.kernel = self.add_weight(
            name="kernel", shape=(*self.kernel_size, self.group_size, self.filters),
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
