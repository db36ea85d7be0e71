"""Execution plans: replicas, pipeline stages, gradient accumulation, multi-worker, horovod, IPU."""

import importlib

from keras_efficientnet.distribute.plan import (
    BACKENDS, PRECISIONS, ExecutionPlan, Runtime, accumulation_for, parse_pipeline_splits, plan,
    plan_from_flags_dict, run, runtime_for)

# TensorFlow-dependent parts load on first use, so that planning and flag validation stay cheap.
_LAZY = {
    "PipelinedModel": "pipeline", "split_model": "pipeline", "batch_norm_layers": "pipeline",
    "plan_splits": "planner", "unit_costs": "planner", "describe_splits": "planner",
    "build_strategy": "strategies", "configure_logical_cpus": "strategies",
    "check_peers": "strategies", "read_tf_config": "strategies",
    "make_train_step": "train_loop", "make_horovod_train_step": "train_loop",
    "distribute_batch": "train_loop", "run_steps": "train_loop",
    "broadcast_variables": "train_loop", "fit": "train_loop",
    "apply_plan": "ipu", "build_ipu_strategy": "ipu",
}


def __getattr__(name):
    if name in _LAZY:
        module = importlib.import_module(f"keras_efficientnet.distribute.{_LAZY[name]}")
        return getattr(module, name)
    if name in ("pipeline", "planner", "strategies", "train_loop", "ipu"):
        return importlib.import_module(f"keras_efficientnet.distribute.{name}")
    raise AttributeError(f"module 'keras_efficientnet.distribute' has no attribute {name!r}")


__all__ = ["BACKENDS", "PRECISIONS", "ExecutionPlan", "Runtime", "accumulation_for",
           "parse_pipeline_splits", "plan", "plan_from_flags_dict", "run", "runtime_for", *_LAZY]
