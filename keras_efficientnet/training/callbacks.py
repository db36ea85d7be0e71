"""Keras callbacks of the trainer: throughput, non-finite loss guard, checkpoints, averaging."""

from __future__ import annotations

import math
import time

import keras
import numpy as np

from keras_efficientnet.training.checkpoint import CheckpointManager


class NonFiniteLossError(RuntimeError):
    """Raised when the training loss becomes NaN or infinite."""


class Throughput(keras.callbacks.Callback):
    """Adds `images_per_second` to the logs (shown by the progress bar) and keeps the mean.

    Args:
        global_batch_size: examples per optimizer step.
        steps_per_execution: optimizer steps between two `on_train_batch_end` calls.
    """

    def __init__(self, global_batch_size: int, steps_per_execution: int = 1):
        super().__init__()
        self.global_batch_size = global_batch_size
        self.steps_per_execution = steps_per_execution
        self.images = 0
        self.seconds = 0.0
        self._start = None
        self._first = True

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        elapsed = time.perf_counter() - self._start
        images = self.global_batch_size * self.steps_per_execution
        if self._first:  # the first call includes tracing: leave it out of the figure
            self._first = False
        else:
            self.images += images
            self.seconds += elapsed
        if logs is not None and elapsed > 0:
            logs["images_per_second"] = images / elapsed

    @property
    def images_per_second(self) -> float:
        return self.images / self.seconds if self.seconds else float("nan")


class NonFiniteLossGuard(keras.callbacks.Callback):
    """Stops the run on a NaN or infinite loss, naming the step; checkpoints stay untouched.

    Args:
        steps_per_epoch: steps per epoch, to report a global step.
        initial_epoch: the epoch training (re)started at.
        steps_per_execution: steps between two `on_train_batch_end` calls.
        checkpoints: the manager, to name the last good checkpoint in the message.
    """

    def __init__(self, steps_per_epoch: int, initial_epoch: int = 0,
                 steps_per_execution: int = 1, checkpoints: CheckpointManager | None = None):
        super().__init__()
        self.steps_per_epoch = steps_per_epoch
        self.epoch = initial_epoch
        self.steps_per_execution = steps_per_execution
        self.checkpoints = checkpoints

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        step = self.epoch * self.steps_per_epoch + batch + 1
        last = self.checkpoints.latest() if self.checkpoints else None
        kept = f"; the last good checkpoint {last} is intact" if last else ""
        raise NonFiniteLossError(
            f"training loss became {float(loss)} at step {step} (epoch {self.epoch + 1}, "
            f"batch {batch + 1}){kept}. Lower --learning_rate or check the data.")


class WeightAverage:
    """The exponential average of per-epoch weights (decay 0.97 in the paper).

    avg <- decay * avg + (1 - decay) * weights after each epoch, starting from the first epoch's
    weights; non-trainable variables (BatchNorm statistics) are averaged too.
    """

    def __init__(self, decay: float, values: list | None = None):
        self.decay = decay
        self.values = values

    def update(self, model: keras.Model) -> None:
        current = [np.asarray(w, dtype="float64") for w in model.get_weights()]
        if self.values is None:
            self.values = current
            return
        self.values = [self.decay * a + (1.0 - self.decay) * w
                       for a, w in zip(self.values, current)]

    def weights_like(self, model: keras.Model) -> list:
        return [a.astype(w.dtype) for a, w in zip(self.values, model.get_weights())]


class EpochCheckpoint(keras.callbacks.Callback):
    """After each epoch: update the weight average, then write a checkpoint atomically.

    Args:
        manager: the checkpoint manager; None keeps the average and history but writes nothing
            (the other workers of a multi-process run).
        average: a `WeightAverage`, or None.
        state: extra JSON-serialisable state stored in each checkpoint (e.g. the config).
        steps_per_epoch: to record the global step.
    """

    def __init__(self, manager: CheckpointManager | None, average: WeightAverage | None,
                 state: dict, steps_per_epoch: int):
        super().__init__()
        self.manager = manager
        self.average = average
        self.state = state
        self.steps_per_epoch = steps_per_epoch
        self.history: list[dict] = []

    def on_epoch_end(self, epoch, logs=None):
        if self.average is not None:
            self.average.update(self.model)
        self.history.append({k: float(v) for k, v in (logs or {}).items()})
        if self.manager is None:
            return
        state = {**self.state, "global_step": (epoch + 1) * self.steps_per_epoch,
                 "history": self.history}
        self.manager.save(epoch + 1, self.model, self.model.optimizer, state,
                          self.average.values if self.average is not None else None)
