"""The MBConv block of EfficientNet, with group convolutions and Proxy Norm as options."""

from __future__ import annotations

import keras

from keras_efficientnet.layers import fusion
from keras_efficientnet.layers.activation import activation_config
from keras_efficientnet.layers.group_conv import GroupConv2D, conv_kernel_initializer
from keras_efficientnet.layers.groups import num_groups
from keras_efficientnet.layers.normalization import check_norm, normalization
from keras_efficientnet.layers.proxy_norm import ProxyNormActivation
from keras_efficientnet.layers.squeeze_excite import SqueezeExcite
from keras_efficientnet.layers.stochastic_depth import StochasticDepth


def norm_activation(norm: str, channels: int, *, norm_groups: int, proxy_norm: bool,
                    activation, prefix: str, where: str,
                    proxy_scale: bool = True) -> list[keras.Layer]:
    """The layers that follow a convolution: norm then activation, or norm then Proxy Norm.

    With Proxy Norm the norm has no affine of its own: the proxy-normalized activation holds it.
    `proxy_scale=False` leaves the proxy's `1 / sigma` to the consumer (see ProxyNormActivation).
    """
    if proxy_norm:
        return [normalization(norm, channels, norm_groups=norm_groups, center=False, scale=False,
                              name=f"{prefix}_norm", where=where),
                ProxyNormActivation(activation, scale_output=proxy_scale, name=f"{prefix}_act")]
    return [normalization(norm, channels, norm_groups=norm_groups, name=f"{prefix}_norm",
                          where=where),
            keras.layers.Activation(activation, name=f"{prefix}_act")]


@keras.saving.register_keras_serializable(package="keras_efficientnet")
class MBConvBlock(keras.layers.Layer):
    """Mobile inverted bottleneck: expand 1x1, spatial (group) conv, squeeze-excite, project 1x1.

    Follows EfficientNet (Tan & Le 2019) with the changes of Masters et al. 2021: the spatial conv
    is a group conv of `group_size` channels per group (1 = depthwise), and the norms may be
    batch-independent (group/layer norm) followed by Proxy Norm. A residual connection with
    stochastic depth is used when the block keeps its shape. With Proxy Norm and squeeze-excite,
    the spatial conv's proxy `1 / sigma` multiplies the SE gate instead of the features, so the
    squeeze pools unscaled features, as in Graphcore's implementation.

    Args:
        filters_in: input channels.
        filters_out: output channels.
        kernel_size: spatial kernel size. Default 3.
        strides: spatial stride. Default 1.
        expand_ratio: expansion of the 1x1 expand conv; 1 skips it. Default 1.
        se_ratio: squeeze-excite channels as a fraction of `filters_in`; 0 disables. Default 0.25.
        group_size: channels per group of the spatial conv. Default 1 (depthwise).
        norm: "batch", "group" or "layer". Default "batch".
        norm_groups: groups of the group norm. Default 4.
        proxy_norm: use ProxyNormActivation after the expand and spatial convs. Default False.
        activation: activation name. Default "swish".
        drop_rate: stochastic-depth rate of the residual branch. Default 0.
        id_skip: allow the residual connection. Default True.

    Example:
        >>> block = MBConvBlock(32, 32, expand_ratio=4, group_size=16, norm="layer",
        ...                     proxy_norm=True, name="block2b")
        >>> block(np.zeros((1, 16, 16, 32), "float32")).shape
        (1, 16, 16, 32)
    """

    def __init__(self, filters_in: int, filters_out: int, kernel_size: int = 3, strides: int = 1,
                 *, expand_ratio: int = 1, se_ratio: float = 0.25, group_size: int = 1,
                 norm: str = "batch", norm_groups: int = 4, proxy_norm: bool = False,
                 activation="swish", drop_rate: float = 0.0, id_skip: bool = True, **kwargs):
        super().__init__(**kwargs)
        for arg, value in (("filters_in", filters_in), ("filters_out", filters_out),
                           ("kernel_size", kernel_size), ("strides", strides),
                           ("expand_ratio", expand_ratio)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{self.name}: {arg} must be a positive int, received {value!r}")
        if not 0.0 <= float(se_ratio) <= 1.0:
            raise ValueError(f"{self.name}: se_ratio must be in [0, 1], received {se_ratio!r}")
        try:
            check_norm(norm, norm_groups, proxy_norm)
        except ValueError as error:
            raise ValueError(f"{self.name}: {error}") from None
        self.filters_in = filters_in
        self.filters_out = filters_out
        self.kernel_size = kernel_size
        self.strides = strides
        self.expand_ratio = expand_ratio
        self.se_ratio = float(se_ratio)
        self.group_size = group_size
        self.norm = norm
        self.norm_groups = norm_groups
        self.proxy_norm = proxy_norm
        self.activation = activation
        self.drop_rate = float(drop_rate)
        self.id_skip = id_skip
        self.filters = filters_in * expand_ratio
        # Validate the group structure now, so a bad group_size fails when the model is defined.
        num_groups(self.filters, group_size, where=self.name)

    @property
    def has_residual(self) -> bool:
        return self.id_skip and self.strides == 1 and self.filters_in == self.filters_out

    def build(self, input_shape):
        if input_shape[-1] != self.filters_in:
            raise ValueError(f"{self.name}: expects {self.filters_in} input channels, "
                             f"received input shape {tuple(input_shape)}")
        common = dict(norm_groups=self.norm_groups, where=self.name)
        layers = []
        if self.expand_ratio != 1:
            layers.append(keras.layers.Conv2D(
                self.filters, 1, use_bias=False, kernel_initializer=conv_kernel_initializer(),
                name="expand_conv"))
            layers += norm_activation(self.norm, self.filters, proxy_norm=self.proxy_norm,
                                      activation=self.activation, prefix="expand", **common)
        layers.append(GroupConv2D(self.filters, self.kernel_size, self.strides,
                                  group_size=self.group_size, name="spatial_conv"))
        fold = self.proxy_norm and self.se_ratio > 0
        layers += norm_activation(self.norm, self.filters, proxy_norm=self.proxy_norm,
                                  activation=self.activation, prefix="spatial",
                                  proxy_scale=not fold, **common)
        # The layer whose 1 / sigma the SE gate takes (None: the activation scales itself).
        self.gate_scale_source = layers[-1] if fold else None
        if self.se_ratio > 0:
            filters_se = max(1, int(self.filters_in * self.se_ratio))
            layers.append(SqueezeExcite(filters_se, self.activation, name="se"))
        layers.append(keras.layers.Conv2D(
            self.filters_out, 1, use_bias=False, kernel_initializer=conv_kernel_initializer(),
            name="project_conv"))
        # No activation follows the projection: with Proxy Norm it keeps a scale-only norm.
        layers.append(normalization(self.norm, self.filters_out, center=not self.proxy_norm,
                                    name="project_norm", **common))
        self.ordered_layers = layers
        shape = tuple(input_shape)
        for layer in layers:
            layer.build(shape)
            shape = layer.compute_output_shape(shape)
        self.stochastic_depth = None
        if self.has_residual and self.drop_rate > 0:
            self.stochastic_depth = StochasticDepth(self.drop_rate, name="drop")

    def _call_kwargs(self, layer) -> dict:
        """A layer's extra call arguments: the squeeze-excite gate takes the proxy 1 / sigma."""
        if isinstance(layer, SqueezeExcite) and self.gate_scale_source is not None:
            return {"gate_scale": self.gate_scale_source.inverse_std()}
        return {}

    def _residual(self, x, inputs, training):
        if not self.has_residual:
            return x
        if self.stochastic_depth is not None:
            x = self.stochastic_depth(x, training=training)
        return x + inputs

    def call(self, inputs, training=None):
        x = inputs
        for layer in self.ordered_layers:
            # Keras passes `training` on to BatchNormalization through the context.
            x = layer(x, **self._call_kwargs(layer))
        return self._residual(x, inputs, training)

    def fused_call(self, inputs, pending=None, portable: bool = False):
        """Inference (`layers.fusion`): the same block with each layer in its fused form (norms
        with their activations, Proxy Norm's scale folded into the next conv), the same gate
        and residual. Returns `(outputs, None)`."""
        if self.has_residual:  # the skip adds the value itself
            inputs, pending = fusion.materialize(inputs, pending), None
        x, pending = fusion.fused_sequence(self.ordered_layers, inputs, pending, portable,
                                           self._call_kwargs)
        return self._residual(fusion.materialize(x, pending), inputs, training=False), None

    def compute_output_shape(self, input_shape):
        batch, height, width, _ = input_shape

        def out(size):
            return None if size is None else -(-size // self.strides)

        return (batch, out(height), out(width), self.filters_out)

    def count_macs(self, input_shape, count_layer):
        total, shape = 0, tuple(input_shape)
        for layer in self.ordered_layers:
            total += count_layer(layer, shape)
            shape = layer.compute_output_shape(shape)
        return total

    def get_config(self):
        config = super().get_config()
        config.update(
            filters_in=self.filters_in, filters_out=self.filters_out,
            kernel_size=self.kernel_size, strides=self.strides, expand_ratio=self.expand_ratio,
            se_ratio=self.se_ratio, group_size=self.group_size, norm=self.norm,
            norm_groups=self.norm_groups, proxy_norm=self.proxy_norm,
            activation=activation_config(self.activation), drop_rate=self.drop_rate,
            id_skip=self.id_skip)
        return config
