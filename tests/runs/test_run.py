"""`ke.open_run(path)`: a run's config, history, best record and results read without a
framework; its models loaded on first use, each holding the weights its choice names."""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

import pytest

from keras_efficientnet.runs import record

TINY = "efficientnet-tiny-g16-lnpn"
REPO = pathlib.Path(__file__).resolve().parents[2]
METRICS = "epoch,loss,top1,top5,val_loss,val_top1,val_top5,learning_rate\n" \
          "1,2.5,0.25,0.5,,,,0.1\n2,2.0,0.5,0.75,1.5,0.625,0.875,0.05\n"


def _records(root: pathlib.Path) -> None:
    """A run's records, written by hand (no model)."""
    root.mkdir(parents=True)
    record.RunConfig(config={"model": TINY, "dropout_rate": -1.0, "drop_connect_rate": 0.2},
                     num_classes=3, train_resolution=32, test_resolution=32,
                     class_names=["a", "b", "c"]).write(root / record.CONFIG)
    record.BestRecord(phase="train", epoch=2, val_top1=0.625, weights="the latest weights",
                      checkpoint="checkpoints/best").write(root / record.BEST_RECORD)
    (root / record.METRICS).write_text(METRICS)
    (root / record.RESULTS).write_text(json.dumps({
        "mode": "train", "model": TINY, "dataset": "digits", "global_batch_size": 16,
        "num_classes": 3, "train_examples": 30, "eval_examples": 9, "config": {},
        "top1": 0.625, "history": []}))


def test_the_records_read_without_a_framework(tmp_path):
    _records(tmp_path / "run")
    code = (
        "import sys, keras_efficientnet as ke\n"
        f"run = ke.open_run({str(tmp_path / 'run')!r})\n"
        "print(run.config.num_classes, run.config.class_names, run.best.epoch, "
        "run.best.val_top1, run.history[1]['val_top1'], run.history[0]['val_top1'], "
        "run.results().top1, sorted(run.models))\n"
        "heavy = {'keras', 'tensorflow', 'numpy', 'jax'} & set(sys.modules)\n"
        "assert not heavy, heavy\n")
    out = subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO,
                         capture_output=True, text=True).stdout
    assert out.split("\n")[0] == (
        "3 ['a', 'b', 'c'] 2 0.625 0.625 None 0.625 ['average', 'best', 'final', 'latest']")


def test_not_a_run_and_a_bad_record_are_one_line(tmp_path):
    from keras_efficientnet.runs.run import open_run

    with pytest.raises(ValueError, match=r"is not a run directory \(no checkpoints/"):
        open_run(tmp_path)
    _records(tmp_path / "run")
    (tmp_path / "run" / record.BEST_RECORD).write_text(json.dumps({"phase": 1}))
    with pytest.raises(record.RecordError) as error:
        open_run(tmp_path / "run")
    assert str(error.value) == (f"{tmp_path / 'run' / record.BEST_RECORD}: field 'phase' must "
                                "be a string, found 1")


@pytest.mark.tf_only
def test_the_models_load_on_first_use_with_their_weights(tmp_path):
    import keras
    import numpy as np

    import keras_efficientnet as ke
    from keras_efficientnet.models.efficientnet import EfficientNet

    root = tmp_path / "run"
    _records(root)
    keras.utils.set_random_seed(1)
    saved = EfficientNet.from_preset(TINY, classes=3, input_shape=(32, 32, 3))
    saved.save(root / record.MODEL)
    run = ke.open_run(root)
    assert run.models._loaded == {}
    final = run.models["final"]
    assert run.models["final"] is final  # loaded once
    for got, want in zip(final.get_weights(), saved.get_weights(), strict=True):
        np.testing.assert_array_equal(got, want)
    with pytest.raises(KeyError, match="'newest': a run's models are final, best"):
        run.models["newest"]
    with pytest.raises(ValueError, match=r"best.keras \(the run validated nothing"):
        run.models["best"]
