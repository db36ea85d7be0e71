"""Does restoring the averaged optimizer slots change the fine-tune? A measurement on the digits.

Trains the default job's model once (flags/default.flags: the tiny G16 LayerNorm + Proxy Norm
model at 64 px, RMSProp, the per-epoch weight average, which now carries the optimizer's slots),
then fine-tunes its head at 96 px from the averaged weights several times, each seed twice: with
the averaged slots restored (what the trainer does, as Graphcore's restore of the averaged
checkpoint does) and with a fresh optimizer (mean square 1, momentum 0). Prints the held-out
top-1 of each fine-tune, the means, and the paired difference beside the noise (the spread over
seeds and the binomial standard error of one evaluation). Takes about 10 minutes on 2 cores:

    python scripts/finetune_slots.py [--seeds 5] [--epochs 25]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def base_config(flagfile: Path, **changes):
    from absl import flags

    from keras_efficientnet.cli.flags import config_from_flags, define_flags

    values = flags.FlagValues()
    define_flags(values)
    values(["finetune_slots", f"--flagfile={flagfile}"])
    return config_from_flags(values).replace(**changes)


def measure(config, seeds: int) -> dict:
    from keras_efficientnet.training import trainer

    train_examples, eval_examples, num_classes = trainer.dataset_facts(config)
    _, test_res = trainer.resolutions(config)
    eval_steps = -(-eval_examples // config.micro_batch_size)
    eval_data = trainer.build_datasets(config, test_res, training=False, split=config.eval_split,
                                       repeat=False, num_classes=num_classes)
    trained = trainer.train(config, num_classes, train_examples)
    weights = trained["average"].weights_like(trained["model"])
    slots = trained["average"].slots(trained["model"])
    model = trainer.build_model(config, test_res, num_classes)
    model.set_weights(weights)
    trainer.compile_model(model, "sgd", config, num_classes)
    before = trainer.evaluate(model, eval_data, eval_steps)["top1"]
    print(f"weight average before the fine-tune: top-1 {before:.4f}", flush=True)
    top1 = {"restored": [], "fresh": []}
    for seed in range(seeds):
        for arm, given in (("restored", slots), ("fresh", None)):
            tuned, _ = trainer.finetune(config.replace(seed=seed), weights, num_classes,
                                        train_examples, optimizer_slots=given)
            top1[arm].append(trainer.evaluate(tuned, eval_data, eval_steps)["top1"])
            print(f"seed {seed} {arm:8s}: top-1 {top1[arm][-1]:.4f}", flush=True)
    return {"before": before, "top1": top1, "eval_examples": eval_examples}


def report(result: dict) -> None:
    top1 = result["top1"]
    diffs = [a - b for a, b in zip(top1["restored"], top1["fresh"])]
    for arm, values in top1.items():
        print(f"{arm:8s}: mean top-1 {statistics.mean(values):.4f}, spread over seeds (std) "
              f"{statistics.stdev(values) if len(values) > 1 else 0.0:.4f}")
    p = statistics.mean(top1["fresh"])
    se = math.sqrt(p * (1 - p) / result["eval_examples"])
    mean = statistics.mean(diffs)
    spread = statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else float("nan")
    print(f"restored - fresh: {mean:+.4f} (paired, standard error {spread:.4f}); one "
          f"evaluation's binomial standard error {se:.4f} ({result['eval_examples']} images)")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--flagfile", default=str(REPO / "flags" / "default.flags"))
    parser.add_argument("--seeds", type=int, default=5, help="fine-tune seeds, each arm")
    parser.add_argument("--epochs", type=int, default=None, help="default: the flagfile's")
    args = parser.parse_args(argv)
    if args.seeds < 1:
        parser.error(f"--seeds must be >= 1, received {args.seeds}")
    changes = dict(verbose=0, resume=False)
    if args.epochs is not None:
        changes["epochs"] = args.epochs
    with tempfile.TemporaryDirectory(prefix="finetune-slots-") as scratch:
        config = base_config(Path(args.flagfile), model_dir=scratch, **changes)
        print(f"{config.model} on {config.dataset}: {config.epochs} epochs at "
              f"{config.train_resolution}px, weight average {config.weight_average_decay}, "
              f"fine-tune {config.finetune_epochs} epochs at {config.test_resolution}px",
              flush=True)
        report(measure(config, args.seeds))


if __name__ == "__main__":
    main()
