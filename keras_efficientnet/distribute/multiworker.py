"""Replicas in several processes or hosts under MultiWorkerMirroredStrategy (TF_CONFIG)."""

from __future__ import annotations

import json
import os
import socket
import threading
import time

import numpy as np
import tensorflow as tf

from keras_efficientnet.distribute import train_loop
from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import skip_seen


def read_tf_config(environ=None) -> dict:
    """The parsed TF_CONFIG, with a clear error when it is missing or malformed."""
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    fix = ('set TF_CONFIG on every worker, e.g. {"cluster": {"worker": ["host1:port", '
           '"host2:port"]}, "task": {"type": "worker", "index": 0}}')
    if not text:
        raise ValueError(f"--strategy=multiworker needs the TF_CONFIG environment variable; {fix}")
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
        except Exception as error:
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


def is_chief_task(config: dict) -> bool:
    """Whether TF_CONFIG's task writes checkpoints and results: the chief, else worker 0."""
    task = config["task"]
    kind = task.get("type", "worker")
    return kind == "chief" or (kind == "worker" and int(task["index"]) == 0)


class MultiWorkerRuntime:
    """`plan.replicas` replicas over the processes named in TF_CONFIG, one input shard each.

    Every worker reads only its shard of the training files
    (`strategy.distribute_datasets_from_function`: one input pipeline per worker, each local
    replica taking its own per-replica batches), so N workers decode N times less each. The
    project's step sums each replica's micro-batches and all-reduces once per update; the
    project's loop runs it (Keras 3 `fit` fails under this strategy, keras#20585). Workers
    check that they resume from the same epoch: they must read the chief's checkpoints (one
    `--model_dir` on a shared filesystem).

    Args:
        plan: an `ExecutionPlan` with strategy "multiworker".
        timeout: seconds to wait for the peers to answer. Default 60.
        environ: where TF_CONFIG is read (default `os.environ`).
    """

    evaluates_in_place = False  # variables are mirrored: evaluate a one-device copy

    def __init__(self, plan: ExecutionPlan, *, timeout: float = 60.0, environ=None):
        self.plan = plan
        self.timeout = timeout
        self.environ = environ
        self.strategy = None
        self._tf_config = None

    def start(self) -> None:
        """Reads TF_CONFIG and starts the strategy before any other TensorFlow op (as
        MultiWorkerMirroredStrategy requires); the peers are probed for at most `timeout` s."""
        self._tf_config = read_tf_config(self.environ)
        self.strategy = build_multiworker_strategy(timeout=self.timeout, environ=self.environ)
        if self.strategy.num_replicas_in_sync != self.plan.replicas:
            raise ValueError(
                f"--replicas={self.plan.replicas} but the multi-worker cluster has "
                f"{self.strategy.num_replicas_in_sync} replicas (workers x local devices); set "
                f"--replicas={self.strategy.num_replicas_in_sync} or change TF_CONFIG")

    @property
    def is_chief(self) -> bool:
        return is_chief_task(self._tf_config or read_tf_config(self.environ))

    def scope(self):
        return self.strategy.scope()

    def attach(self, model) -> None:
        pass

    def _sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        per_replica = self.strategy.run(lambda: tf.constant(values))
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return np.asarray(total)

    def fit(self, model, make_dataset, *, epochs, steps_per_epoch, initial_epoch=0,
            callbacks=(), verbose=1):
        train_loop.check_same_start(initial_epoch, self._sum_over_replicas,
                                    self.strategy.num_replicas_in_sync)

        def shard(input_context):
            # Each local replica takes one batch of this worker's pipeline per step.
            local = input_context.num_replicas_in_sync // input_context.num_input_pipelines
            return skip_seen(make_dataset(input_context), initial_epoch=initial_epoch,
                             steps_per_epoch=steps_per_epoch, batches_per_step=local)

        data = self.strategy.distribute_datasets_from_function(shard)
        step = train_loop.make_train_step(
            model, model.optimizer, model.loss, global_batch_size=self.plan.global_batch_size,
            strategy=self.strategy, micro_batches=self.plan.micro_batches_per_step)
        return train_loop.fit(model, step, data, epochs=epochs, steps_per_epoch=steps_per_epoch,
                              initial_epoch=initial_epoch,
                              device_iterations=self.plan.device_iterations,
                              callbacks=callbacks, verbose=verbose)
