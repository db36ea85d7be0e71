"""Layer and model throughput on this machine, each against a reference measured in the same run.

Run with `make benchmark-layers` (or `python -m benchmarks.bench_model --help`). Two files:

- `layers_<backend>.jsonl`: forward+backward of one MBConv spatial conv (batch 16, 56x56x144 by
  default) as `DepthwiseConv2D` (the reference), our `GroupConv2D(group_size=16)` and Keras'
  `Conv2D(groups=9)`; and the cost of proxy norm: GroupNorm(4)+swish (the reference) against
  LayerNorm+swish and GroupNorm/LayerNorm (no affine) + `ProxyNormActivation(swish)`.
- `model_<backend>.jsonl`: training and inference images/s of our B0 variants (G1-BN, G1-GN,
  G16-GN, G16-LN+PN; on TensorFlow also their inference through `keras_efficientnet.serving`,
  labelled `[serving]`) at the native (224) and half (160) resolution, each against
  `keras.applications.EfficientNetB0` at the same resolution, mode and batch, and against timm's
  `efficientnet_b0` on PyTorch (`ratio_to_timm`; `ratio_to_native_timm` against it at 224),
  which a child process measures from its own environment (`make venv-timm`,
  benchmarks/timm_peer.py) with timm's `tf_efficientnet_b0`, at the same batch, resolution,
  precision (float32) and thread count, in channels-last memory. Where that environment is
  missing or broken, each row's `timm_status` says why and the run goes on.

The model configurations are measured in `--rounds` interleaved rounds (all of them, then the
peer, then all again): on a shared machine a single run can drop to half speed, so each row
holds the best round, every round (`images_per_second_rounds`) and their `spread`.

Every timing follows warm-up calls (the first traces); a non-finite loss stops the run. `--size
tiny` swaps B0 for the test-only tiny variant (and Keras' own EfficientNet builder at the same
scaling as the reference) so that tests can take one step per configuration in seconds.
`--smoke` does that for every configuration, untraced (rows to a temporary folder); `--quick`
measures one round at the half resolution with fewer steps (<name>_quick.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import keras_efficientnet as ke
from benchmarks import timm_peer
from benchmarks.common import (
    add_mode_arguments,
    check_finite,
    machine,
    make_row,
    parse_args,
    write_results,
)
from benchmarks.timing import median_seconds
from keras_efficientnet.models.efficientnet import SCALING
from keras_efficientnet.serving import serving_model

BASELINE = "keras.applications.EfficientNetB0"
# Our variants, by the label the results use, and their preset family.
VARIANTS = {"G1-BN": "g1-bn", "G1-GN": "g1-gn", "G16-GN": "g16-gn", "G16-LN+PN": "g16-lnpn"}
# Native and reduced ("half": about half the pixels) resolutions (docs/recipes.md).
RESOLUTIONS = {"b0": (224, 160), "tiny": (64, 32)}
CLASSES = 1000
# The PyTorch peer (benchmarks/timm_peer.py) in its own environment (make venv-timm).
REPO = Path(__file__).resolve().parents[1]
TIMM_PYTHON = os.environ.get("KE_TIMM_PYTHON", str(REPO / ".venv-timm" / "bin" / "python"))
TIMM_MODELS = {"efficientnet_b0": "timm efficientnet_b0 (PyTorch)",
               "tf_efficientnet_b0": "timm tf_efficientnet_b0 (PyTorch)"}
TIMM_PEER = TIMM_MODELS["efficientnet_b0"]  # the one `ratio_to_timm` divides by
TIMM_TIMEOUT = 1800.0  # seconds for one child run (B0 at 2 resolutions on 2 busy cores: ~5 min)
SERVING_SUFFIX = "[serving]"  # our variants' inference through keras_efficientnet.serving
# Preset options of --smoke and --quick (options on the command line still win). The smoke run
# is untraced: tracing every configuration would take a minute on 2 cores.
SMOKE = ["--size=tiny", "--resolutions=32", "--batch=2", "--warmup=1", "--steps=1",
         "--infer-steps=1", "--layer-batch=2", "--layer-size=8", "--layer-channels=32",
         "--layer-repeats=1", "--eager", "--rounds=1", "--no-timm"]
# The quick run: Keras' B0, our G1-BN and the paper's G16-LN+PN (and timm), 160 px only.
QUICK = ["--resolutions=160", "--batch=16", "--warmup=1", "--steps=2", "--infer-steps=2",
         "--layer-repeats=3", "--rounds=1", "--variants=G1-BN,G16-LN+PN"]


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
            seconds = median_seconds(step, warmup=1, repeats=1 if slow else repeats)
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
                 steps: int, infer_steps: int, eager: bool = False,
                 serving: bool = False) -> dict[str, tuple[float, float]]:
    """{"train"|"inference"|"serving": (images/s, median seconds a step)} after warm-up steps;
    "serving" (with `serving`) is the inference of `keras_efficientnet.serving.serving_model`."""
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

    def infer_step(predictor=model):
        check_finite(np.sum(np.asarray(predictor.predict_on_batch(images), "float64")),
                     f"{predictor.name} inference")

    train = median_seconds(train_step, warmup=warmup, repeats=steps)
    infer = median_seconds(infer_step, warmup=warmup, repeats=infer_steps)
    measured = {"train": (batch / train, train), "inference": (batch / infer, infer)}
    if serving:
        fast = serving_model(model)
        fast.run_eagerly = eager
        seconds = median_seconds(lambda: infer_step(fast), warmup=warmup, repeats=infer_steps)
        measured["serving"] = (batch / seconds, seconds)
    return measured


# ------------------------------------------------------------------------------ timm peer


def run_timm_peer(python: str, resolutions: list[int], batch: int, *, threads: int,
                  warmup: int, steps: int, infer_steps: int,
                  timeout: float = TIMM_TIMEOUT) -> tuple[list[dict], str | None]:
    """Measurements of timm's B0s by `benchmarks/timm_peer.py` under `python` (a child process),
    and None, or what was measured and the reason the peer did not (fully) run."""
    if not Path(python).is_file():
        return [], (f"no PyTorch peer: {python} does not exist (make venv-timm creates it)")
    command = [python, "-m", "benchmarks.timm_peer", "--models", ",".join(TIMM_MODELS),
               "--resolutions", ",".join(map(str, resolutions)), "--batch", str(batch),
               "--threads", str(threads), "--warmup", str(warmup), "--steps", str(steps),
               "--infer-steps", str(infer_steps)]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired:
        return [], f"the timm peer took over {timeout:.0f} s and was stopped"
    lines = done.stdout.splitlines()
    measured = [json.loads(line[len(timm_peer.ROW_PREFIX):]) for line in lines
                if line.startswith(timm_peer.ROW_PREFIX)]
    reasons = [line[len(timm_peer.UNAVAILABLE_PREFIX):] for line in lines
               if line.startswith(timm_peer.UNAVAILABLE_PREFIX)]
    if done.returncode == 0:
        return measured, None
    last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
    return measured, (reasons[0] if reasons else
                      f"the timm peer exited with status {done.returncode}: {last}")


def intra_op_threads() -> int:
    """The intra-op threads this process' backend uses (TensorFlow's 0 means one per core)."""
    if keras.backend.backend() == "tensorflow":
        import tensorflow as tf

        return tf.config.threading.get_intra_op_parallelism_threads() or os.cpu_count() or 1
    return os.cpu_count() or 1


# ----------------------------------------------------------------------------------- models


def _measure_round(size, resolution, batch, args, variants, eager, samples) -> None:
    """One measurement of every configuration at `resolution`, appended to `samples`."""
    for label, build, dtype in model_configs(size, variants):
        keras.utils.clear_session()
        model = build(resolution)
        macs = ke.count_macs(model)
        ours = label != BASELINE and keras.backend.backend() == "tensorflow"
        for mode, (ips, seconds) in _throughputs(
                model, dtype, batch, resolution, warmup=args["warmup"], steps=args["steps"],
                infer_steps=args["infer_steps"], eager=eager, serving=ours).items():
            key = ("inference", resolution, f"{label} {SERVING_SUFFIX}") if mode == "serving" \
                else (mode, resolution, label)
            samples.setdefault(key, {"backend": keras.backend.backend(), "gmacs": macs / 1e9,
                                     "seconds": []})["seconds"].append(seconds)
            print(f"{key[0]:9s} {resolution:4d}px {key[2]:34s} {ips:8.2f} img/s", flush=True)
        del model


def _add_timm_samples(measured: list[dict], samples: dict) -> None:
    for m in measured:
        key = (m["mode"], m["resolution"], TIMM_MODELS[m["model"]])
        entry = samples.setdefault(key, {"backend": "torch", "seconds": [],
                                         "peer": {"torch": m["torch"], "timm": m["timm"],
                                                  "threads": m["threads"]}})
        entry["seconds"].append(m["seconds_per_step"])
        print(f"{m['mode']:9s} {m['resolution']:4d}px {key[2]:34s} "
              f"{m['images_per_second']:8.2f} img/s", flush=True)


def bench_models(size: str, resolutions: list[int], batch: int, *, warmup: int, steps: int,
                 infer_steps: int, info: dict, variants: list[str] | None = None,
                 eager: bool = False, rounds: int = 1,
                 timm_python: str | None = None) -> list[dict]:
    """`rounds` interleaved rounds (every configuration, then the timm peer, per resolution);
    rows with the best round, the spread of the rounds and the ratios to the references."""
    samples: dict = {}  # (mode, resolution, label) -> {"seconds": [...], "backend", ...}
    args = dict(warmup=warmup, steps=steps, infer_steps=infer_steps)
    timm_status = None if timm_python else "timm peer left out (--no-timm)"
    for _ in range(rounds):
        for resolution in resolutions:
            _measure_round(size, resolution, batch, args, variants, eager, samples)
            if timm_status is None:
                measured, timm_status = run_timm_peer(timm_python, [resolution], batch,
                                                      threads=intra_op_threads(), **args)
                _add_timm_samples(measured, samples)
                if timm_status:
                    print(f"timm peer: {timm_status}; the run goes on without it", flush=True)
    return model_rows(samples, batch=batch, native=resolutions[0], info=info, size=size,
                      eager=eager, steps=dict(train=steps, inference=infer_steps),
                      warmup=warmup, timm_status=timm_status)


def model_rows(samples: dict, *, batch: int, native: int, info: dict, size: str, eager: bool,
               steps: dict, warmup: int, timm_status: str | None) -> list[dict]:
    """Rows from `samples` (best round of each), each with `ratio_to_reference` (to
    keras.applications), `ratio_to_timm` (to timm's efficientnet_b0 at the same mode and
    resolution) and `ratio_to_native_timm` (to it at the native resolution), or `timm_status`
    saying why the timm ratios are missing."""
    def best(key):
        return batch / min(samples[key]["seconds"])

    rows = []
    for (mode, resolution, label), entry in samples.items():
        ips = best((mode, resolution, label))
        rounds = sorted(batch / s for s in entry["seconds"])
        extra = dict(model_size=size, seconds_per_step=round(min(entry["seconds"]), 4),
                     steps=steps[mode], warmup_steps=warmup, eager=eager,
                     rounds=len(rounds), images_per_second_rounds=[round(r, 3) for r in rounds],
                     spread=round((rounds[-1] - rounds[0]) / rounds[-1], 4),
                     ratio_to_native_reference=round(ips / best((mode, native, BASELINE)), 4))
        if "gmacs" in entry:
            extra["gmacs"] = round(entry["gmacs"], 4)
        if "peer" in entry:
            extra["peer"] = entry["peer"]
        timm_key, native_timm = (mode, resolution, TIMM_PEER), (mode, native, TIMM_PEER)
        if timm_key in samples and native_timm in samples:
            extra["ratio_to_timm"] = round(ips / best(timm_key), 4)
            extra["ratio_to_native_timm"] = round(ips / best(native_timm), 4)
            extra["timm_status"] = "measured"
        else:
            extra["timm_status"] = timm_status or "timm peer not measured at this resolution"
        rows.append(make_row(
            mode, machine=info, backend=entry["backend"], variant=label, resolution=resolution,
            batch=batch, precision="float32", images_per_second=ips, reference=BASELINE,
            reference_images_per_second=best((mode, resolution, BASELINE)), **extra))
    return rows


def _summary(rows: list[dict]) -> None:
    print(f"\n{'benchmark':10s} {'res':>4s} {'variant':36s} {'img/s':>8s} {'spread':>7s} "
          f"{'vs ref':>7s} {'vs timm':>8s}")
    for row in rows:
        timm = row.get("ratio_to_timm")
        print(f"{row['benchmark']:10s} {row['resolution']:4d} {row['variant']:36s} "
              f"{row['images_per_second']:8.2f} {row['spread']:7.1%} "
              f"{row['ratio_to_reference']:7.3f} " + (f"{timm:8.3f}" if timm else f"{'-':>8s}"))
    status = {row["timm_status"] for row in rows} - {"measured"}
    if status:
        print(f"timm ratios missing: {'; '.join(sorted(status))}")


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
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds of every model configuration (and the timm "
                             "peer); rows report the best round and the spread")
    parser.add_argument("--timm-python", default=TIMM_PYTHON,
                        help="interpreter with torch and timm (make venv-timm; "
                             "$KE_TIMM_PYTHON)")
    parser.add_argument("--no-timm", action="store_true", help="leave the PyTorch peer out")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, received {args.rounds}")
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
        write_results(f"layers_{backend}", layer_rows, args.output_dir, args.mode)
        rows += layer_rows
    if not args.skip_models:
        measured = bench_models(args.size, resolutions, args.batch, warmup=args.warmup,
                                steps=args.steps, infer_steps=args.infer_steps, info=info,
                                variants=variants, eager=args.eager, rounds=args.rounds,
                                timm_python=None if args.no_timm else args.timm_python)
        _summary(measured)
        write_results(f"model_{backend}", measured, args.output_dir, args.mode)
        rows += measured
    return rows


if __name__ == "__main__":
    main()
