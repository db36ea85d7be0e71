"""ExecutionPlan: global batch, flags, printed summary and the errors for bad input."""

from __future__ import annotations

import importlib.util
import socket

import pytest

from keras_efficientnet.distribute import strategies
from keras_efficientnet.distribute.plan import (
    ExecutionPlan, accumulation_for, parse_pipeline_splits, plan, plan_from_flags_dict)


def test_large_batch_recipe_global_batch_and_devices():
    # Graphcore's B4 large-batch run: 3 x 256 x 8 = 6144 on 8 replicas x 2 stages.
    p = ExecutionPlan(backend="ipu", replicas=8, pipeline_splits=("block4a",),
                      micro_batch_size=3, gradient_accumulation=256, precision="mixed_float16")
    assert (p.global_batch_size, p.num_stages, p.devices_needed) == (6144, 2, 16)
    assert p.learning_rate(2 ** -9.5) == pytest.approx(8.485, abs=1e-3)
    text = p.describe()
    assert "6144 = 3 x 256 x 8" in text and "block4a" in text and "stochastic rounding" in text


def test_flags_dict_and_auto_planner_flag():
    p = plan_from_flags_dict({"backend": "default", "replicas": 1,
                              "pipeline_splits": "", "micro_batch_size": 4,
                              "gradient_accumulation": 3, "device_iterations": 5,
                              "precision": "float32", "unrelated_flag": 1})
    assert (p.replicas, p.global_batch_size, p.device_iterations) == (1, 12, 5)
    assert plan_from_flags_dict({"pipeline_splits": "block2a, block4a"}).pipeline_splits == (
        "block2a", "block4a")
    auto = plan_from_flags_dict({"pipeline_splits": "auto:3"})
    assert (auto.auto_stages, auto.num_stages, auto.pipeline_splits) == (3, 3, ())
    assert parse_pipeline_splits("auto:1") == ((), 0)
    derived = plan_from_flags_dict({"micro_batch_size": 4, "global_batch_size": 32})
    assert derived.gradient_accumulation == 8


def test_global_batch_that_cannot_be_formed():
    assert accumulation_for(6144, 3, 8) == 256
    with pytest.raises(ValueError, match=r"global batch 100 cannot be formed.*multiple of 24"):
        accumulation_for(100, 3, 8)
    with pytest.raises(ValueError, match="needs gradient accumulation 8"):
        plan_from_flags_dict({"micro_batch_size": 4, "global_batch_size": 32,
                              "gradient_accumulation": 3})
    with pytest.raises(ValueError, match="not implemented"):  # 32 = 4 x 2 x 4 on mirrored
        plan_from_flags_dict({"micro_batch_size": 4, "replicas": 4, "backend": "mirrored",
                              "global_batch_size": 32})


@pytest.mark.parametrize("kwargs,pattern", [
    (dict(backend="tpu"), "backend must be one of"),
    (dict(replicas=0), "replicas must be a positive int, received 0"),
    (dict(precision="fp8"), "precision must be one of"),
    (dict(replicas=2), "backend 'default' runs one replica"),
    (dict(backend="mirrored", replicas=2, pipeline_splits=("block4a",)),
     "only on the IPU backend"),
    (dict(pipeline_splits=("block4a", "block4a")), "repeats a block"),
    (dict(backend="multiworker", replicas=2, gradient_accumulation=2), "not implemented"),
    (dict(pipeline_splits=("block4a",), auto_stages=2), "not both"),
])
def test_invalid_plans(kwargs, pattern):
    with pytest.raises(ValueError, match=pattern):
        ExecutionPlan(**kwargs)


class _Blocks:
    name = "efficientnet_tiny"
    block_names = ("block1a", "block2a", "block3a", "block4a")


def test_unknown_or_unordered_split_and_too_few_devices():
    with pytest.raises(ValueError, match=r"'block9z' is not a block.*valid split points"):
        ExecutionPlan(pipeline_splits=("block9z",)).check_model(_Blocks())
    with pytest.raises(ValueError, match=r"forward order.*\['block2a', 'block4a'\]"):
        ExecutionPlan(pipeline_splits=("block4a", "block2a")).check_model(_Blocks())
    with pytest.raises(ValueError, match=r"needs 4 devices \(1 replicas x 4 pipeline stages\)"):
        ExecutionPlan(pipeline_splits=("block2a", "block3a", "block4a")).check_devices(2)


def test_notebook_entry_prints_the_plan(capsys):
    runtime = plan(micro_batch_size=4, gradient_accumulation=2)
    assert "global batch          8 = 4 x 2 x 1" in capsys.readouterr().out
    assert runtime.plan.global_batch_size == 8
    with runtime.scope():
        pass


def test_multiworker_config_and_unreachable_peer():
    with pytest.raises(ValueError, match="needs the TF_CONFIG environment variable"):
        strategies.read_tf_config({})
    with pytest.raises(ValueError, match="malformed"):
        strategies.read_tf_config({"TF_CONFIG": "{not json"})
    # A port nobody listens on: bind, read the number, close.
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    config = {"cluster": {"worker": ["127.0.0.1:1", f"127.0.0.1:{port}"]},
              "task": {"type": "worker", "index": 0}}
    with pytest.raises(ConnectionError, match=rf"127\.0\.0\.1:{port} \(worker 1.*Fix: start"):
        strategies.check_peers(config, timeout=0.3, interval=0.1)


@pytest.mark.skipif(importlib.util.find_spec("horovod") is not None
                    or importlib.util.find_spec("tensorflow.python.ipu") is not None,
                    reason="horovod or the IPU SDK is installed")
def test_missing_backend_packages_say_how_to_install():
    from keras_efficientnet.distribute import ipu, train_loop

    with pytest.raises(ImportError, match="make install-horovod"):
        train_loop.import_horovod()
    with pytest.raises(ImportError, match="Poplar SDK"):
        ipu.import_ipu()
    with pytest.raises(ImportError, match="make install-horovod"):
        strategies.build_strategy(ExecutionPlan(backend="horovod"))
