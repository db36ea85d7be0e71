"""Model throughput on a GPU under KERAS_BACKEND=jax (no TensorFlow), with timm as a peer.

Run with `make benchmark-gpu` (which is `bash benchmarks/gpu/run.sh`: offline wheels, then this
script); `--smoke` runs tiny sizes on whatever device JAX has, a CPU included, to check the path.
In one run it measures, after warm-up steps (the first compiles):

- training and inference images/s of `keras.applications.EfficientNetB0` (the reference) and of
  our B0 variants G1-BN, G1-GN, G16-GN and G16-LN+PN at the native (224) and half (160)
  resolution: Keras 3 on JAX, one `jax.jit` step over `stateless_call` (the optimizer's
  `stateless_apply` inside), mixed_bfloat16 by default, images already on the device;
- timm's `efficientnet_b0` in PyTorch with autocast at the same precision and channels-last
  memory (optionally `torch.compile`), as an outside peer, when `import timm` works; otherwise
  the reason is printed and the run goes on without it.

Each framework runs in a child process of its own (JAX and PyTorch each load their own CUDA
libraries and take GPU memory), and the JAX one fails if TensorFlow was imported. Rows (the
shared schema of benchmarks/common.py, the GPU named in `machine`) go to
benchmarks/results/model_gpu.jsonl with a chart in model_gpu.png; every ratio is to
keras.applications.EfficientNetB0 at the same resolution, mode, batch and precision, and rows
also carry `ratio_to_timm` when timm ran. A non-finite loss stops the run.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    NonFiniteLossError,
    accelerator,
    check_finite,
    machine,
    make_row,
    smoke_dir,
    write_results,
)

BASELINE = "keras.applications.EfficientNetB0"  # as in bench_model (not imported: no keras)
TIMM = "timm efficientnet_b0 (PyTorch)"
PRECISIONS = ("mixed_bfloat16", "mixed_float16", "float32")
SKIPPED = 3  # a part's exit status meaning "not available here", with the reason printed
CLASSES = 1000


# ----------------------------------------------------------------------------- Keras on JAX


def _jax_steps(model, optimizer, scale_loss: bool, donate: bool):
    """(train_step(state, x, y) -> (state, loss), infer(trainable, non_trainable, x)), each one
    `jax.jit` function."""
    import jax
    import keras
    from keras import ops

    def loss_fn(trainable, non_trainable, optimizer_vars, x, y):
        logits, non_trainable = model.stateless_call(trainable, non_trainable, x,
                                                     training=True)
        loss = ops.mean(ops.sparse_categorical_crossentropy(
            y, ops.cast(logits, "float32"), from_logits=True))
        scaled = loss
        if scale_loss:  # mixed_float16: the LossScaleOptimizer's scale, read statelessly
            mapping = list(zip(optimizer.variables, optimizer_vars))
            with keras.StatelessScope(state_mapping=mapping):
                scaled = optimizer.scale_loss(loss)
        return scaled, (loss, non_trainable)

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def train_step(state, x, y):
        trainable, non_trainable, optimizer_vars = state
        (_, (loss, non_trainable)), grads = grad_fn(trainable, non_trainable, optimizer_vars,
                                                    x, y)
        trainable, optimizer_vars = optimizer.stateless_apply(optimizer_vars, grads, trainable)
        return (trainable, non_trainable, optimizer_vars), loss

    def infer(trainable, non_trainable, x):
        logits, _ = model.stateless_call(trainable, non_trainable, x, training=False)
        return ops.sum(ops.cast(logits, "float32"))

    return jax.jit(train_step, donate_argnums=(0,) if donate else ()), jax.jit(infer)


def _time_steps(run, sync, warmup: int, steps: int) -> tuple[float, float, list]:
    """(seconds for `steps` calls of `run`, seconds of the first warm-up call, outputs)."""
    started = time.perf_counter()
    first = sync(run())
    compile_seconds = time.perf_counter() - started
    outputs = [first]
    for _ in range(warmup - 1):
        outputs.append(sync(run()))
    started = time.perf_counter()
    for _ in range(steps):
        outputs.append(run())
    sync(outputs[-1])  # one sync at the end: the device runs the steps back to back
    return time.perf_counter() - started, compile_seconds, outputs


def _measure_keras(model, dtype: str, images, labels, args, label: str, donate: bool) -> dict:
    """{"train"|"inference": measurement} of one Keras model under JAX."""
    import jax
    import keras

    x = jax.device_put(images.astype(dtype))
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    scale_loss = args.precision == "mixed_float16"
    if scale_loss:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    optimizer.build(model.trainable_variables)
    train_step, infer = _jax_steps(model, optimizer, scale_loss, donate)
    holder = {"state": ([v.value for v in model.trainable_variables],
                        [v.value for v in model.non_trainable_variables],
                        [v.value for v in optimizer.variables])}

    def run_train():
        holder["state"], loss = train_step(holder["state"], x, labels)
        return loss

    where = f"{label} at {x.shape[1]}px (JAX"
    # Inference first, on the initial weights, as for timm (see _measure_timm).
    trainable, non_trainable, _ = holder["state"]
    inference = _time_steps(lambda: infer(trainable, non_trainable, x), jax.block_until_ready,
                            args.warmup, args.infer_steps)
    for value in inference[2]:
        check_finite(value, f"{where} inference output)")
    train = _time_steps(run_train, jax.block_until_ready, args.warmup, args.steps)
    for loss in train[2]:
        check_finite(loss, f"{where} training)")
    return {"train": train[:2], "inference": inference[:2]}


def keras_part(args, emit) -> None:
    """Our variants and the Keras reference under JAX, one `emit(dict)` per measurement."""
    os.environ["KERAS_BACKEND"] = "jax"
    import jax
    import keras
    import numpy as np

    if keras.backend.backend() != "jax":
        raise SystemExit(f"KERAS_BACKEND is {keras.backend.backend()!r}; this part needs jax")
    device = jax.devices()[0]
    if device.platform != "gpu" and not args.smoke:
        raise SystemExit(f"JAX sees no GPU (first device: {device.platform} "
                         f"{device.device_kind}); run with --smoke to check the path on a CPU")
    from benchmarks.bench_model import model_configs

    keras.config.set_dtype_policy(args.precision)
    info = {"keras": keras.__version__, "jax": jax.__version__,
            "jax_device": f"{device.platform}:{device.device_kind}"}
    rng = np.random.default_rng(0)
    donate = device.platform == "gpu"  # CPU buffers cannot be donated (JAX warns)
    for resolution in args.resolution_list:
        images = rng.integers(0, 256, (args.batch, resolution, resolution, 3))
        labels = jax.device_put(rng.integers(0, CLASSES, args.batch).astype("int32"))
        for label, build, dtype in model_configs(args.size, args.variant_list):
            keras.utils.clear_session()
            keras.utils.set_random_seed(0)
            measured = _measure_keras(build(resolution), dtype, images, labels, args, label,
                                      donate)
            for mode, (seconds, compile_seconds) in measured.items():
                steps = args.steps if mode == "train" else args.infer_steps
                emit({"benchmark": mode, "backend": "jax", "variant": label,
                      "resolution": resolution, "images_per_second": args.batch * steps / seconds,
                      "seconds_per_step": seconds / steps, "compile_seconds": compile_seconds,
                      "steps": steps, "input_dtype": dtype, **info})
    if "tensorflow" in sys.modules:
        raise SystemExit("TensorFlow was imported on the JAX path (sys.modules has it): the "
                         "GPU benchmark must run where TensorFlow is absent")


# ----------------------------------------------------------------------------- timm on torch


def _measure_timm(torch, timm, resolution: int, device: str, amp, args) -> dict:
    """{"train"|"inference": measurement} of timm's efficientnet_b0 at one resolution."""
    torch.manual_seed(0)
    model = timm.create_model("efficientnet_b0", pretrained=False, num_classes=CLASSES)
    model = model.to(device).to(memory_format=torch.channels_last)
    if args.torch_compile:
        model = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = torch.amp.GradScaler(device, enabled=amp is torch.float16)
    x = torch.randn(args.batch, 3, resolution, resolution, device=device)
    x = x.contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, CLASSES, (args.batch,), device=device)

    def autocast():
        return torch.autocast(device, dtype=amp or torch.float32, enabled=amp is not None)

    def train_step():
        with autocast():
            loss = torch.nn.functional.cross_entropy(model(x), y)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        return loss.detach()

    def infer():
        with torch.inference_mode(), autocast():
            return model(x).float().sum()

    def sync(value):
        if device == "cuda":
            torch.cuda.synchronize()
        return value

    where = f"{TIMM} at {resolution}px"
    # Inference first, on the initial weights: PyTorch's BatchNorm moves its running statistics
    # by 0.1 a step (Keras' by 0.01), and after a few training steps on a small batch and feature
    # map the eval-mode activations of an untrained network can overflow (seen with bfloat16 at
    # 32 px, batch 2: inf by block 3), which would stop the run for a reason unrelated to speed.
    model.eval()
    inference = _time_steps(infer, sync, args.warmup, args.infer_steps)
    for value in inference[2]:
        check_finite(value.item(), f"{where} (inference output)")
    model.train()
    train = _time_steps(train_step, sync, args.warmup, args.steps)
    for loss in train[2]:
        check_finite(loss.item(), f"{where} (training)")
    return {"train": train[:2], "inference": inference[:2]}


def timm_part(args, emit) -> None:
    """timm's efficientnet_b0 with autocast and channels-last memory."""
    try:
        import timm
        import torch
    except Exception as error:
        print(f"timm peer skipped: `import timm` failed ({type(error).__name__}: {error})")
        raise SystemExit(SKIPPED) from None
    if torch.cuda.is_available():
        device = "cuda"
    elif args.smoke:
        device = "cpu"
    else:
        print("timm peer skipped: PyTorch sees no CUDA device")
        raise SystemExit(SKIPPED)
    torch.backends.cudnn.benchmark = True
    amp = {"mixed_bfloat16": torch.bfloat16, "mixed_float16": torch.float16}.get(args.precision)
    info = {"torch": torch.__version__, "timm": timm.__version__,
            "torch_device": (torch.cuda.get_device_name(0) if device == "cuda" else "cpu"),
            "torch_compile": bool(args.torch_compile)}
    for resolution in args.resolution_list:
        measured = _measure_timm(torch, timm, resolution, device, amp, args)
        for mode, (seconds, compile_seconds) in measured.items():
            steps = args.steps if mode == "train" else args.infer_steps
            emit({"benchmark": mode, "backend": "torch", "variant": TIMM,
                  "resolution": resolution, "images_per_second": args.batch * steps / seconds,
                  "seconds_per_step": seconds / steps, "compile_seconds": compile_seconds,
                  "steps": steps, "input_dtype": "float32", **info})


# ----------------------------------------------------------------------------- the run


def _run_part(name: str, argv: list[str], scratch: Path) -> tuple[int, list[dict]]:
    """Runs one part in a child process; returns its exit status and measurements."""
    out = scratch / f"{name}.jsonl"
    env = {**os.environ, "KERAS_BACKEND": "jax", "TF_CPP_MIN_LOG_LEVEL": "2"}
    command = [sys.executable, "-m", "benchmarks.bench_gpu", *argv, "--part", name,
               "--part-output", str(out)]
    print(f"--- {name}: {' '.join(command[1:])}", flush=True)
    status = subprocess.call(command, env=env)
    measured = []
    if out.exists():
        measured = [json.loads(line) for line in out.read_text().splitlines() if line.strip()]
    return status, measured


def rows_from(measured: list[dict], args, info: dict) -> list[dict]:
    """Rows with ratios to the Keras reference (and to timm) at the same mode and resolution."""
    by_key = {(m["benchmark"], m["resolution"], m["variant"]): m for m in measured}
    rows = []
    for m in measured:
        key = (m["benchmark"], m["resolution"])
        reference = by_key.get((*key, BASELINE))
        if reference is None:
            raise SystemExit(f"no {BASELINE} measurement for {key}: nothing to compare with")
        timm_row = by_key.get((*key, TIMM))
        extra = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in m.items()
                 if k not in ("benchmark", "backend", "variant", "resolution",
                              "images_per_second")}
        if timm_row is not None:
            extra["ratio_to_timm"] = round(m["images_per_second"]
                                           / timm_row["images_per_second"], 4)
        rows.append(make_row(
            m["benchmark"], machine=info, backend=m["backend"], variant=m["variant"],
            resolution=m["resolution"], batch=args.batch, precision=args.precision,
            images_per_second=m["images_per_second"], reference=BASELINE,
            reference_images_per_second=reference["images_per_second"], model_size=args.size,
            warmup_steps=args.warmup, smoke=bool(args.smoke), **extra))
    return rows


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--precision", choices=PRECISIONS, default="mixed_bfloat16")
    parser.add_argument("--batch", type=int, default=None, help="default 256 (smoke: 2)")
    parser.add_argument("--resolutions", default=None,
                        help="comma-separated; default 224,160 (smoke: 32)")
    parser.add_argument("--variants", default=None,
                        help="comma-separated subset of G1-BN,G1-GN,G16-GN,G16-LN+PN")
    parser.add_argument("--warmup", type=int, default=None,
                        help="untimed steps, the first compiles; default 3 (smoke: 1)")
    parser.add_argument("--steps", type=int, default=None,
                        help="timed training steps; default 20 (smoke: 1)")
    parser.add_argument("--infer-steps", type=int, default=None,
                        help="timed inference steps; default 20 (smoke: 1)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny model, tiny sizes, any device: checks the path, measures "
                             "nothing worth keeping (written to --output-dir or a temporary "
                             "folder, never benchmarks/results)")
    parser.add_argument("--no-timm", action="store_true", help="leave the PyTorch peer out")
    parser.add_argument("--torch-compile", action="store_true",
                        help="torch.compile the timm model (off by default: eager is what "
                             "timm's own benchmark script measures by default)")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results "
                             "(smoke: a temporary folder)")
    parser.add_argument("--part", choices=("keras", "timm"), default=None,
                        help=argparse.SUPPRESS)
    parser.add_argument("--part-output", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    defaults = (dict(batch=2, resolutions="32", warmup=1, steps=1, infer_steps=1)
                if args.smoke else
                dict(batch=256, resolutions="224,160", warmup=3, steps=20, infer_steps=20))
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    args.size = "tiny" if args.smoke else "b0"
    args.resolution_list = [int(r) for r in args.resolutions.split(",")]
    args.variant_list = args.variants.split(",") if args.variants else None
    if args.warmup < 1:
        parser.error("--warmup must be >= 1: the first step compiles")
    return args


def main(argv=None) -> list[dict]:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parse_args(argv)
    if args.part:
        out = open(args.part_output, "a")

        def emit(measurement):
            out.write(json.dumps(measurement) + "\n")
            out.flush()  # what was measured survives a later failure
            print(f"{measurement['benchmark']:9s} {measurement['resolution']:4d}px "
                  f"{measurement['variant']:34s} {measurement['images_per_second']:10.1f} "
                  f"img/s (first call {measurement['compile_seconds']:.1f} s)", flush=True)

        try:
            (keras_part if args.part == "keras" else timm_part)(args, emit)
        except NonFiniteLossError as error:
            raise SystemExit(f"FAILED: {error}") from error
        finally:
            out.close()
        return []

    started = time.perf_counter()
    measured, notes = [], []
    with tempfile.TemporaryDirectory(prefix="bench-gpu-") as scratch:
        status, keras_measured = _run_part("keras", argv, Path(scratch))
        if status != 0:
            raise SystemExit(f"the Keras/JAX part failed (exit status {status}); see above")
        measured += keras_measured
        if args.no_timm:
            notes.append("timm peer left out (--no-timm)")
        else:
            status, timm_measured = _run_part("timm", argv, Path(scratch))
            if status == SKIPPED:
                notes.append("timm peer skipped (reason printed above)")
            elif status != 0:
                raise SystemExit(f"the timm part failed (exit status {status}); see above")
            measured += timm_measured
    versions = {}
    for m in measured:
        for key in ("keras", "jax", "jax_device", "torch", "timm", "torch_device"):
            if key in m:
                versions[key] = m.pop(key)
    gpu = accelerator()  # nvidia-smi's name, driver and memory; else JAX's device kind
    if not gpu and versions.get("jax_device", "").startswith("gpu:"):
        gpu = {"gpu": versions["jax_device"].split(":", 1)[1]}
    info = machine(**gpu, **versions)
    rows = rows_from(measured, args, info)
    # A smoke run's rows go to a temporary folder (or the one given), never benchmarks/results.
    output_dir = smoke_dir(args.output_dir) if args.smoke else args.output_dir
    write_results("model_gpu_smoke" if args.smoke else "model_gpu", rows, output_dir)
    print(f"\n{'benchmark':9s} {'res':>4s} {'variant':34s} {'img/s':>10s} {'vs ref':>7s} "
          f"{'vs timm':>7s}")
    for row in rows:
        timm_ratio = row.get("ratio_to_timm")
        print(f"{row['benchmark']:9s} {row['resolution']:4d} {row['variant']:34s} "
              f"{row['images_per_second']:10.1f} {row['ratio_to_reference']:7.3f} "
              + (f"{timm_ratio:7.3f}" if timm_ratio is not None else f"{'-':>7}"))
    for note in notes:
        print(note)
    print(f"benchmark-gpu took {time.perf_counter() - started:.0f} s on "
          f"{info.get('gpu', 'no GPU (smoke run)')}")
    return rows


if __name__ == "__main__":
    main()
