"""Keras callbacks of the trainer: throughput, loss guards (NaN, divergence), checkpoints."""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from pathlib import Path

import keras
import numpy as np

from keras_efficientnet.training.checkpoint import CheckpointManager, checkpoint_name
from keras_efficientnet.training.preemption import Preempted

log = logging.getLogger("keras_efficientnet")


class NonFiniteLossError(RuntimeError):
    """Raised when the training loss becomes NaN or infinite."""


class NonFiniteValidationError(NonFiniteLossError):
    """Raised when validations in a row score non-finite (the weights the run would ship give
    NaN or infinite outputs on the held-out split), as a diverged loss stops a run."""


class NonFiniteModelError(NonFiniteLossError):
    """Raised after a run's results are written when the model it would save scores
    non-finite on the held-out split: the model file is not written."""


class Throughput(keras.callbacks.Callback):
    """Adds `images_per_second` to the logs (shown by the progress bar) and keeps the mean.

    Args:
        examples_per_step_call: examples all replicas take in one step call
            (`plan.examples_per_step_call`).
        step_calls_per_execution: step calls between two `on_train_batch_end` calls
            (`plan.step_calls_per_execution`).
    """

    def __init__(self, examples_per_step_call: int, step_calls_per_execution: int = 1):
        super().__init__()
        self.examples_per_step_call = examples_per_step_call
        self.step_calls_per_execution = step_calls_per_execution
        self.images = 0
        self.seconds = 0.0
        self._start = None
        self._first = True

    def on_train_batch_begin(self, batch, logs=None):
        self._start = time.perf_counter()

    def on_train_batch_end(self, batch, logs=None):
        elapsed = time.perf_counter() - self._start
        images = self.examples_per_step_call * self.step_calls_per_execution
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


class _StepCallback(keras.callbacks.Callback):
    """Knows the global step at each batch end, also in a resumed partial epoch.

    A run resumed after `initial_batch` batches of epoch `initial_epoch` trains the rest of that
    epoch in its own `fit` call, whose batch indices start at 0 again: they are offset here.
    """

    def __init__(self, step_calls_per_epoch: int, initial_epoch: int = 0, initial_batch: int = 0):
        super().__init__()
        self.step_calls_per_epoch = step_calls_per_epoch
        self.initial_epoch = initial_epoch
        self.initial_batch = initial_batch
        self.epoch = initial_epoch

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def batches_done(self, batch: int) -> int:
        """Batches of the current epoch done once Keras' `batch` (0-based) has ended."""
        offset = self.initial_batch if self.epoch == self.initial_epoch else 0
        return offset + batch + 1

    def global_step(self, batch: int) -> int:
        return self.epoch * self.step_calls_per_epoch + self.batches_done(batch)

    def where(self, batch: int) -> str:
        return (f"step {self.global_step(batch)} (epoch {self.epoch + 1}, batch "
                f"{self.batches_done(batch)})")


def _kept(checkpoints: CheckpointManager | None) -> str:
    last = checkpoints.latest() if checkpoints else None
    return f"the last good checkpoint {last} is intact" if last else "no good checkpoint exists"


class NonFiniteLossGuard(_StepCallback):
    """Stops the run on a NaN or infinite loss, naming the step; checkpoints stay untouched.

    Args:
        step_calls_per_epoch: step calls per epoch (Keras' steps), to report a global step.
        initial_epoch, initial_batch: where training (re)started.
        checkpoints: the manager, to name the last good checkpoint in the message.
    """

    def __init__(self, step_calls_per_epoch: int, initial_epoch: int = 0,
                 checkpoints: CheckpointManager | None = None, initial_batch: int = 0):
        super().__init__(step_calls_per_epoch, initial_epoch, initial_batch)
        self.checkpoints = checkpoints

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or math.isfinite(float(loss)):
            return
        raise NonFiniteLossError(
            f"training loss became {float(loss)} at {self.where(batch)}; "
            f"{_kept(self.checkpoints)}. Lower --learning_rate or check the data.")


class DivergenceError(RuntimeError):
    """Raised when the training loss stays finite but far above chance level."""


class DivergenceGuard(_StepCallback):
    """Stops a run whose loss stays far above chance, as a NaN would, and marks the state
    suspect while it is above, so that checkpoints written then are not trusted.

    The rule: the loss Keras reports (the epoch's running mean, what the progress bar shows)
    above `factor` x ln(classes) at `patience` step ends in a row. A classifier's initial
    cross-entropy is about ln(classes) (2.3 for 10 classes, 6.9 for 1000), and training only
    lowers it; ten times that means logits of wrong classes tens of units high, which a
    diverged optimizer produces (an RMSProp rate of 1e6 gives 1e16) and a healthy run does not.
    A single spike is tolerated: it must last `patience` step ends.

    Args:
        num_classes: classes of the classifier (sets the threshold).
        factor: multiple of ln(classes) that counts as diverged. Default 10.
        patience: consecutive step ends above it that stop the run. Default 5.
        step_calls_per_epoch, initial_epoch, initial_batch: to name the global step.
        checkpoints: the manager, to name the last good checkpoint in the message.

    Example:
        >>> guard = DivergenceGuard(num_classes=1000, factor=10, patience=5,
        ...                         step_calls_per_epoch=100)
        >>> model.fit(data, callbacks=[guard])   # raises DivergenceError after 5 bad steps
    """

    def __init__(self, num_classes: int, factor: float = 10.0, patience: int = 5,
                 step_calls_per_epoch: int = 1, initial_epoch: int = 0, initial_batch: int = 0,
                 checkpoints: CheckpointManager | None = None):
        super().__init__(step_calls_per_epoch, initial_epoch, initial_batch)
        if factor <= 0 or patience < 1:
            raise ValueError(f"factor must be > 0 and patience >= 1, received {factor}, "
                             f"{patience}")
        self.num_classes = num_classes
        self.factor = factor
        self.patience = patience
        self.threshold = factor * math.log(max(num_classes, 2))
        self.checkpoints = checkpoints
        self.above = 0  # consecutive step ends above the threshold
        self.first_step = None

    @property
    def suspect(self) -> bool:
        """Whether the loss is above the threshold now (a checkpoint now is not trusted)."""
        return self.above > 0

    def on_train_batch_end(self, batch, logs=None):
        loss = (logs or {}).get("loss")
        if loss is None or not math.isfinite(float(loss)):
            return  # NonFiniteLossGuard's case
        loss = float(loss)
        if loss <= self.threshold:
            self.above, self.first_step = 0, None
            return
        self.above += 1
        if self.first_step is None:
            self.first_step = self.global_step(batch)
        if self.above >= self.patience:
            raise DivergenceError(
                f"training diverged: the loss ({loss:.3g}, running mean of the epoch) stayed "
                f"above {self.threshold:.3g} = {self.factor:g} x ln({self.num_classes} classes) "
                f"for {self.above} step ends in a row, from step {self.first_step} to "
                f"{self.where(batch)}; {_kept(self.checkpoints)}. Lower --learning_rate "
                "(--divergence_factor=0 turns this check off).")


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


class Averaging(keras.callbacks.Callback):
    """Updates a `WeightAverage` (or `SlotAverage`) with the model's weights at each epoch's
    end; placed before the checkpointer, so that the epoch's checkpoint holds the new average.

    Args:
        average: the `WeightAverage` to update.
    """

    def __init__(self, average: WeightAverage):
        super().__init__()
        self.average = average

    def on_epoch_end(self, epoch, logs=None):
        self.average.update(self.model)


class EpochHistory(keras.callbacks.Callback):
    """The per-epoch logs of the run (`epochs`, a list the checkpointer stores in each
    checkpoint's state), continued from a resumed run's.

    Args:
        history: the per-epoch logs of the epochs before the resumed one.
    """

    def __init__(self, history=()):
        super().__init__()
        self.epochs: list[dict] = list(history)

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append({k: float(v) for k, v in (logs or {}).items()})


class RestoredMetrics(keras.callbacks.Callback):
    """Puts a resumed partial epoch's saved metric sums back at its start, so that the epoch
    reports what the uninterrupted one would (a mismatch restarts the running mean, warned).

    Args:
        values: the metric variables' values saved mid-epoch.
        initial_epoch: the resumed epoch (0-based).
    """

    def __init__(self, values: list, initial_epoch: int):
        super().__init__()
        self.values = values
        self.initial_epoch = initial_epoch

    def on_epoch_begin(self, epoch, logs=None):
        if self.values is None or epoch != self.initial_epoch:
            return
        variables = self.model.metrics_variables
        try:
            if len(variables) != len(self.values):
                raise ValueError(f"{len(self.values)} saved, {len(variables)} now")
            for variable, value in zip(variables, self.values):
                variable.assign(value)
        except ValueError as error:  # e.g. per-replica sums under a strategy
            for variable in variables:
                variable.assign(keras.ops.zeros_like(variable))
            log.warning("the resumed epoch's loss and metrics restart their running mean "
                        "(its weights are exact): %s", str(error).splitlines()[0])
        self.values = None


@dataclasses.dataclass(frozen=True)
class Position:
    """Where training (re)starts: step calls per epoch (Keras' steps), and the epoch and
    batches of it already done by a resumed run."""

    step_calls_per_epoch: int
    initial_epoch: int = 0
    initial_batch: int = 0


@dataclasses.dataclass(frozen=True)
class Contents:
    """What each checkpoint holds besides the model's, optimizer's and generators' variables:
    `state` (JSON-serialisable: config, classes), the per-epoch `history` (an
    `EpochHistory.epochs` list, read at each save) and the weight `average` (its arrays)."""

    state: dict
    history: list = dataclasses.field(default_factory=list)
    average: WeightAverage | None = None


@dataclasses.dataclass(frozen=True)
class SaveEvery:
    """Mid-epoch saves besides the epoch ends: every `steps` global steps (0 = off) and when
    `minutes` passed since the last save (0 = off)."""

    steps: int = 0
    minutes: float = 0.0


class Checkpointer(_StepCallback):
    """Writes checkpoints: at each epoch's end, mid-epoch as `every` says, and at the step where
    a signal asked the run to stop (then raises `Preempted`). Its one job: the weight average
    (`Averaging`), validation (`validation.Validating`) and the history (`EpochHistory`) are
    callbacks of their own that run before it; `after_save` hears of each epoch-end checkpoint
    before a signal stops the run (the best checkpoint's copy).

    Args:
        manager: the checkpoint manager; None writes nothing (the other workers of a
            multi-process run).
        contents: a `Contents`: the state, history and weight average stored in each
            checkpoint.
        position: a `Position`: steps per epoch and where training (re)started.
        every: a `SaveEvery`: mid-epoch saves. Default epoch ends only.
        watch: a `preemption.SignalWatch`; its `stop_signal()` stops the run at a step end.
        health: a `DivergenceGuard`; saves while it is `suspect` are marked unhealthy.
        directory: where the chief writes, named in the stop line of a process without
            `manager` (all processes stop at the same step; only the chief writes).
        after_save: called with (manager, checkpoint path or None) after each epoch-end save.
    """

    def __init__(self, manager: CheckpointManager | None, contents: Contents, position: Position,
                 *, every: SaveEvery = SaveEvery(), watch=None,
                 health: DivergenceGuard | None = None, directory=None, after_save=None):
        super().__init__(position.step_calls_per_epoch, position.initial_epoch,
                         position.initial_batch)
        self.manager = manager
        self.directory = directory
        self.contents = contents
        self.every_steps = every.steps
        self.every_seconds = every.minutes * 60.0
        self.watch = watch
        self.health = health
        self.after_save = after_save
        self._last_save = time.monotonic()

    def _save(self, epoch: int, batch: int, *, metrics: bool) -> str | None:
        self._last_save = time.monotonic()
        if self.manager is None:
            return None
        if self.watch is not None and self.watch.coordinating:
            # Several processes: a metric's value is then a sum over every replica, and reading
            # it an all-reduce that the other workers would have to join at this very step
            # (not so for --checkpoint_minutes, timed per process). The project's loop keeps
            # the epoch's loss on the host anyway, so these sums are not saved.
            metrics = False
        global_step = epoch * self.step_calls_per_epoch + batch
        average, state = self.contents.average, {
            **self.contents.state, "global_step": global_step, "history": self.contents.history}
        return str(self.manager.save(
            epoch, self.model, self.model.optimizer, state,
            average.values if average is not None else None, batch=batch,
            healthy=not (self.health is not None and self.health.suspect),
            metrics=list(self.model.metrics_variables) if metrics else None))

    def _stop_if_asked(self, path: str | None, step: int, epoch: int, batch: int) -> None:
        signum = self.watch.stop_signal() if self.watch is not None else None
        if signum is None:
            return
        writer = None
        if path is None and self.directory is not None:
            path, writer = str(Path(self.directory) / checkpoint_name(epoch, batch)), "the chief"
        raise Preempted(signum, path, step, by=self.watch.stopped_by(), writer=writer,
                        everywhere=self.watch.coordinating)

    def on_train_batch_end(self, batch, logs=None):
        done = self.batches_done(batch)
        if done >= self.step_calls_per_epoch:
            return  # the epoch's end saves (and stops when asked) next
        step = self.global_step(batch)
        asked = self.watch is not None and self.watch.stop_signal() is not None
        due = (self.every_steps and step % self.every_steps == 0) or (
            self.every_seconds and time.monotonic() - self._last_save >= self.every_seconds)
        if asked or due:
            path = self._save(self.epoch, done, metrics=True)
            self._stop_if_asked(path, step, self.epoch, done)

    def on_epoch_end(self, epoch, logs=None):
        path = self._save(epoch + 1, 0, metrics=False)
        if self.after_save is not None:  # e.g. a new best's checkpoint becomes checkpoints/best
            self.after_save(self.manager, path)
        self._stop_if_asked(path, (epoch + 1) * self.step_calls_per_epoch, epoch + 1, 0)
