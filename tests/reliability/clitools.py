"""Helpers of the reliability suite: run the CLI in a subprocess, read its one-line errors."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
# Every subprocess has a bound: a hang fails the test instead of stalling the suite.
TIMEOUT_S = 600
# A tiny run on the digits: ~0.2 s per step on a 2-core CPU after a few seconds of start-up.
TINY = ["--flagfile=flags/smoke.flags", "--mode=train", "--resume", "--verbose=2",
        "--learning_rate=0.05"]


def env(**extra) -> dict:
    return dict(os.environ, PYTHONPATH=str(REPO), TF_CPP_MIN_LOG_LEVEL="2",
                TF_ENABLE_ONEDNN_OPTS=os.environ.get("TF_ENABLE_ONEDNN_OPTS", "0"), **extra)


def cli_command(*args, python_options=()) -> list[str]:
    return [sys.executable, *python_options, "-m", "keras_efficientnet.train", *map(str, args)]


def run_cli(*args, timeout: float = TIMEOUT_S, python_options=(), **kwargs):
    """Runs the training command to its end; returns the CompletedProcess (text)."""
    return subprocess.run(cli_command(*args, python_options=python_options), cwd=REPO,
                          env=kwargs.pop("env", env()), capture_output=True, text=True,
                          timeout=timeout, **kwargs)


def start_cli(*args, **kwargs) -> subprocess.Popen:
    return subprocess.Popen(cli_command(*args), cwd=REPO, env=kwargs.pop("env", env()),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


def messages(stderr: str) -> list[str]:
    """The lines the command line itself printed: errors and stops (TensorFlow and absl log
    lines start with a level letter and a date, or with 'WARNING: All log messages')."""
    return [line for line in stderr.splitlines()
            if line.startswith(("error: ", "stopped by ", "warning: "))]


def assert_one_line(result, status: int, *patterns: str) -> str:
    """The run exited with `status`, printed exactly one error line matching every pattern,
    and no traceback. Returns the line."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [line for line in messages(result.stderr) if not line.startswith("warning: ")]
    assert len(lines) == 1, result.stderr[-3000:]
    for pattern in patterns:
        assert re.search(pattern, lines[0]), (pattern, lines[0])
    assert result.returncode == status, (result.returncode, result.stderr[-3000:])
    return lines[0]


def wait_for(predicate, timeout: float, what: str, process: subprocess.Popen | None = None):
    """Polls `predicate` until true; fails after `timeout` s or when `process` exits first."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if process is not None and process.poll() is not None:
            out, err = process.communicate()
            pytest.fail(f"process ended (rc {process.returncode}) before {what}:\n{err[-3000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"no {what} within {timeout} s")
        time.sleep(0.05)


def stop(process: subprocess.Popen, signum=signal.SIGTERM, timeout: float = TIMEOUT_S):
    """Sends `signum` and waits; returns (returncode, stdout, stderr)."""
    process.send_signal(signum)
    out, err = process.communicate(timeout=timeout)
    return process.returncode, out, err


def weights(path: Path) -> dict[str, np.ndarray]:
    """Every array of a Keras .weights.h5 file, by its path inside the file."""
    import h5py

    arrays = {}
    with h5py.File(path) as f:
        f.visititems(lambda name, obj: arrays.__setitem__(name, obj[()])
                     if isinstance(obj, h5py.Dataset) else None)
    return arrays


def assert_same_checkpoint(a: Path, b: Path) -> None:
    """Two checkpoint folders hold bit-identical weights, optimizer, RNG and average state."""
    wa, wb = weights(a / "model.weights.h5"), weights(b / "model.weights.h5")
    assert wa.keys() == wb.keys() and wa
    for name in wa:
        np.testing.assert_array_equal(wa[name], wb[name], err_msg=name)
    for name in ("optimizer.npz", "rng.npz", "average.npz"):
        with np.load(a / name) as x, np.load(b / name) as y:
            assert x.files == y.files
            for key in x.files:
                np.testing.assert_array_equal(x[key], y[key], err_msg=f"{name}:{key}")


def write_unreadable_folder(root: Path, classes=("a", "b"), per_class: int = 3) -> Path:
    """An image folder (train and validation) whose every file is text named .jpg."""
    for split in ("train", "validation"):
        for name in classes:
            folder = root / split / name
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                (folder / f"{i}.jpg").write_text("not an image\n")
    return root
