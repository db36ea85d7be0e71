"""Tiny trainer runs shared by the multi-device, multi-worker and horovod test processes.

Every run trains the tiny G16 LN+PN model (batch-independent) on the seeded synthetic source for
2 optimizer updates of a global batch of 16 per epoch, with constant-rate momentum SGD and no
randomness in the model (no dropout, no stochastic depth), so that every execution plan must end
with the same weights as Keras' `fit` on one device. The synthetic source is not shuffled, so
the shards of 2 workers (examples 0, 2, 4, ... and 1, 3, 5, ...) together hold exactly the
examples of the one-device run's batches. No validation (--eval_every=0): these runs compare
losses and weights, which it does not touch, and it cost each run a model build and a traced
test step (about 2.5 of a one-device run's 12.5 CPU seconds).
"""

import os
import signal

import keras
import numpy as np

from keras_efficientnet.distribute import runtime_for
from keras_efficientnet.training import TrainConfig, trainer

BASE = dict(mode="train", model="efficientnet-tiny-g16-lnpn", dataset="synthetic",
            train_resolution=32, test_resolution=32, micro_batch_size=16, updates_per_epoch=2,
            epochs=1, eval_steps=1, verbose=0, optimizer="sgd", learning_rate=0.01,
            momentum=0.9, weight_decay=0.0, lr_schedule="constant", warmup_epochs=0.0,
            label_smoothing=0.0, drop_connect_rate=0.0, dropout_rate=0.0,
            weight_average_decay=0.0, eval_every=0, seed=5, resume=False)


def config(model_dir: str, **changes) -> TrainConfig:
    return TrainConfig(**{**BASE, "model_dir": model_dir, **changes})


def train_run(model_dir: str, *, one_device: bool = False, kill_at_epoch: int | None = None,
              callbacks: tuple = (), **changes) -> dict:
    """Trains through `trainer.train` under the config's runtime (or Keras' one-device `fit`).

    `kill_at_epoch`: the process kills itself (SIGKILL, no clean-up) as that epoch's first step
    begins, after the previous epoch's checkpoint was written. `callbacks` run after the rest.
    """
    cfg = config(model_dir, **changes)
    runtime = None if one_device else runtime_for(cfg)
    if runtime is not None:
        runtime.start()  # first: the multi-worker strategy must precede other TF ops
    train_examples, _, num_classes = trainer.dataset_facts(cfg)
    seen = Seen(kill_at_epoch)
    trained = trainer.train(cfg, num_classes, train_examples, runtime=runtime,
                            extra_callbacks=[seen, *callbacks])
    return {"losses": [h["loss"] for h in trained["history"]],
            "weights": trained["model"].get_weights(), "initial": seen.weights,
            "epochs": seen.epochs, "checkpoint": trained["checkpoint"]}


class Seen(keras.callbacks.Callback):
    """Keeps the weights training starts from and the epochs it runs; kills the process at the
    start of `kill_at_epoch` when given."""

    def __init__(self, kill_at_epoch: int | None = None):
        super().__init__()
        self.kill_at_epoch = kill_at_epoch
        self.epochs: list[int] = []

    def on_train_begin(self, logs=None):
        self.weights = self.model.get_weights()

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)

    def on_train_batch_begin(self, batch, logs=None):
        if self.epochs[-1] == self.kill_at_epoch:
            os.kill(os.getpid(), signal.SIGKILL)


def save(out: str, run: dict) -> None:
    np.savez(out, losses=np.array(run["losses"]), has_checkpoint=run["checkpoint"] is not None,
             epochs=np.array(run["epochs"]),
             **{f"w{i:03d}": w for i, w in enumerate(run["weights"])},
             **{f"init{i:03d}": w for i, w in enumerate(run["initial"])})


def max_relative_diff(a: list, b: list) -> float:
    """Largest |a - b| over all weights, relative to the largest |b|."""
    scale = max(float(np.max(np.abs(w))) for w in b)
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b)) / scale
