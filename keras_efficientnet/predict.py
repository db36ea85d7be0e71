"""`python -m keras_efficientnet.predict --model=MODEL.keras IMAGE...`: top-5 classes per image.

Each image is read as a training run evaluates: decoded (JPEG, PNG, BMP or GIF), its short side
resized to `resolution x 256/224`, the centre square cropped to the model's resolution, uint8.
Class names come from `--class_names`, else from the `class_names.json` that training writes
beside `model.keras`; without them classes print as their index.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
from absl import flags

from keras_efficientnet.datasets.options import EVAL_RESIZE_RATIO

CLASS_NAMES_FILE = "class_names.json"  # as keras_efficientnet.training.export writes it


def _flags() -> flags.FlagValues:
    # Its own FlagValues: the training command defines `--model` (a preset) in absl's global one.
    values = flags.FlagValues()
    flags.DEFINE_string("model", None, "A .keras model file, e.g. runs/default/model.keras.",
                        flag_values=values)
    flags.DEFINE_string("class_names", "", "JSON file with a list of class names in label "
                        "order; empty = class_names.json beside the model, if there is one.",
                        flag_values=values)
    flags.DEFINE_integer("top_k", 5, "Classes to print per image.", lower_bound=1,
                         flag_values=values)
    flags.DEFINE_integer("resolution", 0, "Input resolution for models that take any size; "
                         "0 = the model's.", lower_bound=0, flag_values=values)
    flags.DEFINE_float("resize_ratio", EVAL_RESIZE_RATIO, "Resize the short side to resolution "
                       "x this before the centre crop (as evaluation does).", lower_bound=1.0,
                       flag_values=values)
    return values


def _class_names(values: flags.FlagValues, model_path: Path) -> list[str] | None:
    path = Path(values.class_names) if values.class_names else model_path.with_name(
        CLASS_NAMES_FILE)
    if not path.is_file():
        if values.class_names:
            raise ValueError(f"--class_names={values.class_names!r}: no such file")
        return None
    try:
        names = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise ValueError(f"{path}: not a JSON list of class names ({error})") from None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise ValueError(f"{path}: expected a JSON list of class names (strings)")
    return names


def _probabilities(outputs: np.ndarray) -> np.ndarray:
    # A model whose classifier emits logits (e.g. built with classifier_activation=None): its
    # rows are not distributions, so softmax them.
    outputs = np.asarray(outputs, np.float64)
    if outputs.min() >= 0 and np.allclose(outputs.sum(axis=-1), 1.0, atol=1e-3):
        return outputs
    shifted = np.exp(outputs - outputs.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


def predict(model, image_paths: list[str], resolution: int,
            resize_ratio: float = EVAL_RESIZE_RATIO) -> np.ndarray:
    """Class probabilities `[images, classes]` of `model` for the image files."""
    import tensorflow as tf

    from keras_efficientnet.datasets.preprocessing import center_crop

    images = np.stack([center_crop(tf.io.read_file(path), resolution, resize_ratio).numpy()
                       for path in image_paths])
    return _probabilities(model.predict(images, verbose=0))


def format_top_k(path: str, probabilities: np.ndarray, k: int,
                 names: list[str] | None) -> str:
    """`path` then one line per class: rank, name (or index) and probability."""
    lines = [path]
    for rank, index in enumerate(np.argsort(-probabilities, kind="stable")[:k], start=1):
        label = names[index] if names and index < len(names) else f"class {index}"
        lines.append(f"  {rank}. {label:<24} {probabilities[index]:.4f}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    values = _flags()
    try:
        images = values(sys.argv if argv is None else argv)[1:]
        if not values.model:
            raise ValueError("--model is required: a .keras file, e.g. "
                             "--model=runs/default/model.keras")
        model_path = Path(values.model)
        if not model_path.is_file() or model_path.suffix != ".keras":
            raise ValueError(f"--model={values.model!r} is not a .keras file")
        if not images:
            raise ValueError("no images given: python -m keras_efficientnet.predict "
                             "--model=MODEL.keras IMAGE [IMAGE ...]")
        missing = [path for path in images if not Path(path).is_file()]
        if missing:
            raise ValueError(f"no such image file: {', '.join(missing)}")
        names = _class_names(values, model_path)
    except (flags.Error, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2

    import keras

    # Safe mode on; the package's classes are registered: `-m` imported the package first.
    model = keras.models.load_model(model_path)
    resolution = values.resolution or model.input_shape[1]
    if resolution is None:
        print(f"error: {model_path} takes any resolution; give --resolution", file=sys.stderr)
        return 2
    probabilities = predict(model, images, resolution, values.resize_ratio)
    if names is not None and len(names) != probabilities.shape[-1]:
        print(f"error: {len(names)} class names for a model of {probabilities.shape[-1]} "
              "classes; give the right --class_names", file=sys.stderr)
        return 2
    k = min(values.top_k, probabilities.shape[-1])
    for path, row in zip(images, probabilities):
        print(format_top_k(path, row, k, names))
    return 0


def run() -> None:
    """Console-script entry point (`keras-efficientnet-predict`)."""
    sys.exit(main())


if __name__ == "__main__":
    run()
