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


# metrics.csv is opened through atomic.open_file's checks, appends included (issue 36).

def _bounded(seconds: int = 5):
    """A SIGALRM that fails the test instead of letting a blocked open hang the suite."""
    import signal

    def fail(signum, frame):
        raise TimeoutError(f"blocked for {seconds} s")

    signal.signal(signal.SIGALRM, fail)
    signal.alarm(seconds)


@pytest.mark.parametrize("kind", ["symlink", "fifo", "directory"])
def test_a_link_pipe_or_folder_at_metrics_csv_is_refused_before_the_first_epoch(tmp_path,
                                                                                 kind):
    import os
    import signal

    from keras_efficientnet.atomic import UnsafePathError

    path, victim = tmp_path / "metrics.csv", tmp_path / "victim.txt"
    victim.write_text("precious\n")
    {"symlink": lambda: path.symlink_to(victim), "fifo": lambda: os.mkfifo(path),
     "directory": path.mkdir}[kind]()
    found = {"symlink": f"a symbolic link (to {str(victim)!r})", "fifo": "a named pipe (FIFO)",
             "directory": "a directory"}[kind]
    callback = MetricsCSV(path)
    _bounded()
    try:
        with pytest.raises(UnsafePathError) as raised:
            callback.on_train_begin()  # before any epoch
    finally:
        signal.alarm(0)
    assert str(raised.value).startswith(f"{path} is {found}, not a regular file")
    assert victim.read_text() == "precious\n"


def test_a_full_disk_names_metrics_csv_the_free_space_and_the_fix_and_leaves_no_half_row(
        tmp_path, monkeypatch):
    import errno
    import os
    import shutil

    from keras_efficientnet import atomic
    from keras_efficientnet.cli import errors

    path = tmp_path / "metrics.csv"
    callback = MetricsCSV(path)
    callback._clock = FakeClock(0.0, 1.0, 2.0, 3.0)
    callback.on_train_begin()
    _epoch(callback, 0, 1)
    before = path.read_bytes()
    real_write = os.write

    def disk_full_half_way(fd, data):  # a few bytes land, then the disk is full
        if len(data) > 4:
            return real_write(fd, bytes(data[:4]))
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(atomic.os, "write", disk_full_half_way)
    callback._clock = FakeClock(4.0, 5.0, 6.0)
    with pytest.raises(atomic.WriteError) as raised:
        _epoch(callback, 1, 1)
    monkeypatch.undo()
    free = atomic.human_bytes(shutil.disk_usage(tmp_path).free)
    assert str(raised.value) == (
        f"could not write {path}: No space left on device ({free} free there); nothing "
        "half-written was left. Fix: free space (or raise the quota, or give a --model_dir on "
        "another disk), then rerun the same command")
    assert path.read_bytes() == before  # the half row was cut away
    assert errors.describe(raised.value)[1] == 1


def test_non_finite_figures_are_written_as_such_not_as_missing(tmp_path):
    path = tmp_path / "metrics.csv"
    callback = MetricsCSV(path)
    callback._clock = FakeClock(0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0)
    callback.on_train_begin()
    _epoch(callback, 0, 1, {"val_loss": float("nan"), "val_top1": 0.1,
                            "val_top5": float("-inf")})
    _epoch(callback, 1, 1)
    text = path.read_text().splitlines()
    assert text[1].split(",")[4:7] == ["nan", "0.1", "-inf"]
    assert text[2].split(",")[4:7] == ["", "", ""]  # no validation that epoch
    rows = read_metrics(path)
    assert rows[0]["val_loss"] != rows[0]["val_loss"] and rows[0]["val_top5"] == float("-inf")
    assert rows[1]["val_loss"] is None
