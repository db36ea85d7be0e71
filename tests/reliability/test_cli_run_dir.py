"""One run per model_dir end to end (a second command refused, a dead owner's lock taken over),
and the flag errors that answer before TensorFlow loads. The run directory's unit tests (lock
without flock, fresh-run rule, leftovers, the session) are in tests/training/test_run_dir.py."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from keras_efficientnet.training import TrainConfig
from keras_efficientnet.training.run_dir import RunDirError, RunLock
from tests.reliability.clitools import REPO, assert_one_line, env, run_cli

# Holds the lock of the model_dir given as argv[1] until killed (`import keras_efficientnet`
# loads no framework, so it starts in ~0.1 s).
HOLD_LOCK = """
import sys, time
from keras_efficientnet.training.run_dir import RunLock
RunLock(sys.argv[1]).acquire()
print("held", flush=True)
time.sleep(600)
"""


def _config(model_dir, **changes):
    return TrainConfig(**{"model_dir": str(model_dir), "model": "efficientnet-tiny-g16-lnpn",
                          **changes})


@pytest.fixture
def holder(tmp_path):
    """A live process holding tmp_path/run's lock."""
    model_dir = tmp_path / "run"
    model_dir.mkdir()
    process = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(model_dir)], cwd=REPO,
                               env=env(), stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    yield model_dir, process
    process.kill()
    process.wait(timeout=60)


def test_a_second_run_fails_at_once_naming_the_holder(holder):
    model_dir, process = holder
    result = run_cli("--flagfile=flags/smoke.flags", f"--model_dir={model_dir}", timeout=120)
    line = assert_one_line(result, 2, r"is in use by another run",
                           rf"pid {process.pid} on {socket.gethostname()}")
    assert f"{sys.executable} -c" in line  # the holder's command line
    # Refused before any work: nothing but the lock in the directory, and the TensorFlow
    # start-up line never printed.
    assert sorted(p.name for p in model_dir.iterdir()) == ["run.lock"]
    assert "cpu_feature_guard" not in result.stderr


def test_a_lock_whose_owner_died_is_taken_over_with_its_record(holder):
    model_dir, process = holder
    with pytest.raises(RunDirError, match=f"pid {process.pid}"):
        RunLock(model_dir).acquire()
    process.send_signal(signal.SIGKILL)  # dies without releasing: the kernel drops its flock
    process.wait(timeout=60)
    lock = RunLock(model_dir)
    previous = lock.acquire()
    try:
        assert previous["pid"] == process.pid and previous["host"] == socket.gethostname()
        record = json.loads((model_dir / "run.lock").read_text())
        assert record["pid"] == os.getpid()
    finally:
        lock.release()
    assert not (model_dir / "run.lock").exists()


def _unwritable(tmp_path) -> Path:
    if os.geteuid() == 0:  # root writes through permission bits: use a kernel filesystem
        return Path("/sys/kernel/keras-efficientnet-run")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder / "run"


@pytest.mark.parametrize("case", ["file", "under_file", "unwritable", "model", "micro_batch",
                                  "missing_folder", "peer_timeout"])
def test_bad_input_answers_in_one_line_before_tensorflow_loads(tmp_path, case):
    (tmp_path / "a_file").write_text("x")
    args, pattern = {
        "file": ([f"--model_dir={tmp_path / 'a_file'}"], "is a file, not a directory"),
        "under_file": ([f"--model_dir={tmp_path / 'a_file' / 'run'}"], "lies under .*a_file"),
        "unwritable": ([f"--model_dir={_unwritable(tmp_path)}", "--mode=evaluate"],
                       "is not writable"),
        "model": (["--model=efficientnet-b0-g16-lpn", f"--model_dir={tmp_path}"],
                  "did you mean efficientnet-b0-g16-lnpn"),
        "micro_batch": (["--micro_batch_size=0", f"--model_dir={tmp_path}"],
                        "--micro_batch_size must be >= 1, received 0"),
        "missing_folder": (["--dataset=folder:/no/such/photos", f"--model_dir={tmp_path}"],
                           "image folder '/no/such/photos' does not exist"),
        "peer_timeout": (["--strategy=multiworker", "--replicas=2", "--peer_timeout=-1",
                          f"--model_dir={tmp_path}"],
                         r"--peer_timeout must be > 0 seconds, received -1\.0"),
    }[case]
    started = time.monotonic()
    result = run_cli("--flagfile=flags/smoke.flags", *args, python_options=["-X", "importtime"],
                     timeout=120)
    elapsed = time.monotonic() - started
    assert_one_line(result, 2, pattern)
    imported = {line.rsplit("|", 1)[-1].strip() for line in result.stderr.splitlines()
                if line.startswith("import time:")}
    assert "keras_efficientnet.training.config" in imported  # the flags were checked ...
    assert not imported & {"tensorflow", "keras", "jax"}, "... without loading a framework"
    print(f"{case}: {elapsed:.2f} s to the error")


# Runs the training command in-process and prints which frameworks it imported (argv: flags).
TRAIN_AND_LIST_IMPORTS = """
import sys
from keras_efficientnet.cli import train
status = train.main(train.parse_command_line(["train", *sys.argv[1:]]))
print(sorted(m for m in ("tensorflow", "keras", "jax") if m in sys.modules))
sys.exit(status)
"""


@pytest.mark.parametrize("flag, pattern", [
    ("--dataset=fodler:x", r"--dataset='fodler:x': unknown dataset source 'fodler:x'; did you "
                           r"mean 'folder'\? valid: 'synthetic', 'digits'"),
    ("--dataset=folder:", r"needs an argument after the colon, e\.g\. 'folder:/data/photos'"),
])
def test_a_misspelt_dataset_moves_nothing_and_loads_no_tensorflow(tmp_path, flag, pattern):
    # Issue 34 point 5: the source table is plain Python, so --noresume's fresh-run rule (which
    # moves an earlier run aside) never runs for a source that cannot be read.
    model_dir = tmp_path / "run"
    (model_dir / "checkpoints").mkdir(parents=True)
    earlier = {"results.json": '{"top1": 0.5}', "metrics.csv": "epoch,top1\n1,0.5\n",
               "checkpoints/LATEST": "ckpt-1"}
    for name, text in earlier.items():
        (model_dir / name).write_text(text)
    result = subprocess.run(
        [sys.executable, "-c", TRAIN_AND_LIST_IMPORTS, "--flagfile=flags/smoke.flags",
         f"--model_dir={model_dir}", "--noresume", flag],
        cwd=REPO, env=env(), capture_output=True, text=True, timeout=120)
    assert_one_line(result, 2, pattern)
    assert result.stdout.splitlines()[-1] == "[]"  # no framework imported
    assert sorted(p.name for p in model_dir.iterdir()) == ["checkpoints", "metrics.csv",
                                                           "results.json"]
    assert {name: (model_dir / name).read_text() for name in earlier} == earlier
