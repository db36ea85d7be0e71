"""Starts the multi-device and multi-worker processes together, once per session."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common import free_ports

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 600  # a bound that a loaded 2-core machine still meets



def wait_all(procs, tag: str, timeout: float = TIMEOUT_S) -> list[int]:
    """Waits for every process of `procs` under one deadline and returns their exit codes; a
    process still running then is killed and reaped, and the test fails naming `tag`."""
    deadline = time.monotonic() + timeout
    try:
        for proc in procs:
            proc.wait(max(deadline - time.monotonic(), 1))
    except subprocess.TimeoutExpired:
        pytest.fail(f"{tag}: the workers did not end in {timeout} s")
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return [proc.returncode for proc in procs]

class Processes:
    """The subprocess runs both test modules need, started in parallel (2 cores: ~half time)."""

    def __init__(self, tmp: Path):
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3", "CUDA_VISIBLE_DEVICES": ""}
        env.pop("TF_CONFIG", None)
        self.tmp = tmp
        self.procs: dict[str, subprocess.Popen] = {}

        def start(name, args, extra_env=None):
            log = open(tmp / f"{name}.log", "w")
            self.procs[name] = subprocess.Popen(
                [sys.executable, "-m", *args], cwd=REPO, env={**env, **(extra_env or {})},
                stdout=log, stderr=subprocess.STDOUT)

        ports = free_ports(2)
        cluster = {"worker": [f"127.0.0.1:{p}" for p in ports]}
        for index in range(2):
            tf_config = json.dumps({"cluster": cluster,
                                    "task": {"type": "worker", "index": index}})
            start(f"worker{index}", ["tests.distribute.multiworker_script",
                                     str(tmp / f"worker{index}.npz"),
                                     str(tmp / f"worker{index}_run")], {"TF_CONFIG": tf_config})
        # The multi-device process also writes the single-process reference (one less start).
        start("multidevice", ["tests.distribute.multidevice_script", str(tmp / "single.npz")])

    def wait(self, name: str) -> str:
        proc = self.procs[name]
        try:
            proc.wait(TIMEOUT_S)
        except subprocess.TimeoutExpired:
            for other in self.procs.values():
                other.kill()
            pytest.fail(f"{name} did not finish in {TIMEOUT_S} s")
        log = (self.tmp / f"{name}.log").read_text()
        if proc.returncode != 0:
            pytest.fail(f"{name} failed ({proc.returncode}):\n{log[-4000:]}")
        return log


@pytest.fixture(scope="session")
def processes(tmp_path_factory) -> Processes:
    procs = Processes(tmp_path_factory.mktemp("distribute"))
    yield procs
    for proc in procs.procs.values():
        if proc.poll() is None:
            proc.kill()


@pytest.fixture(scope="session", autouse=True)
def _start_processes_early(request):
    # The subprocesses take most of this suite's time: start them with the first test so that
    # the in-process tests run meanwhile. Under pytest-xdist every worker sees every item, so
    # there they start with the first test that needs them, in the one worker that runs it.
    if "PYTEST_XDIST_WORKER" in os.environ:
        return
    if any("test_distribute_multiprocess" in item.nodeid for item in request.session.items):
        request.getfixturevalue("processes")
