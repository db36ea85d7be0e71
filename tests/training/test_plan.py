"""training.plan: batch arithmetic per strategy, flags, text, and the errors for bad input."""

from __future__ import annotations

import pytest

from keras_efficientnet.training.plan import (
    ExecutionPlan,
    accumulation_for,
    check_splits,
    parse_pipeline_splits,
    plan_from_values,
)


def test_large_batch_recipe_on_ipus():
    # Graphcore's B4 large-batch run: 3 x 256 x 8 = 6144 on 8 replicas x 2 stages. Graphcore's
    # dataset batch is the per-replica micro-batch and its steps_per_execution counts
    # micro-batches: 16 updates per host call = 16 x 256 steps, a multiple of 256.
    p = ExecutionPlan(strategy="ipu", replicas=8, pipeline_splits=("block4a",),
                      micro_batch_size=3, gradient_accumulation=256, device_iterations=16,
                      precision="mixed_float16")
    assert (p.global_batch_size, p.num_stages, p.devices_needed) == (6144, 2, 16)
    assert (p.examples_per_step_call, p.step_calls_per_execution) == (24, 4096)
    assert p.optimizer_applies_per_update == 1  # Graphcore accumulates, the optimizer must not
    # ImageNet's 1,281,167 images: 208 updates of 6144, a multiple of 16 host calls.
    assert p.updates_per_epoch(1_281_167) == 208
    assert p.step_calls_per_epoch(208) == 208 * 256
    assert p.optimizer_applies_per_epoch(208) == 208
    text = p.describe()
    assert "6144 = 3 x 256 x 8" in text and "block4a" in text and "stochastic rounding" in text


@pytest.mark.parametrize("strategy,replicas,splits,expect", [
    # (micro-batches per step call, examples per step call, step calls per update,
    #  optimizer applies per update, step calls per execution with 3 device iterations)
    ("default", 1, (), (1, 4, 6, 6, 18)),             # Keras' optimizer accumulates
    ("default", 1, ("block3a",), (6, 24, 1, 1, 3)),   # the pipelined step accumulates
    ("mirrored", 2, (), (6, 48, 1, 1, 3)),            # one process cuts the whole step
    ("multiworker", 2, (), (6, 48, 1, 1, 3)),         # each worker reads its shard of it
    ("horovod", 4, (), (6, 96, 1, 1, 3)),
    ("ipu", 2, (), (1, 8, 6, 1, 18)),                 # Graphcore accumulates
])
def test_batch_arithmetic_of_every_strategy(strategy, replicas, splits, expect):
    p = ExecutionPlan(strategy=strategy, replicas=replicas, pipeline_splits=splits,
                      micro_batch_size=4, gradient_accumulation=6, device_iterations=3)
    got = (p.micro_batches_per_step_call, p.examples_per_step_call, p.step_calls_per_update,
           p.optimizer_applies_per_update, p.step_calls_per_execution)
    assert got == expect
    # Whatever the layout, an update is the same number of examples: step calls per update x
    # examples per step call, and it is what the learning rate is scaled by.
    assert p.step_calls_per_update * p.examples_per_step_call == p.examples_per_update
    assert p.examples_per_update == p.global_batch_size == 24 * replicas
    assert p.micro_batches_per_update == 6 and p.examples_per_forward_pass == 4 * replicas


def test_updates_per_epoch_from_examples_or_flag():
    p = ExecutionPlan(micro_batch_size=8, gradient_accumulation=2)
    assert p.updates_per_epoch(100) == 6  # 100 // 16
    assert p.updates_per_epoch(100, requested=4) == 4
    assert p.step_calls_per_epoch(4) == 8 and p.optimizer_applies_per_epoch(4) == 8
    with pytest.raises(ValueError, match=r"10 examples cannot form one optimizer update of 16"):
        p.updates_per_epoch(10)
    ipu = ExecutionPlan(strategy="ipu", replicas=2, micro_batch_size=2, device_iterations=4)
    assert ipu.updates_per_epoch(100) == 24  # 25 rounded down to whole host calls of 4
    with pytest.raises(ValueError, match="no whole host call"):
        ipu.updates_per_epoch(100, requested=3)


def test_values_and_the_auto_planner_flag():
    p = plan_from_values({"strategy": "default", "replicas": 1, "pipeline_splits": "",
                          "micro_batch_size": 4, "gradient_accumulation": 3,
                          "device_iterations": 5, "precision": "float32", "unrelated_flag": 1})
    assert (p.replicas, p.global_batch_size, p.device_iterations) == (1, 12, 5)
    assert plan_from_values({"pipeline_splits": "block2a, block4a"}).pipeline_splits == (
        "block2a", "block4a")
    auto = plan_from_values({"pipeline_splits": "auto:3"})
    assert (auto.auto_stages, auto.num_stages, auto.pipeline_splits) == (3, 3, ())
    assert parse_pipeline_splits("auto:1") == ((), 0)
    assert parse_pipeline_splits(["block2a", "block4a"]) == (("block2a", "block4a"), 0)
    derived = plan_from_values({"micro_batch_size": 4, "global_batch_size": 32})
    assert derived.gradient_accumulation == 8


def test_global_batch_with_replicas_derives_the_accumulation():
    # 768 on 8 GPUs: micro-batch 32 x 3 accumulated x 8 replicas.
    p = plan_from_values({"strategy": "mirrored", "replicas": 8, "micro_batch_size": 32,
                          "global_batch_size": 768})
    assert (p.gradient_accumulation, p.micro_batches_per_step_call, p.examples_per_step_call) == (
        3, 3, 768)


def test_global_batch_that_cannot_be_formed():
    assert accumulation_for(6144, 3, 8) == 256
    assert accumulation_for(6144, 3, 8, given=256) == 256
    with pytest.raises(ValueError, match=r"global_batch_size=100 must be a multiple of .* = 24 "):
        accumulation_for(100, 3, 8)
    with pytest.raises(ValueError, match="needs --gradient_accumulation=8.*give one of"):
        plan_from_values({"micro_batch_size": 4, "global_batch_size": 32,
                          "gradient_accumulation": 3})


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(strategy="tpu"), "--strategy must be one of"),
    (dict(replicas=0), "replicas must be a positive int, received 0"),
    (dict(precision="fp8"), "precision must be one of"),
    (dict(replicas=2), "--strategy=default runs one replica"),
    (dict(strategy="mirrored", replicas=2, pipeline_splits=("block4a",)),
     "run only with --strategy=ipu"),
    (dict(strategy="mirrored", pipeline_splits=("block4a",)), "is not supported"),
    (dict(pipeline_splits=("block4a", "block4a")), "repeats a block"),
    (dict(pipeline_splits=("block4a",), auto_stages=2), "not both"),
])
def test_invalid_plans(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ExecutionPlan(**kwargs)


def test_unknown_or_unordered_split_and_too_few_devices():
    names = ("block1a", "block2a", "block3a", "block4a")
    with pytest.raises(ValueError, match=r"'block9z' is not a block.*valid split points"):
        check_splits(("block9z",), names, "efficientnet_tiny")
    with pytest.raises(ValueError, match=r"forward order.*\['block2a', 'block4a'\]"):
        ExecutionPlan(pipeline_splits=("block4a", "block2a")).check_block_names(names, "m")
    check_splits(("block2a", "head"), names, "m")  # "head" is a split point too
    with pytest.raises(ValueError, match=r"needs 4 devices \(1 replicas x 4 pipeline stages\)"):
        ExecutionPlan(pipeline_splits=("block2a", "block3a", "block4a")).check_devices(2)


def test_fine_tune_plan_keeps_the_layout_and_changes_the_update():
    p = ExecutionPlan(strategy="mirrored", replicas=2, micro_batch_size=8, gradient_accumulation=3)
    tuned = p.with_examples_per_update(64, "--finetune_batch_size")
    assert (tuned.replicas, tuned.micro_batch_size, tuned.strategy) == (2, 8, "mirrored")
    assert (tuned.micro_batches_per_update, tuned.examples_per_update) == (4, 64)
    with pytest.raises(ValueError, match=r"--finetune_batch_size=40 must be a multiple of "
                                         r"--micro_batch_size=8 x --replicas=2 = 16 .*; use 32 "
                                         r"or 48"):
        p.with_examples_per_update(40, "--finetune_batch_size")


def test_one_strategy_table():
    from keras_efficientnet.training.plan import STRATEGIES, STRATEGY_TABLE

    assert STRATEGIES == tuple(STRATEGY_TABLE) == (
        "default", "mirrored", "multiworker", "horovod", "ipu")
    assert [n for n, s in STRATEGY_TABLE.items() if s.step_accumulates] == [
        "mirrored", "multiworker", "horovod"]
    assert [n for n, s in STRATEGY_TABLE.items() if not s.one_process] == [
        "multiworker", "horovod"]


def test_no_function_of_the_package_takes_an_ambiguous_steps_per_epoch():
    # Issue 19: "steps per epoch" meant optimizer updates, step calls and optimizer applies in
    # three places. Every count now names its unit; Keras' own fit(steps_per_epoch=) is only
    # ever called with a step-call count, never taken as a parameter of ours.
    import ast
    import pathlib

    package = pathlib.Path(__file__).resolve().parents[2] / "keras_efficientnet"
    found = []
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                args = node.args
                names = [a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)]
                if "steps_per_epoch" in names:
                    found.append(f"{path.relative_to(package)}:{node.lineno}")
    assert found == []
