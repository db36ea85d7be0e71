"""training.callbacks and training.preemption: loss guards, mid-epoch checkpoints, signals
deferred to a step boundary."""

from __future__ import annotations

import math
import os
import signal

import pytest

from keras_efficientnet.training.callbacks import (
    Checkpointer,
    DivergenceError,
    DivergenceGuard,
    NonFiniteLossError,
    NonFiniteLossGuard,
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
    checkpointer = Checkpointer(manager, None, {}, step_calls_per_epoch=5, every_steps=3,
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
