"""keras-efficientnet: Graphcore's "Making EfficientNet More Efficient" in Keras 3.

The model, layers and optimizers use `keras.ops` and import without TensorFlow (for example under
`KERAS_BACKEND=jax`); the host pipeline (`datasets`), trainer and distribution code need TensorFlow
and are imported on first use.
"""

import importlib

__version__ = "0.1.0"

from keras_efficientnet import (
    layers,
    models,
)
from keras_efficientnet.models.efficientnet import EfficientNet
from keras_efficientnet.models.macs import count_macs

_LAZY_SUBMODULES = ("datasets", "optimizers", "training", "distribute", "cli")


def __getattr__(name):
    # Lazy so that `import keras_efficientnet` never pulls TensorFlow in on the JAX backend.
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"keras_efficientnet.{name}")
    raise AttributeError(f"module 'keras_efficientnet' has no attribute {name!r}")


__all__ = ["EfficientNet", "count_macs", "layers", "models", *_LAZY_SUBMODULES]
