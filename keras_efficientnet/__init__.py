"""keras-efficientnet: Graphcore's "Making EfficientNet More Efficient" in Keras 3.

The model, layers and optimizers use `keras.ops` and import without TensorFlow (for example under
`KERAS_BACKEND=jax`); the host pipeline (`datasets`), trainer and distribution code need TensorFlow.
Every public name below loads on first use, so `import keras_efficientnet` itself imports neither
Keras nor TensorFlow, and the command-line tools check their flags before either loads.

Keras' serialization still finds every layer, the model, each optimizer and learning-rate
schedule by name: `keras.models.load_model(path)` (safe mode included) of a model that uses them
or was compiled with them works in a fresh process after `import keras_efficientnet`, with
nothing more (`registration` says how: the first lookup of a `keras_efficientnet>` name imports
the modules that register them).
"""

import importlib

from keras_efficientnet import registration

__version__ = "0.1.0"

# The package face, one table: public name -> (module, attribute; None: the module itself).
# Resolved on first use by `__getattr__`.
_EXPORTS = {
    **{name: (f"keras_efficientnet.{name}", None) for name in (
        "layers", "models", "optimizers", "datasets", "training", "distribute", "cli")},
    "EfficientNet": ("keras_efficientnet.models.efficientnet", "EfficientNet"),
    "count_macs": ("keras_efficientnet.models.macs", "count_macs"),
    "decode_predictions": ("keras_efficientnet.models.imagenet_classes", "decode_predictions"),
    "list_presets": ("keras_efficientnet.models.presets", "list_presets"),
    "list_recipes": ("keras_efficientnet.recipes", "list_recipes"),
}


def __getattr__(name):
    # Lazy so that `import keras_efficientnet` imports no framework (nor TensorFlow under JAX).
    if name in _EXPORTS:
        module, attribute = _EXPORTS[name]
        loaded = importlib.import_module(module)
        return loaded if attribute is None else getattr(loaded, attribute)
    raise AttributeError(f"module 'keras_efficientnet' has no attribute {name!r}")


registration.install()

__all__ = list(_EXPORTS)
