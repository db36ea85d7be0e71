"""From a config or a few keywords to a started runtime: the one place that picks the strategy."""

from __future__ import annotations

import importlib
import logging

from keras_efficientnet.training.config import TrainConfig
from keras_efficientnet.training.plan import (
    PIPELINED_RUNTIME,
    STRATEGY_TABLE,
    ExecutionPlan,
    plan_from_values,
)
from keras_efficientnet.training.runtime import Runtime

log = logging.getLogger(__name__)


def runtime_for(plan: ExecutionPlan | TrainConfig, **options) -> Runtime:
    """The (not yet started) runtime of a plan, or of a config's plan with the config's
    runtime settings (the strategy's `runtime_options`, e.g. `--peer_timeout`); `options` go to
    the runtime."""
    if isinstance(plan, TrainConfig):
        config, plan = plan, plan.plan
        options = {**{keyword: getattr(config, name) for keyword, name in
                      STRATEGY_TABLE[plan.strategy].runtime_options.items()}, **options}
    strategy = STRATEGY_TABLE[plan.strategy]
    module, name = (PIPELINED_RUNTIME if plan.strategy == "default" and plan.pipelined
                    else strategy.runtime)
    # Imported on use: each strategy's packages (horovod, the IPU SDK) load only when asked for.
    return getattr(importlib.import_module(module), name)(plan, **options)


def make_runtime(strategy: str = "default", **plan_fields) -> Runtime:
    """One call for notebooks: the plan of `strategy` and `plan_fields` (as the flags:
    replicas, pipeline_splits, micro_batch_size, gradient_accumulation, global_batch_size,
    device_iterations, precision; and `peer_timeout` for multiworker), checked, logged and
    started.

    Start it first thing (mirrored splits the CPU into logical devices when there is no GPU,
    which must precede TensorFlow's device initialisation).

    Example:
        >>> rt = ke.distribute.make_runtime("mirrored", replicas=2, micro_batch_size=8)
        >>> with rt.scope():
        ...     model = ke.EfficientNet("tiny", classes=4)
    """
    known = STRATEGY_TABLE[strategy].runtime_options if strategy in STRATEGY_TABLE else {}
    options = {keyword: plan_fields.pop(name) for keyword, name in known.items()
               if name in plan_fields}
    plan = plan_from_values({"strategy": strategy, **plan_fields})
    log.info("%s", plan.describe())
    runtime = runtime_for(plan, **options)
    runtime.start()
    return runtime


def run(config: TrainConfig, runtime: Runtime | None = None, session=None) -> dict:
    """Trains and evaluates `config` under its execution plan: what the CLI runs.

    Builds the runtime of the config's plan and starts it (a missing package, too few devices
    or an unreachable peer fail here, before any work; multi-worker strategies also need this
    to precede other TensorFlow ops), then runs `training.train_and_evaluate(config, runtime,
    session)` (`session`: the run's entered `training.session.RunSession`, or None for its own).
    """
    from keras_efficientnet.training.trainer import train_and_evaluate

    if runtime is None:
        runtime = runtime_for(config)
        runtime.start()
    return train_and_evaluate(config, runtime=runtime, session=session)
