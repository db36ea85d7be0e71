"""The trainer: config, builders, callbacks, atomic checkpoints and the train/fine-tune driver."""

from keras_efficientnet.training.callbacks import (
    NonFiniteLossError,
    NonFiniteLossGuard,
    Throughput,
    WeightAverage,
)
from keras_efficientnet.training.checkpoint import CheckpointManager
from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.trainer import (
    build_datasets,
    build_model,
    build_optimizer,
    compile_model,
    evaluate,
    finetune,
    finetune_config,
    finetune_schedule,
    lr_schedule,
    train,
    train_and_evaluate,
)

__all__ = [
    "CheckpointManager", "NonFiniteLossError", "NonFiniteLossGuard", "Throughput", "TrainConfig",
    "WeightAverage", "build_datasets", "build_model", "build_optimizer", "compile_model",
    "evaluate", "finetune", "finetune_config", "finetune_schedule", "lr_schedule", "train",
    "train_and_evaluate",
]
