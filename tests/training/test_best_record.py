"""The best record (issue 36, class 4): best.json is written after its checkpoint copy and
best.keras, stores paths relative to the run (a moved run names its own files), and an
unreadable one stops the run in one line instead of reading as "no best yet"."""

from __future__ import annotations

import json
import logging

import pytest

from keras_efficientnet.runs import record, weights
from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.builders import build_model
from keras_efficientnet.training.checkpoint import CheckpointManager

pytestmark = pytest.mark.tf_only
TINY = "efficientnet-tiny-g16-lnpn"
SCORES = {"top1": 0.5, "top5": 0.75, "loss": 1.5}


def _validation(model_dir):
    from keras_efficientnet.training.validation import Validation

    config = TrainConfig(model=TINY, dataset="digits", test_resolution=32,
                         model_dir=str(model_dir), eval_every=1)
    return Validation(config, 10, 1)


def test_an_unreadable_best_record_stops_with_one_line(tmp_path):
    (tmp_path / record.BEST_RECORD).write_text('{"phase": "train", "epoch": ')
    with pytest.raises(ValueError) as error:
        _validation(tmp_path)
    line = str(error.value)
    assert line.startswith(f"{tmp_path / record.BEST_RECORD}: not JSON") and "\n" not in line
    (tmp_path / record.BEST_RECORD).write_text(json.dumps({"phase": "train", "epoch": "2"}))
    with pytest.raises(ValueError, match=r"best.json: field 'epoch' must be an integer"):
        _validation(tmp_path)


class _RefusingManager(CheckpointManager):
    def keep_best(self, checkpoint):  # the disk refuses the copy (or the process is killed)
        raise OSError(28, "No space left on device")


def test_the_record_follows_its_checkpoint_copy_and_a_moved_run_names_its_own(tmp_path,
                                                                               caplog):
    run = tmp_path / "run"
    validation = _validation(run)
    validation._copy = build_model(validation.config, 32, 10)
    checkpoints = run / record.CHECKPOINTS
    checkpoint = CheckpointManager(checkpoints).save(1, validation._copy)
    validation._keep_best(0, SCORES, "the latest weights")
    assert not (run / record.BEST_RECORD).exists() and not (run / record.BEST_MODEL).exists()
    with pytest.raises(OSError):
        validation.saved(_RefusingManager(checkpoints), checkpoint)
    assert not (run / record.BEST_RECORD).exists()  # never naming a copy that is not there
    validation._keep_best(0, SCORES, "the latest weights")
    validation.saved(CheckpointManager(checkpoints), checkpoint)
    stored = json.loads((run / record.BEST_RECORD).read_text())
    assert (stored["file"], stored["checkpoint"]) == ("best.keras", "checkpoints/best")
    assert (stored["epoch"], stored["val_top1"], stored["checkpoint_of"]) == (1, 0.5,
                                                                              "epoch-0001")
    # Moved: the record still names this run's copy, which verifies against it.
    moved = tmp_path / "moved"
    run.rename(moved)
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet"):
        again = _validation(moved)
    assert again.best["checkpoint"] == "checkpoints/best" and caplog.records == []
    assert weights.resolve(f"{moved}:best").path == moved / record.BEST_MODEL
    # Killed after the next best's copy, before its record: the two disagree, and a resumed
    # run says so once, naming both and which it trusts.
    manager = CheckpointManager(moved / record.CHECKPOINTS)
    manager.keep_best(manager.save(2, validation._copy))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="keras_efficientnet"):
        _validation(moved)
    [warning] = [r.getMessage() for r in caplog.records]
    assert warning.startswith(f"the best checkpoint {moved / 'checkpoints' / 'best'} does not "
                              f"match {moved / record.BEST_RECORD} (epoch 1): ")
    assert "trusting best.json and best.keras" in warning

