"""`--weights=imagenet|PATH`: a new training run starts from pretrained weights.

`imagenet` (or a keras.applications EfficientNet `.h5`) loads keras.applications' ImageNet
weights into the G1-BN presets (`models.pretrained`); a `.keras` or `.weights.h5` left by any
run of ours loads into the same preset. Where the class counts differ the classifier stays newly
initialized (logged) and every other variable loads by its path; a file that does not fit fails
in one line naming the preset it holds and the one asked for.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

log = logging.getLogger("keras_efficientnet")

HEAD = "predictions/"  # the classifier's variables


def check_weights_flag(weights: str) -> None:
    """Before TensorFlow loads: `weights` is empty, "imagenet" or an existing model file."""
    if weights in ("", "imagenet"):
        return
    if not weights.endswith((".keras", ".h5", ".hdf5")):
        raise ValueError(f"--weights={weights!r}: give 'imagenet', a .keras or .weights.h5 file "
                         "of a run, or a keras.applications EfficientNet .h5 file")
    if not os.path.isfile(weights):
        raise ValueError(f"--weights={weights!r}: no such file")


def _is_keras_applications_file(path: str) -> bool:
    # keras.applications' (legacy HDF5) files list their layers in a `layer_names` attribute;
    # Keras 3's .weights.h5 files do not.
    if not path.endswith((".h5", ".hdf5")) or path.endswith(".weights.h5"):
        return False
    import h5py

    with h5py.File(path, "r") as f:
        return "layer_names" in f.attrs or "layer_names" in f.get("model_weights", {}).attrs


def _describe(model) -> str:
    from keras_efficientnet.models.presets import preset_name

    config = model.get_config()
    return (f"{preset_name(config) or model.name} with {config.get('classes')} classes")


def _copy_by_path(model, donor, source: str, preset: str) -> int:
    """Assigns every variable of `donor` to `model`'s of the same path and shape, the
    classifier only when it fits; returns how many; ValueError if anything else misfits."""
    theirs = {v.path: v for v in donor.weights}
    misfits, assigned = [], 0
    for variable in model.weights:
        other = theirs.get(variable.path)
        if other is not None and tuple(other.shape) == tuple(variable.shape):
            variable.assign(other.numpy() if hasattr(other, "numpy") else other.value)
            assigned += 1
        elif not variable.path.startswith(HEAD):
            misfits.append(variable.path)
    if misfits:
        raise ValueError(f"--weights={source!r} holds {_describe(donor)}, which does not fit "
                         f"--model={preset} ({len(misfits)} variables differ, e.g. "
                         f"{misfits[0]}); use it with --model={_describe(donor).split()[0]}")
    return assigned


def warm_start(model, config) -> str:
    """Loads `config.weights` into the newly built `model`; returns what was loaded."""
    import keras

    source = config.weights
    if source == "imagenet" or _is_keras_applications_file(source):
        from keras_efficientnet.models import pretrained

        pretrained.load_weights(model, source)  # logs a newly initialized classifier
        return f"{source} (keras.applications' EfficientNet weights)"
    if source.endswith(".keras"):
        from keras_efficientnet.registration import load_model

        donor = load_model(source, compile=False)
    else:  # a run's .weights.h5: the same preset and classes
        donor = keras.models.clone_model(model)
        try:
            donor.load_weights(source)
        except ValueError as error:
            raise ValueError(f"--weights={source!r} does not fit --model={config.model} with "
                             f"{model.output_shape[-1]} classes "
                             f"({str(error).strip().splitlines()[0]}); a run's model.keras "
                             "also loads into another class count") from None
    _copy_by_path(model, donor, source, config.model)
    classes, donor_classes = model.output_shape[-1], donor.output_shape[-1]
    if classes != donor_classes:
        log.info("loaded %s into %s; its %d-class classifier is newly initialized (the file's "
                 "has %d classes)", source, model.name, classes, donor_classes)
        return f"{source} (classifier new: {donor_classes} -> {classes} classes)"
    log.info("loaded %s into %s", source, model.name)
    return str(Path(source))
