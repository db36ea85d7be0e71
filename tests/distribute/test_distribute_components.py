"""Planner costs and splits, the accumulating step, the loop, and the horovod step."""

from __future__ import annotations

import itertools
import logging
import math
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_efficientnet as ke
from keras_efficientnet.distribute import horovod, planner, train_loop
from keras_efficientnet.training.plan import ExecutionPlan

LOSS = keras.losses.CategoricalCrossentropy()


@pytest.fixture(scope="module")
def tiny():
    keras.utils.set_random_seed(0)
    return ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer", proxy_norm=True,
                           classes=4, input_shape=(32, 32, 3), dropout_rate=0.0,
                           drop_connect_rate=0.0)


def test_unit_costs_add_up_to_the_model(tiny):
    costs = planner.unit_costs(tiny)
    assert [c.name for c in costs] == ["stem", *tiny.block_names, "head"]
    assert sum(c.macs for c in costs) == ke.count_macs(tiny)
    # Stem at 32x32: the 3072-value input normalised, then conv, norm and activation outputs
    # of 16x16x16 each (half-width stem: 16 channels).
    assert costs[0].activations == 32 * 32 * 3 + 3 * 16 * 16 * 16
    assert costs[0].macs == 3 * 3 * 3 * 16 * 16 * 16


def test_planner_is_optimal_and_logs_shares(tiny, caplog):
    costs = planner.unit_costs(tiny)
    macs = [c.macs / sum(c.macs for c in costs) for c in costs]
    acts = [c.activations / sum(c.activations for c in costs) for c in costs]

    def busiest(cuts):
        bounds = [0, *cuts, len(costs)]
        return max(max(sum(macs[a:b]), sum(acts[a:b])) for a, b in zip(bounds, bounds[1:]))

    for stages in (2, 3, 4):
        split = planner.plan_splits(tiny, stages)
        brute = min(busiest(c) for c in itertools.combinations(range(1, len(costs)), stages - 1))
        chosen = [[c.name for c in costs].index(s) for s in split.splits]
        assert busiest(chosen) == pytest.approx(brute)
        assert math.fsum(split.mac_shares) == pytest.approx(1.0)
    text = split.describe()
    assert "stage 3:" in text and "MACs" in text and "activations" in text
    with caplog.at_level(logging.INFO, logger="keras_efficientnet.distribute.planner"):
        resolved = planner.resolve_splits(ExecutionPlan(auto_stages=3), tiny)
    assert resolved.pipeline_splits == planner.plan_splits(tiny, 3).splits
    assert "stage 2:" in caplog.text and "MACs" in caplog.text


def test_planner_finds_graphcore_b4_split():
    # Graphcore's large-batch G16-B4 ran 2 stages split at block4a.
    model = ke.EfficientNet("b4", group_size=16, expand_ratio=4, norm="group",
                            first_stage_group_size=8)
    assert planner.plan_splits(model, 2).splits == ("block4a",)
    auto = planner.resolve_splits(ExecutionPlan(strategy="ipu", replicas=8, auto_stages=2), model)
    assert auto.pipeline_splits == ("block4a",)


def _whole_batch_gradients(model, x, y):
    """Independent reference: tf.GradientTape over the whole batch's mean loss."""
    with tf.GradientTape() as tape:
        value = LOSS(y, model(x, training=True))
    return value, tape.gradient(value, model.trainable_variables)


def test_accumulated_micro_batches_equal_the_whole_batch_gradient(tiny):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, 256, (4, 32, 32, 3)).astype("uint8"))
    y = tf.constant(np.eye(4, dtype="float32")[[0, 1, 2, 3]])
    loss_fn = train_loop.per_example_loss(LOSS)
    value, grads = train_loop.accumulate_gradients(tiny, x, y, loss_fn, divisor=4,
                                                   micro_batches=2)
    ref_value, ref = _whole_batch_gradients(tiny, x, y)
    assert float(value) == pytest.approx(float(ref_value), rel=1e-6)
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in ref)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, atol=1e-5 * scale)
    with pytest.raises(ValueError, match="4 examples cannot be cut into 3 equal micro-batches"):
        train_loop.accumulate_gradients(tiny, x, y, loss_fn, divisor=4, micro_batches=3)


class _Recorder:
    def __init__(self):
        self.calls = []


def fake_horovod(size, recorder):
    """Horovod stand-in: `size` workers that all computed the same gradients."""

    def allreduce(tensor, op=None, name=None):
        recorder.calls.append(("allreduce", name, op))
        # Average of `size` equal tensors; Sum would multiply.
        return tensor if op == "Average" else tensor * size

    def broadcast(tensor, root_rank=0, name=None):
        recorder.calls.append(("broadcast", name, root_rank))
        return tensor + 1.0

    return types.SimpleNamespace(Average="Average", Sum="Sum", allreduce=allreduce,
                                 broadcast=broadcast, size=lambda: size)


def _small_model():
    keras.utils.set_random_seed(1)
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.Dense(2, activation="softmax")(inputs))


def test_horovod_step_averages_gradients_with_allreduce():
    recorder = _Recorder()
    hvd = fake_horovod(4, recorder)
    model, reference = _small_model(), _small_model()
    x = tf.constant([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0]])
    y = tf.constant([[1.0, 0.0], [0.0, 1.0]])
    step = horovod.make_horovod_train_step(model, keras.optimizers.SGD(0.5), LOSS, hvd=hvd)
    loss = float(step(x, y))
    with tf.GradientTape() as tape:
        value = LOSS(y, reference(x))
    grads = tape.gradient(value, reference.trainable_variables)
    for w, r, g in zip(model.trainable_variables, reference.trainable_variables, grads):
        np.testing.assert_allclose(w, r - 0.5 * g, rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(float(value), rel=1e-6)
    reduced = [c for c in recorder.calls if c[0] == "allreduce"]
    assert [c[1] for c in reduced] == ["grad_0", "grad_1", "loss"]
    assert all(c[2] == "Average" for c in reduced)
    before = [keras.ops.convert_to_numpy(v) for v in model.variables]
    horovod.broadcast_variables(model.variables, hvd=hvd)
    for b, v in zip(before, model.variables):
        np.testing.assert_allclose(v, b + 1.0)


def test_accumulating_horovod_step_averages_once_per_update():
    # 2 micro-batches of 2 on each of 4 identical workers: one update with the gradient of the
    # 4-example mean, and one allreduce per gradient (not one per micro-batch).
    recorder = _Recorder()
    model, reference = _small_model(), _small_model()
    x = tf.constant([[1.0, 2.0, 3.0], [0.5, -1.0, 2.0], [0.0, 1.0, -2.0], [2.0, 0.5, 1.0]])
    y = tf.constant([[1.0, 0.0], [0.0, 1.0], [0.0, 1.0], [1.0, 0.0]])
    step = horovod.make_horovod_train_step(model, keras.optimizers.SGD(0.5), LOSS,
                                           hvd=fake_horovod(4, recorder), micro_batches=2)
    loss = float(step(x, y))
    value, grads = _whole_batch_gradients(reference, x, y)
    for w, r, g in zip(model.trainable_variables, reference.trainable_variables, grads):
        np.testing.assert_allclose(w, r - 0.5 * g, rtol=1e-6, atol=1e-7)
    assert loss == pytest.approx(float(value), rel=1e-6)
    assert [c[1] for c in recorder.calls] == ["grad_0", "grad_1", "loss"]


def test_loop_groups_device_iterations_and_equals_single_steps():
    # 3 steps in host calls of 2 (then 1) end where 3 single calls of the same step end.
    rng = np.random.default_rng(3)
    batches = [(tf.constant(rng.normal(size=(2, 3)), tf.float32),
                tf.constant(np.eye(2, dtype="float32")[rng.integers(0, 2, 2)]))
               for _ in range(3)]
    grouped, single = _small_model(), _small_model()
    for model in (grouped, single):
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=LOSS)
    step = train_loop.make_train_step(grouped, grouped.optimizer, LOSS, global_batch_size=2)
    history = train_loop.fit(grouped, step, batches, epochs=1, step_calls_per_epoch=3,
                             step_calls_per_execution=2, verbose=0)
    reference = train_loop.make_train_step(single, single.optimizer, LOSS, global_batch_size=2)
    losses = [float(reference(x, y)) for x, y in batches]
    assert history.history["loss"] == [pytest.approx(np.mean(losses), rel=1e-6)]
    for a, b in zip(grouped.get_weights(), single.get_weights()):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(ValueError, match="step_calls_per_execution must be a positive int"):
        train_loop.fit(grouped, step, batches, epochs=1, step_calls_per_epoch=1,
                       step_calls_per_execution=0)


def test_workers_resuming_from_different_epochs_or_steps_fail_together():
    def sums(*positions):  # each replica's (epoch, steps left), summed as the all-reduce would
        return lambda values: sum(np.array([e, e * e, s, s * s], "float64")
                                  for e, s in positions)

    train_loop.check_same_start(3, sums((3, 8), (3, 8)), 2, 8)
    with pytest.raises(ValueError, match=r"from epoch 3, the mean over the 2 replicas is 1\.5"):
        train_loop.check_same_start(3, sums((3, 8), (0, 8)), 2, 8)
    with pytest.raises(ValueError, match="same --model_dir on a filesystem they share"):
        train_loop.check_same_start(0, sums((3, 8), (0, 8)), 2, 8)
    # Same epoch, different mid-epoch checkpoints: 8 and 4 steps left.
    with pytest.raises(ValueError, match=r"different steps of epoch 3 \(this one has 4 steps "
                                         r"left, the mean over the 2 replicas is 6\)"):
        train_loop.check_same_start(3, sums((3, 8), (3, 4)), 2, 4)


def test_loss_scaling_gives_the_plain_update():
    # mixed_float16 runs wrap the optimizer in a LossScaleOptimizer: the step scales the loss
    # and `apply` unscales, so in float32 the update equals plain SGD's (scales are powers of 2).
    rng = np.random.default_rng(4)
    x = tf.constant(rng.normal(size=(2, 3)), tf.float32)
    y = tf.constant(np.eye(2, dtype="float32")[[0, 1]])
    scaled, plain = _small_model(), _small_model()
    for model, optimizer in ((scaled, keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.5))), (plain, keras.optimizers.SGD(0.5))):
        train_loop.make_train_step(model, optimizer, LOSS, global_batch_size=2)(x, y)
    for a, b in zip(scaled.trainable_variables, plain.trainable_variables):
        np.testing.assert_allclose(a, b, rtol=1e-6)
