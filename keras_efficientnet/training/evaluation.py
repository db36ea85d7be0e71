"""What `--mode=evaluate` scores: the weights of a finished run, chosen by --evaluate_weights."""

from __future__ import annotations

import logging
from pathlib import Path

from keras_efficientnet.training.export import MODEL_FILE
from keras_efficientnet.training.validation import BEST_MODEL_FILE

log = logging.getLogger("keras_efficientnet")


def load_model_file(model, path: Path, config, named: str | None = None) -> None:
    """Loads the weights of a `.keras` file written by a run (its softmax copy: the same
    variables as the trainer's model), or a weights file, into `model`; a one-line ValueError
    naming it (`named`, default its path) when they differ."""
    try:
        model.load_weights(path)
    except ValueError as error:  # Keras prints the tensors: keep its first line
        raise ValueError(f"{named or path} does not fit --model={config.model} with "
                         f"{model.output_shape[-1]} classes: "
                         f"{str(error).strip().splitlines()[0]}") from None


def load_evaluated_weights(config, model) -> str:
    """Loads into `model` what --mode=evaluate scores and returns which file that was:
    --init_checkpoint if given, else by --evaluate_weights: `final` the run's model.keras
    (without one, the checkpoints' weight average), `best` its best.keras, `average` the
    latest checkpoint's weight average, `latest` its raw weights."""
    from keras_efficientnet.training.resume import load_weights_for

    if config.init_checkpoint:
        return load_weights_for(config, model)
    if config.evaluate_weights == "best":
        path = Path(config.model_dir) / BEST_MODEL_FILE
        if not path.is_file():
            raise ValueError(f"--evaluate_weights=best: no {path} (the run validated nothing: "
                             "--eval_every=0, or it stopped before its first validation)")
        load_model_file(model, path, config)
        return str(path)
    if config.evaluate_weights == "final":
        path = Path(config.model_dir) / MODEL_FILE
        if path.is_file():
            load_model_file(model, path, config)
            return str(path)
        log.info("no %s (the run did not finish): scoring its latest checkpoint", path)
    return load_weights_for(config, model, averaged=config.evaluate_weights != "latest")
