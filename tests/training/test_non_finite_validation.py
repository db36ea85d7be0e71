"""A validation whose loss or scores are not finite is never a best, is recorded as non-finite
(metrics.csv `nan`, results.json null named in `non_finite`), warned about in one line, and
stops the run at its second in a row; a model whose outputs are not finite on the held-out split
is never written. The weights come with NaN BatchNorm moving variances: training (batch
statistics) stays finite, every inference output is NaN."""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
from absl import flags

from keras_efficientnet.cli import train as cli
from keras_efficientnet.runs.record import read_metrics
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import build_model
from tests.reliability.clitools import REPO

pytestmark = pytest.mark.tf_only

PRESET = "efficientnet-tiny-g1-bn"


@pytest.fixture(scope="module")
def nan_statistics(tmp_path_factory):
    """A weights file of the tiny G1-BN model whose BatchNorm moving variances are NaN."""
    config = TrainConfig(model=PRESET, dataset="digits", train_resolution=32,
                         test_resolution=32, micro_batch_size=16)
    model = build_model(config, 32, 10)
    spoiled = 0
    for variable in model.non_trainable_variables:
        if variable.path.endswith("moving_variance"):
            variable.assign(np.full(variable.shape, np.nan, "float32"))
            spoiled += 1
    assert spoiled
    path = tmp_path_factory.mktemp("weights") / "nan_stats.weights.h5"
    model.save_weights(path)
    return path


def _train(run_dir, weights, *extra) -> int:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--mode=train",
                 f"--model={PRESET}", "--test_resolution=32", "--updates_per_epoch=2",
                 "--eval_every=1", "--eval_steps=1", f"--weights={weights}",
                 f"--model_dir={run_dir}", "--verbose=0", *extra])
    try:
        return cli.main(["train"])
    finally:
        flags.FLAGS.unparse_flags()


def _strict(path):
    return json.loads(path.read_text(),
                      parse_constant=lambda name: pytest.fail(f"{path}: not strict JSON {name}"))


@pytest.mark.slow  # a training run (about 10 s alone, 45 s on the loaded 2-core machine)
def test_one_non_finite_validation_is_no_best_and_the_model_is_not_shipped(
        nan_statistics, tmp_path, capsys, caplog):
    run = tmp_path / "run"
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        status = _train(run, nan_statistics, "--epochs=1")
    assert status == 1
    warned = [r.getMessage() for r in caplog.records if "not finite" in r.getMessage()]
    assert len(warned) == 1 and "validation after epoch 1 is not finite (val_loss nan" in (
        warned[0]) and "not a best" in warned[0]
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: the model's outputs on the validation split are not "
                            "finite (")
    assert f"{run / 'model.keras'} was not written" in error and "non_finite" in error
    # Never a best, never shipped.
    assert not (run / "best.json").exists() and not (run / "best.keras").exists()
    assert not (run / "model.keras").exists()
    # Recorded as non-finite: nan in metrics.csv, null named in results.json's non_finite.
    row = read_metrics(run / "metrics.csv")[0]
    assert np.isnan(row["val_loss"]) and np.isfinite(row["loss"])
    results = _strict(run / "results.json")
    assert results["loss"] is None and results["model_file"] is None
    assert {"loss", "history[0].val_loss"} <= set(results["non_finite"])
    assert results["history"][0]["val_loss"] is None


@pytest.mark.slow
def test_a_second_non_finite_validation_in_a_row_stops_the_run(nan_statistics, tmp_path,
                                                               capsys):
    run = tmp_path / "run"
    assert _train(run, nan_statistics, "--epochs=3") == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("error: validation was not finite 2 times in a row (epochs 1, 2; "
                            "val_loss nan")
    assert "no best.keras is written" in error
    assert [row["epoch"] for row in read_metrics(run / "metrics.csv")] == [1]  # stopped at 2
    assert not (run / "best.json").exists() and not (run / "model.keras").exists()
    assert (run / "checkpoints" / "epoch-0001").is_dir()
    assert not (run / "checkpoints" / "epoch-0002").exists()


def test_a_non_finite_validation_is_never_a_best_and_a_finite_one_resets_the_count(
        tmp_path, monkeypatch, caplog):
    # Scripted scores: epoch 1 finite (a best); epoch 2 a NaN loss with a top-1 that would
    # win; epoch 3 finite and better (the best, and the count starts again); epoch 4 an
    # infinite top-5 with the highest top-1: one in a row, warned about, not a best.
    from keras_efficientnet.training.validation import Validation

    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="digits",
                         test_resolution=32, micro_batch_size=16, eval_steps=1,
                         model_dir=str(tmp_path))
    script = iter([{"top1": 0.5, "top5": 0.9, "loss": 1.0},
                   {"top1": 0.9, "top5": 1.0, "loss": float("nan")},
                   {"top1": 0.6, "top5": 0.95, "loss": 0.9},
                   {"top1": 0.95, "top5": float("inf"), "loss": 0.5}])
    monkeypatch.setattr("keras_efficientnet.training.builders.evaluate",
                        lambda model, data, steps: next(script))
    validation = Validation(config, 10, 1)
    validation._build()
    model = validation._copy
    with caplog.at_level(logging.WARNING, "keras_efficientnet"):
        logs = [validation(epoch, model, None) for epoch in range(4)]
    assert validation.best["epoch"] == 3 and validation.best["val_top1"] == 0.6
    assert np.isnan(logs[1]["val_loss"]) and np.isinf(logs[3]["val_top5"])
    assert validation.non_finite == [4]  # epoch 3 reset the count: the run goes on
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2
    assert warned[0].startswith("validation after epoch 2 is not finite (val_loss nan): the "
                                "latest weights give non-finite outputs on the validation "
                                "split")
    assert "not a best (best.keras stays epoch 1's)" in warned[0]
    assert "(val_top5 inf)" in warned[1] and "best.keras stays epoch 3's" in warned[1]
