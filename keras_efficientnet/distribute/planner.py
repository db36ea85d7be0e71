"""Chooses pipeline splits that balance multiply-accumulates and activation memory per stage."""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass

import keras

from keras_efficientnet.models.macs import layer_macs
from keras_efficientnet.training.plan import ExecutionPlan, check_splits

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UnitCost:
    """One chain unit ("stem", a block, "head"): MACs and activation elements per example."""

    name: str
    macs: int
    activations: int


@dataclass(frozen=True)
class Split:
    """The planner's answer: split points and each stage's share of MACs and activations."""

    splits: tuple[str, ...]
    stages: tuple[tuple[str, ...], ...]
    mac_shares: tuple[float, ...]
    activation_shares: tuple[float, ...]

    def describe(self) -> str:
        lines = [f"Pipeline split at {', '.join(self.splits) or '(none)'}"]
        for i, (units, macs, acts) in enumerate(zip(self.stages, self.mac_shares,
                                                     self.activation_shares)):
            span = units[0] if len(units) == 1 else f"{units[0]}..{units[-1]}"
            lines.append(f"  stage {i}: {span:<18} MACs {100 * macs:5.1f}%  "
                         f"activations {100 * acts:5.1f}%")
        return "\n".join(lines)


def _shape(tensor) -> tuple:
    return (1, *tensor.shape[1:])


def _activation_elements(layer: keras.Layer, input_shape: tuple) -> int:
    # A block's stored activations are its sublayers' outputs (what backprop keeps), not only
    # the block output; walk a composite layer's ordered sublayers when it exposes them.
    inner = getattr(layer, "ordered_layers", None)
    if inner:
        total, shape = 0, input_shape
        for sub in inner:
            shape = sub.compute_output_shape(shape)
            total += math.prod(d for d in shape[1:] if d)
        return total
    return math.prod(d for d in layer.compute_output_shape(input_shape)[1:] if d)


def unit_costs(model: keras.Model) -> list[UnitCost]:
    """MACs and activation elements (per example) of each chain unit of an EfficientNet."""
    costs = []
    for name, layers in model.block_layers().items():
        macs = acts = 0
        for layer in layers:
            shape = _shape(layer.input)
            macs += layer_macs(layer, shape)
            acts += _activation_elements(layer, shape)
        costs.append(UnitCost(name, int(macs), int(acts)))
    return costs


def plan_splits(model: keras.Model, num_stages: int, *,
                activation_weight: float = 1.0) -> Split:
    """Splits the chain into `num_stages` contiguous stages minimising the busiest stage.

    A stage's load is max(MAC share, `activation_weight` x activation share): the slowest stage
    sets the pipeline's pace and the fullest one its memory. Exact by dynamic programming over
    the units ("stem", blocks, "head"); splits fall before a block or the head.
    """
    costs = unit_costs(model)
    if not isinstance(num_stages, int) or not 1 <= num_stages <= len(costs):
        raise ValueError(f"num_stages must be an int in [1, {len(costs)}] for {model.name}, "
                         f"received {num_stages!r}")
    total_macs = sum(c.macs for c in costs) or 1
    total_acts = sum(c.activations for c in costs) or 1
    n = len(costs)
    prefix_m = [0]
    prefix_a = [0]
    for c in costs:
        prefix_m.append(prefix_m[-1] + c.macs)
        prefix_a.append(prefix_a[-1] + c.activations)

    def load(i, j):  # units i..j-1
        return max((prefix_m[j] - prefix_m[i]) / total_macs,
                   activation_weight * (prefix_a[j] - prefix_a[i]) / total_acts)

    inf = float("inf")
    # best[k][j]: least busiest-stage load of units 0..j-1 in k stages; cut[k][j]: last cut.
    best = [[inf] * (n + 1) for _ in range(num_stages + 1)]
    cut = [[0] * (n + 1) for _ in range(num_stages + 1)]
    best[0][0] = 0.0
    for k in range(1, num_stages + 1):
        for j in range(k, n + 1):
            for i in range(k - 1, j):
                value = max(best[k - 1][i], load(i, j))
                if value < best[k][j]:
                    best[k][j], cut[k][j] = value, i
    bounds, j = [], n
    for k in range(num_stages, 0, -1):
        bounds.append(cut[k][j])
        j = cut[k][j]
    return _split_of(costs, sorted(bounds)[1:])  # the first bound is always unit 0


def _split_of(costs: list[UnitCost], starts: list[int]) -> Split:
    """The `Split` whose stages 1, 2, ... start at the units indexed by `starts`."""
    total_macs = sum(c.macs for c in costs) or 1
    total_acts = sum(c.activations for c in costs) or 1
    bounds = [0, *starts, len(costs)]
    spans = list(zip(bounds[:-1], bounds[1:]))
    return Split(
        splits=tuple(costs[s].name for s in starts),
        stages=tuple(tuple(c.name for c in costs[s:e]) for s, e in spans),
        mac_shares=tuple(sum(c.macs for c in costs[s:e]) / total_macs for s, e in spans),
        activation_shares=tuple(sum(c.activations for c in costs[s:e]) / total_acts
                                for s, e in spans))


def describe_splits(model: keras.Model, splits: tuple[str, ...]) -> Split:
    """Each stage's share of MACs and activations for given split points (e.g. from flags)."""
    check_splits(splits, model.block_names, model.name)
    costs = unit_costs(model)
    names = [c.name for c in costs]
    return _split_of(costs, [names.index(s) for s in splits])


def resolve_splits(plan: ExecutionPlan, model: keras.Model) -> ExecutionPlan:
    """`plan` with `auto:N` replaced by the planner's splits, checked on the built `model`; logs
    each stage's share of MACs and activations."""
    if plan.auto_stages:
        plan = dataclasses.replace(plan, auto_stages=0,
                                   pipeline_splits=plan_splits(model, plan.auto_stages).splits)
    plan.check_block_names(model.block_names, model.name)
    if plan.pipelined:
        log.info("%s", describe_splits(model, plan.pipeline_splits).describe())
    return plan
