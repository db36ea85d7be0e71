"""SIGTERM to the workers of a 2-worker command-line run: all stop at one step, the chief
checkpoints it, and the same command on both resumes to the uninterrupted run's weights.

Each run is the smoke model on the digits, 2 epochs of 6 steps, 2 workers on 127.0.0.1 sharing
one --model_dir (the chief writes). The signal goes out as the chief's epoch-1 checkpoint
appears, so it lands during epoch 2 (whose steps take ~1-3 s here).
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

import pytest

from tests.distribute.conftest import free_ports, wait_all
from tests.reliability.clitools import (
    REPO,
    TINY,
    assert_same_checkpoint,
    cli_command,
    env,
    messages,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.tf_only]

SHAPE = ["--epochs=2", "--updates_per_epoch=6", "--strategy=multiworker", "--replicas=2"]
TIMEOUT_S = 600
# From the signal to both exits: the next host call's vote, the chief's save, TensorFlow's
# shutdown. Steps take ~1-3 s on a loaded 2-core machine.
STOP_BOUND_S = 90


def _start(model_dir: Path, tag: str, tmp: Path) -> list[subprocess.Popen]:
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(2)]}
    procs = []
    for index in range(2):
        tf_config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
        procs.append(subprocess.Popen(
            cli_command(*TINY, *SHAPE, f"--model_dir={model_dir}"), cwd=REPO,
            env=env(TF_CONFIG=tf_config, CUDA_VISIBLE_DEVICES=""), stdout=subprocess.DEVNULL,
            stderr=open(tmp / f"{tag}{index}.err", "w"), text=True))
    return procs


def _wait(procs, tmp: Path, tag: str, timeout: float = TIMEOUT_S) -> list[tuple[int, str]]:
    codes = wait_all(procs, tag, timeout)
    return [(code, (tmp / f"{tag}{i}.err").read_text()) for i, code in enumerate(codes)]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("uninterrupted")
    results = _wait(_start(tmp / "run", "ref", tmp), tmp, "ref")
    assert [code for code, _ in results] == [0, 0], results[0][1][-3000:] + results[1][1][-3000:]
    return tmp / "run" / "checkpoints" / "epoch-0002"


@pytest.mark.parametrize("signalled", [[1], [0, 1]], ids=["non-chief", "both"])
def test_sigterm_stops_both_workers_at_one_checkpointed_step_and_both_resume(
        tmp_path, reference, signalled):
    model_dir = tmp_path / "run"
    procs = _start(model_dir, "stop", tmp_path)
    epoch_one = model_dir / "checkpoints" / "epoch-0001"
    wait_for(epoch_one.is_dir, TIMEOUT_S, "the epoch-1 checkpoint", procs[0])
    for index in signalled:
        procs[index].send_signal(signal.SIGTERM)
    sent = time.monotonic()
    results = _wait(procs, tmp_path, "stop", STOP_BOUND_S)
    print(f"both ended {time.monotonic() - sent:.1f} s after SIGTERM")
    lines = []
    for code, err in results:
        assert "Traceback" not in err, err[-3000:]
        found = [line for line in messages(err) if not line.startswith("warning: ")]
        assert len(found) == 1 and code == 143, (code, err[-3000:])
        lines.append(found[0])
    steps = {int(re.search(r"after step (\d+):", line)[1]) for line in lines}
    paths = {re.search(r"checkpoint to (\S+);", line.replace("written to", "to"))[1]
             for line in lines}
    assert len(steps) == 1 and len(paths) == 1, lines  # one step, one checkpoint, named by both
    step, saved = steps.pop(), Path(paths.pop())
    assert 6 < step < 12 and saved.name == f"epoch-0001-batch-{step - 6:06d}", lines
    assert saved.is_dir() and json.loads((saved / "state.json").read_text())["global_step"] == step
    chief, other = lines
    if signalled == [1]:
        assert chief.startswith("stopped by SIGTERM to worker 1 (127.0.0.1:"), chief
        assert other.startswith(f"stopped by SIGTERM after step {step}: the chief writes the "
                                f"checkpoint to {saved}; run the same command on every worker")
    else:
        assert chief.startswith(f"stopped by SIGTERM after step {step}: checkpoint written to "
                                f"{saved}; run the same command on every worker"), chief

    results = _wait(_start(model_dir, "resume", tmp_path), tmp_path, "resume")
    for code, err in results:
        assert code == 0, err[-3000:]
        assert f"resumed from {saved}" in err
    print(f"stopped at step {step}, resumed: {saved.name}")
    assert_same_checkpoint(model_dir / "checkpoints" / "epoch-0002", reference)
