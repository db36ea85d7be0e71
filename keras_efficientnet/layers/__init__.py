"""Keras layers of keras-efficientnet; each works on the TensorFlow and JAX backends.

Each layer's module registers it with Keras when imported; `import keras_efficientnet` imports
them all. Here they load on first use, so that `num_groups` (plain Python, used by the
architecture tables) does not pull Keras in.
"""

import importlib

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


def import_all() -> None:
    """Imports every layer module (registering each layer with Keras' serialization) and binds
    the names above here, as an eager `from ... import` would (`normalization` is both a module
    and a function: the function wins, as it always has)."""
    for name, module in _MODULES.items():
        globals()[name] = getattr(
            importlib.import_module(f"keras_efficientnet.layers.{module}"), name)


__all__ = [
    "GroupConv2D", "ImageNormalization", "MBConvBlock", "ProxyNormActivation", "SqueezeExcite",
    "StochasticDepth", "conv_kernel_initializer", "normal_quantiles", "normalization",
    "num_groups",
]
