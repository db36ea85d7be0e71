"""Builds the tf.distribute strategy of a plan: one device, mirrored, or multi-worker."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import tensorflow as tf

from keras_efficientnet.distribute.plan import ExecutionPlan


def configure_logical_cpus(count: int) -> list[str]:
    """Splits the host CPU into `count` logical devices (tests and CPU benchmarks).

    Must run before TensorFlow initialises its devices (before any op or `list_logical_devices`),
    which is why multi-device tests start a fresh process. Returns all logical CPU devices (at
    least `count`: an earlier split into more devices is kept).
    """
    if not isinstance(count, int) or count < 1:
        raise ValueError(f"count must be a positive int, received {count!r}")
    cpu = tf.config.list_physical_devices("CPU")[0]
    current = tf.config.get_logical_device_configuration(cpu)
    # Already split into at least `count` devices (e.g. by a test process): use those.
    if not current or len(current) < count:
        try:
            tf.config.set_logical_device_configuration(
                cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
        except RuntimeError as error:
            raise RuntimeError(
                f"cannot split the CPU into {count} logical devices: TensorFlow has already "
                f"initialised its devices ({error}); call configure_logical_cpus() first thing "
                "in a fresh process") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def read_tf_config(environ=None) -> dict:
    """The parsed TF_CONFIG, with a clear error when it is missing or malformed."""
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    fix = ('set TF_CONFIG on every worker, e.g. {"cluster": {"worker": ["host1:port", '
           '"host2:port"]}, "task": {"type": "worker", "index": 0}}')
    if not text:
        raise ValueError(f"backend 'multiworker' needs the TF_CONFIG environment variable; {fix}")
    try:
        config = json.loads(text)
        workers = list(config["cluster"]["worker"])
        task = config["task"]
        index = int(task["index"])
    except (ValueError, KeyError, TypeError) as error:
        raise ValueError(f"TF_CONFIG is malformed ({error!r}): {text!r}; {fix}") from None
    if not 0 <= index < len(workers):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(workers)} workers "
                         f"{workers}; {fix}")
    return config


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG worker address {address!r} is not host:port")
    return host, int(port)


def check_peers(config: dict, *, timeout: float = 60.0, interval: float = 0.5) -> None:
    """Waits until every other worker in `config` accepts TCP connections, else raises.

    Peers start at different moments, so an unanswered connect is retried until `timeout`
    seconds; an unresolvable host fails at once. The error names the host:port and the fix.
    """
    workers = list(config["cluster"]["worker"])
    me = int(config["task"]["index"])
    pending = {}
    for i, address in enumerate(workers):
        if i == me:
            continue
        host, port = _split_address(address)
        try:
            socket.getaddrinfo(host, port)
        except OSError as error:
            raise ConnectionError(
                f"multi-worker peer {address} (worker {i}): host {host!r} does not resolve "
                f"({error}); fix the address in TF_CONFIG") from None
        pending[i] = (host, port)
    deadline = time.monotonic() + timeout
    last_error = {}
    while pending:
        for i, (host, port) in list(pending.items()):
            try:
                with socket.create_connection((host, port), timeout=min(interval, 2.0)):
                    del pending[i]
            except OSError as error:
                last_error[i] = error
        if not pending:
            return
        if time.monotonic() > deadline:
            names = ", ".join(f"{workers[i]} (worker {i}: {last_error[i]})" for i in pending)
            raise ConnectionError(
                f"multi-worker peer(s) unreachable after {timeout:.0f} s: {names}. Fix: start "
                "every worker listed in TF_CONFIG (same cluster list, each with its own task "
                "index), check the hosts and ports, and open the ports in the firewall")
        time.sleep(interval)


def build_multiworker_strategy(*, timeout: float = 60.0, environ=None):
    """MultiWorkerMirroredStrategy from TF_CONFIG, failing clearly when a peer never answers.

    The strategy's constructor starts this worker's server and then blocks until all peers have
    joined, so it runs in a helper thread while this thread probes the peers; an unreachable
    peer raises here instead of hanging (the daemon thread dies with the process).
    """
    config = read_tf_config(environ)
    result: dict = {}

    def create():
        try:
            result["strategy"] = tf.distribute.MultiWorkerMirroredStrategy()
        except Exception as error:  # noqa: BLE001 - re-raised in the calling thread
            result["error"] = error

    thread = threading.Thread(target=create, daemon=True)
    thread.start()
    check_peers(config, timeout=timeout)
    thread.join(timeout)
    if "error" in result:
        raise result["error"]
    if "strategy" not in result:
        raise ConnectionError(f"multi-worker peers answer but the strategy did not start within "
                              f"{timeout:.0f} s; check that every worker runs the same TF_CONFIG "
                              "cluster list")
    return result["strategy"]


# One MirroredStrategy per device set and process: two strategies over the same devices number
# their all-reduces from the same collective keys, and their ops then meet in one collective
# ("Shape mismatch in the collective instance ..."), e.g. a notebook that plans twice.
_MIRRORED: dict[tuple[str, ...], tf.distribute.MirroredStrategy] = {}


def _mirrored(devices: tuple[str, ...]) -> tf.distribute.MirroredStrategy:
    if devices not in _MIRRORED:
        _MIRRORED[devices] = tf.distribute.MirroredStrategy(list(devices))
    return _MIRRORED[devices]


def build_strategy(plan: ExecutionPlan, *, timeout: float = 60.0):
    """The tf.distribute strategy for `plan`; checks the device count before training."""
    if plan.backend in ("default", "horovod"):
        # Horovod runs one process per device; its all-reduce lives in the train step.
        if plan.backend == "horovod":
            from keras_efficientnet.distribute.train_loop import import_horovod

            import_horovod()
        return tf.distribute.get_strategy()
    if plan.backend == "ipu":
        from keras_efficientnet.distribute.ipu import build_ipu_strategy

        return build_ipu_strategy(plan)
    if plan.backend == "mirrored":
        gpus = tf.config.list_physical_devices("GPU")
        if gpus:
            devices = [d.name for d in tf.config.list_logical_devices("GPU")]
            plan.check_devices(len(devices), "GPU")
            devices = devices[:plan.replicas]
        else:
            devices = [d.name for d in tf.config.list_logical_devices("CPU")]
            plan.check_devices(len(devices), "logical CPU device")
            devices = devices[:plan.replicas]
        return _mirrored(tuple(devices))
    strategy = build_multiworker_strategy(timeout=timeout)
    if strategy.num_replicas_in_sync != plan.replicas:
        raise ValueError(
            f"--replicas={plan.replicas} but the multi-worker cluster has "
            f"{strategy.num_replicas_in_sync} replicas (workers x local devices); set --replicas "
            f"to {strategy.num_replicas_in_sync} or change TF_CONFIG")
    return strategy
