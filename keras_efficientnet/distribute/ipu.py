"""Thin adapter mapping an ExecutionPlan onto Graphcore's IPU TensorFlow API (untested on IPUs)."""

from __future__ import annotations

from keras_efficientnet.distribute.plan import ExecutionPlan


def import_ipu():
    """`tensorflow.python.ipu`, or an ImportError naming the fix."""
    try:
        from tensorflow.python import ipu
    except ImportError as error:
        raise ImportError(
            f"backend 'ipu' needs Graphcore's TensorFlow wheel from the Poplar SDK ({error}); "
            "install the SDK's tensorflow and ipu_tensorflow_addons wheels and `source "
            "enable.sh`, or choose --backend=default/mirrored") from None
    return ipu


def ipu_count(plan: ExecutionPlan) -> int:
    """IPUs to attach: replicas x pipeline stages (a power of two, as IPU systems require)."""
    count = plan.replicas * plan.num_stages
    if count & (count - 1):
        raise ValueError(f"the plan needs {count} IPUs ({plan.replicas} replicas x "
                         f"{plan.num_stages} stages), but IPUs are attached in powers of two; "
                         "change --replicas or the number of pipeline stages")
    return count


def configure(plan: ExecutionPlan, ipu=None):
    """Builds and applies the IPUConfig of `plan`; returns it."""
    ipu = ipu or import_ipu()
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


def build_ipu_strategy(plan: ExecutionPlan, ipu=None):
    """Configures the IPU system for `plan` and returns an IPUStrategy (build the model in it)."""
    ipu = ipu or import_ipu()
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


def apply_plan(model, plan: ExecutionPlan) -> dict:
    """Sets stages and accumulation on a model built under IPUStrategy; returns compile kwargs.

    Pipelined: `set_pipeline_stage_assignment` (one stage per block range) and
    `set_pipelining_options(gradient_accumulation_steps_per_replica=...)`. Not pipelined:
    `set_gradient_accumulation_options` when accumulating. Device iterations become
    `steps_per_execution` in `model.compile(**returned)`, which is where Graphcore's Keras
    takes them.
    """
    plan = plan.resolve(model)
    if plan.pipelined:
        stages = stage_of_layers(model, plan.pipeline_splits)
        assignments = model.get_pipeline_stage_assignment()
        for assignment in assignments:
            assignment.pipeline_stage = stages[assignment.layer.name]
        model.set_pipeline_stage_assignment(assignments)
        model.set_pipelining_options(
            gradient_accumulation_steps_per_replica=plan.gradient_accumulation)
    elif plan.gradient_accumulation > 1:
        model.set_gradient_accumulation_options(
            gradient_accumulation_steps_per_replica=plan.gradient_accumulation)
    return {"steps_per_execution": plan.device_iterations}
