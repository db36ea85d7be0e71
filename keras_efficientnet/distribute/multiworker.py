"""Replicas in several processes or hosts under MultiWorkerMirroredStrategy (TF_CONFIG)."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator

import numpy as np
import tensorflow as tf

from keras_efficientnet.distribute import train_loop, watchdog
from keras_efficientnet.training.plan import ExecutionPlan
from keras_efficientnet.training.runtime import RuntimeBase, first_step, skip_seen

# The jobs whose tasks join MultiWorkerMirroredStrategy's cluster (an evaluator does not).
CLUSTER_JOBS = ("chief", "worker")
FIX_TF_CONFIG = ('set TF_CONFIG on every worker, e.g. {"cluster": {"worker": ["host1:port", '
                 '"host2:port"]}, "task": {"type": "worker", "index": 0}}')


def read_tf_config(environ=None) -> dict:
    """The parsed TF_CONFIG, with a clear error when it is missing or malformed."""
    environ = os.environ if environ is None else environ
    text = environ.get("TF_CONFIG", "")
    if not text:
        raise ValueError("--strategy=multiworker needs the TF_CONFIG environment variable; "
                         f"{FIX_TF_CONFIG}")
    try:
        config = json.loads(text)
        cluster = {job: list(config["cluster"][job]) for job in CLUSTER_JOBS
                   if job in config["cluster"]}
        kind = config["task"].get("type", "worker")
        index = int(config["task"]["index"])
        if "worker" not in cluster:
            raise KeyError("cluster.worker")
    except (ValueError, KeyError, TypeError, AttributeError) as error:
        raise ValueError(f"TF_CONFIG is malformed ({error!r}): {text!r}; {FIX_TF_CONFIG}") from None
    if kind not in cluster:
        raise ValueError(f"TF_CONFIG task type {kind!r} is not one of the cluster's jobs "
                         f"{sorted(cluster)}; {FIX_TF_CONFIG}")
    if not 0 <= index < len(cluster[kind]):
        raise ValueError(f"TF_CONFIG task index {index} is outside the {len(cluster[kind])} "
                         f"{kind}s {cluster[kind]}; {FIX_TF_CONFIG}")
    for addresses in cluster.values():
        for address in addresses:
            _split_address(address)
    return config


def _split_address(address: str) -> tuple[str, int]:
    host, _, port = str(address).rpartition(":")
    if not host or not port.isdigit():
        raise ValueError(f"TF_CONFIG address {address!r} is not host:port; {FIX_TF_CONFIG}")
    return host.strip("[]"), int(port)  # [::1]:2222 is an IPv6 host


def cluster_tasks(config: dict) -> list[tuple[str, int, str]]:
    """(job, index, "host:port") of every task of the cluster, chief first."""
    return [(job, i, address) for job in CLUSTER_JOBS
            for i, address in enumerate(config["cluster"].get(job, ()))]


def own_task(config: dict) -> tuple[str, int]:
    task = config["task"]
    return task.get("type", "worker"), int(task["index"])


def peer_names(config: dict) -> str:
    """The other tasks as "host:port (worker 1), ..."."""
    me = own_task(config)
    return ", ".join(f"{address} ({job} {i})" for job, i, address in cluster_tasks(config)
                     if (job, i) != me)


@contextlib.contextmanager
def holding_port(port: int) -> Iterator[None]:
    """Listens on this task's port (all interfaces, as TensorFlow's server will) inside.

    Every worker probes its peers before it starts its TensorFlow server, so without this no
    worker would answer and all would wait for each other. The kernel completes the peers'
    connections without an `accept`. A port in use fails here, naming the address.
    """
    try:
        if socket.has_dualstack_ipv6():
            server = socket.create_server(("", port), family=socket.AF_INET6,
                                          dualstack_ipv6=True, backlog=1024)
        else:
            server = socket.create_server(("", port), backlog=1024)
    except OSError as error:
        raise ConnectionError(
            f"this task's port {port} (its address in TF_CONFIG) cannot be opened ({error}): "
            "another process uses it (an earlier run still alive?) or the task index points at "
            "another task's address; stop that process or fix TF_CONFIG") from None
    try:
        yield
    finally:
        server.close()  # TensorFlow's server binds it next (gRPC sets SO_REUSEADDR)


def check_peers(config: dict, *, timeout: float = 60.0, interval: float = 0.2) -> None:
    """Waits until every other task in `config` accepts TCP connections, else raises.

    Peers start at different moments, so an unanswered connect is retried until `timeout`
    seconds (each attempt bounded by what is left); an unresolvable host fails at once. The
    error names each peer that never answered (host:port, job and index) and the fix. Pure
    Python with short system calls: SIGTERM and SIGINT handlers run at once meanwhile.
    """
    me = own_task(config)
    pending = {}
    for job, i, address in cluster_tasks(config):
        if (job, i) == me:
            continue
        host, port = _split_address(address)
        try:
            socket.getaddrinfo(host, port)
        except OSError as error:
            raise ConnectionError(
                f"multi-worker peer {address} ({job} {i}): host {host!r} does not resolve "
                f"({error}); fix the address in TF_CONFIG") from None
        pending[(job, i)] = (address, host, port)
    deadline = time.monotonic() + timeout
    last_error: dict = {}
    while pending:
        for key, (_, host, port) in list(pending.items()):
            left = deadline - time.monotonic()
            try:
                with socket.create_connection((host, port), timeout=min(2.0, max(left, 0.05))):
                    del pending[key]
            except OSError as error:
                last_error[key] = error
        if not pending:
            return
        if time.monotonic() >= deadline:
            names = ", ".join(f"{address} ({job} {i}: {last_error[(job, i)]})"
                              for (job, i), (address, _, _) in pending.items())
            raise ConnectionError(
                f"multi-worker peer(s) unreachable after {timeout:g} s (--peer_timeout): "
                f"{names}. Fix: start every task listed in TF_CONFIG (same cluster list, each "
                "with its own task index), check the hosts and ports, open the ports in the "
                "firewall, or raise --peer_timeout for late starters")
        time.sleep(min(interval, max(deadline - time.monotonic(), 0)))


def build_multiworker_strategy(*, timeout: float = 60.0, environ=None):
    """MultiWorkerMirroredStrategy from TF_CONFIG, failing clearly when a peer never joins.

    First the peers are probed over TCP (at most `timeout` s, this task listening on its own
    port meanwhile): an unreachable peer raises `ConnectionError` naming it. Then the
    strategy's constructor starts this task's server and waits for all peers to join, inside
    one C++ call that keeps the GIL and catches SIGTERM; it can still wait forever when a peer
    accepts TCP but never joins (another service on that port, a worker of another cluster, a
    peer that died after answering). It runs under a `watchdog.guarded` bound of another
    `timeout` s, which also ends the process at once on SIGTERM or SIGINT, writing one line.
    """
    config = read_tf_config(environ)
    _, own_port = _split_address(_own_address(config))
    with holding_port(own_port):
        check_peers(config, timeout=timeout)
    peers = peer_names(config)
    on_timeout = (
        f"error: the multi-worker peers {peers} accept connections but TensorFlow did not "
        f"connect them within {timeout:g} s (--peer_timeout). Fix: check that each address in "
        "TF_CONFIG is a worker of this run, started with the same cluster list and its own "
        "task index (not another service on that port), then start all workers again")
    on_signal = ("stopped by {signal} while TensorFlow was connecting the multi-worker peers "
                 f"({peers}), before any training: nothing to save; run the same command to "
                 "start")
    with watchdog.guarded(timeout, on_timeout=on_timeout, on_signal=on_signal):
        return tf.distribute.MultiWorkerMirroredStrategy()


def _own_address(config: dict) -> str:
    job, index = own_task(config)
    return config["cluster"][job][index]


def is_chief_task(config: dict) -> bool:
    """Whether TF_CONFIG's task writes checkpoints and results: the chief, else worker 0."""
    task = config["task"]
    kind = task.get("type", "worker")
    return kind == "chief" or (kind == "worker" and int(task["index"]) == 0)


class MultiWorkerRuntime(RuntimeBase):
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
        timeout: seconds to wait for the peers to answer, and again for TensorFlow to join
            them (`--peer_timeout`). Default 60.
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
        MultiWorkerMirroredStrategy requires): at most `timeout` s probing the peers, then
        at most `timeout` s for TensorFlow to join them (`build_multiworker_strategy`)."""
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

    def _sum_over_replicas(self, values: np.ndarray) -> np.ndarray:
        per_replica = self.strategy.run(lambda: tf.constant(values))
        total = self.strategy.reduce(tf.distribute.ReduceOp.SUM, per_replica, axis=None)
        return np.asarray(total)

    def fit(self, model, make_dataset, *, epochs, step_calls_per_epoch, initial_epoch=0,
            start_step=None, callbacks=(), verbose=1, watch=None):
        train_loop.check_same_start(initial_epoch, self._sum_over_replicas,
                                    self.strategy.num_replicas_in_sync, step_calls_per_epoch)
        start = first_step(initial_epoch, step_calls_per_epoch, start_step)

        def shard(input_context):
            # Each local replica takes one batch of this worker's pipeline per step call.
            local = input_context.num_replicas_in_sync // input_context.num_input_pipelines
            return skip_seen(make_dataset(input_context), start, batches_per_step_call=local)

        data = self.strategy.distribute_datasets_from_function(shard)
        step = train_loop.make_train_step(
            model, model.optimizer, model.loss, global_batch_size=self.plan.examples_per_update,
            strategy=self.strategy, micro_batches=self.plan.micro_batches_per_step_call)
        # SIGTERM/SIGINT stop every worker at the same step (see train_loop.StopVote).
        return train_loop.fit_together(
            model, step, data, watch=watch, epochs=epochs,
            make_vote=lambda w: train_loop.strategy_stop_vote(self.strategy, w,
                                                              self.replica_names()),
            step_calls_per_epoch=step_calls_per_epoch, initial_epoch=initial_epoch,
            step_calls_per_execution=self.plan.step_calls_per_execution, callbacks=callbacks,
            verbose=verbose)

    def replica_names(self) -> list[str]:
        """The task of each replica index: "worker 1 (host:port)", chief first, as
        MultiWorkerMirroredStrategy numbers its replicas (task order x local devices)."""
        tasks = cluster_tasks(self._tf_config or read_tf_config(self.environ))
        local = self.strategy.num_replicas_in_sync // len(tasks)
        return [f"{job} {i} ({address})" for job, i, address in tasks for _ in range(local)]
