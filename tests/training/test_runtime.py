"""training.runtime: a runtime gets its plan through its constructor or `replan` (never written
from outside), and where the input starts through `fit`'s `start_step`."""

from __future__ import annotations

import pytest

from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import OneDevice, first_step, skip_seen

pytestmark = pytest.mark.tf_only


def test_replan_gives_another_runtime_and_leaves_this_one():
    training = ExecutionPlan(micro_batch_size=8, gradient_accumulation=2)
    runtime = OneDevice(training)
    tuned = runtime.replan(training.with_examples_per_update(32, "--finetune_batch_size"))
    assert tuned is not runtime and runtime.plan is training
    assert (tuned.plan.micro_batches_per_update, runtime.plan.micro_batches_per_update) == (4, 2)
    with pytest.raises(ValueError, match="replan keeps the strategy and replicas"):
        runtime.replan(ExecutionPlan(strategy="mirrored", replicas=2))


def test_the_input_starts_at_the_epoch_or_at_the_resumed_step_call():
    import tensorflow as tf

    # 5 step calls per epoch: epoch 2 starts at step call 10; a resume mid-epoch at 13.
    assert first_step(2, 5, None) == 10 and first_step(2, 2, 13) == 13
    data = tf.data.Dataset.range(100)
    assert next(iter(skip_seen(data, 13))).numpy() == 13
    # Two batches per step call from this pipeline (two local replicas): 26 batches skipped.
    assert next(iter(skip_seen(data, 13, batches_per_step_call=2))).numpy() == 26
