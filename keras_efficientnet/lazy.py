"""One helper for every package face: names that load on first use, listed by `dir()`.

A face (`__init__.py`) imports its plain-Python names at once and lists the others in a table,
one line a name: `"EfficientNet": ("keras_efficientnet.models.efficientnet", "EfficientNet")`
(attribute None: the module itself; a module name starting with "." is relative to the face).
`lazy_face` returns the face's `__getattr__` and `__dir__` (PEP 562), so that
`import keras_efficientnet` loads no framework, and `dir(ke)` and notebook completion still show
every name; the face's `__all__` is its eager names and `*_EXPORTS`. Plain Python: importing it
imports nothing else.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Callable, Iterable


class _Face(types.ModuleType):
    """A face module. The import system binds each submodule on its package once it loads,
    which would hide an exported attribute of the same name (`layers.normalization`, a
    function, and `layers/normalization.py`): the exported attribute stays."""

    def __setattr__(self, name, value):
        module, attribute = self.__dict__.get("_lazy_exports", {}).get(name, (None, None))
        if isinstance(value, types.ModuleType) and attribute is not None:
            value = getattr(importlib.import_module(module, self.__name__), attribute)
        super().__setattr__(name, value)


def lazy_face(package: str, exports: dict[str, tuple[str, str | None]],
              submodules: Iterable[str] = ()
              ) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`(__getattr__, __dir__)` for the face `package` (its `__name__`).

    Args:
        package: the face's module name.
        exports: public name -> (module, attribute), loaded on first use and kept on the face.
        submodules: modules of the package reachable as attributes (`dir()` shows them) but
            not in `__all__` (some need optional libraries).
    """
    exports = dict(exports)
    submodules = tuple(submodules)
    face = sys.modules[package]
    face.__class__ = _Face
    face._lazy_exports = exports

    def resolve(name: str):
        if name in exports:
            module, attribute = exports[name]
            loaded = importlib.import_module(module, package)
            value = loaded if attribute is None else getattr(loaded, attribute)
        elif name in submodules:
            value = importlib.import_module(f"{package}.{name}")
        else:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        setattr(face, name, value)  # later lookups find it without coming back here
        return value

    def names() -> list[str]:
        return sorted({*face.__dict__, *getattr(face, "__all__", ()), *exports, *submodules})

    return resolve, names
