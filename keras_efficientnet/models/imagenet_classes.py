"""ImageNet-1k's 1000 class names (package data) and `decode_predictions`, without Keras.

The names are in `imagenet_classes.tsv` beside this module, written by
`scripts/imagenet_classes.py` from tensorflow-datasets' ImageNet labels (its docstring says
where each column comes from). Label `i` of every ImageNet classifier here, and of
keras.applications', is row `i`.
"""

from __future__ import annotations

import functools
from importlib import resources
from typing import NamedTuple

NUM_CLASSES = 1000


class ImageNetClass(NamedTuple):
    wnid: str  # WordNet id, e.g. "n01440764"
    name: str  # short name, e.g. "tench"
    label: str  # every synonym, e.g. "tench, Tinca tinca"


@functools.cache
def imagenet_classes() -> tuple[ImageNetClass, ...]:
    """The 1000 classes in label order."""
    text = resources.files(__package__).joinpath("imagenet_classes.tsv").read_text("utf-8")
    rows = [line.split("\t") for line in text.splitlines() if line and not line.startswith("#")]
    classes = tuple(ImageNetClass(wnid, name, label) for _, wnid, name, label in rows)
    if len(classes) != NUM_CLASSES:  # a damaged install
        raise RuntimeError(f"imagenet_classes.tsv holds {len(classes)} classes, not 1000")
    return classes


def imagenet_class_names() -> list[str]:
    """The 1000 short names in label order ("tench", "goldfish", ...)."""
    return [c.name for c in imagenet_classes()]


def decode_predictions(predictions, top: int = 5) -> list[list[tuple[str, str, float]]]:
    """The `top` classes of each row of ImageNet `predictions` `[batch, 1000]`, best first, as
    `(wordnet_id, name, score)`: what `keras.applications.*.decode_predictions` returns, from
    the package's own copy of the names (no download).

    Example:
        >>> decode_predictions(np.eye(1000)[[1]], top=1)
        [[('n01443537', 'goldfish', 1.0)]]
    """
    # NumPy is imported here, not at the top: `keras_efficientnet.models` is imported by the
    # command lines before TensorFlow, and NumPy's BLAS starts threads that do not block
    # SIGTERM (distribute/watchdog.py needs every early thread to block it).
    import numpy as np

    predictions = np.asarray(predictions)
    if predictions.ndim != 2 or predictions.shape[1] != NUM_CLASSES:
        raise ValueError("decode_predictions expects ImageNet predictions of shape "
                         f"[batch, {NUM_CLASSES}], received shape {predictions.shape}")
    if not 1 <= top <= NUM_CLASSES:
        raise ValueError(f"top must be in [1, {NUM_CLASSES}], received {top}")
    classes = imagenet_classes()
    decoded = []
    for row in predictions:
        best = np.argsort(-row, kind="stable")[:top]
        decoded.append([(classes[i].wnid, classes[i].name, float(row[i])) for i in best])
    return decoded
