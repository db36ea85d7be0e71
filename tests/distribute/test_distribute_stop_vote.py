"""The multi-process stop vote in the project's loop, in one process: a second "worker" is a
variable that the test sets, summed into the vote as its all-reduce would."""

from __future__ import annotations

import signal

import keras
import numpy as np
import pytest
import tensorflow as tf

from keras_efficientnet.distribute import train_loop
from keras_efficientnet.training.callbacks import Checkpointer, Contents, Position
from keras_efficientnet.training.checkpoint import METRICS, CheckpointManager, position_of
from keras_efficientnet.training.preemption import Preempted, SignalWatch

pytestmark = pytest.mark.tf_only
LOSS = keras.losses.CategoricalCrossentropy()
NAMES = ["worker 0 (a:1)", "worker 1 (b:2)"]


def _run(tmp_path, *, chief: bool, signals: dict, device_iterations: int = 2,
         checkpoints: bool = True):
    """6 steps per epoch, 2 epochs, in host calls of `device_iterations`. `signals` maps a
    step index (0-based, global) to (who, signum): the signal arrives while that step runs,
    to this process ("me") or to the peer ("peer")."""
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    rng = np.random.default_rng(0)
    batches = [(tf.constant(rng.normal(size=(2, 3)), tf.float32),
                tf.constant(np.eye(2, dtype="float32")[rng.integers(0, 2, 2)]))
               for _ in range(12)]
    step = train_loop.make_train_step(model, model.optimizer, LOSS, global_batch_size=2)
    watch = SignalWatch()
    peer = tf.Variable(0.0)  # the other worker's flag, read inside the traced vote
    vote = train_loop.StopVote(watch, lambda flag: train_loop.one_hot_vote(0, 2, flag)
                               + train_loop.one_hot_vote(1, 2, peer.read_value()), NAMES)
    steps_run = []

    def data():
        for index, batch in enumerate(batches):
            # Input for step `index` is read just before its host call runs it.
            steps_run.append(index)
            yield batch

    class Signals(keras.callbacks.Callback):
        # After a host call: signals that arrived while it ran (too late for its vote).
        def on_train_batch_end(self, batch, logs=None):
            for index in range(len(steps_run) - device_iterations, len(steps_run)):
                who, signum = signals.get(index, (None, 0))
                if who == "me":
                    watch.requested = signum
                elif who == "peer":
                    peer.assign(float(signum))

    manager = CheckpointManager(tmp_path / "checkpoints")
    checkpointer = Checkpointer(manager if chief else None, Contents({}), Position(6),
                                watch=watch, directory=manager.directory)
    callbacks = [Signals(), checkpointer] if checkpoints else [Signals()]
    with pytest.raises(Preempted) as stopped, watch.deferred(), watch.coordinated():
        train_loop.fit(model, step, data(), epochs=2, step_calls_per_epoch=6,
                       step_calls_per_execution=device_iterations, callbacks=callbacks,
                       verbose=0, stop_vote=vote)
    return stopped.value, len(steps_run), manager


def test_a_signal_to_the_peer_stops_this_worker_one_host_call_later_with_a_checkpoint(tmp_path):
    # SIGTERM reaches the peer during step 7 (host call of steps 6-7): it votes in the next
    # call (steps 8-9), after which both stop: step 10 = epoch 1, batch 4.
    stopped, run, manager = _run(tmp_path, chief=True, signals={7: ("peer", signal.SIGTERM)})
    assert run == 10
    assert (stopped.step, stopped.exit_code, stopped.by) == (10, 143, "worker 1 (b:2)")
    assert position_of(stopped.checkpoint) == (1, 4)
    assert [position_of(p) for p in manager.all()] == [(1, 0), (1, 4)]
    # No metric sums mid-epoch: under several workers, reading them is an all-reduce.
    assert not (manager.all()[-1] / METRICS).exists()
    assert stopped.describe() == (
        f"stopped by SIGTERM to worker 1 (b:2) after step 10: checkpoint written to "
        f"{stopped.checkpoint}; run the same command on every worker to resume from that step")


def test_the_signalled_non_chief_names_the_chiefs_checkpoint_and_writes_nothing(tmp_path):
    stopped, run, manager = _run(tmp_path, chief=False, signals={2: ("me", signal.SIGINT)})
    assert (run, stopped.step, stopped.exit_code, stopped.by) == (6, 6, 130, None)
    assert stopped.checkpoint == str(tmp_path / "checkpoints" / "epoch-0001")
    assert manager.all() == []
    assert stopped.describe().startswith(
        "stopped by SIGINT after step 6: the chief writes the checkpoint to ")


def test_signals_to_both_in_one_host_call_stop_at_the_same_boundary(tmp_path):
    stopped, run, _ = _run(tmp_path, chief=True, signals={4: ("me", signal.SIGTERM),
                                                          5: ("peer", signal.SIGINT)},
                           device_iterations=3)
    # The call of steps 3-5 sees neither; the call of steps 6-8 carries both votes.
    assert (run, stopped.step, stopped.signum, stopped.by) == (9, 9, signal.SIGTERM, None)
    assert stopped.describe().startswith("stopped by SIGTERM after step 9: checkpoint written to ")
    assert stopped.describe().endswith("run the same command on every worker to resume from "
                                       "that step")


def test_without_a_checkpoint_callback_the_loop_stops_at_the_agreed_step(tmp_path):
    stopped, run, manager = _run(tmp_path, chief=True, signals={0: ("peer", signal.SIGTERM)},
                                 checkpoints=False)
    assert (run, stopped.checkpoint, stopped.by) == (4, None, "worker 1 (b:2)")
    assert manager.all() == []


def test_a_signal_too_late_for_the_last_vote_stops_after_the_loop():
    watch = SignalWatch()
    with pytest.raises(Preempted, match="outside a training step"), watch.coordinated():
        watch.requested = signal.SIGTERM
    vote = train_loop.StopVote(watch, None, NAMES)
    assert not vote.decide(np.zeros(2))
    assert vote.decide(np.array([0.0, 15.0])) and watch.agreed == (15, "worker 1 (b:2)")
