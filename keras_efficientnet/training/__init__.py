"""The trainer: config, builders, callbacks, atomic checkpoints and the train/fine-tune driver.

`TrainConfig` and the run-directory and signal helpers are plain Python and load at once; the
Keras parts load on first use, so that the command line checks its flags without Keras.
"""

import importlib

from keras_efficientnet.training.config import TrainConfig

_MODULES = {
    "NonFiniteLossError": "callbacks", "NonFiniteLossGuard": "callbacks",
    "DivergenceError": "callbacks", "DivergenceGuard": "callbacks", "Throughput": "callbacks",
    "WeightAverage": "callbacks", "CheckpointManager": "checkpoint",
    "Preempted": "preemption", "RunDirError": "run_dir",
    "RunSession": "session",
    **{name: "builders" for name in (
        "build_datasets", "build_model", "build_optimizer", "compile_model", "evaluate",
        "lr_schedule")},
    **{name: "finetune" for name in ("finetune", "finetune_config", "finetune_schedule")},
    **{name: "trainer" for name in ("train", "train_and_evaluate")},
}


def __getattr__(name):
    if name in _MODULES:
        module = importlib.import_module(f"keras_efficientnet.training.{_MODULES[name]}")
        return getattr(module, name)
    raise AttributeError(f"module 'keras_efficientnet.training' has no attribute {name!r}")


__all__ = ["TrainConfig", *_MODULES]
