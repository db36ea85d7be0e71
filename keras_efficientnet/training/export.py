"""What a training run leaves for inference: the final model as `.keras` and as a SavedModel."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path

import keras

from keras_efficientnet.atomic import (
    WriteError,
    atomic_file,
    fsync_directory,
    private_mode,
    require_space,
    write_atomically,
    write_error,
)
from keras_efficientnet.runs.record import CLASS_NAMES as CLASS_NAMES_FILE
from keras_efficientnet.runs.record import MODEL as MODEL_FILE
from keras_efficientnet.training.checkpoint import nbytes
from keras_efficientnet.training.run_dir import EXPORT_MARK, check_export_dir

log = logging.getLogger("keras_efficientnet")


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


def _save_atomically(model: keras.Model, how: str, path: Path, suffix: str) -> Path:
    # Keras writes only to names ending in `suffix` (".keras", ".weights.h5"): stage the file
    # under one, beside the temporary file that `atomic_file` then flushes and renames into
    # place (never through a link at `path`: atomic_file refuses one). `how`: "save" or
    # "save_weights".
    with atomic_file(path) as tmp:
        require_space(path.parent, nbytes(model.weights))
        staged = tmp.with_name(tmp.name + suffix)
        try:
            getattr(model, how)(staged)
            os.replace(staged, tmp)
        finally:
            staged.unlink(missing_ok=True)
    return path


def _save_keras_atomically(model: keras.Model, path: Path) -> Path:
    return _save_atomically(model, "save", path, ".keras")


def save_weights_atomically(model: keras.Model, path: str | os.PathLike) -> Path:
    """`model.save_weights(path)` written atomically, never through a link, a refused write
    named (`atomic.WriteError`)."""
    return _save_atomically(model, "save_weights", Path(path), ".weights.h5")


def save_model(model: keras.Model, model_dir: str | os.PathLike,
               class_names: tuple[str, ...] | None = None) -> Path:
    """Writes `<model_dir>/model.keras` (and `class_names.json` when the names are known).

    `keras_efficientnet.load_model` reads it in any process (or `keras.models.load_model` after
    `keras_efficientnet.register()`);
    `keras-efficientnet-predict --model_file=<model_dir>/model.keras IMAGE...` uses both.
    """
    model_dir = Path(model_dir)
    path = _save_keras_atomically(model, model_dir / MODEL_FILE)
    if class_names:
        write_atomically(model_dir / CLASS_NAMES_FILE, json.dumps(list(class_names), indent=1,
                                                                allow_nan=False))
    log.info("wrote %s", path)
    return path


def export_saved_model(model: keras.Model, export_dir: str | os.PathLike,
                       serving: str = "auto") -> Path:
    """Writes a TensorFlow SavedModel whose `serving_default` signature takes the model's
    input (uint8 images `[batch, height, width, 3]`) and returns its output (probabilities).

    Its graph is `keras_efficientnet.serving.export_saved_model`'s: with "auto" the layers'
    fused forms (`EfficientNet.fused_call`) for LayerNorm/GroupNorm models (the same outputs
    to float32 round-off, fewer passes over memory), Keras' layers for the others; "off" keeps
    Keras' layers for every model, "on" fuses any EfficientNet.

    Atomic: the SavedModel is written into a temporary sibling folder and renamed into place;
    an earlier export of ours there is replaced whole (nothing of it stays), and a directory
    holding anything else is refused (`run_dir.check_export_dir`). A refused write raises
    `atomic.WriteError` and leaves the earlier export as it was.

    Converters start from it: `tf.lite.TFLiteConverter.from_saved_model(export_dir)` for
    TFLite, `python -m tf2onnx.convert --saved-model export_dir` for ONNX (see the README).
    """
    export_dir = check_export_dir(export_dir)
    parent = export_dir.parent
    tmp = old = None
    try:
        parent.mkdir(parents=True, exist_ok=True)
        require_space(parent, nbytes(model.weights))
        tmp = Path(tempfile.mkdtemp(dir=parent, prefix=f".{export_dir.name}.tmp-"))
        # uint8 in, whatever the model's input dtype (float32 takes uint8 too, cast inside):
        # a server sends a quarter of the bytes, and TFLite and ONNX converters keep uint8.
        import tensorflow as tf

        from keras_efficientnet.serving import export_saved_model as export_inference

        fused = export_inference(model, tmp, serving, input_signature=[
            tf.TensorSpec(tuple(model.inputs[0].shape), tf.uint8, name="images")])
        write_atomically(tmp / EXPORT_MARK, json.dumps(
            {"format": "tf_saved_model", "model": model.name,
             "forward_pass": "fused" if fused else "keras",
             "written": time.strftime("%Y-%m-%d %H:%M:%S %Z")}, allow_nan=False))
        private_mode(tmp, 0o755)
        check_export_dir(export_dir)  # again: it may have changed meanwhile
        if export_dir.is_dir():
            old = Path(tempfile.mkdtemp(dir=parent, prefix=f".{export_dir.name}.old-"))
            os.replace(export_dir, old / export_dir.name)
        os.replace(tmp, export_dir)
        fsync_directory(parent)
    except BaseException as error:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        if old is not None and not export_dir.exists():  # put the earlier export back
            os.replace(old / export_dir.name, export_dir)
        if isinstance(error, OSError) and not isinstance(error, WriteError):
            raise write_error(export_dir, error, f"the SavedModel {export_dir}") from None
        raise
    finally:
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    log.info("wrote SavedModel %s", export_dir)
    return export_dir
