"""Replicas on one host's local GPUs (or logical CPU devices) under MirroredStrategy."""

from __future__ import annotations

import tensorflow as tf

from keras_efficientnet.distribute import train_loop
from keras_efficientnet.distribute.devices import local_devices
from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import RuntimeBase, first_step, skip_seen

# One MirroredStrategy per device set and process: two strategies over the same devices number
# their all-reduces from the same collective keys, and their ops then meet in one collective
# ("Shape mismatch in the collective instance ..."), e.g. a notebook that plans twice.
_MIRRORED: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def mirrored_strategy(devices: list[str]) -> tf.distribute.MirroredStrategy:
    """The process's MirroredStrategy over exactly `devices` (made once, then reused)."""
    key = tuple(devices)
    if key not in _MIRRORED:
        _MIRRORED[key] = tf.distribute.MirroredStrategy(list(key))
    return _MIRRORED[key]


class MirroredRuntime(RuntimeBase):
    """`plan.replicas` replicas in this process, one per local GPU or logical CPU device.

    Keras' `fit` trains when a step is one micro-batch (it cuts each global batch between the
    replicas); with accumulation the project's step takes all micro-batches of an update per
    replica and all-reduces once, and the project's loop runs it. One process reads the input.

    Args:
        plan: an `ExecutionPlan` with strategy "mirrored".
    """

    evaluates_in_place = False  # variables are mirrored: evaluate a one-device copy

    def __init__(self, plan: ExecutionPlan):
        self.plan = plan
        self.strategy = None

    def start(self) -> None:
        self.strategy = mirrored_strategy(local_devices(self.plan.replicas, "replicas"))

    def scope(self):
        return self.strategy.scope()

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        data = skip_seen(make_dataset(None),
                         first_step(initial_epoch, step_calls_per_epoch, start_step))
        if self.plan.micro_batches_per_step_call == 1:
            return model.fit(data, epochs=epochs, initial_epoch=initial_epoch,
                             steps_per_epoch=step_calls_per_epoch, callbacks=list(callbacks),
                             shuffle=False, verbose=verbose)
        step = train_loop.make_train_step(
            model, model.optimizer, model.loss, global_batch_size=self.plan.examples_per_update,
            strategy=self.strategy, micro_batches=self.plan.micro_batches_per_step_call)
        return train_loop.fit(
            model, step, data, epochs=epochs, step_calls_per_epoch=step_calls_per_epoch,
            initial_epoch=initial_epoch,
            step_calls_per_execution=self.plan.step_calls_per_execution,
            distribute=lambda x, y: train_loop.distribute_batch(self.strategy, x, y),
            callbacks=callbacks, verbose=verbose)
