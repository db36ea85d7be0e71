"""keras-efficientnet: Graphcore's "Making EfficientNet More Efficient" in Keras 3.

The model, layers and optimizers use `keras.ops` and import without TensorFlow (for example under
`KERAS_BACKEND=jax`); the host pipeline (`datasets`), trainer and distribution code need TensorFlow.
Every public name below loads on first use (`keras_efficientnet.lazy`; `dir()` lists them all),
so `import keras_efficientnet` itself imports neither Keras nor TensorFlow, and the command-line
tools check their flags before either loads.

A saved model names our classes (`keras_efficientnet>GroupConv2D` ...), and Keras finds a class
once its module has run: `keras_efficientnet.load_model(path)` loads a `.keras` file in any
process, and `keras_efficientnet.register()` lets a bare `keras.models.load_model(path)` (or any
Keras deserialization) find every layer, the model, each optimizer and learning-rate schedule.
"""

from keras_efficientnet.lazy import lazy_face

__version__ = "0.1.0"

# The package face, one table: public name -> (module, attribute; None: the module itself).
# Resolved on first use by `__getattr__`.
_EXPORTS = {
    **{name: (f"keras_efficientnet.{name}", None) for name in (
        "layers", "models", "optimizers", "datasets", "training", "distribute", "cli", "runs")},
    "EfficientNet": ("keras_efficientnet.models.efficientnet", "EfficientNet"),
    "count_macs": ("keras_efficientnet.models.macs", "count_macs"),
    "decode_predictions": ("keras_efficientnet.models.imagenet_classes", "decode_predictions"),
    "list_presets": ("keras_efficientnet.models.presets", "list_presets"),
    "list_recipes": ("keras_efficientnet.recipes", "list_recipes"),
    "load_model": ("keras_efficientnet.registration", "load_model"),
    "register": ("keras_efficientnet.registration", "register"),
    "open_run": ("keras_efficientnet.runs.run", "open_run"),
}

__all__ = [*_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
