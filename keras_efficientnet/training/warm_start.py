"""`--weights=imagenet|PATH|RUN[:choice]`: a new training run starts from pretrained weights.

The argument is any form of `runs.weights` (resolved and verified there). `imagenet` (or a
keras.applications EfficientNet `.h5`) loads keras.applications' ImageNet weights into the G1-BN
presets (`models.pretrained`); a `.keras`, `.weights.h5`, checkpoint folder or run of ours loads
into the same preset. Where the class counts differ the classifier stays newly
initialized (logged) and every other variable loads by its path; a file that does not fit fails
in one line naming the preset it holds and the one asked for.
"""

from __future__ import annotations

import logging
from pathlib import Path

from keras_efficientnet.runs import weights as weights_lib

log = logging.getLogger("keras_efficientnet")

HEAD = "predictions/"  # the classifier's variables


def check_weights_flag(weights: str, model: str | None = None) -> None:
    """Before TensorFlow loads: `weights` is empty or a form of `runs.weights` that exists,
    and `imagenet` fits preset `model` (keras.applications' weights fit G1-BN only)."""
    weights_lib.check(weights, "--weights")
    if weights == "imagenet" and model is not None:
        from keras_efficientnet.models.presets import keras_applications_misfit, preset_config

        misfit = keras_applications_misfit(preset_config(model))
        if misfit:
            raise ValueError(f"--weights=imagenet does not fit --model={model}: {misfit}")


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
    source = config.weights
    weights = weights_lib.resolve(source, flag="--weights", default="final")
    if weights.kind == "imagenet" or (weights.kind == "h5"
                                      and weights_lib.is_keras_applications(weights)):
        from keras_efficientnet.models import pretrained

        pretrained.load_weights(model, source)  # logs a newly initialized classifier
        return f"{source} (keras.applications' EfficientNet weights)"
    try:  # a .keras file may hold another class count; the other forms the same classes
        donor = weights_lib.donor_model(weights, model)
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
    log.info("loaded %s into %s", weights.describe(), model.name)
    return str(Path(source))
