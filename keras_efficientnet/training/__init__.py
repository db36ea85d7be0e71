"""The trainer: config, builders, callbacks, atomic checkpoints and the train/fine-tune driver.

`TrainConfig` is plain Python and loads at once; the Keras parts load on first use
(`keras_efficientnet.lazy`), so that the command line checks its flags without Keras.
"""

from keras_efficientnet.lazy import lazy_face
from keras_efficientnet.training.config import TrainConfig

# Public name -> (module, attribute), one line a name.
_EXPORTS = {
    "NonFiniteLossError": (".callbacks", "NonFiniteLossError"),
    "NonFiniteLossGuard": (".callbacks", "NonFiniteLossGuard"),
    "DivergenceError": (".callbacks", "DivergenceError"),
    "DivergenceGuard": (".callbacks", "DivergenceGuard"),
    "Throughput": (".callbacks", "Throughput"),
    "WeightAverage": (".callbacks", "WeightAverage"),
    "CheckpointManager": (".checkpoint", "CheckpointManager"),
    "Preempted": (".preemption", "Preempted"),
    "RunDirError": (".run_dir", "RunDirError"),
    "RunSession": (".session", "RunSession"),
    "build_datasets": (".builders", "build_datasets"),
    "build_model": (".builders", "build_model"),
    "build_optimizer": (".builders", "build_optimizer"),
    "compile_model": (".builders", "compile_model"),
    "evaluate": (".builders", "evaluate"),
    "lr_schedule": (".builders", "lr_schedule"),
    "finetune": (".finetune", "finetune"),
    "finetune_config": (".finetune", "finetune_config"),
    "finetune_schedule": (".finetune", "finetune_schedule"),
    "train": (".trainer", "train"),
    "train_and_evaluate": (".trainer", "train_and_evaluate"),
}

__all__ = ["TrainConfig", *_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS)
