"""What `--mode=evaluate` scores: the weights of a finished run, chosen by --evaluate_weights
(`RUN:final|best|average|latest` of `runs.weights`), or --init_checkpoint."""

from __future__ import annotations

from pathlib import Path

from keras_efficientnet.runs import weights as weights_lib
from keras_efficientnet.training.resume import load_weights_for
from keras_efficientnet.training.run_config import named_from_run


def load_model_file(model, path: Path, config, named: str | None = None) -> None:
    """Loads the weights of a `.keras` file written by a run (its softmax copy: the same
    variables as the trainer's model), or a weights file, into `model`, verified first
    (`runs.weights.resolve`); a one-line ValueError naming it (`named`, default its path) when
    they differ."""
    weights = weights_lib.resolve(str(path), named=named or str(path))
    weights_lib.load(weights, model, named=named or str(path),
                     target=named_from_run(config, "model"))


def load_evaluated_weights(config, model) -> str:
    """Loads into `model` what --mode=evaluate scores and returns which file that was:
    --init_checkpoint if given, else by --evaluate_weights: `final` the run's model.keras
    (without one, the checkpoints' weight average), `best` its best.keras, `average` the
    latest checkpoint's weight average, `latest` its raw weights."""
    if config.init_checkpoint:  # a run given there: its newest checkpoint's weight average
        return load_weights_for(config, model)
    return load_weights_for(config, model, choice=config.evaluate_weights)
