"""training.callbacks and training.preemption: loss guards, mid-epoch checkpoints, signals
deferred to a step boundary."""

from __future__ import annotations

import inspect
import math
import os
import signal

import numpy as np
import pytest

from keras_efficientnet.training.callbacks import (
    Averaging,
    Checkpointer,
    Contents,
    DivergenceError,
    DivergenceGuard,
    EpochHistory,
    NonFiniteLossError,
    NonFiniteLossGuard,
    Position,
    RestoredMetrics,
    SaveEvery,
    WeightAverage,
)
from keras_efficientnet.training.checkpoint import (
    CheckpointManager,
    position_of,
)
from keras_efficientnet.training.preemption import Preempted, SignalWatch
from tests.helpers import tiny_sgd_model

pytestmark = pytest.mark.tf_only


def _model(seed=0):
    return tiny_sgd_model(seed)


def test_divergence_needs_the_loss_above_the_factor_for_patience_step_ends():
    guard = DivergenceGuard(num_classes=10, factor=10.0, patience=3, step_calls_per_epoch=100)
    assert guard.threshold == pytest.approx(10 * math.log(10))  # 23.03
    guard.on_epoch_begin(0)
    for batch, loss in enumerate([2.3, 30.0, 30.0, 20.0, 1e16, float("nan")]):
        guard.on_train_batch_end(batch, {"loss": loss})  # a 2-step spike is tolerated
    assert guard.suspect  # 1e16 counted; NaN is the other guard's and changes nothing
    guard.on_train_batch_end(6, {"loss": 5e15})
    with pytest.raises(DivergenceError, match=r"stayed above 23 = 10 x ln\(10 classes\) for 3 "
                                              r"step ends in a row, from step 5 to step 8 "
                                              r"\(epoch 1, batch 8\); no good checkpoint"):
        guard.on_train_batch_end(7, {"loss": 4e15})


def test_guards_count_steps_from_a_mid_epoch_resume(tmp_path):
    # Resumed after 3 batches of epoch 3 (index 2), 10 steps per epoch: the partial epoch's
    # batch 0 is global step 2 * 10 + 3 + 1 = 24; the next epoch starts at batch 1 again.
    manager = CheckpointManager(tmp_path)
    manager.save(2, _model(), batch=3)
    guard = NonFiniteLossGuard(10, initial_epoch=2, initial_batch=3, checkpoints=manager)
    guard.on_epoch_begin(2)
    with pytest.raises(NonFiniteLossError, match=r"became inf at step 24 \(epoch 3, batch 4\); "
                                                 r"the last good checkpoint .*epoch-0002-batch"):
        guard.on_train_batch_end(0, {"loss": float("inf")})
    guard.on_epoch_begin(3)
    assert guard.where(0) == "step 31 (epoch 4, batch 1)"


def test_checkpointer_saves_mid_epoch_every_n_steps_and_stops_on_a_signal(tmp_path):
    model = _model()
    manager = CheckpointManager(tmp_path, keep=10)
    watch = SignalWatch()
    checkpointer = Checkpointer(manager, Contents({}), Position(5), every=SaveEvery(steps=3),
                                watch=watch)
    checkpointer.set_model(model)
    model.optimizer.build(model.trainable_variables)
    for epoch in range(2):  # global steps 3, 6 and 9 mid-epoch; 5 and 10 at the epoch ends
        checkpointer.on_epoch_begin(epoch)
        for batch in range(5):
            checkpointer.on_train_batch_end(batch)
        checkpointer.on_epoch_end(epoch, {"loss": 1.0})
    assert [position_of(p) for p in manager.all()] == [(0, 3), (1, 0), (1, 1), (1, 4), (2, 0)]
    checkpointer.on_epoch_begin(2)
    watch.requested = signal.SIGTERM
    with pytest.raises(Preempted) as stopped:
        checkpointer.on_train_batch_end(1)
    assert stopped.value.checkpoint == str(tmp_path / "epoch-0002-batch-000002")
    assert (stopped.value.step, stopped.value.exit_code) == (12, 143)
    state = CheckpointManager.read_state(stopped.value.checkpoint)
    assert (state["epoch"], state["batch"], state["global_step"]) == (2, 2, 12)


def test_signals_wait_for_the_step_inside_a_training_loop_and_stop_at_once_outside():
    previous = signal.getsignal(signal.SIGTERM)
    with SignalWatch() as watch:
        with pytest.raises(Preempted) as outside:
            os.kill(os.getpid(), signal.SIGTERM)
            signal.sigtimedwait([], 0)  # the handler has run by now
        assert outside.value.checkpoint is None and outside.value.exit_code == 143
        watch.requested = None
        with watch.deferred():
            os.kill(os.getpid(), signal.SIGINT)  # first: only noted, for the step's end
            assert watch.requested == signal.SIGINT
            with pytest.raises(Preempted, match="stopped by SIGINT"):
                os.kill(os.getpid(), signal.SIGINT)  # second: at once
            watch.requested = None  # caught here: else the region's end raises it again
    assert signal.getsignal(signal.SIGTERM) is previous


def test_the_checkpointer_and_its_collaborators_take_at_most_8_parameters():
    from keras_efficientnet.training.validation import Validating, Validation

    for cls in (Checkpointer, Averaging, EpochHistory, RestoredMetrics, Validating, Validation):
        parameters = list(inspect.signature(cls.__init__).parameters)[1:]  # without self
        assert len(parameters) <= 8, (cls.__name__, parameters)
    # One job: nothing of the average, validation or history is the checkpointer's own.
    assert not {"average", "validation", "history", "_metrics"} & set(vars(
        Checkpointer(None, Contents({}), Position(1))))


def test_the_epoch_end_collaborators_feed_the_checkpoint_in_their_order(tmp_path):
    # Kernel values 1 then 3 at the two epoch ends, decay 0.5: the average is 1, then
    # 0.5 * 1 + 0.5 * 3 = 2 (by hand); the checkpoint after epoch 2 holds it and both epochs'
    # logs, and after_save hears of each epoch-end checkpoint before a signal stops the run.
    model = _model()
    manager, watch = CheckpointManager(tmp_path, keep=5), SignalWatch()
    average, history, heard = WeightAverage(0.5), EpochHistory([{"loss": 9.0}]), []
    checkpointer = Checkpointer(manager, Contents({"num_classes": 2}, history.epochs, average),
                                Position(3), watch=watch,
                                after_save=lambda m, path: heard.append((m, path)))
    callbacks = [Averaging(average), history, checkpointer]
    for callback in callbacks:
        callback.set_model(model)
    model.optimizer.build(model.trainable_variables)
    for epoch, value in enumerate((1.0, 3.0)):
        model.set_weights([np.full_like(w, value) for w in model.get_weights()])
        if epoch == 1:
            watch.requested = signal.SIGTERM  # arrives during the last epoch
        for callback in callbacks[:-1]:
            callback.on_epoch_end(epoch, {"loss": 1.0 + epoch})
        if epoch == 1:
            with pytest.raises(Preempted) as stopped:
                checkpointer.on_epoch_end(epoch, {"loss": 2.0})
            assert stopped.value.checkpoint == str(tmp_path / "epoch-0002")
        else:
            checkpointer.on_epoch_end(epoch, {"loss": 1.0})
    assert [path for _, path in heard] == [str(tmp_path / "epoch-0001"),
                                           str(tmp_path / "epoch-0002")]
    state = CheckpointManager.restore(tmp_path / "epoch-0002", _model())
    assert state["history"] == [{"loss": 9.0}, {"loss": 1.0}, {"loss": 2.0}]
    assert state["global_step"] == 6 and state["num_classes"] == 2
    for array in state["average"]:
        np.testing.assert_array_equal(array, 2.0)


def test_restored_metrics_go_back_only_at_the_resumed_epoch():
    model = _model()
    x = np.zeros((1, 4), "float32")
    model.compute_metrics(x, np.zeros((1, 3), "float32"), model(x))
    saved = [np.full(tuple(v.shape), 7.0, "float32") for v in model.metrics_variables]
    restored = RestoredMetrics(saved, initial_epoch=2)
    restored.set_model(model)
    restored.on_epoch_begin(1)
    assert all(float(np.sum(v.numpy())) == 0.0 for v in model.metrics_variables)
    restored.on_epoch_begin(2)
    for variable in model.metrics_variables:
        np.testing.assert_array_equal(variable.numpy(), 7.0)
