"""What the trainer asks of an execution runtime, and the one-device runtime that needs no strategy.

`keras_efficientnet.distribute` implements the same `Runtime` protocol once per strategy
(mirrored, multi-worker, horovod, pipeline stages, IPU); the trainer only ever talks to it.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Callable, Iterator, Sequence
from typing import Any, ContextManager, Protocol

import keras

from keras_efficientnet.training.plan import ExecutionPlan

# Builds the training input of one input pipeline: called with None (one pipeline holding whole
# steps) or a `tf.distribute.InputContext` (a shard; batches of the per-replica size of
# `plan.examples_per_step`), it returns a repeated `tf.data.Dataset` from the start of training.
MakeDataset = Callable[[Any], Any]


class Runtime(Protocol):
    """One execution plan bound to where it runs.

    `start()` connects and checks (devices, peers, packages) before any work; the model and
    optimizer are built inside `scope()`; `attach(model)` checks and prepares the built model
    (pipeline splits, IPU stage assignment); `fit(...)` trains a compiled model for whole epochs
    with Keras callbacks and returns the History. `is_chief` says whether this process writes
    checkpoints and results; `evaluates_in_place` whether Keras can evaluate the trained model
    object on one device (else the trainer evaluates a one-device copy).
    """

    plan: ExecutionPlan

    @property
    def is_chief(self) -> bool: ...

    @property
    def evaluates_in_place(self) -> bool: ...

    def start(self) -> None: ...

    def scope(self) -> ContextManager: ...

    def attach(self, model: keras.Model) -> None: ...

    def fit(self, model: keras.Model, make_dataset: MakeDataset, *, epochs: int,
            steps_per_epoch: int, initial_epoch: int = 0,
            callbacks: Sequence[keras.callbacks.Callback] = (),
            verbose: int = 1) -> keras.callbacks.History: ...


# The global step a run resumed mid-epoch starts at: the trainer sets it around the `fit` that
# finishes the interrupted epoch (whose `steps_per_epoch` is then only the steps left), so that
# every runtime's `skip_seen` starts there without another argument in the protocol.
_START_STEP: contextvars.ContextVar[int | None] = contextvars.ContextVar("start_step",
                                                                        default=None)


@contextlib.contextmanager
def starting_at_step(step: int) -> Iterator[None]:
    """Inside, `skip_seen` positions the input at global step `step` (a mid-epoch resume)."""
    token = _START_STEP.set(step)
    try:
        yield
    finally:
        _START_STEP.reset(token)


def skip_seen(dataset, *, initial_epoch: int, steps_per_epoch: int, batches_per_step: int = 1):
    """`dataset` from where an uninterrupted run would be after `initial_epoch` epochs (or at
    the step `starting_at_step` gives).

    The pipeline is seeded, so skipping the batches already consumed (`batches_per_step` per
    step from this pipeline) makes a resumed run see exactly what the uninterrupted one would.
    """
    start = _START_STEP.get()
    steps = initial_epoch * steps_per_epoch if start is None else start
    return dataset.skip(steps * batches_per_step)


class OneDevice:
    """The runtime of the default plan: one device, Keras' `fit`, the optimizer accumulating.

    Args:
        plan: an `ExecutionPlan` with strategy "default" and no pipeline stages.
    """

    is_chief = True
    evaluates_in_place = True

    def __init__(self, plan: ExecutionPlan):
        if plan.strategy != "default" or plan.pipelined:
            raise ValueError(
                f"--strategy={plan.strategy} with {plan.num_stages} pipeline stage(s) needs an "
                "execution runtime: run `python -m keras_efficientnet.train`, or call "
                "keras_efficientnet.distribute.run(config) instead of "
                "train_and_evaluate(config)")
        self.plan = plan

    def start(self) -> None:
        pass

    def scope(self) -> ContextManager:
        return contextlib.nullcontext()

    def attach(self, model: keras.Model) -> None:
        pass

    def fit(self, model, make_dataset, *, epochs, steps_per_epoch, initial_epoch=0,
            callbacks=(), verbose=1):
        data = skip_seen(make_dataset(None), initial_epoch=initial_epoch,
                         steps_per_epoch=steps_per_epoch)
        return model.fit(data, epochs=epochs, initial_epoch=initial_epoch,
                         steps_per_epoch=steps_per_epoch, callbacks=list(callbacks),
                         shuffle=False, verbose=verbose)
