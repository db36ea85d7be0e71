"""Keras layers of keras-efficientnet; each works on the TensorFlow and JAX backends.

Each layer's module registers it with Keras' serialization when imported
(`keras_efficientnet.register()` imports them all). Here they load on first use
(`keras_efficientnet.lazy`), so that `num_groups` (plain Python, used by the architecture
tables) does not pull Keras in. `fusion` holds the layers' fused inference forms.
"""

from keras_efficientnet.layers.groups import num_groups
from keras_efficientnet.lazy import lazy_face

# Public name -> (module, attribute; None: the module itself), one line a name.
_EXPORTS = {
    "GroupConv2D": (".group_conv", "GroupConv2D"),
    "conv_kernel_initializer": (".group_conv", "conv_kernel_initializer"),
    "ImageNormalization": (".image_normalization", "ImageNormalization"),
    "MBConvBlock": (".mbconv", "MBConvBlock"),
    "normalization": (".normalization", "normalization"),
    "ProxyNormActivation": (".proxy_norm", "ProxyNormActivation"),
    "normal_quantiles": (".proxy_norm", "normal_quantiles"),
    "SqueezeExcite": (".squeeze_excite", "SqueezeExcite"),
    "StochasticDepth": (".stochastic_depth", "StochasticDepth"),
    "fusion": (".fusion", None),
}

__all__ = ["num_groups", *_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
