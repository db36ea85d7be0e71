"""Execution plans at run time: one runtime per strategy behind `training.runtime.Runtime`.

`run(config)` trains a config under its plan (what the CLI does); `make_runtime("mirrored",
replicas=2, ...)` gives a notebook a started runtime. The plan value itself
(`ExecutionPlan`, its batch arithmetic) lives in `keras_efficientnet.training.plan`.
"""

from keras_efficientnet.lazy import lazy_face
from keras_efficientnet.training.plan import (
    PIPELINED_RUNTIME,
    PRECISIONS,
    STRATEGIES,
    STRATEGY_TABLE,
    ExecutionPlan,
    accumulation_for,
    parse_pipeline_splits,
    plan_from_values,
)

# TensorFlow-dependent parts load on first use (`keras_efficientnet.lazy`), so that planning
# and flag validation stay cheap. Public name -> (module, attribute), one line a name; the
# runtime classes come from the strategy table.
_EXPORTS = {
    "make_runtime": (".launch", "make_runtime"),
    "run": (".launch", "run"),
    "runtime_for": (".launch", "runtime_for"),
    "configure_logical_cpus": (".devices", "configure_logical_cpus"),
    "PipelinedModel": (".pipeline", "PipelinedModel"),
    "split_model": (".pipeline", "split_model"),
    "plan_splits": (".planner", "plan_splits"),
    "describe_splits": (".planner", "describe_splits"),
    "unit_costs": (".planner", "unit_costs"),
    "make_train_step": (".train_loop", "make_train_step"),
    "fit": (".train_loop", "fit"),
    **{cls: (module, cls)
       for module, cls in (*(s.runtime for s in STRATEGY_TABLE.values()), PIPELINED_RUNTIME)
       if module.startswith(__name__)},
}

__all__ = ["PRECISIONS", "STRATEGIES", "STRATEGY_TABLE", "ExecutionPlan", "accumulation_for",
           "parse_pipeline_splits", "plan_from_values", *_EXPORTS]
__getattr__, __dir__ = lazy_face(__name__, _EXPORTS, submodules=(
    "devices", "horovod", "ipu", "launch", "mirrored", "multiworker", "pipeline", "planner",
    "train_loop"))
