"""Two horovod (Gloo) workers under `horovodrun -np 2` against one process: sharding,
accumulation, the stop vote and resume. Part of `make test-slow`; skipped (with the reason) where
horovod is not installed: `make install-horovod` builds it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("horovod.tensorflow", reason="horovod is not installed in this "
                    "environment: `make install-horovod` builds it (about 15 minutes)")

HORORUN = Path(sys.executable).with_name("horovodrun")
pytestmark = [pytest.mark.slow, pytest.mark.tf_only,
              pytest.mark.skipif(not HORORUN.exists(), reason="horovodrun not beside python")]

REPO = Path(__file__).resolve().parents[2]


def _horovodrun(module: str, out: Path, timeout: int) -> None:
    """Runs `python -m tests.distribute.<module> OUT` on 2 Gloo workers on this host; past
    `timeout` seconds horovodrun and its workers (one process group) are killed."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.Popen([str(HORORUN), "-np", "2", "-H", "localhost:2", "--gloo",
                            sys.executable, "-m", f"tests.distribute.{module}", str(out)],
                           cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           text=True, start_new_session=True)
    try:
        output, _ = run.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(run.pid, signal.SIGKILL)
        output, _ = run.communicate()
        pytest.fail(f"horovodrun {module} did not end in {timeout} s:\n{output[-3000:]}")
    assert run.returncode == 0, output[-6000:]


# ~45 s on a loaded 2-core machine: two processes start TensorFlow and Gloo
def test_two_horovod_workers_equal_one_process(tmp_path):
    _horovodrun("horovod_script", tmp_path, timeout=300)
    rank0, rank1, reference = (np.load(tmp_path / f"{name}.npy")
                               for name in ("rank0", "rank1", "reference"))
    np.testing.assert_array_equal(rank0, rank1)
    np.testing.assert_allclose(rank0, reference, rtol=1e-5, atol=1e-6)


# ~2.5 min loaded: two processes train the tiny model through the trainer
def test_trainer_on_two_horovod_workers_equals_keras_fit_on_one_device(tmp_path):
    _horovodrun("horovod_trainer_script", tmp_path, timeout=600)
    rank0, rank1, single = (np.load(tmp_path / f"{name}.npz")
                            for name in ("rank0", "rank1", "single"))
    keys = [k for k in single.files if k.startswith("w")]
    moved = max(np.max(np.abs(single[k] - single[k.replace("w", "init")])) for k in keys)
    assert len(keys) > 50 and moved > 1e-3
    for key in keys:
        np.testing.assert_array_equal(rank0[key], rank1[key])
        np.testing.assert_allclose(rank0[key], single[key], rtol=1e-4, atol=5e-5)
    np.testing.assert_allclose(rank0["losses"], single["losses"], rtol=1e-4)
    # Only rank 0 writes checkpoints.
    assert rank0["has_checkpoint"] and not rank1["has_checkpoint"]
    assert not (tmp_path / "run1").exists()


# ~4 min loaded: two processes train, stop and resume; rank 0 also the one-device reference
def test_sigterm_to_one_horovod_worker_stops_both_at_one_step_and_both_resume(tmp_path):
    _horovodrun("horovod_stop_script", tmp_path, timeout=900)
    rank0, rank1, single = (np.load(tmp_path / f"{name}.npz")
                            for name in ("rank0", "rank1", "single"))
    # 4 steps per epoch in host calls of 2: rank 1's signal arrives before epoch 2's first
    # call, whose vote stops both after it (step 6 = epoch 1, batch 2), checkpointed by rank 0.
    saved = tmp_path / "run" / "checkpoints" / "epoch-0001-batch-000002"
    for rank in (rank0, rank1):
        assert (int(rank["step"]), int(rank["exit_code"])) == (6, 143), str(rank["message"])
        assert str(rank["checkpoint"]) == str(saved)
    assert str(rank0["by"]) == "rank 1" and str(rank1["by"]) == "None"
    assert str(rank0["message"]).startswith("stopped by SIGTERM to rank 1 after step 6: ")
    assert saved.is_dir()
    # Both resumed from it: the rest of epoch 2, to the uninterrupted one-device weights.
    assert rank0["epochs"].tolist() == rank1["epochs"].tolist() == [1]
    keys = [k for k in single.files if k.startswith("w")]
    assert len(keys) > 50
    for key in keys:
        np.testing.assert_array_equal(rank0[key], rank1[key])
        np.testing.assert_allclose(rank0[key], single[key], rtol=1e-4, atol=5e-5)
