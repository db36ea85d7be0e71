"""The plan on Graphcore IPUs: IPUConfig, IPUStrategy and Graphcore's Keras pipelining options.

This cannot run today (see `IPU_REQUIREMENTS`): Graphcore's Keras API lives on its fork of
Keras 2.6, which Keras 3 code cannot use. The mapping below is written against Graphcore's
sources (graphcore/tensorflow `tensorflow/python/ipu/`, graphcore/keras r2.6
`keras/ipu/extensions/`) and checked against a stand-in that enforces their constraints
(tests/distribute/graphcore_standin.py):

- stage assignment and accumulation exist only on Graphcore's Functional/Sequential models;
- a pipelined model trains through Graphcore's `fit`, which builds the pipeline from the
  assignment; calling the model (a custom step) ignores the assignment;
- `steps_per_execution` must be a multiple of the accumulation count;
- the dataset batch is the per-replica micro-batch (effective batch = batch x accumulation x
  replicas), and `fit`'s `steps_per_epoch` counts batches of all replicas together;
- Graphcore accumulates (pipelining or accumulation options), so the optimizer must not, and
  its default reduction sums micro-batch gradients: the mapping asks for their running mean,
  as Graphcore's own CNN examples do, so that an update is the mean over the global batch.
"""

from __future__ import annotations

import importlib.metadata
import math

import tensorflow as tf

from keras_efficientnet.distribute.planner import resolve_splits
from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import RuntimeBase, first_step, skip_seen

IPU_REQUIREMENTS = (
    "--strategy=ipu needs Graphcore's Poplar SDK on a machine with IPUs: its TensorFlow 2.6 "
    "wheel (tensorflow.python.ipu: IPUConfig, IPUStrategy) and its fork of Keras 2.6, whose "
    "Functional and Sequential models carry get_pipeline_stage_assignment, "
    "set_pipeline_stage_assignment, set_pipelining_options and "
    "set_gradient_accumulation_options. This project is written for Keras 3, which needs "
    "TensorFlow >= 2.16 and whose models have none of those methods, so it cannot run on the SDK "
    "today; its IPU mapping (keras_efficientnet/distribute/ipu.py) is checked only against a "
    "stand-in of Graphcore's API. On GPUs the same global batch runs with --strategy=mirrored "
    "--replicas=N --gradient_accumulation=M and no --pipeline_splits")

# What Graphcore's Keras fork adds to its models (keras/ipu/extensions), used by the mapping.
GRAPHCORE_MODEL_METHODS = ("get_pipeline_stage_assignment", "set_pipeline_stage_assignment",
                           "set_pipelining_options", "set_gradient_accumulation_options")
# Graphcore's GradientAccumulationReductionMethod, by name: "sum" (its default) adds the
# micro-batch gradients; "running_mean" averages them, which keeps the update's scale.
REDUCTION = "running_mean"


def ipu_unavailable() -> ImportError:
    """The error `--strategy=ipu` gives before any work: what running needs, and why not here."""
    try:
        keras_version = importlib.metadata.version("keras")
    except importlib.metadata.PackageNotFoundError:
        keras_version = "not installed"
    return ImportError(f"{IPU_REQUIREMENTS} (installed here: Keras {keras_version})")


def require_graphcore_model(model) -> None:
    """Raises unless `model` carries Graphcore's IPU extension (a model of its Keras fork)."""
    missing = [m for m in GRAPHCORE_MODEL_METHODS if not callable(getattr(model, m, None))]
    if missing:
        raise TypeError(
            f"{getattr(model, 'name', model)!r} has no {', '.join(missing)}: Graphcore puts "
            f"them only on models of its Keras 2.6 fork, never on a Keras 3 model. "
            f"{IPU_REQUIREMENTS}")


def ipus_per_replica(plan: ExecutionPlan) -> int:
    """IPUs one replica takes: its stages, rounded up to a power of two as Graphcore's Keras
    does (replication factor = attached IPUs // that)."""
    return 2 ** math.ceil(math.log2(plan.num_stages))


def ipu_count(plan: ExecutionPlan) -> int:
    """IPUs to attach: replicas x IPUs per replica (a power of two, as IPU systems require)."""
    count = plan.replicas * ipus_per_replica(plan)
    if count & (count - 1):
        raise ValueError(f"the plan needs {count} IPUs ({plan.replicas} replicas x "
                         f"{ipus_per_replica(plan)} IPUs per replica), but IPUs are attached in "
                         "powers of two; make --replicas a power of two")
    return count


def configure(plan: ExecutionPlan, ipu):
    """Builds and applies the IPUConfig of `plan` (`ipu`: tensorflow.python.ipu); returns it."""
    config = ipu.config.IPUConfig()
    config.auto_select_ipus = ipu_count(plan)
    if plan.uses_stochastic_rounding:
        # SDK 3.x takes an enum, SDK 2.x a bool.
        behaviour = getattr(ipu.config, "StochasticRoundingBehaviour", None)
        config.floating_point_behaviour.esr = behaviour.ON if behaviour is not None else True
    if plan.pipelined:
        # Pipelined training recomputes each stage's forward in its backward to save memory.
        config.allow_recompute = True
    config.configure_ipu_system()
    return config


def build_ipu_strategy(plan: ExecutionPlan, ipu):
    """Configures the IPU system for `plan` and returns an IPUStrategy (build the model in it)."""
    configure(plan, ipu)
    return ipu.ipu_strategy.IPUStrategy()


def stage_of_layers(model, splits: tuple[str, ...]) -> dict[str, int]:
    """Pipeline stage of each top-level layer of an EfficientNet, cut before each split."""
    stage, stages = 0, {}
    for unit, layers in model.block_layers().items():
        if unit in splits:
            stage += 1
        for layer in layers:
            stages[layer.name] = stage
    return stages


def apply_plan(model, plan: ExecutionPlan) -> None:
    """Sets stages and accumulation on a model of Graphcore's Keras, built under IPUStrategy,
    before `compile` (`steps_per_execution=plan.steps_per_execution`) and `fit`.

    Pipelined: every layer call gets its stage (`set_pipeline_stage_assignment`) and
    `set_pipelining_options` the accumulation count (pipelined models always accumulate). Not
    pipelined: `set_gradient_accumulation_options` when accumulating. Either way the micro-batch
    gradients are averaged (`REDUCTION`), not summed.
    """
    require_graphcore_model(model)
    if plan.pipelined:
        stages = stage_of_layers(model, plan.pipeline_splits)
        assignments = model.get_pipeline_stage_assignment()
        for assignment in assignments:
            assignment.pipeline_stage = stages[assignment.layer.name]
        model.set_pipeline_stage_assignment(assignments)
        model.set_pipelining_options(
            gradient_accumulation_steps_per_replica=plan.gradient_accumulation,
            gradient_accumulation_reduction_method=REDUCTION)
    elif plan.gradient_accumulation > 1:
        model.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=plan.gradient_accumulation,
            gradient_accumulation_reduction_method=REDUCTION)


class IPURuntime(RuntimeBase):
    """The plan on IPUs through Graphcore's Keras: its `fit` runs the pipeline and accumulates.

    `start()` raises `ipu_unavailable()` unless Graphcore's `tensorflow.python.ipu` is given
    (only a stand-in can be, today: see the module docstring).

    Args:
        plan: an `ExecutionPlan` with strategy "ipu".
        ipu: `tensorflow.python.ipu`, or a stand-in with the same API.
    """

    evaluates_in_place = False  # a Graphcore model: evaluate a one-device copy

    def __init__(self, plan: ExecutionPlan, *, ipu=None):
        self.plan = plan
        self.ipu = ipu
        self.strategy = None

    def start(self) -> None:
        if self.ipu is None:
            raise ipu_unavailable()
        self.strategy = build_ipu_strategy(self.plan, self.ipu)

    def scope(self):
        return self.strategy.scope()

    def attach(self, model) -> None:
        require_graphcore_model(model)
        self.plan = resolve_splits(self.plan, model)
        apply_plan(model, self.plan)

    def input_context(self) -> tf.distribute.InputContext:
        """One input pipeline feeding every replica: Graphcore's infeed hands the replicas
        consecutive batches, each one replica's micro-batch."""
        return tf.distribute.InputContext(num_input_pipelines=1, input_pipeline_id=0,
                                          num_replicas_in_sync=self.plan.replicas)

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        data = skip_seen(make_dataset(self.input_context()),
                         first_step(initial_epoch, step_calls_per_epoch, start_step),
                         batches_per_step_call=self.plan.replicas)
        # Graphcore's `fit` counts the batches of all replicas (each replica runs
        # steps_per_epoch / replicas steps); ours counts one replica's step calls.
        return model.fit(data, epochs=epochs, initial_epoch=initial_epoch,
                         steps_per_epoch=step_calls_per_epoch * self.plan.replicas,
                         callbacks=list(callbacks), verbose=verbose)
