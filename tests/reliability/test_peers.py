"""Multi-worker start-up with a peer that never joins: bounded by --peer_timeout, one line
naming the peer, and SIGTERM/SIGINT effective during the probe and TensorFlow's own wait."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from keras_efficientnet.distribute import multiworker
from tests.distribute.conftest import free_ports
from tests.reliability.clitools import REPO, assert_one_line, cli_command, env, messages

pytestmark = pytest.mark.tf_only
WATCHDOG = REPO / "keras_efficientnet" / "distribute" / "watchdog.py"
# Start-up (TensorFlow's import) before the probe: ~5 s on a quiet 2-core CPU; generous.
STARTUP_S = 90


def _tf_config(workers, index=0, kind="worker", chief=None) -> dict:
    cluster = {"worker": list(workers)}
    if chief:
        cluster["chief"] = list(chief)
    return {"cluster": cluster, "task": {"type": kind, "index": index}}


def _listener() -> socket.socket:
    """A peer that accepts TCP (the kernel completes connections) but is no TensorFlow."""
    return socket.create_server(("127.0.0.1", 0), backlog=16)


def _refusing() -> socket.socket:
    """A port that refuses connections (bound, never listening) and that no other process can
    take while the test holds it: a port from `free_ports` may be bound by another test's
    process meanwhile (the multi-process tests run beside these)."""
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    return held


def _address(server: socket.socket) -> str:
    return f"127.0.0.1:{server.getsockname()[1]}"


# --- check_peers and the port a task holds while it probes, with real sockets ----------------

def test_peers_that_listen_pass_at_once():
    with _listener() as a, _listener() as b:
        config = _tf_config(["127.0.0.1:1", _address(a), _address(b)], index=0)
        started = time.monotonic()
        multiworker.check_peers(config, timeout=5)
        assert time.monotonic() - started < 1.0


def test_a_closed_port_fails_after_the_timeout_naming_the_peer_and_its_index():
    with _listener() as up, _refusing() as held:
        closed = held.getsockname()[1]
        up_address = _address(up)
        config = _tf_config([up_address, "127.0.0.1:1", f"127.0.0.1:{closed}"], index=1)
        started = time.monotonic()
        with pytest.raises(ConnectionError) as error:
            multiworker.check_peers(config, timeout=0.6, interval=0.1)
    elapsed = time.monotonic() - started
    assert 0.6 <= elapsed < 2.0, elapsed
    message = str(error.value)
    assert f"127.0.0.1:{closed} (worker 2: [Errno 111] Connection refused)" in message
    assert up_address not in message and "--peer_timeout" in message


def test_a_peer_that_starts_late_is_waited_for():
    port, = free_ports(1)
    late = []
    timer = threading.Timer(0.5, lambda: late.append(
        socket.create_server(("127.0.0.1", port))))
    timer.start()
    try:
        started = time.monotonic()
        multiworker.check_peers(_tf_config(["127.0.0.1:1", f"127.0.0.1:{port}"]), timeout=10,
                                interval=0.1)
        assert 0.5 <= time.monotonic() - started < 3.0
    finally:
        timer.join()
        for server in late:
            server.close()


def test_a_chief_job_is_a_peer_too_and_an_unresolvable_host_fails_at_once():
    config = _tf_config(["127.0.0.1:1", "no-such-host.invalid:2222"], index=0,
                        chief=["127.0.0.1:3"])
    assert multiworker.peer_names(config) == ("127.0.0.1:3 (chief 0), "
                                              "no-such-host.invalid:2222 (worker 1)")
    started = time.monotonic()
    with pytest.raises(ConnectionError, match=r"no-such-host\.invalid:2222 \(worker 1\): host "
                                              r"'no-such-host\.invalid' does not resolve"):
        multiworker.check_peers(config, timeout=30)
    assert time.monotonic() - started < 5.0


def test_a_task_listens_on_its_own_port_while_probing_and_a_used_port_is_named():
    port, = free_ports(1)
    with multiworker.holding_port(port):
        socket.create_connection(("127.0.0.1", port), timeout=2).close()
        with pytest.raises(ConnectionError, match=f"this task's port {port} .* cannot be "
                                                  "opened"):
            with multiworker.holding_port(port):
                pass
    with pytest.raises(ConnectionRefusedError):  # released for TensorFlow's server
        socket.create_connection(("127.0.0.1", port), timeout=2).close()


@pytest.mark.parametrize("text,pattern", [
    ('{"cluster": {"worker": ["a:1"]}, "task": {"type": "ps", "index": 0}}',
     r"task type 'ps' is not one of the cluster's jobs \['worker'\]"),
    ('{"cluster": {"worker": ["a:1", "b"]}, "task": {"index": 0}}',
     r"address 'b' is not host:port"),
    ('{"cluster": {"chief": ["a:1"]}, "task": {"type": "chief", "index": 0}}',
     r"TF_CONFIG is malformed"),
])
def test_bad_tf_config_is_one_clear_error(text, pattern):
    with pytest.raises(ValueError, match=pattern):
        multiworker.read_tf_config({"TF_CONFIG": text})


# --- the watchdog, in plain Python processes (no TensorFlow: fast) ---------------------------

GUARDED = """
import importlib.util, sys, time
spec = importlib.util.spec_from_file_location("watchdog", {path!r})
watchdog = importlib.util.module_from_spec(spec); spec.loader.exec_module(watchdog)
with watchdog.guarded({timeout}, on_timeout="error: too slow", on_signal="stopped by {{signal}}"):
    print("guarding", flush=True)
    time.sleep({sleep})
print("returned", flush=True)
"""


def _guarded(timeout: float, sleep: float) -> subprocess.Popen:
    code = GUARDED.format(path=str(WATCHDOG), timeout=timeout, sleep=sleep)
    process = subprocess.Popen([sys.executable, "-I", "-c", code], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True)
    assert process.stdout.readline() == "guarding\n"
    return process


def test_watchdog_lets_a_call_that_returns_in_time_go_on():
    process = _guarded(timeout=30, sleep=0.2)
    out, err = process.communicate(timeout=30)
    assert (process.returncode, out, err) == (0, "returned\n", "")


def test_watchdog_ends_a_call_that_does_not_return():
    started = time.monotonic()
    process = _guarded(timeout=1, sleep=60)
    out, err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL and err == "error: too slow\n"
    assert time.monotonic() - started < 5.0


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_watchdog_stops_the_process_at_once_on_a_signal(signum):
    process = _guarded(timeout=60, sleep=60)
    sent = time.monotonic()
    process.send_signal(signum)
    out, err = process.communicate(timeout=30)
    assert process.returncode == -signal.SIGKILL
    assert err == f"stopped by {signal.Signals(signum).name}\n"
    assert time.monotonic() - sent < 2.0


def test_pending_signals_are_read_from_proc():
    spec = importlib.util.spec_from_file_location("watchdog", WATCHDOG)
    watchdog = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(watchdog)
    handler = signal.signal(signal.SIGUSR1, lambda *args: None)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGUSR1])
    try:
        assert signal.SIGUSR1 not in watchdog.pending_signals(os.getpid())
        # To this (main) thread, which blocks it: pending (other threads may not block it).
        signal.pthread_kill(threading.main_thread().ident, signal.SIGUSR1)
        assert signal.SIGUSR1 in watchdog.pending_signals(os.getpid())
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)  # delivered to the no-op
        signal.signal(signal.SIGUSR1, handler)


# --- the command line: one process per case, started together --------------------------------

def _start_cli(tmp: Path, name: str, tf_config: dict, peer_timeout: float) -> dict:
    log = open(tmp / f"{name}.err", "w")
    process = subprocess.Popen(
        cli_command("--flagfile=flags/smoke.flags", "--mode=train", "--strategy=multiworker",
                    "--replicas=2", f"--peer_timeout={peer_timeout}",
                    f"--model_dir={tmp / name}"),
        cwd=REPO, env=env(TF_CONFIG=json.dumps(tf_config)), stdout=subprocess.PIPE,
        stderr=log, text=True)
    return {"process": process, "started": time.monotonic(), "err": tmp / f"{name}.err"}


def _finish(case: dict, timeout: float = STARTUP_S) -> subprocess.CompletedProcess:
    process = case["process"]
    try:
        out, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.communicate()
        pytest.fail(f"no exit within {timeout} s:\n{case['err'].read_text()[-3000:]}")
    case["seconds"] = time.monotonic() - case["started"]
    return subprocess.CompletedProcess(process.args, process.returncode, out,
                                       case["err"].read_text())


def _accepted(server: socket.socket, count: int, timeout: float) -> None:
    """Waits until `count` connections reached `server` (the probe's, then TensorFlow's)."""
    server.settimeout(timeout)
    for _ in range(count):
        server.accept()[0].close()


@pytest.fixture(scope="module")
def cli_cases(tmp_path_factory):
    """Two runs at once: a closed peer port (the probe's error) and a peer that accepts TCP
    but is no TensorFlow server, stopped by SIGTERM while TensorFlow's constructor waits."""
    tmp = tmp_path_factory.mktemp("peers")
    own_a, own_b = free_ports(2)
    with _listener() as fake, _refusing() as held:
        closed = held.getsockname()[1]
        cases = {
            "closed": _start_cli(tmp, "closed", _tf_config(
                [f"127.0.0.1:{own_a}", f"127.0.0.1:{closed}"]), peer_timeout=3),
            # This run is worker 1: its TensorFlow connects to the leader, worker 0 (the fake).
            "term": _start_cli(tmp, "term", _tf_config(
                [_address(fake), f"127.0.0.1:{own_b}"], index=1), peer_timeout=300),
        }
        _accepted(fake, 2, STARTUP_S)
        cases["term"]["signalled"] = time.monotonic()
        cases["term"]["process"].send_signal(signal.SIGTERM)
        results = {name: _finish(cases[name]) for name in ("term", "closed")}
    for name, case in cases.items():
        print(f"{name}: collected {case['seconds']:.1f} s after its start")
    term = cases["term"]
    print(f"term: exit within {term['started'] + term['seconds'] - term['signalled']:.2f} s "
          "of SIGTERM")
    return cases, results


def _plan_printed_first(stdout: str) -> bool:
    """The run's first lines: what loads (`loading: ...`), the recipe it chose, the plan."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    return lines[0].startswith("loading: TensorFlow") and "Execution plan" in lines[1:3]


def test_cli_names_the_unreachable_peer_after_the_plan_within_the_bound(cli_cases):
    cases, results = cli_cases
    result = results["closed"]
    line = assert_one_line(result, 2, r"^error: multi-worker peer\(s\) unreachable after 3 s "
                                      r"\(--peer_timeout\): 127\.0\.0\.1:\d+ \(worker 1: "
                                      r"\[Errno 111\] Connection refused\)")
    assert "raise --peer_timeout" in line
    assert _plan_printed_first(result.stdout)  # printed before the wait
    assert cases["closed"]["seconds"] < 3 + STARTUP_S


def test_sigterm_while_tensorflow_waits_for_a_peer_stops_at_once(cli_cases):
    cases, results = cli_cases
    result = results["term"]
    assert "Traceback" not in result.stderr
    assert messages(result.stderr) == [messages(result.stderr)[0]]
    assert messages(result.stderr)[0].startswith(
        "stopped by SIGTERM while TensorFlow was connecting the multi-worker peers "
        "(127.0.0.1:")
    assert result.returncode == -signal.SIGKILL  # the watchdog's last resort
    assert time.monotonic() - cases["term"]["signalled"] < 30  # see the fixture's print
    assert _plan_printed_first(result.stdout)


# --- slow: every other way a start-up wait ends ----------------------------------------------

@pytest.mark.slow  # ~25 s on 2 cores: three runs with TensorFlow's start-up each
def test_slow_cli_waits_all_end_promptly(tmp_path):
    ports = free_ports(3)
    with _listener() as fake, _refusing() as held:
        ports.append(held.getsockname()[1])
        cases = {
            # A peer that accepts TCP but never joins: TensorFlow's wait times out.
            "stuck": _start_cli(tmp_path, "stuck", _tf_config(
                [_address(fake), f"127.0.0.1:{ports[0]}"], index=1), peer_timeout=3),
            # SIGINT (Ctrl-C) and SIGTERM while the probe waits for a closed port.
            "int_probe": _start_cli(tmp_path, "int_probe", _tf_config(
                [f"127.0.0.1:{ports[1]}", f"127.0.0.1:{ports[3]}"]), peer_timeout=300),
            "term_probe": _start_cli(tmp_path, "term_probe", _tf_config(
                [f"127.0.0.1:{ports[2]}", f"127.0.0.1:{ports[3]}"]), peer_timeout=300),
        }
        for name, own in (("int_probe", ports[1]), ("term_probe", ports[2])):
            _wait_listening(own, cases[name]["process"])  # the task holds its port: probing
        cases["int_probe"]["process"].send_signal(signal.SIGINT)
        cases["term_probe"]["process"].send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        results = {name: _finish(case) for name, case in cases.items()}
    assert_one_line(results["stuck"], -signal.SIGKILL,
                    r"^error: the multi-worker peers 127\.0\.0\.1:\d+ \(worker 0\) accept "
                    r"connections but TensorFlow did not connect them within 3 s")
    assert_one_line(results["int_probe"], 130, "^stopped by SIGINT outside a training step")
    assert_one_line(results["term_probe"], 143, "^stopped by SIGTERM outside a training step")
    assert time.monotonic() - signalled < 30
    for name, case in cases.items():
        print(f"{name}: exit after {case['seconds']:.1f} s")


def _wait_listening(port: int, process: subprocess.Popen) -> None:
    deadline = time.monotonic() + STARTUP_S
    while time.monotonic() < deadline and process.poll() is None:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    pytest.fail(f"port {port} never listened (rc {process.poll()})")


@pytest.mark.slow  # ~10 s: TensorFlow's start-up
def test_slow_unroutable_peer_ends_within_the_bound_in_one_line(tmp_path):
    # Where 10.255.255.1 is unroutable, the probe's connect times out (the first line); where
    # a proxy answers every address (some sandboxes), TensorFlow's wait times out (the second).
    own, = free_ports(1)
    case = _start_cli(tmp_path, "unroutable", _tf_config(
        [f"127.0.0.1:{own}", "10.255.255.1:2222"]), peer_timeout=3)
    result = _finish(case)
    line = assert_one_line(result, result.returncode, "10\\.255\\.255\\.1:2222 \\(worker 1")
    assert (result.returncode, line.split(":")[0]) in {(2, "error"), (-signal.SIGKILL, "error")}
    assert case["seconds"] < 2 * 3 + STARTUP_S
    print(f"unroutable: {line[:60]}... rc {result.returncode}, {case['seconds']:.1f} s")
