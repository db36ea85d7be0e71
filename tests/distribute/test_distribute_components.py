"""Planner costs and splits, the IPU mapping and the horovod step against stand-ins."""

from __future__ import annotations

import itertools
import math
import types

import keras
import numpy as np
import pytest
import tensorflow as tf

import keras_efficientnet as ke
from keras_efficientnet.distribute import ipu, planner, train_loop
from keras_efficientnet.distribute.pipeline import PipelinedModel
from keras_efficientnet.distribute.plan import ExecutionPlan, plan

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


def test_planner_is_optimal_and_prints_shares(tiny, capsys):
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
    out = capsys.readouterr().out
    assert "stage 3:" in out and "MACs" in out and "activations" in out


def test_planner_finds_graphcore_b4_split():
    # Graphcore's large-batch G16-B4 ran 2 stages split at block4a.
    model = ke.EfficientNet("b4", group_size=16, expand_ratio=4, norm="group",
                            first_stage_group_size=8)
    assert planner.plan_splits(model, 2, verbose=False).splits == ("block4a",)
    auto = ExecutionPlan(backend="ipu", replicas=8, auto_stages=2).resolve(model)
    assert auto.pipeline_splits == ("block4a",)


def test_accumulation_through_plan_equals_whole_batch_gradient(tiny):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, 256, (4, 32, 32, 3)).astype("uint8"))
    y = tf.constant(np.eye(4, dtype="float32")[[0, 1, 2, 3]])
    runtime = plan(micro_batch_size=2, gradient_accumulation=2, print_plan=False)
    wrapped = runtime.wrap(tiny)
    assert isinstance(wrapped, PipelinedModel)
    _, grads = wrapped.compute_gradients(x, y, LOSS)  # eager: cheap, same code as the step
    with tf.GradientTape() as tape:
        value = LOSS(y, tiny(x, training=True))
    ref = tape.gradient(value, tiny.trainable_variables)
    scale = max(float(tf.reduce_max(tf.abs(g))) for g in ref)
    for g, r in zip(grads, ref):
        np.testing.assert_allclose(g, r, atol=1e-5 * scale)
    with pytest.raises(ValueError, match="'block9z' is not a block"):
        plan(pipeline_splits="block9z", print_plan=False).wrap(tiny)


class _Recorder:
    def __init__(self):
        self.calls = []


def fake_ipu_module(recorder):
    """A stand-in for `tensorflow.python.ipu` that records what the adapter asks of it."""

    class IPUConfig:
        def __init__(self):
            self.auto_select_ipus = None
            self.allow_recompute = False
            self.floating_point_behaviour = types.SimpleNamespace(esr=None)
            recorder.calls.append(("IPUConfig",))

        def configure_ipu_system(self):
            recorder.calls.append(("configure_ipu_system", self.auto_select_ipus,
                                   self.floating_point_behaviour.esr, self.allow_recompute))

    class IPUStrategy:
        def __init__(self):
            recorder.calls.append(("IPUStrategy",))

    return types.SimpleNamespace(
        config=types.SimpleNamespace(
            IPUConfig=IPUConfig,
            StochasticRoundingBehaviour=types.SimpleNamespace(ON="ON", OFF="OFF")),
        ipu_strategy=types.SimpleNamespace(IPUStrategy=IPUStrategy))


class FakeIPUModel:
    """The tiny EfficientNet plus the pipelining methods Graphcore's Keras adds, recorded."""

    def __init__(self, model, recorder):
        self.model, self.recorder = model, recorder
        self.name, self.block_names = model.name, model.block_names

    def block_layers(self):
        return self.model.block_layers()

    def get_pipeline_stage_assignment(self):
        return [types.SimpleNamespace(layer=layer, pipeline_stage=None)
                for layer in self.model.layers[1:]]

    def set_pipeline_stage_assignment(self, assignments):
        self.recorder.calls.append(("set_pipeline_stage_assignment",
                                    {a.layer.name: a.pipeline_stage for a in assignments}))

    def set_pipelining_options(self, **kwargs):
        self.recorder.calls.append(("set_pipelining_options", kwargs))

    def set_gradient_accumulation_options(self, **kwargs):
        self.recorder.calls.append(("set_gradient_accumulation_options", kwargs))


def test_ipu_mapping_pipelined(tiny):
    recorder = _Recorder()
    module = fake_ipu_module(recorder)
    p = ExecutionPlan(backend="ipu", replicas=8, pipeline_splits=("block4a",),
                      micro_batch_size=3, gradient_accumulation=256, device_iterations=10,
                      precision="mixed_float16")
    ipu.build_ipu_strategy(p, module)
    compile_kwargs = ipu.apply_plan(FakeIPUModel(tiny, recorder), p)
    assert compile_kwargs == {"steps_per_execution": 10}
    names = [c[0] for c in recorder.calls]
    assert names == ["IPUConfig", "configure_ipu_system", "IPUStrategy",
                     "set_pipeline_stage_assignment", "set_pipelining_options"]
    assert recorder.calls[1] == ("configure_ipu_system", 16, "ON", True)
    stages = recorder.calls[3][1]
    assert stages["stem_conv"] == stages["block3a"] == 0
    assert stages["block4a"] == stages["predictions"] == 1
    assert recorder.calls[4][1] == {"gradient_accumulation_steps_per_replica": 256}


def test_ipu_mapping_not_pipelined(tiny):
    recorder = _Recorder()
    module = fake_ipu_module(recorder)
    p = ExecutionPlan(backend="ipu", replicas=4, gradient_accumulation=8)
    ipu.configure(p, module)
    assert ipu.apply_plan(FakeIPUModel(tiny, recorder), p) == {"steps_per_execution": 1}
    assert recorder.calls[1] == ("configure_ipu_system", 4, None, False)  # fp32: no SR
    assert recorder.calls[2] == ("set_gradient_accumulation_options",
                                 {"gradient_accumulation_steps_per_replica": 8})
    with pytest.raises(ValueError, match="powers of two"):
        ipu.configure(ExecutionPlan(backend="ipu", replicas=3), module)


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
    step = train_loop.make_horovod_train_step(model, keras.optimizers.SGD(0.5), LOSS, hvd=hvd)
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
    train_loop.broadcast_variables(model.variables, hvd=hvd)
    for b, v in zip(before, model.variables):
        np.testing.assert_allclose(v, b + 1.0)


def test_run_steps_groups_device_iterations():
    model = _small_model()
    step = train_loop.make_train_step(model, keras.optimizers.SGD(0.1), LOSS,
                                      global_batch_size=2)
    reference_model = _small_model()
    reference = train_loop.make_train_step(reference_model, keras.optimizers.SGD(0.1), LOSS,
                                           global_batch_size=2)
    rng = np.random.default_rng(3)
    batches = [(tf.constant(rng.normal(size=(2, 3)), tf.float32),
                tf.constant(np.eye(2, dtype="float32")[rng.integers(0, 2, 2)]))
               for _ in range(3)]
    grouped = train_loop.run_steps(step, batches, device_iterations=2)
    single = [float(reference(x, y)) for x, y in batches]
    np.testing.assert_allclose(grouped, single, rtol=1e-6)


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
