"""Validation while training: every --eval_every epochs the held-out split is scored with the
weights the run would ship (the weight average here); the figures reach the epoch line,
metrics.csv, results.json's history and TensorBoard's validation run."""

from __future__ import annotations

import json

import numpy as np
import pytest
from absl import flags

from keras_efficientnet.cli import train as cli
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import (
    build_datasets,
    build_model,
    compile_model,
    evaluate,
)
from keras_efficientnet.training.checkpoint import CheckpointManager
from keras_efficientnet.training.optimizer_state import SlotAverage
from keras_efficientnet.training.reporting import read_metrics
from tests.reliability.clitools import REPO

pytestmark = pytest.mark.tf_only


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """3 epochs of the smoke recipe, validated after epochs 2 only (--eval_every=2)."""
    run_dir = tmp_path_factory.mktemp("validation") / "run"
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--mode=train",
                 "--epochs=3", "--eval_every=2", f"--model_dir={run_dir}", "--verbose=2",
                 "--keep_checkpoints=5"])
    try:
        assert cli.main(["train"]) == 0
    finally:
        flags.FLAGS.unparse_flags()
    return run_dir


def test_without_eval_steps_validation_counts_the_held_out_split_alone(tmp_path, monkeypatch):
    from keras_efficientnet import datasets
    from keras_efficientnet.training.validation import Validation

    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="digits",
                         test_resolution=32, micro_batch_size=16, eval_steps=0,
                         model_dir=str(tmp_path))
    asked = []
    dataset_info = datasets.dataset_info
    monkeypatch.setattr(datasets, "dataset_info", lambda source, split, **kwargs: (
        asked.append(split) or dataset_info(source, split, **kwargs)))
    validation = Validation(config, 10, None)
    validation._build()
    examples = dataset_info("digits", "validation").num_examples
    assert asked == ["validation"]  # not the training split too
    assert validation.steps == -(-examples // config.plan.examples_per_forward_pass)
    # Given the trainer's count, it counts nothing.
    asked.clear()
    Validation(config, 10, 7)._build()
    assert asked == []


def test_metrics_csv_history_and_tensorboard(run):
    rows = read_metrics(run / "metrics.csv")
    assert [row["epoch"] for row in rows] == [1, 2, 3]
    assert rows[0]["val_top1"] is None and rows[2]["val_top1"] is None
    assert 0 <= rows[1]["val_top1"] <= rows[1]["val_top5"] <= 1 and rows[1]["val_loss"] > 0
    assert all(row["loss"] > 0 and row["learning_rate"] > 0 for row in rows)
    history = json.loads((run / "results.json").read_text())["history"]
    assert [("val_top1" in epoch) for epoch in history] == [False, True, False]
    assert history[1]["val_top1"] == pytest.approx(rows[1]["val_top1"], abs=1e-9)
    assert history[1]["loss"] == pytest.approx(rows[1]["loss"], abs=1e-6)
    assert list((run / "logs" / "validation").glob("events.out.tfevents.*"))


def test_validation_scores_the_weight_average_after_that_epoch(run):
    # Independent reference: the epoch-2 checkpoint's weight average, scored on its own.
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="digits",
                         test_resolution=64, micro_batch_size=16, eval_steps=2)
    model = build_model(config, 64, 10)
    state = CheckpointManager.restore(run / "checkpoints" / "epoch-0002", model)
    model.set_weights(SlotAverage(0.0, state["average"]).weights_like(model))
    compile_model(model, "sgd", config, 10)
    data = build_datasets(config, 64, training=False, split="validation", repeat=False,
                          num_classes=10)
    expected = evaluate(model, data, 2)
    row = read_metrics(run / "metrics.csv")[1]
    assert row["val_top1"] == pytest.approx(expected["top1"], abs=1e-6)
    assert row["val_loss"] == pytest.approx(expected["loss"], rel=1e-5)
    assert np.isfinite(row["val_top5"])


def test_the_best_validated_model_is_kept_and_evaluated(run, capsys):
    # One validation (epoch 2): it is the best so far, kept as best.keras and best.json, and
    # --evaluate_weights=best scores it to the validation's own figure.
    best = json.loads((run / "best.json").read_text())
    row = read_metrics(run / "metrics.csv")[1]
    assert best["epoch"] == 2 and best["weights"] == "the weight average"
    assert best["val_top1"] == pytest.approx(row["val_top1"], abs=1e-12)
    assert json.loads((run / "results.json").read_text())["best"]["epoch"] == 2
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", "--mode=evaluate", f"--model_dir={run}", "--evaluate_weights=best"])
    try:
        assert cli.main(["train"]) == 0
    finally:
        flags.FLAGS.unparse_flags()
    scored = json.loads((run / "results-evaluate.json").read_text())
    assert scored["weights"] == str(run / "best.keras")
    assert scored["top1"] == pytest.approx(row["val_top1"], abs=1e-6)


@pytest.mark.slow
def test_the_best_checkpoint_survives_rotation_and_holds_the_scored_weights(tmp_path,
                                                                              monkeypatch):
    # Validations scripted to score 0.5, 0.9, 0.1: epoch 2 is the best; --keep_checkpoints=1
    # rotates epoch-0002 away, checkpoints/best keeps it with the weights that were scored.
    from keras_efficientnet.training import builders
    from keras_efficientnet.training.checkpoint import verify

    real, scored, script = builders.evaluate, [], [0.5, 0.9, 0.1]

    def scripted(model, data, steps):
        scores = real(model, data, steps)
        scored.append([np.array(w) for w in model.get_weights()])
        if len(scored) > len(script):  # the run's final evaluation
            return scores
        return {**scores, "top1": script[len(scored) - 1]}

    monkeypatch.setattr(builders, "evaluate", scripted)
    run_dir = tmp_path / "run"
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--mode=train",
                 "--epochs=3", "--eval_every=1", f"--model_dir={run_dir}", "--verbose=2",
                 "--keep_checkpoints=1"])
    try:
        assert cli.main(["train"]) == 0
    finally:
        flags.FLAGS.unparse_flags()
    checkpoints = run_dir / "checkpoints"
    best = json.loads((run_dir / "best.json").read_text())
    assert best["epoch"] == 2 and best["val_top1"] == 0.9 and len(scored) >= 3
    assert best["checkpoint"] == "checkpoints/best"  # relative to the run
    assert best["checkpoint_of"] == "epoch-0002"
    assert best["scored_weights"].startswith("average.npz")
    assert sorted(p.name for p in checkpoints.iterdir() if not p.name.startswith(".")) == [
        "LATEST", "best", "epoch-0003"]
    assert verify(checkpoints / "best", position=(2, 0)) is None
    assert CheckpointManager(checkpoints).verify_best(2) is None
    assert CheckpointManager(checkpoints).resume_point() == checkpoints / "epoch-0003"
    config = TrainConfig(model="efficientnet-tiny-g16-lnpn", dataset="digits",
                         test_resolution=64, micro_batch_size=16, eval_steps=2)
    model = build_model(config, 64, 10)
    state = CheckpointManager.restore(checkpoints / "best", model)
    assert state["epoch"] == 2
    kept = SlotAverage(0.0, state["average"]).weights_like(model)
    assert len(kept) == len(scored[1])
    for got, want in zip(kept, scored[1]):
        np.testing.assert_array_equal(got, want)  # bit-equal
    assert not all(np.array_equal(a, b) for a, b in zip(kept, scored[2]))


@pytest.mark.slow
def test_the_finetuned_model_competes_for_best_keras(tmp_path, monkeypatch):
    # The training phase's validations scripted to top-1 0.0: the fine-tuned model (scored for
    # real on the same split) beats them, so best.keras is the fine-tuned model (model.keras).
    import keras

    from keras_efficientnet.training import builders, trainer

    real = trainer.evaluate  # the trainer's own evaluations stay real

    def scripted(model, data, steps):
        return {**real(model, data, steps), "top1": 0.0}

    monkeypatch.setattr(builders, "evaluate", scripted)  # what Validation calls
    monkeypatch.setattr(trainer, "evaluate", real)
    run_dir = tmp_path / "run"
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--flagfile={REPO / 'flags' / 'smoke.flags'}", "--epochs=1",
                 "--eval_every=1", f"--model_dir={run_dir}"])
    try:
        assert cli.main(["train"]) == 0
    finally:
        flags.FLAGS.unparse_flags()
    results = json.loads((run_dir / "results.json").read_text())
    best = json.loads((run_dir / "best.json").read_text())
    assert results["history"][0]["val_top1"] == 0.0 and results["top1"] > 0.0
    assert best["phase"] == "finetune" and best["finetune_epochs"] == 1
    assert best["val_top1"] == pytest.approx(results["top1"], abs=1e-12)
    assert results["best"] == best
    assert (run_dir / "checkpoints" / "best").is_dir()  # the training phase's best stays
    final = keras.saving.load_model(run_dir / "model.keras", compile=False)
    kept = keras.saving.load_model(run_dir / "best.keras", compile=False)
    for a, b in zip(final.get_weights(), kept.get_weights(), strict=True):
        np.testing.assert_array_equal(a, b)
