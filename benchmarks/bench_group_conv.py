"""GroupConv2D(group_size=16) with oneDNN off and on, against a dense Conv2D of the same shape.

Run with `make benchmark-layers` (or `python -m benchmarks.bench_group_conv --help`). TensorFlow
reads `TF_ENABLE_ONEDNN_OPTS` once, at import, so each setting runs in a child process of its own;
this process only starts them and writes the rows. One file, `onednn_tensorflow.jsonl`:

- `conv_fwd_bwd`: forward+backward of the G16-B0 spatial convs (batch 16, stride 1) as a dense
  `Conv2D` (the reference: the CPU's practical ceiling for this arithmetic), `GroupConv2D(16)`
  (with the TensorFlow path it chose: `per_group` or `grouped`) and `DepthwiseConv2D`, each with
  the multiply-accumulates per second it achieved (`gmacs_per_second`, forward + both gradients
  counted as 3x the forward MACs) and their ratio to the dense conv's (`ratio_gmacs_to_dense`).
- `train_onednn` / `inference_onednn`: images/s of the G16-LN+PN B0 (and of
  `keras.applications.EfficientNetB0`, for context) with oneDNN off, against the same model with
  oneDNN on, measured in the same run.

`--smoke` steps one small conv shape and the tiny model variant once per setting (rows to a
temporary folder); `--quick` times fewer steps at a smaller model resolution
(onednn_tensorflow_quick.jsonl).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

from benchmarks.common import add_mode_arguments, parse_args

SETTINGS = {"off": "0", "on": "1"}
# The stride-1 spatial convs of G16-B0 at 224 px (expand ratio 4): side, channels, kernel.
SHAPES = [(56, 96, 3), (28, 160, 5), (14, 320, 3), (14, 448, 5), (7, 768, 5)]
GROUP_SIZE = 16
MODELS = ("keras.applications.EfficientNetB0", "G16-LN+PN")
CHILD_TIMEOUT_S = 1800
# Preset options of --smoke and --quick (options on the command line still win).
# The smoke run is untraced: tracing in both children would take most of a minute on 2 cores.
SMOKE = ["--batch=2", "--repeats=1", "--shapes=8:32:3", "--model-size=tiny", "--resolution=32",
         "--model-batch=2", "--warmup=1", "--steps=1", "--infer-steps=1", "--eager"]
# The quick run keeps three of the five shapes (the two left out hold the dense reference's
# slowest convolutions, 1-2 s a call) so that make benchmark-quick stays under 10 minutes.
QUICK = ["--repeats=2", "--resolution=160", "--model-batch=16", "--warmup=1", "--steps=2",
         "--infer-steps=2", "--shapes=56:96:3,28:160:5,14:320:3"]


def parse_shapes(text: str) -> list[tuple[int, int, int]]:
    """'side:channels:kernel,...' -> [(side, channels, kernel), ...]; ValueError naming the bad
    one (channels must be a multiple of GROUP_SIZE)."""
    shapes = []
    for item in text.split(","):
        try:
            side, channels, kernel = (int(part) for part in item.split(":"))
        except ValueError:
            raise ValueError(f"--shapes: {item!r} is not side:channels:kernel") from None
        if min(side, channels, kernel) < 1 or channels % GROUP_SIZE:
            raise ValueError(f"--shapes: {item!r} needs positive sizes and channels a multiple "
                             f"of {GROUP_SIZE}")
        shapes.append((side, channels, kernel))
    return shapes


def forward_macs(layer_kind: str, batch: int, side: int, channels: int, kernel: int) -> int:
    """Multiply-accumulates of one forward pass (same padding, stride 1, filters = channels)."""
    per_output = {"dense": channels, "group": GROUP_SIZE, "depthwise": 1}[layer_kind]
    return batch * side * side * kernel * kernel * per_output * channels


def child(args) -> list[dict]:
    """Measures every configuration under this process's oneDNN setting (raw figures only)."""
    import keras
    import numpy as np

    import keras_efficientnet as ke
    from benchmarks.bench_model import _grad_step, _throughputs, build_reference, build_variant
    from benchmarks.timing import median_seconds
    from keras_efficientnet.layers.group_conv import tf_conv_path

    results = []
    rng = np.random.default_rng(0)
    for side, channels, kernel in parse_shapes(args.shapes):
        x = rng.standard_normal((args.batch, side, side, channels)).astype("float32")
        layers = {
            "dense": keras.layers.Conv2D(channels, kernel, padding="same", use_bias=False),
            "group": ke.layers.GroupConv2D(channels, kernel, group_size=GROUP_SIZE),
            "depthwise": keras.layers.DepthwiseConv2D(kernel, padding="same", use_bias=False),
        }
        for kind, layer in layers.items():
            layer.build(x.shape)
            seconds = median_seconds(_grad_step(layer, x, args.eager), warmup=2,
                                     repeats=args.repeats)
            path = (tf_conv_path(channels // GROUP_SIZE, channels, channels)
                    if kind == "group" else "")
            results.append({"benchmark": "conv_fwd_bwd", "kind": kind, "side": side,
                            "channels": channels, "kernel": kernel, "seconds": seconds,
                            "path": path, "macs": 3 * forward_macs(kind, args.batch, side,
                                                                   channels, kernel)})
            print(f"  {kind:9s} {side}x{side}x{channels} k{kernel} {path:9s} "
                  f"{seconds * 1e3:9.1f} ms", file=sys.stderr, flush=True)
    for label in MODELS:
        keras.utils.clear_session()
        if label == MODELS[0]:
            model, dtype = build_reference(args.model_size, args.resolution), "float32"
        else:
            model, dtype = build_variant(args.model_size, label, args.resolution), "uint8"
        figures = _throughputs(model, dtype, args.model_batch, args.resolution,
                               warmup=args.warmup, steps=args.steps,
                               infer_steps=args.infer_steps, eager=args.eager)
        for mode, (ips, seconds) in figures.items():
            results.append({"benchmark": f"{mode}_onednn", "variant": label, "seconds": seconds,
                            "images_per_second": ips})
            print(f"  {mode:9s} {label:34s} {ips:8.2f} img/s", file=sys.stderr, flush=True)
    return results


def run_children(argv: list[str]) -> dict[str, list[dict]]:
    """{setting: raw results}, one child process per oneDNN setting, one after the other (the
    cores are the thing measured)."""
    measured = {}
    for setting, value in SETTINGS.items():
        env = {**os.environ, "TF_ENABLE_ONEDNN_OPTS": value, "TF_CPP_MIN_LOG_LEVEL": "2"}
        print(f"oneDNN {setting} (TF_ENABLE_ONEDNN_OPTS={value})", flush=True)
        proc = subprocess.run([sys.executable, "-m", "benchmarks.bench_group_conv", "--child",
                               *argv], env=env, stdout=subprocess.PIPE, text=True,
                              timeout=CHILD_TIMEOUT_S)
        if proc.returncode:
            raise SystemExit(f"the oneDNN-{setting} child failed (exit {proc.returncode})")
        measured[setting] = json.loads(proc.stdout.strip().splitlines()[-1])
    return measured


def make_rows(measured: dict[str, list[dict]], args, info: dict) -> list[dict]:
    from benchmarks.common import make_row

    rows = []
    names = {"dense": "Conv2D (dense)", "group": f"GroupConv2D(group_size={GROUP_SIZE})",
             "depthwise": "DepthwiseConv2D"}
    for setting, results in measured.items():
        convs = [r for r in results if r["benchmark"] == "conv_fwd_bwd"]
        for r in convs:
            dense = next(d for d in convs if d["kind"] == "dense" and d["side"] == r["side"]
                         and d["channels"] == r["channels"])
            gmacs = r["macs"] / r["seconds"] / 1e9
            dense_gmacs = dense["macs"] / dense["seconds"] / 1e9
            rows.append(make_row(
                "conv_fwd_bwd", machine=info, backend="tensorflow",
                variant=names[r["kind"]] + (f" [{r['path']}]" if r["path"] else ""),
                resolution=r["side"], batch=args.batch, precision="float32",
                images_per_second=args.batch / r["seconds"], reference=names["dense"],
                reference_images_per_second=args.batch / dense["seconds"], onednn=setting,
                channels=r["channels"], kernel=r["kernel"], path=r["path"] or r["kind"],
                ms=round(r["seconds"] * 1e3, 2), gmacs_per_second=round(gmacs, 3),
                ratio_gmacs_to_dense=round(gmacs / dense_gmacs, 4), repeats=args.repeats))
    on = {(r["benchmark"], r["variant"]): r for r in measured["on"] if "variant" in r}
    for setting, results in measured.items():
        for r in results:
            if "variant" not in r:
                continue
            reference = on[r["benchmark"], r["variant"]]
            rows.append(make_row(
                r["benchmark"], machine=info, backend="tensorflow",
                variant=f"{r['variant']} (oneDNN {setting})", resolution=args.resolution,
                batch=args.model_batch, precision="float32",
                images_per_second=r["images_per_second"],
                reference=f"{r['variant']} (oneDNN on)",
                reference_images_per_second=reference["images_per_second"], onednn=setting,
                seconds_per_step=round(r["seconds"], 4), model_size=args.model_size,
                eager=args.eager,
                steps=args.steps if r["benchmark"].startswith("train") else args.infer_steps,
                warmup_steps=args.warmup))
    return rows


def summary(rows: list[dict]) -> None:
    print(f"\n{'benchmark':16s} {'oneDNN':6s} {'shape':14s} {'variant':48s} {'GMAC/s':>7s} "
          f"{'vs dense':>8s} {'img/s':>8s} {'vs ref':>7s}")
    for row in rows:
        if "channels" in row:
            shape = f"{row['resolution']}x{row['resolution']}x{row['channels']} k{row['kernel']}"
            macs = f"{row['gmacs_per_second']:7.2f} {row['ratio_gmacs_to_dense']:8.3f}"
        else:
            shape, macs = f"{row['resolution']}px", f"{'-':>7s} {'-':>8s}"
        print(f"{row['benchmark']:16s} {row['onednn']:6s} {shape:14s} {row['variant']:48s} "
              f"{macs} {row['images_per_second']:8.2f} {row['ratio_to_reference']:7.3f}")


def main(argv=None) -> list[dict] | None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16, help="conv benchmark batch")
    parser.add_argument("--repeats", type=int, default=3, help="timed conv steps (median)")
    parser.add_argument("--resolution", type=int, default=224, help="model resolution")
    parser.add_argument("--model-batch", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="untimed model steps")
    parser.add_argument("--steps", type=int, default=3, help="timed training steps")
    parser.add_argument("--infer-steps", type=int, default=3, help="timed inference steps")
    parser.add_argument("--shapes", default=",".join(":".join(map(str, s)) for s in SHAPES),
                        help="conv shapes as side:channels:kernel,... (default: G16-B0's)")
    parser.add_argument("--model-size", choices=("b0", "tiny"), default="b0",
                        help="tiny: the test-only variant (and Keras' builder at its scaling)")
    parser.add_argument("--eager", action="store_true",
                        help="no tf.function (smoke runs: every configuration steps without "
                             "tracing; the timings mean nothing)")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    try:
        parse_shapes(args.shapes)
    except ValueError as error:
        parser.error(str(error))
    if args.child:
        print(json.dumps(child(args)), flush=True)
        return None
    from benchmarks.common import machine, write_results

    # The children measure what this process parsed: every option, presets included, spelled
    # out (never --smoke: that would give each child a temporary folder of its own).
    measured = run_children(child_argv(args))
    import tensorflow as tf  # noqa: F401  (names the TensorFlow version in the machine line)

    info = machine(cpu_flags=cpu_flags())
    rows = make_rows(measured, args, info)
    summary(rows)
    write_results("onednn_tensorflow", rows, args.output_dir, args.mode)
    return rows


def child_argv(args) -> list[str]:
    """The measuring options of `args` as a child's command line."""
    names = ("batch", "repeats", "resolution", "model_batch", "warmup", "steps", "infer_steps",
             "shapes", "model_size")
    return ([f"--{name.replace('_', '-')}={getattr(args, name)}" for name in names]
            + (["--eager"] if args.eager else []))


def cpu_flags() -> str:
    """The vector extensions this CPU has, which decide TensorFlow's oneDNN default on x86."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    wanted = ("avx", "avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16",
                              "amx_tile")
                    return " ".join(f for f in wanted if f in flags)
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()
