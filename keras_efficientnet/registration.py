"""Keras finds the package's classes by name once they are registered: `register()`,
`load_model(path)`.

A saved model names our classes `keras_efficientnet>GroupConv2D`, `keras_efficientnet>LARS` ...,
and a class enters Keras' registry when its module runs its `@register_keras_serializable`
decorator. `import keras_efficientnet` imports none of them (nor Keras), so that the
command-line tools check their flags before a framework loads; a process that loads a saved
model in a fresh interpreter first calls

- `keras_efficientnet.load_model(path, ...)`: `register()`, then `keras.models.load_model`
  with the same arguments (safe mode on by default); or
- `keras_efficientnet.register()`, after which a bare `keras.models.load_model(path)` (or
  `keras.saving.deserialize_keras_object`) finds every class.

Building or importing anything of the package's (`ke.EfficientNet(...)`, `ke.layers.X`) also
registers what it imports. No import hook and no Keras internals: only Keras' public
`register_keras_serializable` and `load_model`.
"""

from __future__ import annotations

import importlib
import os

# Every module whose classes carry Keras' `register_keras_serializable` decorator:
# the layers, the model, the optimizers and the learning-rate schedule (none imports TensorFlow;
# tests/test_registration.py checks the list against the source).
REGISTERING_MODULES = tuple(f"keras_efficientnet.{name}" for name in (
    "layers.group_conv", "layers.image_normalization", "layers.mbconv", "layers.normalization",
    "layers.proxy_norm", "layers.squeeze_excite", "layers.stochastic_depth",
    "models.efficientnet", "optimizers.lars", "optimizers.rmsprop_tf", "optimizers.sgd",
    "optimizers.schedules"))


def register() -> None:
    """Registers every class of the package with Keras' serialization (imports Keras and the
    modules that define them; idempotent)."""
    for module in REGISTERING_MODULES:
        importlib.import_module(module)


def load_model(path: str | os.PathLike, **kwargs):
    """`keras.models.load_model(path, **kwargs)` (`compile`, `safe_mode`, `custom_objects`)
    after `register()`: a `.keras` file of the package's model, layers or optimizers in any
    process."""
    register()
    import keras

    return keras.models.load_model(path, **kwargs)
