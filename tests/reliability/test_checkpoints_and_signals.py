"""Checkpoints that keep the last good one and the random-generator state; loss guards;
signals deferred to a step boundary."""

from __future__ import annotations

import errno
import math
import os
import shutil
import signal

import keras
import numpy as np
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
    CheckpointWriteError,
    checkpoint_name,
    position_of,
)
from keras_efficientnet.training.preemption import Preempted, SignalWatch

pytestmark = pytest.mark.tf_only


def _model(seed=0):
    keras.utils.set_random_seed(seed)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5),
                              keras.layers.Dense(3)])
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="mse",
                  jit_compile=False)
    return model


def test_names_sort_by_position_mid_epoch_saves_included(tmp_path):
    manager = CheckpointManager(tmp_path, keep=10)
    model = _model()
    for epoch, batch in [(1, 0), (0, 3), (1, 2), (2, 0), (0, 0)]:
        manager.save(epoch, model, batch=batch)
    assert [p.name for p in manager.all()] == [
        "epoch-0000", "epoch-0000-batch-000003", "epoch-0001", "epoch-0001-batch-000002",
        "epoch-0002"]
    assert position_of(tmp_path / checkpoint_name(3, 17)) == (3, 17)
    assert position_of(tmp_path / "epoch-0003.bak") is None


def test_rotation_never_drops_the_last_good_checkpoint(tmp_path):
    # The case: epochs 1-2 good, then three saves while the loss was diverged, keeping
    # the newest 2: epoch 2 survives (and LATEST names it), the diverged ones are kept to look at.
    manager = CheckpointManager(tmp_path, keep=2)
    model = _model()
    for epoch in (1, 2):
        manager.save(epoch, model, state={"tag": epoch})
    for epoch in (3, 4, 5):
        manager.save(epoch, model, healthy=False)
    assert [p.name for p in manager.all()] == ["epoch-0002", "epoch-0004", "epoch-0005"]
    assert manager.latest().name == "epoch-0002"
    assert (tmp_path / "LATEST").read_text() == "epoch-0002"
    (tmp_path / "LATEST").unlink()  # without the pointer, the newest healthy one still wins
    assert manager.latest().name == "epoch-0002"
    manager.save(6, model)  # a good save again: it becomes the latest, epoch 2 may go
    assert [p.name for p in manager.all()] == ["epoch-0005", "epoch-0006"]


def test_random_generator_state_round_trips_so_resumed_masks_match(tmp_path):
    x = np.ones((64, 4), "float32")
    model = _model(seed=1)
    model(x, training=True)  # advances the dropout generator
    path = CheckpointManager(tmp_path).save(1, model, model.optimizer)
    expected = keras.ops.convert_to_numpy(model(x, training=True))  # the next mask

    fresh = _model(seed=2)  # another seed: another initial generator state
    fresh.optimizer.build(fresh.trainable_variables)
    CheckpointManager.restore(path, fresh, fresh.optimizer)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(fresh(x, training=True)), expected)
    # Evaluation loads (no optimizer) leave the generators alone.
    other = _model(seed=2)
    before = [keras.ops.convert_to_numpy(v) for v in other.variables if "seed" in v.path]
    CheckpointManager.restore(path, other)
    after = [keras.ops.convert_to_numpy(v) for v in other.variables if "seed" in v.path]
    np.testing.assert_array_equal(before, after)


def test_a_refused_write_names_the_checkpoint_and_leaves_no_partial_folder(tmp_path,
                                                                          monkeypatch):
    model = _model()
    manager = CheckpointManager(tmp_path)
    manager.save(1, model)

    def disk_full(path, *args, **kwargs):
        with open(path, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(model, "save_weights", disk_full)
    with pytest.raises(CheckpointWriteError) as raised:
        manager.save(2, model)
    assert raised.value.errno == errno.ENOSPC
    free = shutil.disk_usage(tmp_path).free / 2**30
    assert str(raised.value) == (
        f"could not write checkpoint {tmp_path / 'epoch-0002'}: No space left on device "
        f"({free:.1f} GiB free there); the last checkpoint {tmp_path / 'epoch-0001'} is "
        "intact. Fix: free space (or raise the quota, or give a --model_dir on another disk), "
        "then rerun the same command to resume")
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "epoch-0001"]


def test_divergence_needs_the_loss_above_the_factor_for_patience_step_ends():
    guard = DivergenceGuard(num_classes=10, factor=10.0, patience=3, steps_per_epoch=100)
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
    checkpointer = Checkpointer(manager, None, {}, steps_per_epoch=5, every_steps=3,
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
    assert signal.getsignal(signal.SIGTERM) is previous
