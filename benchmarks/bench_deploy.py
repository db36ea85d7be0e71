"""Serving speed where models are deployed: our exports and timm's on ONNX Runtime and OpenVINO.

Run with `make benchmark-deploy` (or `python -m benchmarks.bench_deploy --help`). In one run:

- ours, G1-BN, G16-GN and G16-LN+PN at B0 224 px (1000 classes), and the Fashion-MNIST recipe's
  tiny model (`flags/fashion-mnist-g1-bn-native.flags`: its preset and test resolution, 10
  classes), exported by `keras_efficientnet.deploy` (`export_onnx`, then `export_openvino` of
  that file);
- timm's `efficientnet_b0`, exported as a timm user does, `torch.onnx.export(opset_version=17)`,
  by a child process (`benchmarks/timm_deploy.py`; torch and timm in the same venv, `make
  benchmark-deploy` installs them);

each run by `keras_efficientnet.deploy.runtimes` on ONNX Runtime and OpenVINO (the settings the
predict command uses), with TensorFlow's `predict_on_batch` of our Keras models and PyTorch
eager of timm's (timed after 5 SGD steps: see timm_deploy.py) as references. For each:
batch-`--batch` images/s (`deploy_throughput` rows: the best of `--repeats` timings of
`--batches` calls) and batch-1 latency (`deploy_latency` rows: the median of
`--latency-calls`; images_per_second is its inverse), in `--rounds` interleaved rounds (every
configuration, then the next round): each row holds the best round, every round and their
spread. MACs are counted on each ONNX graph (Conv and Gemm/MatMul, batch 1: the same count for
ours and timm's; `gmacs_keras` beside it is `ke.count_macs` of our Keras model), so `GMAC/s` is
comparable across models. Every row has `ratio_to_timm` (to timm on the same runtime and batch;
for TensorFlow rows, to PyTorch eager) and `mac_rate_ratio_to_timm`, and the issue-33 targets
where they apply (`target`, `target_met`).

int8 (on unless `--no-int8`): the headline variant (G16-LN+PN) quantized as
`keras-efficientnet-export --int8` does (`quantize_openvino`: NNCF; `quantize_onnx`: ONNX
Runtime's QDQ quantizer), calibrated on `--int8-calibration` random uint8 images (the ranges
change the accuracy, tested in tests/deploy/test_int8.py and measured in docs/deploy.md, not
the speed), timed in the same rounds as the float rows: rows with `precision` "int8" whose
`ratio_to_timm` is to timm's float32 on the same runtime (issue 33's int8 target: at least
1.0x on OpenVINO).

`deploy_setting` rows measure the runtime settings `runtimes` chose, on G16-LN+PN and timm:
OpenVINO's THROUGHPUT hint against LATENCY, ONNX Runtime with 1 thread against one per core.
With `--profile` (on in a full run) a per-op profile of G16-LN+PN and timm's B0 at batch
`--batch` (OpenVINO's PERF_COUNT, ONNX Runtime's profiler), summed by op type, goes to
`deploy_profile.json` beside the rows.

`--smoke`: tiny G16-LN+PN at 32 px, one call each, timm at 32 px where torch and timm import
(rows to a temporary folder); `--quick`: one round, fewer calls, no settings or profile.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

import keras_efficientnet as ke
from benchmarks import timm_deploy
from benchmarks.common import add_mode_arguments, machine, make_row, parse_args, write_results
from benchmarks.timing import best_seconds, median_seconds
from keras_efficientnet.deploy import export_onnx, export_openvino, runtimes

REPO = Path(__file__).resolve().parents[1]
VARIANTS = {"G1-BN": "g1-bn", "G16-GN": "g16-gn", "G16-LN+PN": "g16-lnpn"}
RECIPE = "fashion-mnist-g1-bn-native"  # the shipped Fashion-MNIST recipe (README)
RECIPE_CLASSES = 10  # Fashion-MNIST's
TIMM = "timm efficientnet_b0"
DEPLOY_RUNTIMES = ("onnxruntime", "openvino")
LABELS = {"onnxruntime": "ONNX Runtime", "openvino": "OpenVINO",
          "tensorflow": "TensorFlow predict", "torch": "PyTorch eager"}
HEADLINE = "G16-LN+PN"  # the variant the settings and profiles measure
TIMM_TIMEOUT = 1800.0
# The smoke run: the headline variant only (settings and profiles included) and timm, tiny.
SMOKE = ["--size=tiny", "--resolution=32", "--variants=G16-LN+PN", "--no-recipe", "--batch=2",
         "--batches=1", "--repeats=1", "--latency-calls=1", "--rounds=1", "--sgd-steps=1",
         "--warmup=1", "--profile-calls=1", "--int8-calibration=2"]
# The quick run: G1-BN and the headline variant (with its int8) against timm.
QUICK = ["--rounds=1", "--batches=2", "--repeats=2", "--latency-calls=8", "--no-settings",
         "--no-profile", "--int8-calibration=16", "--variants=G1-BN,G16-LN+PN", "--no-recipe"]


# ------------------------------------------------------------------------------ models


def recipe_model() -> tuple[str, int]:
    """(preset, test resolution) of the shipped Fashion-MNIST recipe's flagfile."""
    flags = {}
    for line in (REPO / "flags" / f"{RECIPE}.flags").read_text().splitlines():
        if line.startswith("--") and "=" in line:
            key, value = line[2:].split("=", 1)
            flags[key] = value
    return flags["model"], int(flags["test_resolution"])


def our_models(size: str, resolution: int, variants: list[str],
               recipe: bool) -> dict[str, tuple[keras.Model, int]]:
    """{label: (Keras model, resolution)}: our variants, then the recipe's model."""
    models = {}
    for label in variants:
        keras.utils.set_random_seed(0)
        model = ke.EfficientNet.from_preset(
            f"efficientnet-{size}-{VARIANTS[label]}", input_shape=(resolution, resolution, 3),
            classes=1000)
        models[f"{label} {size.upper()}"] = (model, resolution)
    if recipe:
        preset, recipe_resolution = recipe_model()
        keras.utils.set_random_seed(0)
        model = ke.EfficientNet.from_preset(
            preset, input_shape=(recipe_resolution, recipe_resolution, 3),
            classes=RECIPE_CLASSES)
        models[f"{RECIPE} ({preset.removeprefix('efficientnet-')})"] = (model,
                                                                       recipe_resolution)
    return models


def graph_macs(path: Path) -> tuple[int, int]:
    """(multiply-accumulates of one image, node count) of an ONNX graph: Conv (output elements x
    input channels per group x kernel area) and Gemm/MatMul (output elements x inner size),
    from ONNX's shape inference at batch 1."""
    import onnx

    model = onnx.load(str(path))
    dims = model.graph.input[0].type.tensor_type.shape.dim
    dims[0].ClearField("dim_param")
    dims[0].dim_value = 1
    inferred = onnx.shape_inference.infer_shapes(model)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*inferred.graph.value_info, *inferred.graph.output,
                        *inferred.graph.input]}
    weights = {t.name: list(t.dims) for t in inferred.graph.initializer}
    total = 0
    for node in inferred.graph.node:
        out = shapes.get(node.output[0])
        if node.op_type == "Conv" and out:
            kernel = weights.get(node.input[1]) or shapes.get(node.input[1])
            total += int(np.prod(out[1:])) * int(np.prod(kernel[1:]))
        elif node.op_type in ("Gemm", "MatMul") and out:
            a = shapes.get(node.input[0]) or weights.get(node.input[0])
            inner = a[-1] if node.op_type == "MatMul" or not _attr(node, "transA") else a[0]
            total += int(np.prod(out[1:] if len(out) > 2 else out)) * int(inner)
    return total, len(model.graph.node)


def _attr(node, name: str) -> int:
    return next((a.i for a in node.attribute if a.name == name), 0)


# ------------------------------------------------------------------------------ timing


def _check(outputs, where: str) -> None:
    if not np.all(np.isfinite(np.asarray(outputs, np.float64))):
        raise SystemExit(f"non-finite outputs from {where}: its timing would mean nothing")


def time_call(call, images: np.ndarray, args, where: str) -> tuple[float, float]:
    """(seconds a batch, batch-1 latency seconds) of `call`."""
    _check(call(images), where)
    seconds = best_seconds(lambda: call(images), warmup=args.warmup, batches=args.batches,
                           repeats=args.repeats)
    one = images[:1]
    latency = median_seconds(lambda: call(one), warmup=args.warmup,
                             repeats=args.latency_calls)
    return seconds, latency


# ------------------------------------------------------------------------------ timm


def run_timm(args, *, export: Path | None, eager: bool, resolution: int,
             threads: int) -> tuple[dict | None, str | None]:
    """timm_deploy.py in a child process: (its result, None) or (None, why not)."""
    command = [args.timm_python, "-m", "benchmarks.timm_deploy", "--resolution",
               str(resolution), "--batch", str(args.batch), "--threads", str(threads),
               "--sgd-steps", str(args.sgd_steps), "--warmup", str(args.warmup), "--batches",
               str(args.batches), "--repeats", str(args.repeats), "--latency-calls",
               str(args.latency_calls)]
    command += (["--export", str(export)] if export else []) + (["--eager"] if eager else [])
    if not Path(args.timm_python).is_file():
        return None, f"no {args.timm_python} (--timm-python)"
    env = dict(os.environ, PYTHONPATH=str(REPO))
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=TIMM_TIMEOUT)
    except subprocess.TimeoutExpired:
        return None, f"timm_deploy took over {TIMM_TIMEOUT:.0f} s and was stopped"
    lines = done.stdout.splitlines()
    for line in lines:
        if line.startswith(timm_deploy.ROW_PREFIX):
            return json.loads(line[len(timm_deploy.ROW_PREFIX):]), None
    reasons = [line[len(timm_deploy.UNAVAILABLE_PREFIX):] for line in lines
               if line.startswith(timm_deploy.UNAVAILABLE_PREFIX)]
    last = (done.stderr.strip().splitlines() or ["no error output"])[-1]
    return None, reasons[0] if reasons else (f"`{shlex.join(command[1:4])}` exited with status "
                                             f"{done.returncode}: {last}")


# ------------------------------------------------------------------------------ profiles


def profile_openvino(path: Path, images: np.ndarray, calls: int, threads: int) -> dict:
    """Milliseconds a call by OpenVINO node type (PERF_COUNT), summed over `calls` calls."""
    import openvino as ov

    core = ov.Core()
    model = core.read_model(str(path))
    model.reshape({model.inputs[0]: ov.PartialShape(list(images.shape))})
    compiled = core.compile_model(model, "CPU", {
        "PERFORMANCE_HINT": "LATENCY", "INFERENCE_NUM_THREADS": threads,
        "INFERENCE_PRECISION_HINT": "f32", "PERF_COUNT": True})
    request = compiled.create_infer_request()
    element = np.dtype(model.inputs[0].get_element_type().to_dtype())
    request.infer({0: images.astype(element)})  # warm-up
    totals: dict[str, list] = {}
    for _ in range(calls):
        request.infer({0: images.astype(element)})
        for info in request.profiling_info:
            if info.status != info.Status.EXECUTED:
                continue
            entry = totals.setdefault(f"{info.node_type} [{info.exec_type}]", [0.0, 0])
            entry[0] += info.real_time.total_seconds() * 1e3 / calls
            entry[1] += 1
    return _summary(totals, calls)


def profile_onnxruntime(path: Path, images: np.ndarray, calls: int, threads: int) -> dict:
    """Milliseconds a call by ONNX op type (ONNX Runtime's profiler), over `calls` calls."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads
    options.enable_profiling = True
    with tempfile.TemporaryDirectory() as folder:
        options.profile_file_prefix = str(Path(folder) / "ort")
        session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        first = session.get_inputs()[0]
        element = np.dtype(runtimes.ONNX_TYPES.get(first.type, "uint8"))
        feed = {first.name: images.astype(element)}
        session.run(None, feed)  # warm-up (in the trace too: skipped below)
        for _ in range(calls):
            session.run(None, feed)
        events = json.loads(Path(session.end_profiling()).read_text())
    runs = [e for e in events if e.get("name") == "model_run"]
    after = runs[1]["ts"] if len(runs) > 1 else 0  # the warm-up run's events left out
    totals: dict[str, list] = {}
    for event in events:
        if event.get("cat") != "Node" or not event["name"].endswith("_kernel_time") or \
                event["ts"] < after:
            continue
        entry = totals.setdefault(event["args"]["op_name"], [0.0, 0])
        entry[0] += event["dur"] / 1e3 / calls
        entry[1] += 1
    return _summary(totals, calls)


def _summary(totals: dict[str, list], calls: int) -> dict:
    whole = sum(ms for ms, _ in totals.values()) or 1.0
    ops = sorted(totals.items(), key=lambda kv: -kv[1][0])
    return {"ms_per_call": round(whole, 3), "calls": calls,
            "by_op": [{"op": op, "ms": round(ms, 3), "share": round(ms / whole, 4),
                       "nodes": count // calls} for op, (ms, count) in ops]}


# ------------------------------------------------------------------------------ run


def _sessions(path: Path, threads: int, settings: bool) -> dict[tuple[str, str], object]:
    """{(runtime, setting): session}: the chosen settings ("default"), and with `settings`
    the alternatives the deploy_setting rows measure."""
    sessions = {(runtime, "default"): runtimes.open_session(
        path if runtime == "onnxruntime" else path.with_suffix(".xml"), runtime,
        threads=threads) for runtime in DEPLOY_RUNTIMES}
    if settings:
        sessions[("openvino", "THROUGHPUT hint")] = runtimes.open_session(
            path.with_suffix(".xml"), "openvino", threads=threads, hint="THROUGHPUT")
        if threads > 1:
            sessions[("onnxruntime", "1 thread")] = runtimes.open_session(
                path, "onnxruntime", threads=1)
    return sessions


def _timm_images(batch: int, resolution: int) -> np.ndarray:
    # timm's graph takes normalized float NCHW images: standard normal values stand in.
    return np.random.default_rng(0).standard_normal(
        (batch, 3, resolution, resolution)).astype("float32")


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", choices=("b0", "tiny"), default="b0",
                        help="b0, or tiny for a seconds-long check of every configuration")
    parser.add_argument("--resolution", type=int, default=224)
    parser.add_argument("--variants", default=",".join(VARIANTS),
                        help=f"comma-separated subset of {','.join(VARIANTS)}")
    parser.add_argument("--no-recipe", action="store_true",
                        help=f"leave out the {RECIPE} recipe's tiny model")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--batches", type=int, default=4, help="calls in one timing")
    parser.add_argument("--repeats", type=int, default=3, help="timings; the best counts")
    parser.add_argument("--latency-calls", type=int, default=20,
                        help="batch-1 calls; the median counts")
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds")
    parser.add_argument("--sgd-steps", type=int, default=5,
                        help="SGD steps before timing PyTorch eager")
    parser.add_argument("--threads", type=int, default=0,
                        help="intra-op threads of every runtime; 0 = one per core")
    parser.add_argument("--no-settings", action="store_true",
                        help="leave out the deploy_setting rows")
    parser.add_argument("--no-profile", action="store_true",
                        help="leave out the per-op profiles")
    parser.add_argument("--profile-calls", type=int, default=3)
    parser.add_argument("--no-int8", action="store_true",
                        help=f"leave out the int8 rows of {HEADLINE}")
    parser.add_argument("--int8-calibration", type=int, default=64,
                        help="random uint8 images the int8 quantizers calibrate on")
    parser.add_argument("--timm-python", default=sys.executable,
                        help="interpreter with torch and timm (default: this one)")
    parser.add_argument("--no-timm", action="store_true", help="leave timm out")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        parser.error(f"unknown --variants {unknown}; choose from {list(VARIANTS)}")
    if min(args.rounds, args.batches, args.repeats, args.latency_calls, args.batch,
           args.int8_calibration) < 1:
        parser.error("--rounds, --batches, --repeats, --latency-calls, --batch and "
                     "--int8-calibration must be at least 1")
    missing = [r for r in DEPLOY_RUNTIMES if not runtimes.installed(r)]
    if missing:
        raise SystemExit(f"bench_deploy: {', '.join(missing)} not installed: pip install -e "
                         "\".[deploy]\" (make benchmark-deploy installs it)")
    threads = args.threads or runtimes.default_threads()
    load_before = os.getloadavg()
    import onnxruntime
    import openvino

    info = machine(onnxruntime=onnxruntime.__version__,
                   openvino=openvino.get_version().split("-")[0])
    print(f"machine: {info}", flush=True)
    with tempfile.TemporaryDirectory(prefix="ke-bench-deploy-") as folder:
        rows, profiles = run(args, variants, threads, Path(folder), info)
    load = [round(x, 2) for x in (load_before[0], os.getloadavg()[0])]
    for row in rows:
        row["machine"]["load_average_1m_before_after"] = load
    _print_rows(rows)
    print("\nREADME.md's speed table (ratios: to timm's float32 on the same runtime; for "
          "latency, ours over timm's):\n" + readme_table(rows))
    path, _ = write_results("deploy", rows, args.output_dir, args.mode)
    if profiles:
        out = path.with_name(args.mode.file_name("deploy_profile") + ".json")
        out.write_text(json.dumps(profiles, indent=1) + "\n")
        print(f"wrote {out}")
    return rows


def run(args, variants: list[str], threads: int, folder: Path,
        info: dict) -> tuple[list[dict], dict]:
    models = our_models(args.size, args.resolution, variants, recipe=not args.no_recipe)
    rng = np.random.default_rng(0)
    entries: dict[str, dict] = {}  # label -> {"path", "gmacs", "nodes", "sessions", ...}
    for label, (model, resolution) in models.items():
        started = time.perf_counter()
        onnx = export_onnx(model, folder / f"{len(entries)}.onnx")
        export_openvino(onnx, onnx.with_suffix(".xml"))
        macs, nodes = graph_macs(onnx)
        headline = label.startswith(HEADLINE)
        entries[label] = {
            "path": onnx, "gmacs": macs / 1e9, "nodes": nodes, "resolution": resolution,
            "gmacs_keras": ke.count_macs(model) / 1e9, "model": model,
            "export": "keras_efficientnet.deploy.export_onnx (+ export_openvino)",
            "sessions": _sessions(onnx, threads, settings=headline and not args.no_settings),
            "images": rng.integers(0, 256, (args.batch, resolution, resolution, 3),
                                   dtype=np.uint8)}
        print(f"exported {label}: {nodes} ONNX nodes, {macs / 1e9:.3f} GMAC, "
              f"{time.perf_counter() - started:.0f} s", flush=True)
        if headline and not args.no_int8:
            entries[f"{label} int8"] = int8_entry(entries[label], label, threads, rng,
                                                  args.int8_calibration)
    timm_status = "left out (--no-timm)" if args.no_timm else None
    if timm_status is None:
        timm_onnx = folder / "timm.onnx"
        result, timm_status = run_timm(args, export=timm_onnx, eager=False,
                                       resolution=args.resolution, threads=threads)
        if result is not None:
            macs, nodes = graph_macs(timm_onnx)
            entries[TIMM] = {
                "path": timm_onnx, "gmacs": macs / 1e9, "nodes": nodes,
                "resolution": args.resolution, "peer": {k: result[k] for k in ("torch",
                                                                                "timm")},
                "export": "torch.onnx.export(opset_version=17)",
                "sessions": {(runtime, "default"): runtimes.open_session(timm_onnx, runtime,
                                                                         threads=threads)
                             for runtime in DEPLOY_RUNTIMES},
                "images": _timm_images(args.batch, args.resolution)}
            if not args.no_settings:
                entries[TIMM]["sessions"][("openvino", "THROUGHPUT hint")] = (
                    runtimes.open_session(timm_onnx, "openvino", threads=threads,
                                          hint="THROUGHPUT"))
            print(f"exported {TIMM}: {nodes} ONNX nodes, {macs / 1e9:.3f} GMAC", flush=True)
            info.update(entries[TIMM]["peer"])  # the peer's versions, for the chart's footer
        else:
            print(f"timm: {timm_status}; the run goes on without it", flush=True)
    samples: dict[tuple, list] = {}  # (label, backend, setting) -> [(seconds, latency), ...]
    for round_index in range(args.rounds):
        print(f"round {round_index + 1}/{args.rounds}", flush=True)
        for label, entry in entries.items():
            for (runtime, setting), session in entry["sessions"].items():
                # _run: the runtime's call itself (timm's graph takes float NCHW images).
                measured = time_call(session._run, entry["images"], args,
                                     f"{label} on {runtime}")
                samples.setdefault((label, runtime, setting), []).append(measured)
                _progress(label, runtime, setting, measured, args.batch)
            if "model" in entry:
                model = entry["model"]
                measured = time_call(model.predict_on_batch, entry["images"], args,
                                     f"{label} on TensorFlow")
                samples.setdefault((label, "tensorflow", "default"), []).append(measured)
                _progress(label, "tensorflow", "default", measured, args.batch)
        if TIMM in entries:
            result, status = run_timm(args, export=None, eager=True,
                                      resolution=args.resolution, threads=threads)
            if result is None:
                timm_status = f"PyTorch eager: {status}"
            else:
                measured = (result["seconds_per_batch"], result["latency_seconds"])
                samples.setdefault((TIMM, "torch", "default"), []).append(measured)
                _progress(TIMM, "torch", "default", measured, args.batch)
    rows = build_rows(samples, entries, args, info, threads, timm_status)
    profiles = {}
    if not args.no_profile:
        for label in [label for label, entry in entries.items()
                      if label.startswith(HEADLINE) and "model" in entry] + (
                [TIMM] if TIMM in entries else []):
            entry = entries[label]
            profiles[label] = {
                "batch": args.batch, "threads": threads,
                "openvino": profile_openvino(entry["path"].with_suffix(".xml")
                                             if "model" in entry else entry["path"],
                                             entry["images"], args.profile_calls, threads),
                "onnxruntime": profile_onnxruntime(entry["path"], entry["images"],
                                                   args.profile_calls, threads)}
        _print_profiles(profiles)
    return rows, profiles


def int8_entry(entry: dict, label: str, threads: int, rng, calibration: int) -> dict:
    """The entry of `entry`'s model quantized to int8 for both runtimes (module docstring)."""
    import onnx

    from keras_efficientnet.deploy import quantize_onnx, quantize_openvino

    started = time.perf_counter()
    resolution = entry["resolution"]
    images = rng.integers(0, 256, (calibration, resolution, resolution, 3), dtype=np.uint8)
    path = entry["path"]
    xml = quantize_openvino(path, path.with_name(f"{path.stem}.int8.xml"), images)
    int8_onnx = quantize_onnx(path, path.with_name(f"{path.stem}.int8.onnx"), images)
    print(f"quantized {label} to int8 (NNCF, ONNX Runtime QDQ; {calibration} calibration "
          f"images): {time.perf_counter() - started:.0f} s", flush=True)
    return {
        "path": int8_onnx, "variant": label, "precision": "int8", "gmacs": entry["gmacs"],
        "nodes": len(onnx.load(str(int8_onnx), load_external_data=False).graph.node),
        "resolution": resolution, "images": entry["images"],
        "export": f"{entry['export']}, int8: quantize_openvino (NNCF) / quantize_onnx (QDQ), "
                  f"{calibration} random calibration images",
        "sessions": {("openvino", "default"): runtimes.open_session(xml, "openvino",
                                                                    threads=threads),
                     ("onnxruntime", "default"): runtimes.open_session(
                         int8_onnx, "onnxruntime", threads=threads)}}


def _progress(label, runtime, setting, measured, batch) -> None:
    seconds, latency = measured
    suffix = "" if setting == "default" else f" [{setting}]"
    print(f"  {label:34s} {LABELS[runtime] + suffix:32s} {batch / seconds:8.1f} img/s  "
          f"batch 1: {latency * 1e3:7.1f} ms", flush=True)


# Issue 33's targets, per variant label prefix, mode and precision: the least ratio to timm's
# float32 figure on the same runtime (for latency: the most), where `mac` means timm's MACs
# over ours.
def target_for(label: str, mode: str, runtime: str, gmacs: float,
               timm_gmacs: float | None, precision: str = "float32") -> tuple[str, float] | None:
    if runtime not in DEPLOY_RUNTIMES or timm_gmacs is None:
        return None
    if precision == "int8":
        if (label.startswith("G16-LN+PN B0") and mode == "deploy_throughput"
                and runtime == "openvino"):
            return "int8 images/s >= timm's float32", 1.0
        return None
    if label.startswith("G16-LN+PN B0"):
        if mode == "deploy_throughput":
            return "images/s >= timm's x its MAC ratio", timm_gmacs / gmacs
        return "batch-1 latency <= timm's x the MAC ratio", gmacs / timm_gmacs
    if label.startswith("G1-BN B0") and mode == "deploy_throughput":
        return "images/s >= timm's", 1.0
    return None


def build_rows(samples: dict, entries: dict, args, info: dict, threads: int,
               timm_status: str | None) -> list[dict]:
    rows = []
    for (label, backend, setting), measured in samples.items():
        entry = entries[label]
        for mode, batch in (("deploy_throughput", args.batch), ("deploy_latency", 1)):
            per_round = sorted((batch / (m[0] if mode == "deploy_throughput" else m[1])
                                for m in measured))
            ips = per_round[-1]
            if setting != "default":
                reference = f"{label} on {LABELS[backend]}"
                ref_ips = _best(samples[(label, backend, "default")], mode, batch)
            else:
                peer = "torch" if backend in ("tensorflow", "torch") else backend
                reference = f"{TIMM} on {LABELS[peer]}"
                ref_ips = (_best(samples[(TIMM, peer, "default")], mode, batch)
                           if (TIMM, peer, "default") in samples else None)
            extra = dict(
                runtime=LABELS[backend], setting=setting, export=entry.get("export"),
                onnx_nodes=entry["nodes"], gmacs=round(entry["gmacs"], 4),
                gmacs_per_second=round(entry["gmacs"] * ips, 2),
                rounds=len(per_round), images_per_second_rounds=[round(r, 3) for r in per_round],
                spread=round((per_round[-1] - per_round[0]) / per_round[-1], 4),
                threads=threads, batches=args.batches, repeats=args.repeats,
                latency_calls=args.latency_calls, model_size=args.size)
            if mode == "deploy_latency":
                extra["latency_ms"] = round(1e3 / ips, 3)
            float_key = (entry.get("variant", label), backend, setting)
            if entry.get("precision") == "int8" and float_key in samples:
                extra["ratio_to_float32"] = round(
                    ips / _best(samples[float_key], mode, batch), 4)
            if "gmacs_keras" in entry:
                extra["gmacs_keras"] = round(entry["gmacs_keras"], 4)
            if "peer" in entry:
                extra["peer"] = entry["peer"]
            timm_key = (TIMM, "torch" if backend in ("tensorflow", "torch") else backend,
                        "default")
            if timm_key in samples:
                timm_ips = _best(samples[timm_key], mode, batch)
                extra["ratio_to_timm"] = round(ips / timm_ips, 4)
                extra["mac_rate_ratio_to_timm"] = round(
                    ips * entry["gmacs"] / (timm_ips * entries[TIMM]["gmacs"]), 4)
                extra["timm_status"] = "measured"
                target = target_for(entry.get("variant", label), mode, backend,
                                    entry["gmacs"], entries[TIMM]["gmacs"],
                                    entry.get("precision", "float32")
                                    ) if setting == "default" else None
                if target:
                    text, bound = target
                    if mode == "deploy_latency":  # a latency ratio: at most the bound
                        met = timm_ips / ips <= bound
                        extra["latency_ratio_to_timm"] = round(timm_ips / ips, 4)
                    else:
                        met = ips / timm_ips >= bound
                    extra.update(target=text, target_bound=round(bound, 4), target_met=met)
            else:
                extra["timm_status"] = timm_status or "timm not measured"
            if ref_ips is None:  # without timm: the row is its own reference
                reference, ref_ips = f"{label} on {LABELS[backend]}", ips
            rows.append(make_row(
                mode, machine=info, backend=backend, variant=entry.get("variant", label),
                resolution=entry["resolution"], batch=batch,
                precision=entry.get("precision", "float32"),
                images_per_second=ips, reference=reference, reference_images_per_second=ref_ips,
                **extra))
    return rows


def _best(measured: list, mode: str, batch: int) -> float:
    return max(batch / (m[0] if mode == "deploy_throughput" else m[1]) for m in measured)


def _print_rows(rows: list[dict]) -> None:
    print(f"\n{'mode':18s} {'variant':34s} {'runtime':34s} {'img/s':>8s} {'spread':>7s} "
          f"{'GMAC/s':>7s} {'vs timm':>8s} target")
    for row in rows:
        timm = row.get("ratio_to_timm")
        setting = "" if row["setting"] == "default" else f" [{row['setting']}]"
        setting += "" if row["precision"] == "float32" else f" {row['precision']}"
        target = ("" if "target_met" not in row else
                  f"{'met' if row['target_met'] else 'MISSED'} ({row['target']}, "
                  f"bound {row['target_bound']})")
        print(f"{row['benchmark']:18s} {row['variant']:34s} {row['runtime'] + setting:34s} "
              f"{row['images_per_second']:8.2f} {row['spread']:7.1%} "
              f"{row['gmacs_per_second']:7.1f} " + (f"{timm:8.3f}" if timm else f"{'-':>8s}")
              + f" {target}")


def readme_table(rows: list[dict]) -> str:
    """The README's speed table (markdown) from deploy rows: per model and precision,
    batch-N images/s and batch-1 latency on ONNX Runtime and OpenVINO, each with its ratio to
    timm's float32 on the same runtime (the runtimes' default settings): images/s ours over
    timm's, latency ours over timm's (the form of issue 33's targets)."""
    cells: dict[tuple, dict] = {}
    batch = None
    timm_sizes = {row["resolution"] for row in rows if row["variant"] == TIMM}
    # timm first: the reference every ratio is to.
    for row in sorted(rows, key=lambda row: row["variant"] != TIMM):
        if row.get("setting", "default") != "default" or row["backend"] not in DEPLOY_RUNTIMES:
            continue
        model = (row["variant"], row["precision"], row["resolution"])
        ratio = row.get("ratio_to_timm")
        if row["benchmark"] == "deploy_throughput":
            batch = row["batch"]
            text = f"{row['images_per_second']:.1f}"
        else:
            text = f"{row['latency_ms']:.3g} ms"
            ratio = 1 / ratio if ratio else None  # latency: ours over timm's (issue 33's)
        # Against timm at its resolution only (the recipe's tiny model runs at its own).
        if ratio is not None and row["variant"] != TIMM and row["resolution"] in timm_sizes:
            text += f" ({ratio:.2f}x)"
        cells.setdefault(model, {})[(row["benchmark"], row["backend"])] = text
    columns = [(mode, runtime) for mode in ("deploy_throughput", "deploy_latency")
               for runtime in DEPLOY_RUNTIMES]
    names = {"deploy_throughput": f"batch {batch}, images/s", "deploy_latency": "batch 1"}
    lines = ["| model | " + " | ".join(f"{LABELS[r]}, {names[m]}" for m, r in columns) + " |",
             "|---" * (len(columns) + 1) + "|"]
    for (variant, precision, resolution), by in cells.items():
        name = f"{variant}{'' if precision == 'float32' else ' ' + precision}, {resolution} px"
        lines.append(f"| {name} | " + " | ".join(by.get(c, "-") for c in columns) + " |")
    return "\n".join(lines)


def _print_profiles(profiles: dict) -> None:
    for label, profile in profiles.items():
        for runtime in ("openvino", "onnxruntime"):
            summary = profile[runtime]
            top = ", ".join(f"{op['op']} {op['ms']:.1f} ms ({op['share']:.0%}, {op['nodes']})"
                            for op in summary["by_op"][:8])
            print(f"profile {label} on {LABELS[runtime]}, batch {profile['batch']}: "
                  f"{summary['ms_per_call']:.1f} ms a call: {top}", flush=True)


if __name__ == "__main__":
    main()
