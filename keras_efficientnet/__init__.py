"""keras-efficientnet: Graphcore's "Making EfficientNet More Efficient" in Keras 3.

The model, layers and optimizers use `keras.ops` and import without TensorFlow (for example under
`KERAS_BACKEND=jax`); the host pipeline (`datasets`), trainer and distribution code need TensorFlow
and are imported on first use.
"""

import importlib

__version__ = "0.1.0"

# Modules whose classes Keras must find by name when it loads a saved model: every public layer,
# the EfficientNet model, every optimizer and learning-rate schedule.
_SERIALIZABLE_MODULES = ("layers", "models", "optimizers")


def _register_serializables() -> None:
    """Registers every public layer, model, optimizer and schedule with Keras' serialization.

    Importing a module runs its `@keras.saving.register_keras_serializable` decorators, so that
    `import keras_efficientnet` is all a fresh process needs before
    `keras.models.load_model(path)` (safe mode included) of a model that uses them, or that was
    compiled with `LARS`, `RMSPropTF`, `SGD` or a `WarmupSchedule`. These modules need Keras but
    not TensorFlow. It is the one place where importing the package imports Keras.
    """
    for name in _SERIALIZABLE_MODULES:
        importlib.import_module(f"keras_efficientnet.{name}")


_register_serializables()

from keras_efficientnet import layers, models, optimizers  # noqa: E402
from keras_efficientnet.models.efficientnet import EfficientNet  # noqa: E402
from keras_efficientnet.models.macs import count_macs  # noqa: E402
from keras_efficientnet.models.presets import list_presets  # noqa: E402

_LAZY_SUBMODULES = ("datasets", "training", "distribute", "cli")


def __getattr__(name):
    # Lazy so that `import keras_efficientnet` never pulls TensorFlow in on the JAX backend.
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"keras_efficientnet.{name}")
    raise AttributeError(f"module 'keras_efficientnet' has no attribute {name!r}")


__all__ = ["EfficientNet", "count_macs", "layers", "list_presets", "models", "optimizers",
           *_LAZY_SUBMODULES]
