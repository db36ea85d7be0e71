"""Trainer: config validation, atomic checkpoints, fine-tune, CLI (resume: tests/reliability)."""

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

pytestmark = pytest.mark.tf_only

from keras_efficientnet.training import (  # noqa: E402
    CheckpointManager,
    NonFiniteLossError,
    NonFiniteLossGuard,
    TrainConfig,
    lr_schedule,
    trainer,
)
from keras_efficientnet.training.config import ResolutionRuleWarning  # noqa: E402

REPO = Path(__file__).resolve().parents[2]

TINY = dict(model="efficientnet-tiny-g16-lnpn", dataset="synthetic", train_resolution=32,
            test_resolution=32, micro_batch_size=8, updates_per_epoch=3, eval_steps=1, verbose=0,
            optimizer="sgd", learning_rate=0.01, lr_schedule="cosine", warmup_epochs=0.5,
            label_smoothing=0.0, drop_connect_rate=0.0, dropout_rate=0.0,
            keep_checkpoints=2, seed=3)


def _config(tmp_path, **changes):
    return TrainConfig(**{**TINY, "model_dir": str(tmp_path / "run"), **changes})


@pytest.mark.parametrize("changes,match", [
    (dict(optimizer="adamw"), r"--optimizer='adamw' is not valid; choose one of \['rmsprop'"),
    (dict(model="efficientnet-b9"), "--model='efficientnet-b9' is not a known preset"),
    (dict(micro_batch_size=0), "--micro_batch_size must be >= 1"),
    (dict(label_smoothing=1.5), r"--label_smoothing must be in \[0, 1\)"),
    (dict(train_resolution=16), "--train_resolution must be 0"),
    (dict(peer_timeout=0.0), "--peer_timeout must be > 0 seconds, received 0.0"),
    (dict(peer_timeout=float("nan")), "--peer_timeout must be a finite number, received nan"),
])
def test_bad_flags_name_the_flag_and_the_valid_values(changes, match):
    with pytest.raises(ValueError, match=match):
        TrainConfig(**changes)


def test_config_round_trips_through_a_dict():
    config = TrainConfig(epochs=3, optimizer="lars")
    assert TrainConfig.from_dict(config.to_dict()) == config
    assert config.replace(micro_batch_size=4, gradient_accumulation=8, replicas=2,
                          strategy="mirrored").global_batch_size == 64
    with pytest.raises(ValueError, match="unknown config fields"):
        TrainConfig.from_dict({"epoch": 3})


def test_schedule_follows_graphcores_exponential_recipe():
    # 5 warm-up epochs of 10 steps; x0.97 every 350 / 146 epochs counted from step 0, warm-up
    # included (Graphcore's LR_Schedules/exponential.py): the warm-up ramps to the decayed rate.
    config = TrainConfig(lr_schedule="exponential", warmup_epochs=5, decay_epochs=350 / 146,
                         decay_rate=0.97)
    schedule = lr_schedule(config, optimizer_applies_per_epoch=10, epochs=350, peak=0.046875)
    period = 3500 / 146  # steps per drop
    table = {0: 0.0, 23: 0.046875 * 23 / 50, 25: 0.046875 * 0.97 * 25 / 50,
             50: 0.046875 * 0.97 ** 2, 71: 0.046875 * 0.97 ** 2, 72: 0.046875 * 0.97 ** 3,
             3499: 0.046875 * 0.97 ** 145, 3500: 0.046875 * 0.97 ** 146}
    assert math.floor(72 / period) == 3 and math.floor(71 / period) == 2
    for step, expected in table.items():
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-9)


def test_finetune_follows_graphcores_recipe():
    # B0 recipe: train at 768 = 32 x 24; fine-tune 2 epochs at 512 (32 x 16 accumulated), peak
    # 2^-11 x 512 = 0.25, cosine counted from step 0 under a 5-epoch warm-up (still rising at
    # the end), RMSProp rho 1 - 2^-14 x 512.
    config = TrainConfig(micro_batch_size=32, gradient_accumulation=24, finetune_batch_size=512,
                         finetune_epochs=2)
    tuned = trainer.finetune_config(config)
    assert (tuned.micro_batch_size, tuned.gradient_accumulation) == (32, 16)
    assert tuned.rmsprop_rho == pytest.approx(1 - 2 ** -14 * 512)
    schedule = trainer.finetune_schedule(config, optimizer_applies_per_epoch=100)
    for step in (0, 40, 100, 150, 199):
        expected = 0.25 * step / 500 * 0.5 * (1 + math.cos(math.pi * step / 200))
        assert float(schedule(step)) == pytest.approx(expected, rel=1e-5, abs=1e-9)
    assert float(schedule(200)) == pytest.approx(0.0, abs=1e-9)


@pytest.mark.parametrize("changes,accumulation,match", [
    (dict(strategy="ipu", micro_batch_size=3, gradient_accumulation=256, replicas=8,
          pipeline_splits="block4a", finetune_batch_size=504), 21, None),
    (dict(strategy="mirrored", replicas=2, micro_batch_size=8, finetune_batch_size=64), 4, None),
    (dict(finetune_batch_size=48), None, r"--finetune_batch_size=48 must be a multiple of "
                                         r"--micro_batch_size=32 x --replicas=1 = 32 .*; use 32 "
                                         r"or 64"),
    (dict(strategy="ipu", micro_batch_size=3, gradient_accumulation=256, replicas=8,
          finetune_batch_size=512), None, r"multiple of .* = 24 .*; use 504 or 528"),
])
def test_finetune_micro_batches_per_update_or_a_one_line_error(changes, accumulation, match):
    if match:
        with pytest.raises(ValueError, match=match):
            TrainConfig(mode="train_and_finetune", **changes)
    else:
        config = TrainConfig(mode="train_and_finetune", **changes)
        assert config.finetune_plan.micro_batches_per_update == accumulation
        tuned = trainer.finetune_config(config)
        assert tuned.plan.global_batch_size == changes["finetune_batch_size"]
        assert (tuned.strategy, tuned.replicas, tuned.plan.num_stages) == (
            config.strategy, config.replicas, config.plan.num_stages)


def test_checkpoints_are_atomic_and_pruned(tmp_path, monkeypatch):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    manager = CheckpointManager(tmp_path, keep=2)
    for epoch in (1, 2, 3):
        manager.save(epoch, model, state={"global_step": epoch})
    assert [p.name for p in manager.all()] == ["epoch-0002", "epoch-0003"]
    assert manager.latest().name == "epoch-0003"

    # A crash while writing epoch 4 leaves epoch 3 as the latest and no partial folder.
    def crash(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(model, "save_weights", crash)
    with pytest.raises(OSError, match="disk full"):
        manager.save(4, model)
    assert manager.latest().name == "epoch-0003"
    assert sorted(os.listdir(tmp_path)) == ["LATEST", "epoch-0002", "epoch-0003"]
    assert CheckpointManager.read_state(manager.latest())["global_step"] == 3


def test_non_finite_loss_names_the_step_and_the_intact_checkpoint(tmp_path):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    manager = CheckpointManager(tmp_path)
    manager.save(2, model)
    guard = NonFiniteLossGuard(step_calls_per_epoch=10, initial_epoch=2, checkpoints=manager)
    guard.on_epoch_begin(2)
    guard.on_train_batch_end(3, {"loss": 1.0})
    with pytest.raises(NonFiniteLossError, match=r"became nan at step 24 \(epoch 3, batch 4\); "
                                                 r"the last good checkpoint .*epoch-0002"):
        guard.on_train_batch_end(3, {"loss": float("nan")})


def test_resume_with_another_architecture_is_refused_naming_the_fields(tmp_path):
    # A checkpoint as an earlier run of the lnpn model left it (the weights do not matter:
    # the configs are compared before any model is built).
    config = _config(tmp_path, epochs=1)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    CheckpointManager(tmp_path / "run" / "checkpoints").save(
        1, model, state={"config": config.to_dict()})
    with pytest.raises(ValueError, match=r"another architecture: model \(checkpoint "
                                         r"'efficientnet-tiny-g16-lnpn', now "
                                         r"'efficientnet-tiny-g16-gn'\)"):
        trainer.train(_config(tmp_path, epochs=2, model="efficientnet-tiny-g16-gn"),
                      num_classes=10, train_examples=10_000)


# Slow (9 CPU seconds: a fine-tune): make test keeps a fine-tune whose optimizer moves the head
# layers alone (tests/training/test_optimizer_state.py: its momenta are all head layers').
@pytest.mark.slow
def test_finetune_trains_only_the_head_block(tmp_path):
    config = _config(tmp_path, finetune_epochs=1, test_resolution=64)
    model = trainer.build_model(config, 32, 10)
    before = {w.path: keras.ops.convert_to_numpy(w) for w in model.weights}
    tuned, _ = trainer.finetune(config, model.get_weights(), num_classes=10,
                                train_examples=24)
    changed = {w.path for w in tuned.weights
               if not np.array_equal(keras.ops.convert_to_numpy(w), before[w.path])}
    assert changed  # something trained ...
    assert {path.split("/")[0] for path in changed} <= set(trainer.HEAD_LAYERS)  # ... the head


# Slow (32 s of make test, quiet; a subprocess that loads TensorFlow and trains on 2 logical CPU
# devices): make test keeps the mirrored trainer against Keras fit (tests/distribute/
# test_distribute_multiprocess.py) and the CLI's results.json and config.json of a train and
# fine-tune run (tests/training/test_evaluate_run.py).
@pytest.mark.slow
def test_cli_writes_results_json(tmp_path):
    # Through the execution plan: 2 mirrored replicas on logical CPUs (the CLI splits the CPU
    # when there is no GPU), global batch 16 as in the flagfile; fine-tuned and scored at the
    # training resolution (a quarter of the flagfile's 64 px work; tests/training/
    # test_evaluate_run.py runs the flagfile's 32 -> 64 px).
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-m", "keras_efficientnet.train", "--flagfile=flags/smoke.flags",
         f"--model_dir={tmp_path}", "--dataset=synthetic", "--strategy=mirrored",
         "--replicas=2", "--micro_batch_size=8", "--test_resolution=32"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]

    def strict(constant):  # what other JSON readers accept: no NaN or Infinity
        raise ValueError(f"results.json holds {constant}")

    results = json.loads((tmp_path / "results.json").read_text(), parse_constant=strict)
    for key, kind in [("top1", float), ("top5", float), ("top1_before_finetune", float),
                      ("images_per_second", float), ("epochs", int),
                      ("global_batch_size", int), ("config", dict)]:
        assert isinstance(results[key], kind), key
    assert 0.0 <= results["top1"] <= results["top5"] <= 1.0
    assert results["global_batch_size"] == 16 and results["epochs"] == 1
    assert results["config"]["optimizer"] == "lars"
    assert results["skipped_images"] == 0 and results["checkpoint"].startswith("checkpoints/")
    assert math.isfinite(results["images_per_second"])
    assert "top-1" in result.stdout and (tmp_path / "finetuned.weights.h5").is_file()
    assert results["model_file"] == "model.keras"  # the chief wrote it (relative to the run)
    plan = result.stdout[:result.stdout.index("global batch")]
    assert "strategy              mirrored" in plan and "replicas              2" in plan
    assert "global batch          16 = 8 x 1 x 2" in result.stdout
    assert "2 logical CPU devices" in result.stderr  # logged


def test_cli_rejects_unknown_values_before_any_work(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "keras_efficientnet.train", "--optimizer=adamw",
         f"--model_dir={tmp_path}"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert result.returncode != 0
    assert "adamw" in result.stderr and "rmsprop" in result.stderr
    assert not any(tmp_path.iterdir())


def test_gradient_accumulation_equals_the_large_batch_step():
    # Two accumulated micro-batches of 4 make one SGD step equal to one batch of 8, and both
    # equal the closed form W - lr * 2 / (8 * 2) * X^T (X W + b - Y) for the mean squared error.
    rng = np.random.default_rng(0)
    x = rng.standard_normal((8, 5)).astype("float32")
    y = rng.standard_normal((8, 2)).astype("float32")
    results = []
    for accumulation, batch in ((1, 8), (2, 4)):
        config = TrainConfig(optimizer="sgd", momentum=0.0, weight_decay=0.0,
                             gradient_accumulation=accumulation, micro_batch_size=batch)
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(2)])
        w0, b0 = (w.astype("float64") for w in model.get_weights())
        model.compile(optimizer=trainer.build_optimizer(config, 0.1), loss="mse",
                      jit_compile=False)
        model.fit(x, y, batch_size=batch, epochs=1, shuffle=False, verbose=0)
        results.append(model.get_weights())
    residual = x @ w0 + b0 - y
    expected = [w0 - 0.1 * 2 / 16 * x.T @ residual, b0 - 0.1 * 2 / 16 * residual.sum(0)]
    for large, accumulated, reference in zip(*results, expected):
        np.testing.assert_allclose(large, reference, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(accumulated, reference, rtol=1e-5, atol=1e-6)


def test_weight_average_is_the_exponential_average_of_epoch_weights():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    average = trainer.SlotAverage(0.97)  # the weight average the trainer keeps
    for value in (1.0, 2.0, 4.0):
        model.set_weights([np.full((2, 1), value, "float32"), np.full((1,), -value, "float32")])
        average.update(model)
    expected = (0.97 * (0.97 * 1.0 + 0.03 * 2.0)) + 0.03 * 4.0  # starts at the first epoch
    kernel, bias = average.weights_like(model)
    np.testing.assert_allclose(kernel, expected, rtol=1e-6)
    np.testing.assert_allclose(bias, -expected, rtol=1e-6)
    assert kernel.dtype == np.float32


def test_finetune_without_a_checkpoint_fails_before_any_work(tmp_path):
    config = _config(tmp_path, mode="finetune")
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    with pytest.raises(ValueError, match=r"--mode=finetune needs trained weights: no checkpoint"):
        trainer.load_weights_for(config, model)


def test_resolutions_warn_when_they_differ_modulo_32(tmp_path):
    with pytest.warns(ResolutionRuleWarning, match="differ modulo 32"):
        trainer.resolutions(_config(tmp_path, mode="train_and_finetune", train_resolution=48,
                                    test_resolution=64))
    assert trainer.resolutions(_config(tmp_path, mode="train_and_finetune",
                                       train_resolution=160, test_resolution=224)) == (160, 224)


@pytest.mark.parametrize("precision,flag,expected", [
    ("float32", "auto", False), ("float16", "auto", True), ("mixed_float16", "off", False),
    ("float32", "on", True)])
def test_stochastic_rounding_flag_reaches_the_plan(precision, flag, expected):
    config = TrainConfig(precision=precision, stochastic_rounding=flag)
    assert config.plan.uses_stochastic_rounding is expected
    assert config.plan.precision == precision
