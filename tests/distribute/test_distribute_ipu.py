"""The IPU mapping against the strict Graphcore stand-in, and the stand-in failing on each fault.

Each training here goes the trainer's way (its model, optimizer, compile and input builders,
the IPU runtime's `start`/`attach`/`fit`) with the Keras 3 model wrapped in the stand-in of a
Graphcore Keras model. The fault tests put back, one at a time, what the mapping used to do, and
show that the stand-in (or the record it keeps, compared with the plan) catches it.
"""

from __future__ import annotations

import pytest

from keras_efficientnet.distribute import ipu, train_loop
from keras_efficientnet.distribute.ipu import IPURuntime
from keras_efficientnet.training import TrainConfig, trainer
from keras_efficientnet.training.plan import ExecutionPlan
from tests.distribute import graphcore_standin as standin

CLASSES = 10
# Graphcore's B4 layout on the tiny model: 3 x 256 x 8 = 6144 on 8 replicas x 2 stages.
B4_LAYOUT = dict(strategy="ipu", replicas=8, pipeline_splits="block4a", micro_batch_size=3,
                 gradient_accumulation=256, device_iterations=16, precision="mixed_float16")


def _config(**changes) -> TrainConfig:
    return TrainConfig(**{
        "model": "efficientnet-tiny-g16-lnpn", "dataset": "synthetic", "train_resolution": 32,
        "test_resolution": 32, "optimizer": "sgd", "updates_per_epoch": 32, **B4_LAYOUT,
        **changes})


def train_on_standin(config: TrainConfig, *, keras_model_only: bool = False) -> standin.Record:
    """One epoch as `trainer.train` runs it, on the stand-in; returns what Graphcore would do."""
    record = standin.Record()
    runtime = IPURuntime(config.plan, ipu=standin.ipu_module(record))
    runtime.start()
    plan = config.plan
    updates = plan.updates_per_epoch(4096, config.updates_per_epoch)
    with runtime.scope():
        model = trainer.build_model(config, config.train_resolution, CLASSES)
        if not keras_model_only:
            model = standin.FunctionalModel(model, record)
        runtime.attach(model)
        schedule = trainer.lr_schedule(config, plan.optimizer_applies_per_epoch(updates), 1, 0.1)
        trainer.compile_model(model, trainer.build_optimizer(config, schedule), config, CLASSES)

    def make_dataset(input_context):
        return trainer.build_datasets(config, config.train_resolution, training=True,
                                      split="train", repeat=True, num_classes=CLASSES,
                                      input_context=input_context)

    runtime.fit(model, make_dataset, epochs=1,
                step_calls_per_epoch=plan.step_calls_per_epoch(updates), verbose=0)
    return record


def check_against_plan(record: standin.Record, plan: ExecutionPlan) -> None:
    """What Graphcore would train with must be what the plan says."""
    assert record.replicas == plan.replicas, "replication factor"
    assert record.effective_batch == plan.global_batch_size, (
        f"Graphcore's effective batch {record.effective_batch} != the plan's "
        f"{plan.describe_global_batch()}")
    assert record.micro_batches_per_update == plan.gradient_accumulation, "accumulation"
    assert record.gradient_scale == 1.0, "micro-batch gradients summed, not averaged"


def test_b4_layout_maps_onto_graphcores_api():
    config = _config()
    record = train_on_standin(config)
    check_against_plan(record, config.plan)
    assert record.calls == ["IPUConfig", "configure_ipu_system", "IPUStrategy",
                            "set_pipeline_stage_assignment", "set_pipelining_options",
                            "compile", "fit"]
    assert (record.ipus, record.esr, record.recompute) == (16, "ON", True)
    # Every layer call before block4a on stage 0, the rest on stage 1.
    assert record.stages["stem_conv"] == record.stages["block3a"] == 0
    assert record.stages["block4a"] == record.stages["predictions"] == 1
    assert (record.accumulation, record.reduction) == (256, "RUNNING_MEAN")
    # 16 updates per host call of 256 micro-batches; 32 updates per epoch on each replica.
    assert record.steps_per_execution == 16 * 256
    assert (record.dataset_batch, record.steps_per_replica) == (3, 32 * 256)


def test_unpipelined_accumulation_and_the_planner_split():
    config = _config(replicas=4, pipeline_splits="", gradient_accumulation=8,
                     device_iterations=2, precision="float32")
    record = train_on_standin(config)
    check_against_plan(record, config.plan)
    assert "set_gradient_accumulation_options" in record.calls and record.stages is None
    assert (record.ipus, record.esr, record.recompute) == (4, None, False)
    auto = train_on_standin(_config(pipeline_splits="auto:2"))
    check_against_plan(auto, _config(pipeline_splits="auto:2").plan)
    assert sorted(set(auto.stages.values())) == [0, 1]


def test_ipus_come_in_powers_of_two():
    assert ipu.ipu_count(ExecutionPlan(strategy="ipu", replicas=2,
                                       pipeline_splits=("b", "c"))) == 8  # 3 stages -> 4 IPUs
    with pytest.raises(ValueError, match="powers of two"):
        ipu.ipu_count(ExecutionPlan(strategy="ipu", replicas=3))


# ---------------------------------------------------------------- the five faults, put back


def test_fault_1_keras3_model_has_no_graphcore_methods(monkeypatch):
    # The mapping refuses a Keras 3 model and says what running needs ...
    with pytest.raises(TypeError, match=r"never on a Keras 3 model.*Poplar SDK"):
        train_on_standin(_config(), keras_model_only=True)
    # ... and calling Graphcore's methods on it anyway fails: the stand-in never adds them.
    monkeypatch.setattr(ipu, "require_graphcore_model", lambda model: None)
    with pytest.raises(AttributeError, match="get_pipeline_stage_assignment"):
        train_on_standin(_config(), keras_model_only=True)


def test_fault_2_steps_per_execution_not_a_multiple_of_the_accumulation(monkeypatch):
    # The old mapping passed --device_iterations (16) as steps_per_execution, with 256.
    monkeypatch.setattr(ExecutionPlan, "step_calls_per_execution",
                        property(lambda plan: plan.device_iterations))
    with pytest.raises(RuntimeError, match=r"\(set to 16\) is not divisible by .* \(256\)"):
        train_on_standin(_config())


def test_fault_3_dataset_batch_of_all_replicas(monkeypatch):
    # The old mapping fed micro-batch x replicas per batch: Graphcore multiplies by the
    # replicas again, 24 x 256 x 8 = 49,152.
    monkeypatch.setattr(IPURuntime, "input_context", lambda self: None)
    record = train_on_standin(_config())
    assert record.effective_batch == 49_152
    with pytest.raises(AssertionError, match="effective batch 49152 != the plan's 6144"):
        check_against_plan(record, _config().plan)


def test_fault_4_the_projects_own_step_ignores_the_stage_assignment(monkeypatch):
    # The old runtime trained pipelined IPU plans with the project's loop, calling model(x).
    def project_loop(self, model, make_dataset, *, epochs, step_calls_per_epoch,
                     initial_epoch=0, start_step=None, callbacks=(), verbose=1, watch=None):
        step = train_loop.make_train_step(model, model.optimizer, model.loss,
                                          global_batch_size=self.plan.examples_per_step_call)
        return train_loop.fit(model, step, make_dataset(self.input_context()), epochs=epochs,
                              step_calls_per_epoch=1, verbose=verbose)

    monkeypatch.setattr(IPURuntime, "fit", project_loop)
    # Raised while tf.function traces the step, which wraps it in a StagingError.
    with pytest.raises(Exception, match="StandInError: .* ignores the pipeline stage assignment"):
        train_on_standin(_config())


def test_fault_5_gradients_accumulated_twice(monkeypatch):
    # The old trainer left the accumulation on the optimizer for IPU plans as well.
    monkeypatch.setattr(ExecutionPlan, "optimizer_applies_per_update",
                        property(lambda plan: plan.gradient_accumulation))
    with pytest.raises(standin.StandInError, match=r"accumulated twice \(65536 micro-batches"):
        train_on_standin(_config())


def test_summed_micro_batch_gradients_are_caught(monkeypatch):
    # Graphcore's default reduction sums: an update 256x the mean gradient of the global batch.
    monkeypatch.setattr(ipu, "REDUCTION", "sum")
    record = train_on_standin(_config())
    assert record.gradient_scale == 256.0
    with pytest.raises(AssertionError, match="summed, not averaged"):
        check_against_plan(record, _config().plan)


def test_stand_in_enforces_graphcores_assignment_rules():
    record = standin.Record()
    runtime = IPURuntime(_config().plan, ipu=standin.ipu_module(record))
    runtime.start()
    model = standin.FunctionalModel(
        trainer.build_model(_config(), 32, CLASSES), record)
    assignments = model.get_pipeline_stage_assignment()
    with pytest.raises(ValueError, match="does not match the total number of invocations"):
        model.set_pipeline_stage_assignment(assignments[1:])
    with pytest.raises(ValueError, match="has not been assigned a pipeline stage"):
        model.set_pipeline_stage_assignment(assignments)
    for i, a in enumerate(assignments):
        a.pipeline_stage = 0 if i < len(assignments) - 1 else 2
    with pytest.raises(ValueError, match=r"strictly increasing, found pipeline stages \[0, 2\]"):
        model.set_pipeline_stage_assignment(assignments)
    for i, a in enumerate(assignments):
        a.pipeline_stage = 1 if i == 0 else 0  # the stem on a later stage than what reads it
    with pytest.raises(ValueError, match="dependency from a pipeline stage which has not"):
        model.set_pipeline_stage_assignment(assignments)
    with pytest.raises(ValueError, match="Cannot parse avg"):
        model.set_pipelining_options(gradient_accumulation_steps_per_replica=2,
                                     gradient_accumulation_reduction_method="avg")


def test_cli_strategy_ipu_says_what_running_needs_before_any_work(tmp_path):
    from keras_efficientnet.distribute import run

    config = _config(model_dir=str(tmp_path))
    with pytest.raises(ImportError) as error:
        run(config)
    message = str(error.value)
    assert "\n" not in message
    for needed in ("Poplar SDK", "TensorFlow 2.6", "Keras 2.6", "set_pipelining_options",
                   "Keras 3", "stand-in", "--strategy=mirrored"):
        assert needed in message
    assert not any(tmp_path.iterdir())
