"""metrics.csv's seconds: training time without validation, wall time, both across a resume."""

import csv

import pytest

from keras_efficientnet.training.reporting import COLUMNS, MetricsCSV, read_metrics

pytestmark = pytest.mark.tf_only


class FakeClock:
    """perf_counter stand-in: returns the given instants in order."""

    def __init__(self, *instants):
        self.instants = list(instants)

    def __call__(self):
        return self.instants.pop(0)


def _epoch(callback, epoch, batches, logs=None):
    callback.on_epoch_begin(epoch)
    for batch in range(batches):
        callback.on_train_batch_end(batch)
    callback.on_epoch_end(epoch, {"loss": 1.0, "learning_rate": 0.1, **(logs or {})})


def test_train_seconds_leave_out_what_follows_the_last_batch_and_continue_on_resume(tmp_path):
    path = tmp_path / "metrics.csv"
    first = MetricsCSV(path)
    # train begins 0; epoch 1: begins 1, batches end 3 and 6, validation until 10;
    # epoch 2: begins 11, one batch ends 15, the epoch ends 16.
    first._clock = FakeClock(0.0, 1.0, 3.0, 6.0, 10.0, 11.0, 15.0, 16.0)
    first.on_train_begin()
    _epoch(first, 0, 2, {"val_top1": 0.5})
    _epoch(first, 1, 1)
    rows = read_metrics(path)
    assert [(r["train_seconds"], r["wall_seconds"]) for r in rows] == [(5.0, 10.0), (9.0, 16.0)]
    assert rows[0]["val_top1"] == 0.5 and rows[1]["val_top1"] is None
    # A resumed run (a new process) counts on from the last row: 100 -> 104 of training.
    resumed = MetricsCSV(path)
    resumed._clock = FakeClock(100.0, 101.0, 105.0, 107.0)
    resumed.on_train_begin()
    _epoch(resumed, 2, 1)
    assert read_metrics(path)[2]["train_seconds"] == 13.0
    assert read_metrics(path)[2]["wall_seconds"] == 23.0


def test_a_file_begun_by_an_older_version_keeps_its_columns(tmp_path):
    path = tmp_path / "metrics.csv"
    old_columns = COLUMNS[:8]  # before the seconds columns
    with open(path, "w", newline="") as f:
        csv.writer(f).writerows([old_columns, [1, 2.0, 0.1, 0.5, "", "", "", 0.01]])
    callback = MetricsCSV(path)
    callback._clock = FakeClock(0.0, 1.0, 2.0, 3.0)
    callback.on_train_begin()
    _epoch(callback, 1, 1)
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    assert lines[0] == list(old_columns) and all(len(line) == 8 for line in lines)
    assert read_metrics(path)[1]["epoch"] == 2
