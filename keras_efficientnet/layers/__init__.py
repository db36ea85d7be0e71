"""Keras layers of keras-efficientnet; each works on the TensorFlow and JAX backends.

Each layer's module registers it with Keras when imported (`keras_efficientnet.registration`
imports them when Keras looks one up by name). Here they load on first use, so that `num_groups`
(plain Python, used by the architecture tables) does not pull Keras in.
"""

import importlib
import sys
import types

from keras_efficientnet.layers.groups import num_groups

_MODULES = {
    "GroupConv2D": "group_conv", "conv_kernel_initializer": "group_conv",
    "ImageNormalization": "image_normalization", "MBConvBlock": "mbconv",
    "normalization": "normalization", "ProxyNormActivation": "proxy_norm",
    "normal_quantiles": "proxy_norm", "SqueezeExcite": "squeeze_excite",
    "StochasticDepth": "stochastic_depth",
}


def __getattr__(name):
    if name in _MODULES:
        module = importlib.import_module(f"keras_efficientnet.layers.{_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'keras_efficientnet.layers' has no attribute {name!r}")



class _Package(types.ModuleType):
    """The import system binds each submodule on its package once it loads; `normalization` is
    both a module and a function here, and the package attribute stays the function."""

    def __setattr__(self, name, value):
        if name == "normalization" and isinstance(value, types.ModuleType):
            value = value.normalization
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package

__all__ = [
    "GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation", "SqueezeExcite",
    "StochasticDepth", "conv_kernel_initializer", "normal_quantiles", "normalization",
    "num_groups",
]
