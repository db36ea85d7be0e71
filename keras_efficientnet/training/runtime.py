"""What the trainer asks of an execution runtime, and the one-device runtime that needs no strategy.

`keras_efficientnet.distribute` implements the same `Runtime` protocol once per strategy
(mirrored, multi-worker, horovod, pipeline stages, IPU); the trainer only ever talks to it.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Callable, Sequence
from typing import Any, ContextManager, Protocol

import keras

from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.preemption import SignalWatch

# Builds the training input of one input pipeline: called with None (one pipeline holding whole
# step calls) or a `tf.distribute.InputContext` (a shard; batches of the per-replica size of
# `plan.examples_per_step_call`), it returns a repeated `tf.data.Dataset` from the start of
# training.
MakeDataset = Callable[[Any], Any]


class Runtime(Protocol):
    """One execution plan bound to where it runs.

    `start()` connects and checks (devices, peers, packages) before any work; the model and
    optimizer are built inside `scope()`; `attach(model)` checks and prepares the built model
    (pipeline splits, IPU stage assignment); `fit(...)` trains a compiled model for whole epochs
    with Keras callbacks and returns the History. `replan(plan)` gives a runtime of another plan
    on the same started devices (the fine-tune's: another accumulation), leaving this one as it
    is. `is_chief` says whether this process writes checkpoints and results;
    `evaluates_in_place` whether Keras can evaluate the trained model object on one device (else
    the trainer evaluates a one-device copy).

    Everything a runtime uses comes in through its constructor and these methods: `fit` gets
    where the input starts (`start_step`) and the run's signal watch (`watch`, a
    `preemption.SignalWatch`, for the processes to stop at the same step) as arguments.
    """

    @property
    def plan(self) -> ExecutionPlan: ...

    @property
    def is_chief(self) -> bool: ...

    @property
    def evaluates_in_place(self) -> bool: ...

    def start(self) -> None: ...

    def scope(self) -> ContextManager: ...

    def attach(self, model: keras.Model) -> None: ...

    def replan(self, plan: ExecutionPlan) -> Runtime: ...

    def fit(self, model: keras.Model, make_dataset: MakeDataset, *, epochs: int,
            step_calls_per_epoch: int, initial_epoch: int = 0, start_step: int | None = None,
            callbacks: Sequence[keras.callbacks.Callback] = (), verbose: int = 1,
            watch: SignalWatch | None = None) -> keras.callbacks.History: ...


def skip_seen(dataset, start_step: int, batches_per_step_call: int = 1):
    """`dataset` from global step call `start_step` on: where an uninterrupted run would be.

    The pipeline is seeded, so skipping the batches already consumed (`batches_per_step_call`
    per step call from this pipeline) makes a resumed run see exactly what the uninterrupted one
    would.
    """
    return dataset.skip(start_step * batches_per_step_call)


def first_step(initial_epoch: int, step_calls_per_epoch: int, start_step: int | None) -> int:
    """The global step call a `fit` starts at: `start_step` when given (a resumed partial epoch,
    whose `step_calls_per_epoch` are only the step calls left), else the epoch's first."""
    return initial_epoch * step_calls_per_epoch if start_step is None else start_step


class RuntimeBase:
    """What most runtimes share: no scope, nothing to attach, `replan` as a copy on the same
    started devices. A runtime reads `self.plan` when it attaches and fits."""

    is_chief = True
    evaluates_in_place = True
    plan: ExecutionPlan

    def start(self) -> None:
        pass

    def scope(self) -> ContextManager:
        return contextlib.nullcontext()

    def attach(self, model: keras.Model) -> None:
        pass

    def replan(self, plan: ExecutionPlan) -> RuntimeBase:
        if (plan.strategy, plan.replicas) != (self.plan.strategy, self.plan.replicas):
            raise ValueError(f"replan keeps the strategy and replicas ({self.plan.strategy}, "
                             f"{self.plan.replicas}); received ({plan.strategy}, "
                             f"{plan.replicas})")
        other = copy.copy(self)
        other.plan = plan
        return other


class OneDevice(RuntimeBase):
    """The runtime of the default plan: one device, Keras' `fit`, the optimizer accumulating.

    Args:
        plan: an `ExecutionPlan` with strategy "default" and no pipeline stages.
    """

    def __init__(self, plan: ExecutionPlan):
        if plan.strategy != "default" or plan.pipelined:
            raise ValueError(
                f"--strategy={plan.strategy} with {plan.num_stages} pipeline stage(s) needs an "
                "execution runtime: run `python -m keras_efficientnet.train`, or call "
                "keras_efficientnet.distribute.run(config) instead of "
                "train_and_evaluate(config)")
        self.plan = plan

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        data = skip_seen(make_dataset(None),
                         first_step(initial_epoch, step_calls_per_epoch, start_step))
        return model.fit(data, epochs=epochs, initial_epoch=initial_epoch,
                         steps_per_epoch=step_calls_per_epoch, callbacks=list(callbacks),
                         shuffle=False, verbose=verbose)
