"""Two horovod (Gloo) workers against one process; runs only where `make install-horovod` ran."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("horovod.tensorflow")

HORORUN = Path(sys.executable).with_name("horovodrun")


REPO = Path(__file__).resolve().parents[2]


def _horovodrun(module: str, out: Path, timeout: int) -> None:
    """Runs `python -m tests.distribute.<module> OUT` on 2 Gloo workers on this host."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    run = subprocess.run([str(HORORUN), "-np", "2", "-H", "localhost:2", "--gloo",
                          sys.executable, "-m", f"tests.distribute.{module}", str(out)],
                         cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]


@pytest.mark.slow  # ~30 s: two processes start TensorFlow and Gloo
@pytest.mark.skipif(not HORORUN.exists(), reason="horovodrun not installed beside python")
def test_two_horovod_workers_equal_one_process(tmp_path):
    _horovodrun("horovod_script", tmp_path, timeout=300)
    rank0, rank1, reference = (np.load(tmp_path / f"{name}.npy")
                               for name in ("rank0", "rank1", "reference"))
    np.testing.assert_array_equal(rank0, rank1)
    np.testing.assert_allclose(rank0, reference, rtol=1e-5, atol=1e-6)


@pytest.mark.slow  # ~1 min: two processes train the tiny model through the trainer
@pytest.mark.skipif(not HORORUN.exists(), reason="horovodrun not installed beside python")
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
