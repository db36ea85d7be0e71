"""Data-parallel scaling over logical CPU devices and pipeline overhead against micro-batch count.

Run with `python benchmarks/bench_distribute.py` (add `--help` for sizes and repeats). One
process splits the host CPU into 2 logical devices, then times train steps of the tiny G16
LN+PN EfficientNet (the test model) with the same factories as training:

- `data_parallel`: `make_train_step` on 1 replica (the default strategy, the reference) and on
  a MirroredStrategy over 2 logical CPUs, per-replica batch fixed (weak scaling);
- `pipeline`: `PipelinedModel` cut at the planner's 2-stage split, one stage per logical CPU,
  global batch fixed, micro-batches 1, 2, 4, 8, against the unsplit step.

Logical CPU devices share the same cores and thread pools, so these figures show the overhead of
the machinery (all-reduce, micro-batch scheduling), not a speed-up; on GPUs or IPUs each device
brings its own compute. One JSON row per configuration goes to
benchmarks/results/distribute.jsonl, with images/s, images per CPU-second of the process (robust
to other load on a shared machine) and the ratio to the same run's reference.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import tensorflow as tf  # noqa: E402

from keras_efficientnet.distribute.strategies import configure_logical_cpus  # noqa: E402

DEVICES = configure_logical_cpus(2)

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_efficientnet as ke  # noqa: E402
from benchmarks.common import machine, time_calls, write_rows  # noqa: E402
from keras_efficientnet.distribute import pipeline, planner, train_loop  # noqa: E402

LOSS = keras.losses.CategoricalCrossentropy()


def tiny(resolution: int) -> keras.Model:
    keras.utils.set_random_seed(0)
    return ke.EfficientNet("tiny", group_size=16, expand_ratio=4, norm="layer", proxy_norm=True,
                           classes=10, input_shape=(resolution, resolution, 3),
                           dropout_rate=0.0, drop_connect_rate=0.0)


def batch(size: int, resolution: int):
    rng = np.random.default_rng(0)
    x = tf.constant(rng.integers(0, 256, (size, resolution, resolution, 3)).astype("uint8"))
    y = tf.constant(np.eye(10, dtype="float32")[rng.integers(0, 10, size)])
    return x, y


def measure(fn, images: int, args) -> dict:
    for _ in range(args.warmup):  # the first call traces; CPU time counts the timed calls only
        fn()
    cpu = time.process_time()
    seconds = time_calls(fn, warmup=0, repeats=args.repeats)
    cpu_used = time.process_time() - cpu
    return {"seconds_per_step": seconds, "images_per_s": images / seconds,
            "images_per_cpu_s": images * args.repeats / max(cpu_used, 1e-9),
            "steps_timed": args.repeats}


def data_parallel_rows(args) -> list[dict]:
    rows = []
    for replicas in (1, 2):
        if replicas == 1:
            strategy = tf.distribute.get_strategy()
        else:
            strategy = tf.distribute.MirroredStrategy(DEVICES[:replicas])
        with strategy.scope():
            model = tiny(args.resolution)
            optimizer = keras.optimizers.SGD(0.01)
        global_batch = args.batch * replicas
        step = train_loop.make_train_step(model, optimizer, LOSS,
                                          global_batch_size=global_batch, strategy=strategy)
        x, y = train_loop.distribute_batch(strategy, *batch(global_batch, args.resolution)) \
            if replicas > 1 else batch(global_batch, args.resolution)
        row = {"benchmark": "data_parallel", "replicas": replicas,
               "per_replica_batch": args.batch, "global_batch": global_batch,
               **measure(lambda s=step, a=x, b=y: s(a, b), global_batch, args)}
        rows.append(row)
    for row in rows:
        row["ratio_to_1_replica"] = row["images_per_s"] / rows[0]["images_per_s"]
    return rows


def pipeline_rows(args) -> list[dict]:
    x, y = batch(args.global_batch, args.resolution)
    model = tiny(args.resolution)
    step = train_loop.make_train_step(model, keras.optimizers.SGD(0.01), LOSS,
                                      global_batch_size=args.global_batch)
    rows = [{"benchmark": "pipeline", "stages": 1, "micro_batches": 1, "split": [],
             "global_batch": args.global_batch, "reference": True,
             **measure(lambda: step(x, y), args.global_batch, args)}]
    split = planner.plan_splits(model, 2).splits
    for micro in args.micro_batches:
        model = tiny(args.resolution)
        pipe = pipeline.PipelinedModel(model, split, micro_batches=micro, devices=DEVICES[:2])
        step = pipe.make_train_step(keras.optimizers.SGD(0.01), LOSS)
        rows.append({"benchmark": "pipeline", "stages": 2, "micro_batches": micro,
                     "split": list(split), "global_batch": args.global_batch,
                     "reference": False,
                     **measure(lambda s=step: s(x, y), args.global_batch, args)})
    for row in rows:
        row["ratio_to_unsplit"] = row["images_per_s"] / rows[0]["images_per_s"]
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16, help="per-replica batch (scaling)")
    parser.add_argument("--global_batch", type=int, default=32, help="pipeline global batch")
    parser.add_argument("--micro_batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    info = machine()
    rows = data_parallel_rows(args) + pipeline_rows(args)
    for row in rows:
        row.update(machine=info, resolution=args.resolution, model="tiny-g16-lnpn",
                   devices="logical CPU")
        print({k: (round(v, 3) if isinstance(v, float) else v) for k, v in row.items()
               if k != "machine"})
    print(f"wrote {write_rows('distribute', rows)}")


if __name__ == "__main__":
    main()
