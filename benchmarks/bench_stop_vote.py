"""Cost of the multi-worker stop vote: seconds per step of 2 workers with and without it.

Run with `python -m benchmarks.bench_stop_vote` (options: --help). It starts 2 worker processes
(TF_CONFIG on 127.0.0.1) that train the tiny G16 model with the project's loop
(`train_loop.fit`, one step per host call, the case where the vote costs most) in alternating
rounds without the vote (the reference) and with it (`train_loop.StopVote`: one extra
all-reduce of a vector of replicas, in the same `tf.function` as the step). Per-step seconds
are the median interval between host calls after the first 2 of each round (tracing). The
chief writes one row per variant to benchmarks/results/stop_vote.jsonl; the figure that
matters is `overhead_ms_per_host_call`. `--smoke` takes a few steps at 32 px (rows to a temporary
folder); `--quick` fewer rounds (stop_vote_quick.jsonl).
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    add_mode_arguments,
    free_ports,
    machine,
    make_row,
    parse_args,
    write_results,
)

WORKERS = 2
TIMEOUT_S = 900
# Preset options of --smoke and --quick (options on the command line still win). A round needs
# 4 steps: the first 2 trace, and one interval is timed between the 2 after.
SMOKE = ["--batch=2", "--resolution=32", "--steps=4", "--rounds=1"]
QUICK = ["--steps=12", "--rounds=2"]


def worker(args) -> None:
    from keras_efficientnet.distribute import multiworker

    strategy = multiworker.build_multiworker_strategy(timeout=120)
    import keras
    import numpy as np
    import tensorflow as tf

    import keras_efficientnet as ke
    from keras_efficientnet.distribute import train_loop
    from keras_efficientnet.training.preemption import SignalWatch

    loss = keras.losses.CategoricalCrossentropy()
    global_batch = args.batch * WORKERS
    with strategy.scope():
        keras.utils.set_random_seed(0)
        # bench_distribute's tiny model (that module splits the CPU at import: not here).
        model = ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer",
                                proxy_norm=True, classes=10,
                                input_shape=(args.resolution, args.resolution, 3),
                                dropout_rate=0.0, drop_connect_rate=0.0)
        model.compile(optimizer=keras.optimizers.SGD(0.01), loss=loss)
        step = train_loop.make_train_step(model, model.optimizer, loss,
                                          global_batch_size=global_batch, strategy=strategy)
    rng = np.random.default_rng(0)
    shape = (global_batch, args.resolution, args.resolution, 3)
    x = tf.constant(rng.integers(0, 256, shape).astype("uint8"))
    y = tf.constant(np.eye(10, dtype="float32")[rng.integers(0, 10, global_batch)])
    vote = train_loop.strategy_stop_vote(strategy, SignalWatch(),
                                         [f"worker {i}" for i in range(WORKERS)])

    class Clock(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.times.append(time.perf_counter())

    seconds = {"no vote": [], "vote": []}
    for _, variant in itertools.product(range(args.rounds), seconds):
        clock = Clock()
        clock.times = []
        train_loop.fit(model, step, itertools.repeat((x, y)), epochs=1,
                       step_calls_per_epoch=args.steps, verbose=0, callbacks=[clock],
                       distribute=lambda a, b: train_loop.distribute_batch(strategy, a, b),
                       stop_vote=vote if variant == "vote" else None)
        seconds[variant] += list(np.diff(clock.times[2:]))
    median = {k: float(np.median(v)) for k, v in seconds.items()}
    rows = [make_row("stop_vote", machine=machine(), backend="tensorflow", variant=variant,
                     resolution=args.resolution, batch=global_batch, precision="float32",
                     images_per_second=global_batch / median[variant], reference="no vote",
                     reference_images_per_second=global_batch / median["no vote"],
                     workers=WORKERS, seconds_per_step=round(median[variant], 5),
                     overhead_ms_per_host_call=round(
                         1000 * (median[variant] - median["no vote"]), 3),
                     step_calls_per_round=args.steps, rounds=args.rounds,
                     steps_timed=len(seconds[variant]))
            for variant in median]
    Path(args.out).write_text(json.dumps(rows))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="examples per worker and step")
    parser.add_argument("--resolution", type=int, default=32)
    parser.add_argument("--steps", type=int, default=20,
                        help="step calls per round (one step each)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    parser.add_argument("--worker", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    if args.steps < 4 or args.rounds < 1:
        parser.error(f"--steps must be >= 4 (2 trace, then intervals are timed) and --rounds "
                     f">= 1, received --steps={args.steps} --rounds={args.rounds}")
    if args.worker is not None:
        return worker(args)
    cluster = {"worker": [f"127.0.0.1:{port}" for port in free_ports(WORKERS)]}
    options = [f"--batch={args.batch}", f"--resolution={args.resolution}",
               f"--steps={args.steps}", f"--rounds={args.rounds}"]
    with tempfile.TemporaryDirectory() as tmp:
        procs = []
        for index in range(WORKERS):
            config = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
            procs.append(subprocess.Popen(
                [sys.executable, "-m", "benchmarks.bench_stop_vote", f"--worker={index}",
                 f"--out={tmp}/{index}.json", *options],
                env={**os.environ, "TF_CONFIG": config, "CUDA_VISIBLE_DEVICES": "",
                     "TF_CPP_MIN_LOG_LEVEL": "2"}))
        deadline = time.monotonic() + TIMEOUT_S
        try:
            codes = [p.wait(max(deadline - time.monotonic(), 1)) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
        if codes != [0] * WORKERS:
            raise SystemExit(f"a worker failed: exit codes {codes}")
        rows = json.loads(Path(tmp, "0.json").read_text())
    for row in rows:
        print(f"{row['variant']:8s} {row['seconds_per_step'] * 1000:8.2f} ms/step  "
              f"overhead {row['overhead_ms_per_host_call']:+.2f} ms")
    write_results("stop_vote", rows, args.output_dir, args.mode)


if __name__ == "__main__":
    main()
