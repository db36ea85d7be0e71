"""Where a run starts from: the checkpoint to resume (checked against the config), the weights of
evaluate and finetune modes, and what a resumed partial epoch needs before its `fit`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import keras

from keras_efficientnet.runs import weights as weights_lib
from keras_efficientnet.runs.record import RunFiles
from keras_efficientnet.training.builders import use_one_hot
from keras_efficientnet.training.checkpoint import CheckpointManager
from keras_efficientnet.training.config import ARCHITECTURE_FIELDS, TrainConfig
from keras_efficientnet.training.modes import MODE_TABLE
from keras_efficientnet.training.run_config import named_from_run, run_config_path


def check_architecture(saved: dict, config: TrainConfig, where: Path,
                       fix: str = "Use another --model_dir, or --noresume to start afresh."
                       ) -> None:
    # Each value is named by where it came from: a flag, or the run's config.json (evaluate).
    differing = [f"{name} (checkpoint {saved.get(name)!r}, now "
                 f"{named_from_run(config, name, repr(getattr(config, name)))})"
                 for name in ARCHITECTURE_FIELDS if saved.get(name) != getattr(config, name)]
    if differing:
        raise ValueError(
            f"the checkpoint in {where} was trained with another architecture: "
            f"{'; '.join(differing)}. {fix}")


def check_classes(saved: dict, num_classes: int, config: TrainConfig, where: Path,
                  fix: str = "Use another --model_dir, or --noresume to start afresh (the "
                             "earlier run is moved to model_dir/previous/).") -> None:
    if saved.get("num_classes", num_classes) != num_classes:
        raise ValueError(
            f"the checkpoint in {where} was trained on {saved['num_classes']} classes but "
            f"{named_from_run(config, 'dataset')} has {num_classes}. {fix}")


def resume_point(config: TrainConfig, manager: CheckpointManager, num_classes: int,
                 chief: bool = True) -> Path | None:
    """The checkpoint to resume from (the newest intact healthy one, verified against its
    manifest; the chief moves damaged ones aside), checked against the config."""
    latest = manager.resume_point(move_damaged=chief) if config.resume else None
    if latest is None:
        return None
    saved = CheckpointManager.read_state(latest)
    check_architecture(saved["config"] or {}, config, latest)
    check_classes(saved, num_classes, config, latest)
    return latest


def load_weights_for(config: TrainConfig, model: keras.Model, averaged: bool = True,
                     slots: list | None = None, choice: str | None = None) -> str:
    """Loads --init_checkpoint (any form of `runs.weights`; a run directory given without a
    choice: its newest intact checkpoint), else model_dir's weights by `choice` (default:
    its newest intact checkpoint's weight average, or with `averaged=False` its raw weights);
    returns what was loaded. Every form goes through `runs.weights.resolve`'s verification, and
    a checkpoint's architecture and classes are checked against the config. `slots`, a list,
    receives the optimizer slots averaged with those weights."""
    default = choice or ("average" if averaged else "latest")
    if config.init_checkpoint:
        spec, flag = config.init_checkpoint, "--init_checkpoint"
    else:
        files = RunFiles(config.model_dir)
        needs_checkpoint = default in ("average", "latest") or (
            default == "final" and not files.model.is_file())
        if needs_checkpoint and not CheckpointManager(files.checkpoints).all():
            raise ValueError(
                f"--mode={config.mode} needs trained weights: no checkpoint in "
                f"{files.checkpoints} and no --init_checkpoint given")
        spec, flag = config.model_dir, "--model_dir"
    weights = weights_lib.resolve(spec, flag=flag, default=default)
    fix = (f"Give the flags it was trained with (--model, --dataset), or another {flag}"
           if config.init_checkpoint or not MODE_TABLE[config.mode].scores_only else
           f"Fix or restore {run_config_path(config.model_dir)}, or give the flags it was "
           "trained with (--model, --dataset)")
    if weights.kind == "checkpoint":
        saved = weights_lib.checkpoint_state(weights)
        check_architecture(saved.config or {}, config, weights.path, f"{fix}.")
        check_classes({"num_classes": saved.num_classes or model.output_shape[-1]},
                      model.output_shape[-1], config, weights.path, f"{fix}.")
    named = f"{flag}={spec!r}" if flag == "--init_checkpoint" else str(weights.path)
    return weights_lib.load(weights, model, named=named,
                            target=named_from_run(config, "model"), slots=slots)


def build_metrics(model: keras.Model, config: TrainConfig, resolution: int,
                  num_classes: int) -> None:
    # Keras creates the compiled metrics' variables at the first training step; a resumed
    # partial epoch puts their running sums back before it, so create them now (on one
    # inference-mode example: no random draws, so the restored generator states stay as saved).
    x = keras.ops.zeros((1, resolution, resolution, 3), "uint8")
    y = (keras.ops.zeros((1, num_classes)) if use_one_hot(config)
         else keras.ops.zeros((1,), "int32"))
    model.compute_metrics(x, y, model(x, training=False))


@contextlib.contextmanager
def fit_does_not_finalize(optimizer):
    # Keras' fit ends by swapping the EMA weights into the model (finalize_variable_values): the
    # partial first epoch of a resumed run is not the end of training.
    optimizer.finalize_variable_values = lambda *args, **kwargs: None
    try:
        yield
    finally:
        del optimizer.finalize_variable_values

