"""Execution plans at run time: one runtime per strategy behind `training.runtime.Runtime`.

`run(config)` trains a config under its plan (what the CLI does); `make_runtime("mirrored",
replicas=2, ...)` gives a notebook a started runtime. The plan value itself
(`ExecutionPlan`, its batch arithmetic) lives in `keras_efficientnet.training.plan`.
"""

import importlib

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

# TensorFlow-dependent parts load on first use, so that planning and flag validation stay cheap.
# name -> module: the runtime classes come from the strategy table.
_LAZY = {
    "make_runtime": "launch", "run": "launch", "runtime_for": "launch",
    "configure_logical_cpus": "devices",
    "PipelinedModel": "pipeline", "split_model": "pipeline",
    "plan_splits": "planner", "describe_splits": "planner", "unit_costs": "planner",
    "make_train_step": "train_loop", "fit": "train_loop",
    **{cls: module.rpartition(".")[2]
       for module, cls in (*(s.runtime for s in STRATEGY_TABLE.values()), PIPELINED_RUNTIME)
       if module.startswith(__name__)},
}
_MODULES = ("devices", "horovod", "ipu", "launch", "mirrored", "multiworker", "pipeline",
            "planner", "train_loop")


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"{__name__}.{_LAZY[name]}")
        return getattr(module, name)
    if name in _MODULES:
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["PRECISIONS", "STRATEGIES", "STRATEGY_TABLE", "ExecutionPlan", "accumulation_for",
           "parse_pipeline_splits", "plan_from_values", *_LAZY]
