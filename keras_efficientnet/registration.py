"""Keras finds the package's classes by name without `import keras_efficientnet` importing Keras.

A saved model names our classes `keras_efficientnet>GroupConv2D`, `keras_efficientnet>LARS` ...;
Keras resolves such a name in `keras.saving.get_registered_object` with
`name in GLOBAL_CUSTOM_OBJECTS` then `GLOBAL_CUSTOM_OBJECTS[name]` (the module
`keras.src.saving.object_registration`), and a class enters that dict when its module runs its
`@register_keras_serializable` decorator. `install()` (called by the package's `__init__`) makes
that happen on demand:

- Keras already imported: `register()` at once (importing the modules that register).
- Keras not imported yet: a `sys.meta_path` finder waits for Keras' registry module; right after
  that module runs, its dict is replaced by a `LazyRegistry` holding the same entries, whose
  first lookup of a missing `keras_efficientnet>` name calls `register()`. Nothing is imported
  before that lookup, so the command-line tools check their flags before Keras loads, and a
  process that never loads a saved model never imports our layers.

Listing `keras.saving.get_custom_objects()` shows our classes only once something has looked one
up or imported its module (`register()` imports them all).
"""

from __future__ import annotations

import importlib
import importlib.abc
import sys

PREFIX = "keras_efficientnet>"
KERAS_REGISTRY = "keras.src.saving.object_registration"

# Every module whose classes carry Keras' `register_keras_serializable` decorator:
# the layers, the model, the optimizers and the learning-rate schedule (none imports TensorFlow;
# tests/test_registration.py checks the list against the source).
REGISTERING_MODULES = tuple(f"keras_efficientnet.{name}" for name in (
    "layers.group_conv", "layers.image_normalization", "layers.mbconv", "layers.normalization",
    "layers.proxy_norm", "layers.squeeze_excite", "layers.stochastic_depth",
    "models.efficientnet", "optimizers.lars", "optimizers.rmsprop_tf", "optimizers.sgd",
    "optimizers.schedules"))


def register() -> None:
    """Imports every module that registers a class with Keras' serialization (it imports Keras)."""
    for module in REGISTERING_MODULES:
        importlib.import_module(module)


def _ours(name) -> bool:
    return isinstance(name, str) and name.startswith(PREFIX)


class LazyRegistry(dict):
    """Keras' `GLOBAL_CUSTOM_OBJECTS`, which registers the package's classes the first time a
    name of ours is looked up (`in` or `[]`) and is not there yet."""

    def __contains__(self, name) -> bool:
        if not dict.__contains__(self, name) and _ours(name):
            register()
        return dict.__contains__(self, name)

    def __missing__(self, name):
        if _ours(name):
            register()
            if dict.__contains__(self, name):
                return dict.__getitem__(self, name)
        raise KeyError(name)


class _SwapAfterExec(importlib.abc.Loader):
    """Runs Keras' registry module with its own loader, then swaps in the `LazyRegistry` (before
    any other module can hold the plain dict)."""

    def __init__(self, loader):
        self.loader = loader

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        self.loader.exec_module(module)
        module.GLOBAL_CUSTOM_OBJECTS = LazyRegistry(module.GLOBAL_CUSTOM_OBJECTS)

    def __getattr__(self, name):  # get_source, get_data ...: the wrapped loader's
        return getattr(self.loader, name)


class _RegistryFinder(importlib.abc.MetaPathFinder):
    """Finds Keras' registry module with the finders after it and wraps its loader (once)."""

    def find_spec(self, fullname, path, target=None):
        if fullname != KERAS_REGISTRY:
            return None
        sys.meta_path.remove(self)
        for finder in sys.meta_path:
            spec = getattr(finder, "find_spec", lambda *_: None)(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _SwapAfterExec(spec.loader)
                return spec
        return None


def install() -> None:
    """Makes Keras find the package's classes by name from now on, importing nothing heavy."""
    registry = sys.modules.get(KERAS_REGISTRY)
    if registry is not None:
        if not isinstance(registry.GLOBAL_CUSTOM_OBJECTS, LazyRegistry):
            register()  # Keras is here: others may hold its dict, so fill it rather than swap
    elif not any(isinstance(finder, _RegistryFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _RegistryFinder())
