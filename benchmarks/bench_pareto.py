"""Accuracy against training cost on the embedded digits: G1-BN vs G16-LN+PN at reduced resolution.

Run with `make benchmark-pareto` (or `python -m benchmarks.bench_pareto --help`). Both methods
start from the default job's recipe (flags/default.flags: the tiny model, RMSProp, cosine decay,
label smoothing, per-epoch weight averaging) and train for the same number of epochs through the
trainer's own factories (`train`, `finetune`, `evaluate`):

- `G1-BN native` (the reference): depthwise convs and BatchNorm, trained and tested at the test
  resolution (96px);
- `G16-LN+PN reduced + fine-tune`: G16 group convs, LayerNorm + Proxy Norm, trained at the
  reduced resolution (64px), then the head block fine-tuned at the test resolution on training
  images with evaluation preprocessing (Masters et al. 2021, section 5).

After every epoch the current weights are evaluated on the held-out split at the test resolution
(for G16-LN+PN that is *before* its fine-tune), with the clock paused; the last point of each
curve is the weight average (G1-BN) or the fine-tuned head (G16-LN+PN), the fine-tune's seconds
added. One JSON row per method goes to benchmarks/results/pareto.jsonl (training images/s and its
ratio to G1-BN's, the curve, the final top-1, seconds to the target top-1 and the speed-up to it)
and pareto.png draws top-1 against cumulative training seconds, in the spirit of the paper's
Figure 1. A non-finite loss stops the run (the trainer's guard). `--smoke` trains each method for
2 updates on synthetic images, without the fine-tune (rows to a temporary folder); `--quick` for
fewer epochs (pareto_quick.jsonl).
"""

from __future__ import annotations

import argparse
import os
import shutil
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
BASELINE = "G1-BN native"
METHODS = {
    BASELINE: dict(model="efficientnet-tiny-g1-bn", mode="train", reduced=False),
    "G16-LN+PN reduced + fine-tune": dict(model="efficientnet-tiny-g16-lnpn",
                                          mode="train_and_finetune", reduced=True),
}
# Preset options of --smoke and --quick (options on the command line still win).
# The smoke run leaves the fine-tune out (bench_fashion's smoke run fine-tunes).
SMOKE = ["--dataset=synthetic", "--epochs=1", "--updates-per-epoch=2", "--eval-steps=1",
         "--finetune-epochs=0", "--train-resolution=32", "--test-resolution=32", "--batch=4",
         "--target=0.0"]
QUICK = ["--epochs=4"]


def base_config(flagfile: Path = DEFAULT_FLAGFILE) -> TrainConfig:
    """The recipe of a flagfile, read the way the training command reads it."""
    values = flags.FlagValues()
    define_flags(values)
    values(["bench_pareto", f"--flagfile={flagfile}"])
    return config_from_flags(values)


class EvaluateEachEpoch(keras.callbacks.Callback):
    """After each epoch: held-out top-1 of the current weights at the test resolution, and the
    training seconds so far (since `start()`, with the time spent evaluating taken out)."""

    def __init__(self, eval_model: keras.Model, data, steps: int):
        super().__init__()
        self.eval_model = eval_model
        self.data = data
        self.steps = steps
        self.curve: list[dict] = []
        self.started = time.perf_counter()
        self.excluded = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.excluded = 0.0

    def training_seconds(self) -> float:
        return time.perf_counter() - self.started - self.excluded

    def on_epoch_end(self, epoch, logs=None):
        paused = time.perf_counter()
        seconds = paused - self.started - self.excluded
        self.eval_model.set_weights(self.model.get_weights())
        result = trainer.evaluate(self.eval_model, self.data, self.steps)
        self.curve.append({"phase": "train", "epoch": epoch + 1, "seconds": round(seconds, 2),
                           "top1": round(result["top1"], 4),
                           "train_loss": round(float((logs or {}).get("loss", "nan")), 4)})
        print(f"  epoch {epoch + 1}: {seconds:7.1f} s trained, held-out top-1 "
              f"{result['top1']:.4f}", flush=True)
        self.excluded += time.perf_counter() - paused


def run_method(config: TrainConfig) -> dict:
    """Trains (and fine-tunes) one method; returns its curve, throughput and final top-1."""
    train_examples, eval_examples, num_classes = trainer.dataset_facts(config)
    _, test_res = trainer.resolutions(config)
    eval_steps = config.eval_steps or -(-eval_examples // config.micro_batch_size)
    with trainer.precision_policy(config.precision):
        eval_model = trainer.build_model(config, test_res, num_classes)
        trainer.compile_model(eval_model, "sgd", config, num_classes)
        eval_data = trainer.build_datasets(config, test_res, training=False,
                                           split=config.eval_split, repeat=False,
                                           num_classes=num_classes)
        clock = EvaluateEachEpoch(eval_model, eval_data, eval_steps)
        clock.start()
        trained = trainer.train(config, num_classes, train_examples, extra_callbacks=[clock])
        seconds = clock.training_seconds()
        weights = trained["model"].get_weights()
        if trained["average"] is not None and trained["average"].values is not None:
            weights = trained["average"].weights_like(trained["model"])
        curve = clock.curve
        finetune_ips = None
        if config.mode == "train_and_finetune" and config.finetune_epochs > 0:
            started = time.perf_counter()
            tuned, info = trainer.finetune(config, weights, num_classes, train_examples)
            seconds += time.perf_counter() - started
            finetune_ips = round(info["images_per_second"], 1)
            final = trainer.evaluate(tuned, eval_data, eval_steps)
            phase = f"fine-tuned ({config.finetune_epochs} epochs, head only)"
        else:
            eval_model.set_weights(weights)
            final = trainer.evaluate(eval_model, eval_data, eval_steps)
            phase = "weight average"
    curve.append({"phase": phase, "epoch": config.epochs, "seconds": round(seconds, 2),
                  "top1": round(final["top1"], 4)})
    print(f"  {phase}: {seconds:7.1f} s, held-out top-1 {final['top1']:.4f}", flush=True)
    return {"curve": curve, "images_per_second": trained["images_per_second"],
            "finetune_images_per_second": finetune_ips, "final_top1": round(final["top1"], 4),
            "train_seconds": round(seconds, 2),
            "step_calls_per_epoch": trained["step_calls_per_epoch"],
            "updates_per_epoch": trained["updates_per_epoch"]}


def seconds_to(curve: list[dict], target: float) -> float | None:
    """Training seconds at the first point of `curve` whose top-1 reaches `target`."""
    reached = [p["seconds"] for p in curve if p["top1"] >= target]
    return min(reached) if reached else None


def main(argv=None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flagfile", default=str(DEFAULT_FLAGFILE),
                        help="the recipe both methods start from")
    parser.add_argument("--dataset", default=None, help="default: the flagfile's (digits)")
    parser.add_argument("--epochs", type=int, default=12, help="training epochs, both methods")
    parser.add_argument("--finetune-epochs", type=int, default=None,
                        help="G16-LN+PN head fine-tune epochs; default: the flagfile's (3)")
    parser.add_argument("--train-resolution", type=int, default=None,
                        help="G16-LN+PN's reduced resolution; default: the flagfile's (64)")
    parser.add_argument("--test-resolution", type=int, default=None,
                        help="test resolution, G1-BN's training one; default: the flagfile's")
    parser.add_argument("--batch", type=int, default=None, help="default: the flagfile's (32)")
    parser.add_argument("--updates-per-epoch", type=int, default=0,
                        help="optimizer updates per epoch; 0 = one pass over the training split")
    parser.add_argument("--eval-steps", type=int, default=0, help="0 = the whole held-out split")
    parser.add_argument("--target", type=float, default=0.95, help="target held-out top-1")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    if args.epochs * (args.updates_per_epoch or 2) < 2:
        # The trainer's throughput leaves the first (tracing) step out.
        parser.error("images/s needs at least 2 training steps: raise --epochs or "
                     "--updates-per-epoch")

    base = base_config(Path(args.flagfile))
    changes = dict(epochs=args.epochs, updates_per_epoch=args.updates_per_epoch,
                   eval_steps=args.eval_steps, verbose=2, resume=False)
    for name, value in (("dataset", args.dataset), ("finetune_epochs", args.finetune_epochs),
                        ("train_resolution", args.train_resolution),
                        ("test_resolution", args.test_resolution),
                        ("micro_batch_size", args.batch)):
        if value is not None:
            changes[name] = value
    if args.smoke:
        # Each epoch is scored once, by the curve's own evaluation: the trainer's validation
        # of the same weights would build and trace a second scorer (its path is the
        # trainer's, tested there).
        changes["eval_every"] = 0
    base = base.replace(**changes)
    info = machine()
    print(f"machine: {info}", flush=True)
    measured = {}
    scratch = Path(tempfile.mkdtemp(prefix="bench-pareto-"))
    try:
        for label, method in METHODS.items():
            reduced = base.train_resolution if method["reduced"] else base.test_resolution
            config = base.replace(model=method["model"], mode=method["mode"],
                                  train_resolution=reduced,
                                  model_dir=str(scratch / method["model"]))
            print(f"{label}: {config.model}, train {reduced}px, test "
                  f"{config.test_resolution}px, {config.epochs} epochs", flush=True)
            measured[label] = (config, run_method(config))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    reference = measured[BASELINE][1]
    reference_seconds = seconds_to(reference["curve"], args.target)
    rows = []
    for label, (config, result) in measured.items():
        to_target = seconds_to(result["curve"], args.target)
        rows.append(make_row(
            "pareto", machine=info, backend=keras.backend.backend(), variant=label,
            resolution=config.train_resolution, batch=config.micro_batch_size,
            precision=config.precision, images_per_second=result["images_per_second"],
            reference=BASELINE, reference_images_per_second=reference["images_per_second"],
            model=config.model, dataset=config.dataset, test_resolution=config.test_resolution,
            epochs=config.epochs, finetune_epochs=(config.finetune_epochs
                                                   if config.mode == "train_and_finetune" else 0),
            step_calls_per_epoch=result["step_calls_per_epoch"],
            updates_per_epoch=result["updates_per_epoch"],
            finetune_images_per_second=result["finetune_images_per_second"],
            final_top1=result["final_top1"], train_seconds=result["train_seconds"],
            target_top1=args.target, seconds_to_target=to_target,
            speedup_to_target=(round(reference_seconds / to_target, 3)
                               if to_target and reference_seconds else None),
            curve=result["curve"]))
    print(f"\n{'method':32s} {'img/s':>7s} {'vs ref':>7s} {'top-1':>6s} {'seconds':>8s} "
          f"{'to ' + str(args.target):>8s}")
    for row in rows:
        to_target = row["seconds_to_target"]
        print(f"{row['variant']:32s} {row['images_per_second']:7.1f} "
              f"{row['ratio_to_reference']:7.3f} {row['final_top1']:6.3f} "
              f"{row['train_seconds']:8.1f} {to_target if to_target else 'not hit':>8}")
    write_results("pareto", rows, args.output_dir, args.mode)
    return rows


if __name__ == "__main__":
    main()
