"""Where one step of a model spends its time: a TensorFlow profile, summed by op type.

`python -m benchmarks.profile_step --variant G16-LN+PN --mode train` builds our B0 variant (or
keras.applications' B0 with `--variant keras.applications.EfficientNetB0`), runs warm-up steps,
profiles `--steps` more with `tf.profiler` and prints the op types that took the most time on
the CPU (self time, summed over the steps, in ms a step and in % of all op time), and the
trace's folder. benchmarks/README.md quotes its output.
"""

from __future__ import annotations

import argparse
import collections
import os
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


EXECUTOR_EVENTS = ("Process",)


def op_totals(xspace_path: str | os.PathLike) -> collections.Counter:
    """{op type: picoseconds} over the TensorFlow op events of one `.xplane.pb` trace.

    TensorFlow names an op event `name:Type` on the executor's `tf_Compute` threads; its
    `Process` events wrap the ops they run and are left out, as are the python thread's events.
    """
    from tensorflow.tsl.profiler.protobuf import xplane_pb2

    space = xplane_pb2.XSpace()
    space.ParseFromString(Path(xspace_path).read_bytes())
    totals: collections.Counter = collections.Counter()
    for plane in space.planes:
        if not plane.name.startswith("/host:CPU"):
            continue
        for line in plane.lines:
            if not line.name.startswith("tf_Compute"):
                continue
            for event in line.events:
                kind = plane.event_metadata[event.metadata_id].name.rsplit(":", 1)[-1].strip()
                if kind and kind not in EXECUTOR_EVENTS:
                    totals[kind] += event.duration_ps
    return totals


def top_ops(totals: collections.Counter, steps: int, top: int) -> list[tuple[str, float, float]]:
    """[(op type, ms a step, % of all op time)], the `top` largest first."""
    everything = sum(totals.values()) or 1
    return [(kind, ps / 1e9 / steps, 100.0 * ps / everything)
            for kind, ps in totals.most_common(top)]


def _step(model, mode: str, batch: int, resolution: int, dtype: str):
    import keras
    import numpy as np

    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, resolution, resolution, 3)).astype(dtype)
    labels = rng.integers(0, 1000, batch)
    if mode == "train":
        model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      jit_compile=False)
        return lambda: model.train_on_batch(images, labels)
    return lambda: model.predict_on_batch(images)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variant", default="G16-LN+PN")
    parser.add_argument("--mode", choices=("train", "inference"), default="train")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--top", type=int, default=15)
    parser.add_argument("--logdir", default=None, help="default: a new temporary folder")
    args = parser.parse_args(argv)
    from benchmarks import bench_model

    if args.variant not in (bench_model.BASELINE, *bench_model.VARIANTS):
        parser.error(f"--variant={args.variant!r}: choose {bench_model.BASELINE} or one of "
                     f"{list(bench_model.VARIANTS)}")
    import tensorflow as tf

    if args.variant == bench_model.BASELINE:
        model, dtype = bench_model.build_reference("b0", args.resolution), "float32"
    else:
        model, dtype = bench_model.build_variant("b0", args.variant, args.resolution), "uint8"
    step = _step(model, args.mode, args.batch, args.resolution, dtype)
    for _ in range(args.warmup):
        step()
    logdir = args.logdir or tempfile.mkdtemp(prefix="ke-profile-")
    tf.profiler.experimental.start(logdir)
    for _ in range(args.steps):
        step()
    tf.profiler.experimental.stop()
    traces = sorted(Path(logdir).rglob("*.xplane.pb"), key=lambda p: p.stat().st_mtime)
    totals = op_totals(traces[-1])
    print(f"{args.variant} {args.mode}, batch {args.batch}, {args.resolution} px: "
          f"{sum(totals.values()) / 1e9 / args.steps:.0f} ms of op time a step "
          f"(trace: {traces[-1]})")
    print(f"{'op type':32s} {'ms/step':>9s} {'share':>7s}")
    for kind, ms, share in top_ops(totals, args.steps, args.top):
        print(f"{kind:32s} {ms:9.1f} {share:6.1f}%")


if __name__ == "__main__":
    main()
