"""CPU benchmark of the grouped conv and of model training throughput, each against a reference.

Run with `make benchmark-layers` (or `python benchmarks/bench_model.py --help`). Writes one JSON
row per configuration to benchmarks/results/model_<backend>.jsonl and prints a table.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_efficientnet as ke  # noqa: E402
from benchmarks.common import machine, time_calls, write_rows  # noqa: E402


def _grad_step(layer_fn, variables, x):
    """A compiled forward+backward of sum(y^2) w.r.t. the input and `variables`."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        @tf.function(jit_compile=False)
        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer_fn(x)
                loss = tf.reduce_sum(y * y)
            return tape.gradient(loss, [x, *variables])

        x = tf.constant(x)
        return lambda: [g.numpy() for g in step(x)]
    if backend == "jax":
        import jax

        raise SystemExit("the layer benchmark uses the TensorFlow backend; run the model "
                         f"benchmark under {backend} with --skip-layers") from jax
    raise SystemExit(f"unsupported backend {backend}")


def bench_layers(batch: int, size: int, channels: int, group_size: int, repeats: int) -> list:
    x = np.random.default_rng(0).standard_normal((batch, size, size, channels)).astype("float32")
    groups = channels // group_size
    candidates = {
        "DepthwiseConv2D": keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False),
        f"GroupConv2D(group_size={group_size})": ke.layers.GroupConv2D(
            channels, 3, group_size=group_size),
        f"keras Conv2D(groups={groups})": keras.layers.Conv2D(
            channels, 3, padding="same", groups=groups, use_bias=False),
    }
    rows, reference = [], None
    for name, layer in candidates.items():
        layer.build(x.shape)
        variables = [v.value for v in layer.trainable_weights]
        step = _grad_step(layer, variables, x)
        # Keras' XLA-compiled grouped conv takes seconds a step on CPU: time it fewer times.
        slow = name.startswith("keras Conv2D")
        seconds = time_calls(step, warmup=1, repeats=1 if slow else repeats)
        reference = reference or seconds
        rows.append({"benchmark": "layer_fwd_bwd", "layer": name, "batch": batch,
                     "shape": [size, size, channels], "ms": round(seconds * 1e3, 2),
                     "ratio_to_depthwise": round(seconds / reference, 3)})
        print(f"{name:34s} {seconds * 1e3:10.1f} ms   {seconds / reference:6.2f}x depthwise")
    return rows


def _train_throughput(model, batch: int, resolution: int, steps: int, dtype: str) -> float:
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss="sparse_categorical_crossentropy", jit_compile=False)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, resolution, resolution, 3)).astype(dtype)
    labels = rng.integers(0, 1000, batch)

    def step():
        loss = model.train_on_batch(images, labels)
        if not math.isfinite(float(loss)):
            raise SystemExit(f"non-finite loss {loss} while benchmarking {model.name}")

    seconds = time_calls(step, warmup=2, repeats=steps)
    return batch / seconds


def bench_models(batch: int, resolution: int, steps: int) -> list:
    shape = (resolution, resolution, 3)
    configs = [
        ("keras.applications.EfficientNetB0", "reference_b0",
         lambda: keras.applications.EfficientNetB0(weights=None, input_shape=shape), "float32"),
        ("ours G1-BN b0", "reference_b0",
         lambda: ke.EfficientNet.from_preset("efficientnet-b0-g1-bn", input_shape=shape),
         "uint8"),
        ("ours G16-GN b0", "reference_g16",
         lambda: ke.EfficientNet.from_preset("efficientnet-b0-g16-gn", input_shape=shape),
         "uint8"),
        ("ours G16-LN+PN b0", "reference_g16",
         lambda: ke.EfficientNet.from_preset("efficientnet-b0-g16-lnpn", input_shape=shape),
         "uint8"),
    ]
    rows, references = [], {}
    for name, group, build, dtype in configs:
        keras.utils.clear_session()
        images_per_second = _train_throughput(build(), batch, resolution, steps, dtype)
        reference = references.setdefault(group, (name, images_per_second))
        ratio = images_per_second / reference[1]
        rows.append({"benchmark": "train_throughput", "model": name, "batch": batch,
                     "resolution": resolution, "precision": "float32",
                     "images_per_second": round(images_per_second, 2),
                     "reference": reference[0], "ratio_to_reference": round(ratio, 3)})
        print(f"{name:36s} {images_per_second:8.2f} img/s   {ratio:5.3f}x {reference[0]}")
    return rows


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--steps", type=int, default=5, help="timed training steps per model")
    parser.add_argument("--layer-repeats", type=int, default=5)
    parser.add_argument("--skip-layers", action="store_true")
    parser.add_argument("--skip-models", action="store_true")
    args = parser.parse_args(argv)
    info = machine()
    print(f"machine: {info}")
    rows = []
    if not args.skip_layers:
        rows += bench_layers(args.batch, 56, 144, 16, args.layer_repeats)
    if not args.skip_models:
        rows += bench_models(args.batch, args.resolution, args.steps)
    rows = [{**row, "machine": info} for row in rows]
    print("wrote", write_rows(f"model_{info.get('backend', 'unknown')}", rows))


if __name__ == "__main__":
    main()
