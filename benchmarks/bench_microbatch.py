"""Held-out top-1 against the micro-batch size for BatchNorm, GroupNorm, LayerNorm and LN+PN.

Run with `make benchmark-microbatch` (or `python -m benchmarks.bench_microbatch --help`). The
paper's central claim (Masters et al. 2021; Labatie et al. 2021): BatchNorm degrades when each
replica normalizes small micro-batches, while LayerNorm + Proxy Norm, which uses no batch
statistics, does not, and beats LayerNorm and GroupNorm. Here the same tiny G16 EfficientNet is
trained on the embedded digits with each norm at micro-batches 2, 8 and 32, through the
trainer's own factories and the default job's recipe (flags/default.flags: RMSProp, cosine,
label smoothing, scale-augmenting crops):

- the optimizer batch stays at `--global-batch` (32): smaller micro-batches accumulate their
  gradients to it, as an IPU replica does, so every run sees the same images in the same number
  of updates at the same learning rate (`learning_rate_per_sample` x the global batch), and only
  the statistics BatchNorm sees change;
- after `--epochs` epochs the final weights are evaluated on the held-out split, for each of
  `--seeds` seeds. BatchNorm is evaluated with its statistics re-estimated as the average over
  `--bn-batches` training micro-batches of the size it trained at (its moving averages, momentum
  0.99, still remember their initial values after so few updates; their top-1 is kept too).

One JSON row per (norm, micro-batch) goes to benchmarks/results/microbatch.jsonl: the mean and
the per-seed held-out top-1, and training images/s (its ratio is to BatchNorm at the largest
micro-batch, measured in the same run; on a shared machine it is noisy, the accuracies are not).
microbatch.png draws top-1 against the micro-batch size, one line per norm. `--smoke` trains BN
for a few updates on synthetic images (rows to a temporary folder); `--quick` one seed
for fewer epochs (microbatch_quick.jsonl).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
from absl import flags

from benchmarks.common import add_mode_arguments, machine, make_row, parse_args, write_results
from keras_efficientnet.cli.flags import config_from_flags, define_flags
from keras_efficientnet.training import TrainConfig, trainer

REPO = Path(__file__).resolve().parents[1]
DEFAULT_FLAGFILE = REPO / "flags" / "default.flags"
# Label -> the tiny model's preset family: one G16 architecture, four normalizations.
NORMS = {"BN": "g16-bn", "GN": "g16-gn", "LN": "g16-ln", "LN+PN": "g16-lnpn"}
# Images/s ratios are to BatchNorm at the largest micro-batch, the usual setting.
REFERENCE_NORM = "BN"
# Preset options of --smoke and --quick (options on the command line still win).
# The smoke run trains BatchNorm (the reference, re-estimated) at micro-batch 2 accumulated to 4,
# 2 updates a host call: 2 host calls, as images/s leaves the first (tracing) one out.
SMOKE = ["--dataset=synthetic", "--norms", "BN", "--micro-batches", "2", "--global-batch=4",
         "--epochs=1", "--updates-per-epoch=4", "--seeds", "0", "--device-iterations=2",
         "--eval-steps=2", "--bn-batches=2"]
QUICK = ["--seeds", "0", "--epochs=3"]


def base_config(flagfile: Path = DEFAULT_FLAGFILE) -> TrainConfig:
    """The recipe of a flagfile, read the way the training command reads it."""
    values = flags.FlagValues()
    define_flags(values)
    values(["bench_microbatch", f"--flagfile={flagfile}"])
    return config_from_flags(values)


def run_config(base: TrainConfig, norm: str, micro_batch: int, global_batch: int,
               seed: int, model_dir: Path) -> TrainConfig:
    """One run: `norm`'s preset at `micro_batch`, accumulated to `global_batch`."""
    if global_batch % micro_batch:
        raise ValueError(f"--global-batch={global_batch} must be a multiple of the micro-batch "
                         f"{micro_batch}")
    return base.replace(model=f"efficientnet-tiny-{NORMS[norm]}", mode="train",
                        micro_batch_size=micro_batch,
                        gradient_accumulation=global_batch // micro_batch, seed=seed,
                        model_dir=str(model_dir), resume=False)


def batch_norm_layers(model: keras.Model) -> list:
    return [layer for layer in model._flatten_layers(include_self=False)
            if isinstance(layer, keras.layers.BatchNormalization)]


def reestimate_batch_norm(model: keras.Model, data, batches: int) -> None:
    """Replaces BatchNorm's moving averages by the plain average of the statistics of `batches`
    training micro-batches ("precise BN"): at this short schedule the moving averages (momentum
    0.99) still carry their initial values, which would hide the effect of the micro-batch.

    The k-th batch enters with momentum (k - 1) / k, so the result is the average of exactly the
    statistics BatchNorm normalized with in training, micro-batch by micro-batch.
    """
    layers = batch_norm_layers(model)
    saved = [layer.momentum for layer in layers]
    for k, (images, _) in enumerate(data.take(batches), start=1):
        for layer in layers:
            layer.momentum = (k - 1) / k
        model(images, training=True)
    for layer, momentum in zip(layers, saved):
        layer.momentum = momentum


def train_and_score(config: TrainConfig, bn_batches: int) -> dict:
    """Trains `config` and returns held-out top-1 of its final weights and training images/s
    (BatchNorm: with re-estimated statistics, and with its moving averages as trained)."""
    train_examples, eval_examples, num_classes = trainer.dataset_facts(config)
    started = time.perf_counter()
    trained = trainer.train(config, num_classes, train_examples)
    seconds = time.perf_counter() - started
    model = trained["model"]
    trainer.compile_model(model, "sgd", config, num_classes)
    data = trainer.build_datasets(config, config.test_resolution, training=False,
                                  split=config.eval_split, repeat=False, num_classes=num_classes)
    steps = config.eval_steps or -(-eval_examples // config.micro_batch_size)
    result = {"images_per_second": trained["images_per_second"], "seconds": seconds,
              "step_calls_per_epoch": trained["step_calls_per_epoch"],
              "updates_per_epoch": trained["updates_per_epoch"]}
    return {**result, **top1_fields(score(model, config, data, steps, num_classes, bn_batches)[0])}


def score(model: keras.Model, config: TrainConfig, data, steps: int, num_classes: int,
          bn_batches: int) -> tuple[dict, float]:
    """`trainer.evaluate`'s metrics of `model` on `data`. A BatchNorm model is scored first with
    its moving averages (`top1_moving_averages`), then with its statistics re-estimated on
    `bn_batches` training micro-batches of `config`; also returns the re-estimation's seconds."""
    if not batch_norm_layers(model):
        return trainer.evaluate(model, data, steps), 0.0
    moving = trainer.evaluate(model, data, steps)["top1"]
    started = time.perf_counter()
    train_data = trainer.build_datasets(config, config.train_resolution, training=True,
                                        split=config.train_split, repeat=True,
                                        num_classes=num_classes)
    reestimate_batch_norm(model, train_data, bn_batches)
    seconds = time.perf_counter() - started
    return {**trainer.evaluate(model, data, steps), "top1_moving_averages": moving}, seconds


def top1_fields(metrics: dict) -> dict:
    """The row's accuracy fields, in row order: moving-average top-1 (BatchNorm) then top-1."""
    return {key: metrics[key] for key in ("top1_moving_averages", "top1") if key in metrics}


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flagfile", default=str(DEFAULT_FLAGFILE), help="the shared recipe")
    parser.add_argument("--dataset", default=None, help="default: the flagfile's (digits)")
    parser.add_argument("--norms", nargs="+", default=list(NORMS), choices=list(NORMS))
    parser.add_argument("--micro-batches", nargs="+", type=int, default=[2, 8, 32])
    parser.add_argument("--global-batch", type=int, default=32,
                        help="examples per update, every micro-batch accumulated to it")
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--warmup-epochs", type=float, default=1.0)
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1])
    parser.add_argument("--resolution", type=int, default=32, help="train and test size")
    parser.add_argument("--updates-per-epoch", type=int, default=0,
                        help="optimizer updates per epoch; 0 = one pass over the training split")
    parser.add_argument("--device-iterations", type=int, default=1,
                        help="updates per host call (each holds all its micro-batch steps)")
    parser.add_argument("--eval-steps", type=int, default=0,
                        help="held-out batches (of the micro-batch size); 0 = the whole split")
    parser.add_argument("--bn-batches", type=int, default=128,
                        help="training micro-batches BatchNorm's statistics are re-estimated on")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    if REFERENCE_NORM not in args.norms:
        parser.error(f"--norms must include the reference {REFERENCE_NORM} (its images/s at the "
                     "largest micro-batch is the ratios' denominator)")
    reference = (REFERENCE_NORM, max(args.micro_batches))

    base = base_config(Path(args.flagfile))
    if args.dataset:
        base = base.replace(dataset=args.dataset)
    # The per-example rate of the recipe, times the global batch every run shares.
    per_sample = base.peak_learning_rate() / base.global_batch_size
    base = base.replace(epochs=args.epochs, warmup_epochs=args.warmup_epochs,
                        updates_per_epoch=args.updates_per_epoch, verbose=0,
                        train_resolution=args.resolution, test_resolution=args.resolution,
                        learning_rate=0.0, learning_rate_per_sample=per_sample,
                        weight_average_decay=0.0, eval_steps=args.eval_steps,
                        device_iterations=args.device_iterations)
    if args.smoke:
        # Scored once, by score() below: the trainer's validation would build and trace a
        # second scorer (its path is the trainer's, tested there).
        base = base.replace(eval_every=0)
    info = machine()
    print(f"machine: {info}", flush=True)
    started = time.perf_counter()
    measured: dict[tuple[str, int], list[dict]] = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-microbatch-"))
    try:
        for seed in args.seeds:
            for norm in args.norms:
                for micro in args.micro_batches:
                    config = run_config(base, norm, micro, args.global_batch, seed,
                                        scratch / f"{norm}-{micro}-{seed}")
                    result = train_and_score(config, args.bn_batches)
                    measured.setdefault((norm, micro), []).append({"seed": seed, **result})
                    moving = result.get("top1_moving_averages")
                    print(f"  seed {seed} {norm:6s} micro-batch {micro:3d} (x "
                          f"{config.gradient_accumulation}): top-1 {result['top1']:.4f}"
                          + (f" ({moving:.4f} with the moving averages)"
                             if moving is not None else "")
                          + f", {result['seconds']:5.1f} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    total = time.perf_counter() - started

    reference_ips = statistics.mean(r["images_per_second"] for r in measured[reference])
    rows = []
    for (norm, micro), runs in measured.items():
        top1 = [r["top1"] for r in runs]
        rows.append(make_row(
            "microbatch", machine=info, backend=keras.backend.backend(), variant=norm,
            resolution=args.resolution, batch=micro, precision=base.precision,
            images_per_second=statistics.mean(r["images_per_second"] for r in runs),
            reference=f"{reference[0]} micro-batch {reference[1]}",
            reference_images_per_second=reference_ips, model=f"efficientnet-tiny-{NORMS[norm]}",
            dataset=base.dataset, micro_batch=micro, global_batch=args.global_batch,
            gradient_accumulation=args.global_batch // micro, epochs=args.epochs,
            step_calls_per_epoch=runs[0]["step_calls_per_epoch"],
            updates_per_epoch=runs[0]["updates_per_epoch"], seeds=[r["seed"] for r in runs],
            top1_per_seed=[round(t, 4) for t in top1], top1=round(statistics.mean(top1), 4),
            top1_spread=round(max(top1) - min(top1), 4),
            **({"top1_moving_averages": round(statistics.mean(
                r["top1_moving_averages"] for r in runs), 4),
                "bn_statistics": f"re-estimated on {args.bn_batches} training micro-batches"}
               if "top1_moving_averages" in runs[0] else {}),
            learning_rate=per_sample * args.global_batch, benchmark_seconds=round(total, 1)))
    print(f"\n{'norm':6s} " + " ".join(f"{'mb ' + str(m):>8s}" for m in args.micro_batches))
    for norm in args.norms:
        cells = [next(r["top1"] for r in rows if r["variant"] == norm and r["batch"] == m)
                 for m in args.micro_batches]
        print(f"{norm:6s} " + " ".join(f"{c:8.4f}" for c in cells))
    print(f"{total:.0f} s in all", flush=True)
    write_results("microbatch", rows, args.output_dir, args.mode)
    return rows


if __name__ == "__main__":
    main()
