"""Keras layers of keras-efficientnet; each works on the TensorFlow and JAX backends."""

from keras_efficientnet.layers.group_conv import GroupConv2D, conv_kernel_initializer
from keras_efficientnet.layers.groups import num_groups
from keras_efficientnet.layers.image_normalization import ImageNormalization
from keras_efficientnet.layers.mbconv import MBConvBlock
from keras_efficientnet.layers.normalization import normalization
from keras_efficientnet.layers.proxy_norm import ProxyNormActivation, normal_quantiles
from keras_efficientnet.layers.squeeze_excite import SqueezeExcite
from keras_efficientnet.layers.stochastic_depth import StochasticDepth

__all__ = [
    "GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation", "SqueezeExcite",
    "StochasticDepth", "conv_kernel_initializer", "normal_quantiles", "normalization",
    "num_groups",
]
