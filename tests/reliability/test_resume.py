"""A run stopped by SIGTERM mid-epoch and resumed ends bit-identical to the uninterrupted run,
with dropout and stochastic depth drawing (so the random-generator state must come back)."""

from __future__ import annotations

import os
import signal

import keras
import numpy as np
import pytest

from keras_efficientnet.training import TrainConfig, trainer
from keras_efficientnet.training.preemption import Preempted

pytestmark = pytest.mark.tf_only

TINY = dict(model="efficientnet-tiny-g16-lnpn", dataset="synthetic", train_resolution=32,
            test_resolution=32, micro_batch_size=8, updates_per_epoch=3, eval_steps=1, verbose=0,
            optimizer="sgd", learning_rate=0.01, lr_schedule="cosine", warmup_epochs=0.5,
            label_smoothing=0.1, drop_connect_rate=0.3, dropout_rate=0.3, keep_checkpoints=2,
            seed=3, epochs=2)


class SignalAfterStep(keras.callbacks.Callback):
    """Sends this process `signum` at the end of global step `step` (as Slurm would, from
    outside, at any moment: the trainer must finish the step and save where it stopped)."""

    def __init__(self, step: int, step_calls_per_epoch: int, signum=signal.SIGTERM):
        super().__init__()
        self.step, self.step_calls_per_epoch, self.signum = step, step_calls_per_epoch, signum

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * self.step_calls_per_epoch + batch + 1 == self.step:
            os.kill(os.getpid(), self.signum)


def _train(model_dir, **changes):
    config = TrainConfig(**{**TINY, "model_dir": str(model_dir), **changes})
    return trainer.train(config, num_classes=10, train_examples=10_000,
                         extra_callbacks=changes.pop("callbacks", None))


def test_sigterm_mid_epoch_then_resume_equals_the_uninterrupted_run(tmp_path):
    full = _train(tmp_path / "full")
    config = TrainConfig(**{**TINY, "model_dir": str(tmp_path / "stopped")})
    with pytest.raises(Preempted) as stopped:
        trainer.train(config, num_classes=10, train_examples=10_000,
                      extra_callbacks=[SignalAfterStep(4, step_calls_per_epoch=3)])
    # The signal came after step 4: step 5 (epoch 2, batch 2) finished and was saved.
    assert stopped.value.checkpoint == str(tmp_path / "stopped" / "checkpoints" /
                                           "epoch-0001-batch-000002")
    assert stopped.value.step == 5 and stopped.value.exit_code == 128 + signal.SIGTERM
    resumed = _train(tmp_path / "stopped")

    assert [h["loss"] for h in resumed["history"]] == [h["loss"] for h in full["history"]]
    assert resumed["history"] == full["history"]  # top-1/top-5 of the partial epoch too
    for a, b in zip(resumed["model"].get_weights(), full["model"].get_weights()):
        np.testing.assert_array_equal(a, b)
    for a, b in zip(resumed["average"].values, full["average"].values):
        np.testing.assert_array_equal(a, b)
