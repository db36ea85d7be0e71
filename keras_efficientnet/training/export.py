"""What a training run leaves for inference: the final model as `.keras` and as a SavedModel."""

from __future__ import annotations

import contextlib
import json
import logging
import os
from pathlib import Path

import keras

from keras_efficientnet.atomic import atomic_file, write_atomically

log = logging.getLogger("keras_efficientnet")

MODEL_FILE = "model.keras"
CLASS_NAMES_FILE = "class_names.json"


@contextlib.contextmanager
def _float32_policy():
    previous = keras.config.dtype_policy()
    keras.config.set_dtype_policy("float32")
    try:
        yield
    finally:
        keras.config.set_dtype_policy(previous)


def inference_model(model: keras.Model) -> keras.Model:
    """A float32 copy of an EfficientNet whose classifier outputs probabilities.

    The trainer's models emit logits (its losses take `from_logits=True`) and may compute in
    16 bits; the copy shares nothing with `model`, has a softmax classifier and float32 layers,
    which is what a `.keras` file for `predict` and a serving signature should hold.
    """
    config = model.get_config()
    if config.get("include_top") and config.get("classifier_activation") in (None, "linear"):
        config["classifier_activation"] = "softmax"
    with _float32_policy():
        copy = type(model).from_config(config)
    copy.set_weights(model.get_weights())
    return copy


def _save_keras_atomically(model: keras.Model, path: Path) -> Path:
    # Keras writes only to names ending in ".keras": stage the file under one, beside the
    # temporary file that `atomic_file` then flushes and renames into place.
    with atomic_file(path) as tmp:
        staged = tmp.with_name(tmp.name + ".keras")
        try:
            model.save(staged)
            os.replace(staged, tmp)
        finally:
            staged.unlink(missing_ok=True)
    return path


def save_model(model: keras.Model, model_dir: str | os.PathLike,
               class_names: tuple[str, ...] | None = None) -> Path:
    """Writes `<model_dir>/model.keras` (and `class_names.json` when the names are known).

    `keras.models.load_model` reads it in any process that has run `import keras_efficientnet`;
    `python -m keras_efficientnet.predict --model=<model_dir>/model.keras IMAGE...` uses both.
    """
    model_dir = Path(model_dir)
    path = _save_keras_atomically(model, model_dir / MODEL_FILE)
    if class_names:
        write_atomically(model_dir / CLASS_NAMES_FILE, json.dumps(list(class_names), indent=1))
    log.info("wrote %s", path)
    return path


def export_saved_model(model: keras.Model, export_dir: str | os.PathLike) -> Path:
    """Writes a TensorFlow SavedModel whose `serving_default` signature takes the model's
    input (uint8 images `[batch, height, width, 3]`) and returns its output (probabilities).

    Converters start from it: `tf.lite.TFLiteConverter.from_saved_model(export_dir)` for
    TFLite, `python -m tf2onnx.convert --saved-model export_dir` for ONNX (see the README).
    """
    export_dir = Path(export_dir)
    if export_dir.is_file():
        raise ValueError(f"export directory {str(export_dir)!r} is a file")
    model.export(str(export_dir), format="tf_saved_model", verbose=False)
    log.info("wrote SavedModel %s", export_dir)
    return export_dir
