"""Layer and model throughput on this machine, each against a reference measured in the same run.

Run with `make benchmark-layers` (or `python -m benchmarks.bench_model --help`). Two files:

- `layers_<backend>.jsonl`: forward+backward of one MBConv spatial conv (batch 16, 56x56x144 by
  default) as `DepthwiseConv2D` (the reference), our `GroupConv2D(group_size=16)` and Keras'
  `Conv2D(groups=9)`; and the cost of proxy norm: GroupNorm(4)+swish (the reference) against
  LayerNorm+swish and GroupNorm/LayerNorm (no affine) + `ProxyNormActivation(swish)`.
- `model_<backend>.jsonl`: training and inference images/s of our B0 variants (G1-BN, G1-GN,
  G16-GN, G16-LN+PN) at the native (224) and half (160) resolution, each against
  `keras.applications.EfficientNetB0` at the same resolution, mode and batch.

Every timing follows warm-up calls (the first traces); a non-finite loss stops the run. `--size
tiny` swaps B0 for the test-only tiny variant (and Keras' own EfficientNet builder at the same
scaling as the reference) so that tests can take one step per configuration in seconds.
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import keras_efficientnet as ke
from benchmarks.common import check_finite, machine, make_row, time_calls, write_results
from keras_efficientnet.models.efficientnet import SCALING

BASELINE = "keras.applications.EfficientNetB0"
# Our variants, by the label the results use, and their preset family.
VARIANTS = {"G1-BN": "g1-bn", "G1-GN": "g1-gn", "G16-GN": "g16-gn", "G16-LN+PN": "g16-lnpn"}
# Native and reduced ("half": about half the pixels) resolutions (docs/recipes.md).
RESOLUTIONS = {"b0": (224, 160), "tiny": (64, 32)}
CLASSES = 1000


def build_reference(size: str, resolution: int, classes: int = CLASSES) -> keras.Model:
    """`keras.applications.EfficientNetB0`, or for `size="tiny"` Keras' same builder at the tiny
    variant's scaling (test-only). Logits out, like ours below."""
    shape = (resolution, resolution, 3)
    if size == "b0":
        return keras.applications.EfficientNetB0(weights=None, input_shape=shape,
                                                 classes=classes, classifier_activation=None)
    from keras.src.applications.efficientnet import EfficientNet as KerasEfficientNet

    scaling = SCALING[size]
    return KerasEfficientNet(scaling.width, scaling.depth, scaling.resolution, scaling.dropout,
                             weights=None, input_shape=shape, classes=classes,
                             classifier_activation=None, name=f"keras_efficientnet_{size}")


def build_variant(size: str, label: str, resolution: int, classes: int = CLASSES) -> keras.Model:
    """Our preset `efficientnet-<size>-<family>` for a label of VARIANTS."""
    return ke.EfficientNet.from_preset(f"efficientnet-{size}-{VARIANTS[label]}",
                                       input_shape=(resolution, resolution, 3), classes=classes,
                                       classifier_activation=None)


def model_configs(size: str, variants: list[str] | None = None) -> list[tuple]:
    """(label, builder(resolution), input dtype): the reference first, then ours."""
    chosen = [v for v in VARIANTS if variants is None or v in variants]
    # keras.applications takes float images in [0, 255]; ours take uint8 (normalized inside).
    configs = [(BASELINE, lambda r: build_reference(size, r), "float32")]
    configs += [(label, lambda r, label=label: build_variant(size, label, r), "uint8")
                for label in chosen]
    return configs


# ----------------------------------------------------------------------------------- layers


def _grad_step(layer: keras.Layer, x: np.ndarray, eager: bool = False):
    """A compiled (unless `eager`) forward+backward of sum(y^2) w.r.t. the input and the
    layer's variables."""
    backend = keras.backend.backend()
    if backend == "tensorflow":
        import tensorflow as tf

        variables = [v.value for v in layer.trainable_weights]

        def step(x):
            with tf.GradientTape() as tape:
                tape.watch(x)
                y = layer(x)
                loss = tf.reduce_sum(tf.cast(y, "float32") ** 2)
            return tape.gradient(loss, [x, *variables])

        if not eager:  # XLA off: slower on CPU (and far slower for groups)
            step = tf.function(step, jit_compile=False)
        x = tf.constant(x)
        return lambda: [g.numpy() for g in step(x)]
    if backend == "jax":
        import jax

        trainable = [v.value for v in layer.trainable_variables]
        non_trainable = [v.value for v in layer.non_trainable_variables]

        def loss(x, trainable):
            y, _ = layer.stateless_call(trainable, non_trainable, x)
            return (y.astype("float32") ** 2).sum()

        step = jax.grad(loss, argnums=(0, 1))
        step = step if eager else jax.jit(step)
        x = jax.device_put(x)
        return lambda: jax.block_until_ready(step(x, trainable))
    raise SystemExit(f"the layer benchmark supports tensorflow and jax, not {backend}")


def layer_candidates(channels: int, group_size: int) -> dict[str, list]:
    """{benchmark: {label: layer}}, the reference first in each."""
    groups = channels // group_size

    def pn_after(norm_groups):
        return keras.Sequential([
            keras.layers.GroupNormalization(norm_groups, epsilon=1e-3, center=False,
                                            scale=False),
            ke.layers.ProxyNormActivation("swish")])

    def act_after(norm_groups):
        return keras.Sequential([keras.layers.GroupNormalization(norm_groups, epsilon=1e-3),
                                 keras.layers.Activation("swish")])

    return {
        "layer_fwd_bwd": {
            "DepthwiseConv2D": keras.layers.DepthwiseConv2D(3, padding="same", use_bias=False),
            f"GroupConv2D(group_size={group_size})": ke.layers.GroupConv2D(
                channels, 3, group_size=group_size),
            f"keras Conv2D(groups={groups})": keras.layers.Conv2D(
                channels, 3, padding="same", groups=groups, use_bias=False),
        },
        "norm_fwd_bwd": {
            "GroupNorm(4)+swish": act_after(4),
            "LayerNorm+swish": act_after(1),
            "GroupNorm(4)+ProxyNorm(swish)": pn_after(4),
            "LayerNorm+ProxyNorm(swish)": pn_after(1),
        },
    }


def bench_layers(batch: int, size: int, channels: int, group_size: int, repeats: int,
                 info: dict, eager: bool = False) -> list[dict]:
    x = np.random.default_rng(0).standard_normal((batch, size, size, channels)).astype("float32")
    rows = []
    for benchmark, candidates in layer_candidates(channels, group_size).items():
        reference = None
        for name, layer in candidates.items():
            layer.build(x.shape)
            step = _grad_step(layer, x, eager)
            # Keras' grouped conv takes seconds a step on a TensorFlow CPU (XLA's grouped
            # backward pass): one timed call is plenty to show it.
            slow = name.startswith("keras Conv2D") and keras.backend.backend() == "tensorflow"
            seconds = time_calls(step, warmup=1, repeats=1 if slow else repeats)
            reference = reference or (name, batch / seconds)
            rows.append(make_row(
                benchmark, machine=info, backend=keras.backend.backend(), variant=name,
                resolution=size, batch=batch, precision="float32",
                images_per_second=batch / seconds, reference=reference[0],
                reference_images_per_second=reference[1], channels=channels,
                ms=round(seconds * 1e3, 2), repeats=1 if slow else repeats, eager=eager))
            print(f"{benchmark:14s} {name:32s} {seconds * 1e3:10.1f} ms   "
                  f"{rows[-1]['ratio_to_reference']:7.3f}x {reference[0]}", flush=True)
    return rows


# ----------------------------------------------------------------------------------- models


def _throughputs(model: keras.Model, dtype: str, batch: int, resolution: int, *, warmup: int,
                 steps: int, infer_steps: int,
                 eager: bool = False) -> dict[str, tuple[float, float]]:
    """{"train"|"inference": (images/s, median seconds a step)} after warm-up steps."""
    backend = keras.backend.backend()
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=backend != "tensorflow",  # XLA is slower on a TensorFlow CPU
                  run_eagerly=eager)
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, (batch, resolution, resolution, 3)).astype(dtype)
    labels = rng.integers(0, CLASSES, batch)

    def train_step():
        check_finite(model.train_on_batch(images, labels), f"{model.name} training")

    def infer_step():
        check_finite(np.sum(np.asarray(model.predict_on_batch(images), "float64")),
                     f"{model.name} inference")

    train = time_calls(train_step, warmup=warmup, repeats=steps)
    infer = time_calls(infer_step, warmup=warmup, repeats=infer_steps)
    return {"train": (batch / train, train), "inference": (batch / infer, infer)}


def bench_models(size: str, resolutions: list[int], batch: int, *, warmup: int, steps: int,
                 infer_steps: int, info: dict, variants: list[str] | None = None,
                 eager: bool = False) -> list[dict]:
    backend = keras.backend.backend()
    measured = {}  # (mode, resolution, label) -> (images/s, seconds a step, macs)
    for resolution in resolutions:
        for label, build, dtype in model_configs(size, variants):
            keras.utils.clear_session()
            model = build(resolution)
            macs = ke.count_macs(model)
            for mode, (ips, seconds) in _throughputs(
                    model, dtype, batch, resolution, warmup=warmup, steps=steps,
                    infer_steps=infer_steps, eager=eager).items():
                measured[mode, resolution, label] = (ips, seconds, macs)
                print(f"{mode:9s} {resolution:4d}px {label:34s} {ips:8.2f} img/s", flush=True)
            del model
    rows = []
    native = resolutions[0]
    for (mode, resolution, label), (ips, seconds, macs) in measured.items():
        rows.append(make_row(
            mode, machine=info, backend=backend, variant=label, resolution=resolution,
            batch=batch, precision="float32", images_per_second=ips, reference=BASELINE,
            reference_images_per_second=measured[mode, resolution, BASELINE][0],
            model_size=size, seconds_per_step=round(seconds, 4),
            steps=steps if mode == "train" else infer_steps, warmup_steps=warmup,
            gmacs=round(macs / 1e9, 4), eager=eager,
            # The paper's point: a variant at reduced resolution against the native reference.
            ratio_to_native_reference=round(ips / measured[mode, native, BASELINE][0], 4)))
    return rows


def _summary(rows: list[dict]) -> None:
    print(f"\n{'benchmark':14s} {'res':>4s} {'variant':34s} {'img/s':>9s} {'vs ref':>7s}")
    for row in rows:
        print(f"{row['benchmark']:14s} {row['resolution']:4d} {row['variant']:34s} "
              f"{row['images_per_second']:9.2f} {row['ratio_to_reference']:7.3f}")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=sorted(RESOLUTIONS), default="b0",
                        help="b0, or tiny for a seconds-long check of every configuration")
    parser.add_argument("--resolutions", default=None,
                        help="comma-separated; default native,half (224,160 for b0)")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2,
                        help="untimed steps before timing (the first one traces)")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per model")
    parser.add_argument("--infer-steps", type=int, default=5, help="timed inference steps")
    parser.add_argument("--layer-batch", type=int, default=16)
    parser.add_argument("--layer-size", type=int, default=56)
    parser.add_argument("--layer-channels", type=int, default=144)
    parser.add_argument("--layer-repeats", type=int, default=5)
    parser.add_argument("--skip-layers", action="store_true")
    parser.add_argument("--skip-models", action="store_true")
    parser.add_argument("--eager", action="store_true",
                        help="no tf.function/jit (tests: every configuration steps without "
                             "tracing; the timings mean nothing)")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    args = parser.parse_args(argv)
    resolutions = ([int(r) for r in args.resolutions.split(",")] if args.resolutions
                   else list(RESOLUTIONS[args.size]))
    variants = args.variants.split(",") if args.variants else None
    unknown = sorted(set(variants or []) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}; choose from {list(VARIANTS)}")
    info = machine()
    print(f"machine: {info}", flush=True)
    backend = keras.backend.backend()
    rows = []
    if not args.skip_layers:
        layer_rows = bench_layers(args.layer_batch, args.layer_size, args.layer_channels, 16,
                                  args.layer_repeats, info, args.eager)
        write_results(f"layers_{backend}", layer_rows, args.output_dir)
        rows += layer_rows
    if not args.skip_models:
        model_rows = bench_models(args.size, resolutions, args.batch, warmup=args.warmup,
                                  steps=args.steps, infer_steps=args.infer_steps, info=info,
                                  variants=variants, eager=args.eager)
        _summary(model_rows)
        write_results(f"model_{backend}", model_rows, args.output_dir)
        rows += model_rows
    return rows


if __name__ == "__main__":
    main()
