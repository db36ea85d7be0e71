"""Pipelined, mirrored and multi-worker training against unsplit single-device references."""

from __future__ import annotations

import json

import numpy as np
import pytest

# Relative tolerance on gradients: float32 sums taken in another order differ by ~1e-6 of the
# largest gradient (here about 30, the tiny model's logits being large at initialisation).
RTOL = 1e-5


@pytest.fixture(scope="module")
def multidevice(processes) -> dict:
    log = processes.wait("multidevice")
    line = next(line for line in log.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


@pytest.mark.parametrize("name,devices", [("two", 2), ("four", 4)])
def test_pipelined_step_equals_unsplit_step(multidevice, name, devices):
    result = multidevice[name]
    assert len(set(result["devices"])) == devices  # one stage per logical CPU device
    assert result["forward_diff"] == 0.0
    assert result["grad_diff"] <= RTOL * multidevice["grad_scale"]
    assert result["loss"] == pytest.approx(multidevice["reference_loss"], rel=1e-5)


def test_more_stages_than_devices_is_refused(multidevice):
    message = multidevice["too_many_stages"]
    assert "5 pipeline stages need 5 devices" in message and "4 CPU devices" in message


def test_batch_norm_refused_or_per_micro_batch(multidevice):
    assert "BatchNormalization" in multidevice["bn_refused"]
    assert "allow_batch_norm=True" in multidevice["bn_refused"]
    # Allowed: exactly gradient accumulation over micro-batches, far from the full-batch step.
    assert multidevice["bn_vs_accumulated"] <= RTOL * multidevice["bn_scale"]
    assert multidevice["bn_vs_full_batch"] > 1e-2 * multidevice["bn_scale"]


@pytest.mark.parametrize("name", ["mirrored", "mirrored_accumulating", "pipelined"])
def test_trainer_under_a_plan_equals_keras_fit_on_one_device(multidevice, name):
    # Through trainer.train: mirrored runs Keras fit under MirroredStrategy; mirrored with
    # accumulation and pipelined the project's step and loop with device iterations; the
    # reference is Keras fit on one device on the same global batch.
    result = multidevice["trainer"][name]
    assert result["moved"] > 1e-3  # the two SGD steps changed the weights measurably...
    assert result["weight_diff"] <= 1e-4  # ...and identically to the reference
    np.testing.assert_allclose(result["losses"], multidevice["trainer"]["reference_losses"],
                               rtol=1e-5)


def test_two_sharded_accumulating_workers_equal_one_process(processes):
    # Each worker reads only its shard and accumulates 2 micro-batches of 4 per update; the
    # shards' batches together are the one-device run's batches of 16.
    for name in ("worker0", "worker1", "multidevice"):
        processes.wait(name)
    loaded = {name: np.load(processes.tmp / f"{name}.npz")
              for name in ("worker0", "worker1", "single")}
    keys = [k for k in loaded["single"].files if k.startswith("w")]
    assert len(keys) > 50
    moved = max(np.max(np.abs(loaded["single"][k] - loaded["single"][k.replace("w", "init")]))
                for k in keys)
    assert moved > 1e-3  # training changed the weights, so equality below means something
    for key in keys:
        # The all-reduce gives both workers the same update: bit-identical weights.
        np.testing.assert_array_equal(loaded["worker0"][key], loaded["worker1"][key])
        # Against Keras fit in one process on the same global batch: equal up to float32
        # summation order.
        np.testing.assert_allclose(loaded["worker0"][key], loaded["single"][key],
                                   rtol=1e-4, atol=5e-5)
    np.testing.assert_allclose(loaded["worker0"]["losses"], loaded["single"]["losses"],
                               rtol=1e-4)
    # Only the chief (worker 0) writes checkpoints.
    assert loaded["worker0"]["has_checkpoint"] and not loaded["worker1"]["has_checkpoint"]
    assert not (processes.tmp / "worker1_run").exists()
