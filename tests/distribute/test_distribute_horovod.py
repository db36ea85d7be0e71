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


@pytest.mark.slow  # ~30 s: two processes start TensorFlow and Gloo
@pytest.mark.skipif(not HORORUN.exists(), reason="horovodrun not installed beside python")
def test_two_horovod_workers_equal_one_process(tmp_path):
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
    script = Path(__file__).with_name("horovod_script.py")
    run = subprocess.run([str(HORORUN), "-np", "2", "-H", "localhost:2", "--gloo",
                          sys.executable, str(script), str(tmp_path)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    rank0, rank1, reference = (np.load(tmp_path / f"{name}.npy")
                               for name in ("rank0", "rank1", "reference"))
    np.testing.assert_array_equal(rank0, rank1)
    np.testing.assert_allclose(rank0, reference, rtol=1e-5, atol=1e-6)
