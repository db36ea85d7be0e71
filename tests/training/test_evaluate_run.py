"""`--mode=evaluate --model_dir=RUN` scores what the run trained: the run's config.json
supplies every other flag, model.keras is scored by default (the run's final top-1 to 1e-6),
--evaluate_weights picks the checkpoint's weight average or raw weights instead."""

from __future__ import annotations

import json
import os
import re

import keras
import pytest
import tensorflow as tf
from absl import flags

from keras_efficientnet.cli import train as cli
from tests.reliability.clitools import REPO

pytestmark = pytest.mark.tf_only


def _main(capsys, *argv) -> tuple[int, str]:
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", *map(str, argv)])
    try:
        status = cli.main(["train"])
    finally:
        flags.FLAGS.unparse_flags()
    return status, capsys.readouterr().out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A train_and_finetune run of the smoke recipe (at 32 px, fine-tuned and scored at 64),
    without validation during training (test_validation's; these tests score the outputs)."""
    run_dir = tmp_path_factory.mktemp("evaluate") / "run"
    flags.FLAGS.unparse_flags()
    flags.FLAGS(["train", f"--flagfile={REPO / 'flags' / 'smoke.flags'}",
                 f"--model_dir={run_dir}", "--verbose=0", "--eval_every=0"])
    try:
        assert cli.main(["train"]) == 0
    finally:
        flags.FLAGS.unparse_flags()
    return run_dir, json.loads((run_dir / "results.json").read_text())


def test_the_run_writes_its_resolved_configuration(run):
    run_dir, results = run
    record = json.loads((run_dir / "config.json").read_text())
    assert record["config"]["model"] == "efficientnet-tiny-g16-lnpn"
    assert record["config"]["mode"] == "train_and_finetune"
    assert (record["train_resolution"], record["test_resolution"]) == (32, 64)
    assert record["num_classes"] == results["num_classes"] == 10
    assert record["class_names"] == [str(k) for k in range(10)]
    # What bench_fashion_protocol reads to count the fine-tune's images and seconds (its rows'
    # finetune_* fields): the fine-tune's own global batch and measured rate.
    assert results["finetune_global_batch_size"] == 16  # smoke.flags: micro-batch 16, 1 replica
    assert results["finetune_images_per_second"] > 0
    assert results["mode"] == "train_and_finetune" and results["finetune_epochs"] >= 1


def test_the_results_say_where_the_run_trained(run):
    # The oneDNN state comes from TensorFlow itself (bench_fashion_protocol's rows copy it); the
    # variable this process started with decides it where it was set (make test sets 0).
    _, results = run
    environment = results["environment"]
    assert environment["keras"] == keras.__version__ and environment["backend"] == "tensorflow"
    assert environment["tensorflow"] == tf.__version__
    setting = os.environ.get("TF_ENABLE_ONEDNN_OPTS")
    if setting in ("0", "1"):
        assert environment["onednn"] is (setting == "1")
    else:
        assert isinstance(environment["onednn"], bool)


def test_evaluate_with_no_other_flag_reproduces_the_final_top1(run, capsys, monkeypatch,
                                                               tmp_path):
    run_dir, results = run
    monkeypatch.chdir(tmp_path)  # no flags/ here, and no flagfile given
    status, printed = _main(capsys, "--mode=evaluate", f"--model_dir={run_dir}")
    assert status == 0
    scored = json.loads((run_dir / "results-evaluate.json").read_text())
    assert scored["weights"] == str(run_dir / "model.keras")
    assert re.search(rf"\n  weights +{re.escape(str(run_dir / 'model.keras'))}\n", printed)
    assert scored["model"] == "efficientnet-tiny-g16-lnpn" and scored["test_resolution"] == 64
    assert abs(scored["top1"] - results["top1"]) <= 1e-6
    assert abs(scored["top5"] - results["top5"]) <= 1e-6


def test_evaluate_weights_average_scores_the_pre_finetune_average(run, capsys):
    run_dir, results = run
    status, _ = _main(capsys, "--mode=evaluate", f"--model_dir={run_dir}",
                      "--evaluate_weights=average")
    assert status == 0
    scored = json.loads((run_dir / "results-evaluate.json").read_text())
    assert scored["weights"].endswith("(weight average)")
    assert abs(scored["top1"] - results["top1_before_finetune"]) <= 1e-6
    status, _ = _main(capsys, "--mode=evaluate", f"--model_dir={run_dir}",
                      "--evaluate_weights=latest")
    scored = json.loads((run_dir / "results-evaluate.json").read_text())
    assert status == 0 and "weight average" not in scored["weights"]
    assert scored["weights"].startswith(str(run_dir / "checkpoints"))
