"""Tiny trainer runs shared by the multi-device and multi-worker test processes.

Every run trains the tiny G16 LN+PN model (batch-independent) on the seeded synthetic source for
2 optimizer steps of a global batch of 16, with constant-rate momentum SGD and no randomness in
the model (no dropout, no stochastic depth), so that every execution plan must end with the
same weights as Keras' `fit` on one device.
"""

import keras
import numpy as np

from keras_efficientnet.distribute import runtime_for
from keras_efficientnet.training import TrainConfig, trainer

BASE = dict(mode="train", model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
            train_resolution=32, test_resolution=32, micro_batch_size=16, steps_per_epoch=2,
            epochs=1, eval_steps=1, verbose=0, optimizer="sgd", learning_rate=0.01,
            momentum=0.9, weight_decay=0.0, lr_schedule="constant", warmup_epochs=0.0,
            label_smoothing=0.0, drop_connect_rate=0.0, dropout_rate=0.0,
            weight_average_decay=0.0, seed=5, resume=False)


def config(model_dir: str, **changes) -> TrainConfig:
    return TrainConfig(**{**BASE, "model_dir": model_dir, **changes})


def train_run(model_dir: str, *, one_device: bool = False, **changes) -> dict:
    """Trains through `trainer.train` under the config's runtime (or Keras' one-device `fit`)."""
    cfg = config(model_dir, **changes)
    runtime = None if one_device else runtime_for(cfg)
    if runtime is not None:
        runtime.start()
    train_examples, _, num_classes = trainer.dataset_facts(cfg)
    initial = InitialWeights()
    trained = trainer.train(cfg, num_classes, train_examples, runtime=runtime,
                            extra_callbacks=[initial])
    return {"losses": [h["loss"] for h in trained["history"]],
            "weights": trained["model"].get_weights(), "initial": initial.weights,
            "checkpoint": trained["checkpoint"]}


class InitialWeights(keras.callbacks.Callback):
    """Keeps the weights training starts from (to show how far training moved them)."""

    def on_train_begin(self, logs=None):
        self.weights = self.model.get_weights()


def save(out: str, run: dict) -> None:
    np.savez(out, losses=np.array(run["losses"]), has_checkpoint=run["checkpoint"] is not None,
             **{f"w{i:03d}": w for i, w in enumerate(run["weights"])},
             **{f"init{i:03d}": w for i, w in enumerate(run["initial"])})


def max_relative_diff(a: list, b: list) -> float:
    """Largest |a - b| over all weights, relative to the largest |b|."""
    scale = max(float(np.max(np.abs(w))) for w in b)
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b)) / scale
