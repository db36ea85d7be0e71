"""Host decode per worker with sharded input, data-parallel scaling, and pipeline overhead.

Run with `make benchmark-distribute` (or `python -m benchmarks.bench_distribute --help`). One
process splits the host CPU into 2 logical devices, then measures with the same factories as
training:

- `input_sharding`: the trainer's training input (`trainer.build_datasets` with the
  `InputContext` a multi-worker runtime hands each worker) on a folder of JPEG photographs,
  for 1 worker and for each of 2 workers: the images each worker decodes in one epoch (counted
  exactly, at the decode op) and the seconds it takes, against the single worker (the
  reference). Sharded input gives each of N workers 1/N of the decoding; before, every worker
  decoded the whole global batch and kept its share.
- `data_parallel`: `make_train_step` on 1 replica (the default strategy, the reference) and on
  a MirroredStrategy over 2 logical CPUs, per-replica batch fixed (weak scaling);
- `pipeline`: `PipelinedModel` cut at the planner's 2-stage split, one stage per logical CPU,
  global batch fixed, micro-batches 1, 2, 4, 8, against the unsplit step.

Logical CPU devices share the same cores and thread pools, so the step figures show the
overhead of the machinery (all-reduce, micro-batch scheduling), not a speed-up; the two workers'
input pipelines run one after the other here (on separate hosts they would run side by side).
One JSON row per configuration (the shared schema of benchmarks/common.py) goes to
benchmarks/results/distribute.jsonl, with images/s, images per CPU-second of the process
(robust to other load on a shared machine) and the ratio to the same run's reference; the chart
goes to distribute.png. A non-finite loss stops the run. `--smoke` steps every configuration once
at tiny sizes (rows to a temporary folder); `--quick` times fewer repeats (distribute_quick.jsonl).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from unittest import mock

from keras_efficientnet.distribute.devices import configure_logical_cpus

DEVICES = configure_logical_cpus(2)

import keras  # noqa: E402 - after the CPU split, which must come before TensorFlow starts
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_efficientnet as ke  # noqa: E402
from benchmarks.bench_pipeline import write_photo_folder  # noqa: E402
from benchmarks.common import (  # noqa: E402
    add_mode_arguments,
    check_finite,
    machine,
    make_row,
    parse_args,
    write_results,
)
from benchmarks.timing import median_seconds  # noqa: E402
from keras_efficientnet.datasets import preprocessing  # noqa: E402
from keras_efficientnet.distribute import pipeline, planner, train_loop  # noqa: E402
from keras_efficientnet.distribute.mirrored import mirrored_strategy  # noqa: E402
from keras_efficientnet.training import TrainConfig, trainer  # noqa: E402

LOSS = keras.losses.CategoricalCrossentropy()
# Preset options of --smoke and --quick (options on the command line still win).
SMOKE = ["--resolution=32", "--batch=2", "--global_batch=4", "--micro_batches", "2",
         "--images=8", "--warmup=1", "--repeats=1"]
QUICK = ["--micro_batches", "1", "4", "--images=128", "--repeats=3"]


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


def measure(fn, images: int, args, where: str) -> dict:
    def step():
        check_finite(fn(), where)

    for _ in range(args.warmup):  # the first call traces; CPU time counts the timed calls only
        step()
    cpu = time.process_time()
    seconds = median_seconds(step, warmup=0, repeats=args.repeats)
    cpu_used = time.process_time() - cpu
    return {"seconds_per_step": round(seconds, 4), "images_per_second": images / seconds,
            "images_per_cpu_second": round(images * args.repeats / max(cpu_used, 1e-9), 2),
            "steps_timed": args.repeats}


def decode_one_epoch(config: TrainConfig, input_context) -> tuple[int, float, float]:
    """(images decoded, seconds, CPU seconds) of one epoch of one worker's training input."""
    counter = tf.Variable(0, dtype=tf.int64)
    decode = preprocessing.decode_and_random_crop

    def counting(*args, **kwargs):
        with tf.control_dependencies([counter.assign_add(1)]):
            return tf.identity(decode(*args, **kwargs))

    with mock.patch.object(preprocessing, "decode_and_random_crop", counting):
        data = trainer.build_datasets(config, config.train_resolution, training=True,
                                      split="train", repeat=False, input_context=input_context)
    start, cpu = time.perf_counter(), time.process_time()
    for _ in data:
        pass
    return (int(counter.numpy()), time.perf_counter() - start, time.process_time() - cpu)


def sharding_rows(args) -> list[dict]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-shards-") as root:
        photos = write_photo_folder(root, args.images, quality=90)
        print(f"photo folder: {photos}", flush=True)
        for workers in (1, 2):
            # The plan a run on `workers` processes has: each worker's pipeline reads shard
            # `index` of `workers` and yields per-replica batches of the same size.
            config = TrainConfig(
                dataset=f"folder:{root}", model="efficientnet-tiny-g16-lnpn",
                strategy="multiworker" if workers > 1 else "default", replicas=workers,
                micro_batch_size=args.batch, train_resolution=args.resolution,
                test_resolution=args.resolution, seed=0, host_threads=args.threads)
            for index in range(workers):
                context = (tf.distribute.InputContext(num_input_pipelines=workers,
                                                      input_pipeline_id=index,
                                                      num_replicas_in_sync=workers)
                           if workers > 1 else None)
                decode_one_epoch(config, context)  # warm-up: file cache, first traces
                decoded, seconds, cpu = decode_one_epoch(config, context)
                name = "1 worker" if workers == 1 else f"2 workers: worker {index}"
                print(f"  {name}: decoded {decoded} images in {seconds:.2f} s", flush=True)
                rows.append({"benchmark": "input_sharding", "variant": name,
                             "workers": workers, "worker": index,
                             "batch": config.plan.examples_per_step_call // workers,
                             "decoded_images": decoded, "seconds_per_epoch": round(seconds, 3),
                             "images_per_second": decoded / seconds,
                             "images_per_cpu_second": round(decoded / max(cpu, 1e-9), 2)})
    whole = rows[0]
    for row in rows:
        row["decoded_share"] = round(row["decoded_images"] / whole["decoded_images"], 4)
        row["seconds_share"] = round(row["seconds_per_epoch"] / whole["seconds_per_epoch"], 3)
    return rows


def data_parallel_rows(args) -> list[dict]:
    rows = []
    for replicas in (1, 2):
        if replicas == 1:
            strategy = tf.distribute.get_strategy()
        else:
            strategy = mirrored_strategy(DEVICES[:replicas])
        with strategy.scope():
            model = tiny(args.resolution)
            optimizer = keras.optimizers.SGD(0.01)
        global_batch = args.batch * replicas
        step = train_loop.make_train_step(model, optimizer, LOSS,
                                          global_batch_size=global_batch, strategy=strategy)
        x, y = train_loop.distribute_batch(strategy, *batch(global_batch, args.resolution)) \
            if replicas > 1 else batch(global_batch, args.resolution)
        name = f"{replicas} replica" + ("s" if replicas > 1 else "")
        row = {"benchmark": "data_parallel", "variant": name, "replicas": replicas,
               "per_replica_batch": args.batch, "batch": global_batch,
               **measure(lambda s=step, a=x, b=y: s(a, b), global_batch, args, name)}
        rows.append(row)
    return rows


def pipeline_rows(args) -> list[dict]:
    x, y = batch(args.global_batch, args.resolution)
    model = tiny(args.resolution)
    step = train_loop.make_train_step(model, keras.optimizers.SGD(0.01), LOSS,
                                      global_batch_size=args.global_batch)
    rows = [{"benchmark": "pipeline", "variant": "unsplit", "stages": 1, "micro_batches": 1,
             "split": [], "batch": args.global_batch,
             **measure(lambda: step(x, y), args.global_batch, args, "unsplit")}]
    split = planner.plan_splits(model, 2).splits
    for micro in args.micro_batches:
        model = tiny(args.resolution)
        pipe = pipeline.PipelinedModel(model, split, micro_batches=micro, devices=DEVICES[:2])
        step = pipe.make_train_step(keras.optimizers.SGD(0.01), LOSS)
        name = f"2 stages, {micro} micro-batch" + ("es" if micro > 1 else "")
        rows.append({"benchmark": "pipeline", "variant": name, "stages": 2,
                     "micro_batches": micro, "split": list(split), "batch": args.global_batch,
                     **measure(lambda s=step: s(x, y), args.global_batch, args, name)})
    return rows


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--batch", type=int, default=16,
                        help="per-replica batch (input sharding and scaling)")
    parser.add_argument("--global_batch", type=int, default=32, help="pipeline global batch")
    parser.add_argument("--micro_batches", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--images", type=int, default=256,
                        help="JPEGs in the photo folder the input sharding decodes")
    parser.add_argument("--threads", type=int, default=2,
                        help="tf.data private thread pool per input pipeline")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    info = machine(devices="2 logical CPU devices")
    rows = []
    for measured in (sharding_rows(args), data_parallel_rows(args), pipeline_rows(args)):
        # The first of each group is its reference: one worker; one replica; the unsplit model.
        reference = (measured[0]["variant"], measured[0]["images_per_second"])
        for row in measured:
            row = dict(row)
            rows.append(make_row(
                row.pop("benchmark"), machine=info, backend="tensorflow",
                variant=row.pop("variant"), resolution=args.resolution, batch=row.pop("batch"),
                precision="uint8" if "decoded_images" in row else "float32",
                images_per_second=row.pop("images_per_second"),
                reference=reference[0], reference_images_per_second=reference[1],
                model="tiny-g16-lnpn", **row))
    for row in rows:
        print({k: v for k, v in row.items() if k != "machine"})
    write_results("distribute", rows, args.output_dir, args.mode)
    return rows


if __name__ == "__main__":
    main()
