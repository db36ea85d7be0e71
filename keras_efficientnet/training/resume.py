"""Where a run starts from: the checkpoint to resume (checked against the config), the weights of
evaluate and finetune modes, and what a resumed partial epoch needs before its `fit`."""

from __future__ import annotations

import contextlib
from pathlib import Path

import keras

from keras_efficientnet.training.builders import use_one_hot
from keras_efficientnet.training.checkpoint import WEIGHTS, CheckpointManager
from keras_efficientnet.training.config import ARCHITECTURE_FIELDS, TrainConfig
from keras_efficientnet.training.evaluation import load_model_file
from keras_efficientnet.training.optimizer_state import SlotAverage


def check_architecture(saved: dict, config: TrainConfig, where: Path) -> None:
    differing = [f"{name} (checkpoint {saved.get(name)!r}, now {getattr(config, name)!r})"
                 for name in ARCHITECTURE_FIELDS if saved.get(name) != getattr(config, name)]
    if differing:
        raise ValueError(
            f"the checkpoint in {where} was trained with another architecture: "
            f"{'; '.join(differing)}. Use another --model_dir, or --noresume to start afresh.")


def check_classes(saved: dict, num_classes: int, config: TrainConfig, where: Path) -> None:
    if saved.get("num_classes", num_classes) != num_classes:
        raise ValueError(
            f"the checkpoint in {where} was trained on {saved['num_classes']} classes but "
            f"--dataset={config.dataset} has {num_classes}. Use another --model_dir, or "
            "--noresume to start afresh (the earlier run is moved to model_dir/previous/).")


def resume_point(config: TrainConfig, manager: CheckpointManager, num_classes: int,
                 chief: bool = True) -> Path | None:
    """The checkpoint to resume from (the newest intact healthy one, verified against its
    manifest; the chief moves damaged ones aside), checked against the config."""
    latest = manager.resume_point(move_damaged=chief) if config.resume else None
    if latest is None:
        return None
    saved = CheckpointManager.read_state(latest)
    check_architecture(saved["config"], config, latest)
    check_classes(saved, num_classes, config, latest)
    return latest


def load_weights_for(config: TrainConfig, model: keras.Model, averaged: bool = True,
                     slots: list | None = None) -> str:
    """Loads --init_checkpoint, else model_dir's latest good checkpoint (averaged weights
    first). `slots`, a list, receives the optimizer slots averaged with those weights."""
    source = config.init_checkpoint or ""
    if not source:
        latest = CheckpointManager(Path(config.model_dir) / "checkpoints").resume_point(
            move_damaged=False)
        if latest is None:
            raise ValueError(
                f"--mode={config.mode} needs trained weights: no checkpoint in "
                f"{Path(config.model_dir) / 'checkpoints'} and no --init_checkpoint given")
        source = str(latest)
    path = Path(source)
    if path.is_dir() and (path / "checkpoints").is_dir():  # a run directory: its latest
        latest = CheckpointManager(path / "checkpoints").resume_point(move_damaged=False)
        if latest is None:
            raise ValueError(f"--init_checkpoint={source!r} is a run directory without a "
                             "checkpoint; give its model.keras or a checkpoint folder")
        path = latest
    if path.is_dir():
        saved = CheckpointManager.read_state(path)
        check_architecture(saved["config"], config, path)
        check_classes(saved, model.output_shape[-1], config, path)
        state = CheckpointManager.restore(path, model)
        if averaged and state.get("average") is not None:
            average = SlotAverage(0.0, state["average"])
            model.set_weights(average.weights_like(model))
            if slots is not None:
                slots.extend(average.slots(model) or ())
            return f"{path} (weight average)"
        return str(path)
    if not path.is_file():
        raise ValueError(f"--init_checkpoint={source!r} is neither a checkpoint folder nor a "
                         f"{WEIGHTS!r}-style weights file")
    load_model_file(model, path, config, named=f"--init_checkpoint={source!r}")
    return str(path)


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

