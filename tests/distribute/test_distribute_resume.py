"""Kill a 2-worker run mid-training and start it again: it ends where an uninterrupted run ends.

Both workers share one --model_dir (one filesystem here), as every worker must read the chief's
checkpoints. Each kills itself with SIGKILL (no clean-up, as a lost host) as the second epoch's
first step begins, after the chief wrote the first epoch's checkpoint; started again with the
same command, both resume from that checkpoint and run only the second epoch. The reference is
Keras' `fit` on one device over the same 2 epochs of global batches of 16 (the 2-worker run
equals it without interruption: test_distribute_multiprocess.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.distribute import trainer_runs
from tests.distribute.conftest import free_ports, wait_all

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600


def _two_workers(tmp: Path, tag: str, model_dir: Path, *extra: str) -> list[int]:
    """Runs both workers to their end (or death); returns their exit codes."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        log = open(tmp / f"{tag}{index}.log", "w")
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "tests.distribute.multiworker_script",
             str(tmp / f"{tag}{index}.npz"), str(model_dir), "--epochs", "2", "--resume",
             *extra], cwd=REPO, env={**env, "TF_CONFIG": tf_config}, stdout=log,
            stderr=subprocess.STDOUT))
    return wait_all(procs, tag, TIMEOUT_S)


@pytest.mark.slow  # ~2 min on 2 cores: 4 worker processes, 2 at a time
def test_killed_two_worker_run_resumes_and_ends_where_an_uninterrupted_run_ends(tmp_path):
    model_dir = tmp_path / "run"
    codes = _two_workers(tmp_path, "killed", model_dir, "--kill_at_epoch", "1")
    logs = "".join((tmp_path / f"killed{i}.log").read_text()[-2000:] for i in range(2))
    assert codes == [-signal.SIGKILL] * 2, logs
    checkpoints = model_dir / "checkpoints"
    assert sorted(p.name for p in checkpoints.glob("epoch-*")) == ["epoch-0001"]

    codes = _two_workers(tmp_path, "resumed", model_dir)
    logs = "".join((tmp_path / f"resumed{i}.log").read_text()[-2000:] for i in range(2))
    assert codes == [0, 0], logs
    workers = [np.load(tmp_path / f"resumed{i}.npz") for i in range(2)]
    for worker in workers:
        assert list(worker["epochs"]) == [1]  # only the second epoch ran again
    reference = trainer_runs.train_run(str(tmp_path / "one"), one_device=True, epochs=2)
    keys = sorted(k for k in workers[0].files if k.startswith("w"))
    assert len(keys) == len(reference["weights"]) > 50
    for key, expected in zip(keys, reference["weights"]):
        np.testing.assert_array_equal(workers[0][key], workers[1][key])
        np.testing.assert_allclose(workers[0][key], expected, rtol=1e-4, atol=5e-5)
    # The history holds both epochs: the first restored from the checkpoint.
    np.testing.assert_allclose(workers[0]["losses"], reference["losses"], rtol=1e-4)
    assert sorted(p.name for p in checkpoints.glob("epoch-*")) == ["epoch-0001", "epoch-0002"]
