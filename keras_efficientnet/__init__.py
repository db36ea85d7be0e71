"""keras-efficientnet: Graphcore's "Making EfficientNet More Efficient" in Keras 3.

The model, layers and optimizers use `keras.ops` and import without TensorFlow (for example under
`KERAS_BACKEND=jax`); the host pipeline (`datasets`), trainer and distribution code need TensorFlow
and are imported on first use.

`import keras_efficientnet` imports the model, every layer, optimizer and learning-rate schedule,
which registers them with Keras' serialization, so that a fresh process needs nothing more before
`keras.models.load_model(path)` (safe mode included) of a model that uses them or was compiled
with them. One exception: a process started as one of our command-line entry points
(`python -m keras_efficientnet.train`, `keras-efficientnet-train`) skips that import, checks its
flags first (a mistyped flag answers in about a second instead of after Keras and TensorFlow
load), and then calls `import_all()` itself.
"""

import importlib
import os
import sys

__version__ = "0.1.0"

# Modules run with `python -m` and console scripts that check their flags before Keras loads.
CLI_MODULES = ("keras_efficientnet.train", "keras_efficientnet.predict",
               "keras_efficientnet.evaluate")
CLI_SCRIPTS = ("keras-efficientnet-train", "keras-efficientnet-predict",
               "keras-efficientnet-evaluate")

# The package face, one table: public name -> (module, attribute; None: the module itself).
# Resolved on first use by `__getattr__`; `import_all` binds them all.
_EXPORTS = {
    **{name: (f"keras_efficientnet.{name}", None) for name in (
        "layers", "models", "optimizers", "datasets", "training", "distribute", "cli")},
    "EfficientNet": ("keras_efficientnet.models.efficientnet", "EfficientNet"),
    "count_macs": ("keras_efficientnet.models.macs", "count_macs"),
    "decode_predictions": ("keras_efficientnet.models.imagenet_classes", "decode_predictions"),
    "list_presets": ("keras_efficientnet.models.presets", "list_presets"),
    "list_recipes": ("keras_efficientnet.recipes", "list_recipes"),
}
# The exports whose import registers classes with Keras' serialization (so that it finds them by
# name when it loads a saved model): every public layer, the model, every optimizer and
# learning-rate schedule. The others need TensorFlow and load only when asked for.
_REGISTERING = ("layers", "models", "optimizers", "EfficientNet", "count_macs",
                "decode_predictions", "list_presets", "list_recipes")


def _resolve(name: str):
    module, attribute = _EXPORTS[name]
    loaded = importlib.import_module(module)
    return loaded if attribute is None else getattr(loaded, attribute)


# Interpreter options that take a value as the next argument (`python -X importtime -m ...`).
_OPTIONS_WITH_VALUES = ("-X", "-W", "--check-hash-based-pycs")


def started_as_cli(argv: list[str] | None = None) -> bool:
    """Whether this process is one of the CLI_MODULES (`python [options] -m MODULE`) or
    CLI_SCRIPTS: `argv` defaults to the interpreter's own command line (`sys.orig_argv`)."""
    argv = list(getattr(sys, "orig_argv", sys.argv) if argv is None else argv)
    arguments = iter(argv[1:])
    for arg in arguments:
        if arg == "-m":
            return next(arguments, None) in CLI_MODULES
        if arg == "-c":
            return False
        if arg in _OPTIONS_WITH_VALUES:
            next(arguments, None)
        elif not arg.startswith("-"):  # the script: a console script is `python /bin/SCRIPT`
            return os.path.basename(arg) in CLI_SCRIPTS
    return bool(argv) and os.path.basename(argv[0]) in CLI_SCRIPTS


def import_all() -> None:
    """Imports the model, every layer, optimizer and schedule, registering them with Keras (what
    `import keras_efficientnet` does outside the command-line entry points). It is the one place
    where importing the package imports Keras."""
    _resolve("layers").import_all()
    globals().update({name: _resolve(name) for name in _REGISTERING})


def __getattr__(name):
    # Lazy so that `import keras_efficientnet` never pulls TensorFlow in on the JAX backend.
    if name in _EXPORTS:
        return _resolve(name)
    raise AttributeError(f"module 'keras_efficientnet' has no attribute {name!r}")


if not started_as_cli():
    import_all()

__all__ = list(_EXPORTS)
