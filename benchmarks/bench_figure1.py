"""The paper's Figure 1 for this machine: hours of training here against the paper's top-1.

Run with `make benchmark-figure1` (`python -m benchmarks.bench_figure1 --help`). For each
ImageNet recipe of flags/ (B0-B3: G1-GN native, G16-GN native and half, G16-LN+PN native and
half), this measures on this machine the training step of the recipe itself (its model at its
training resolution and micro-batch, its optimizer, weight decay and label smoothing, uint8
images in) and the head-only fine-tune step at the test resolution, in images/s after warm-up.
Multiplied by the recipe's schedule (epochs x 1,281,167 ImageNet training images, plus the
fine-tune's epochs) that gives the hours one training run would take here. The top-1 beside it is
**the paper's**, read off its Figure 1 (`models.presets.PAPER_TOP1`), never ours: nothing here
trains on ImageNet. The chart answers a user's question: on my hardware, which recipe buys the
most accuracy per hour?

Rows go to benchmarks/results/figure1_<backend>.jsonl (one per recipe; the reference of each
variant's rows is its G1-GN native recipe, measured in the same run), each with its steps'
spread over `--rounds` rounds, interleaved among the variant's recipes. The file is rewritten
(atomically) after each variant, and a variant whose every recipe already has its row there is
not measured again, so a stopped run resumes at the variant it was measuring: `--variants b1 b2
b3` adds to the B0 rows. `--smoke` measures the tiny test model at tiny sizes in seconds, rows
to a temporary folder (the test suite's check); `--quick` fewer steps, marked, in
figure1_<backend>_quick.jsonl.

Cost on the quiet 2-core AMD EPYC, 2 rounds of 2 timed steps after 1 warm-up (the committed
rows): about B0 7 minutes, B1 10, B2 10, B3 14, each recipe in a process of its own (see
`measure`); `--report-only` prints the table and redraws the chart from the rows, measuring
nothing.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import multiprocessing
import os
import shutil
import tempfile
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras
import numpy as np

from benchmarks.charts import read_rows
from benchmarks.common import (
    check_finite,
    machine,
    make_row,
    results_dir,
    smoke_dir,
    write_rows,
)
from benchmarks.timing import median_seconds

REPO = Path(__file__).resolve().parents[1]
FLAGS_DIR = REPO / "flags"
IMAGENET_TRAIN_IMAGES = 1_281_167
VARIANTS = ("b0", "b1", "b2", "b3")
# (family, recipe) -> label; the paper's series (its G1-GN baseline has no fine-tune and is
# the same training as G1-GN native, so it is left out).
SERIES = {("g1-gn", "native"): "G1-GN native", ("g16-gn", "native"): "G16-GN native",
          ("g16-gn", "half"): "G16-GN half", ("g16-lnpn", "native"): "G16-LN+PN native",
          ("g16-lnpn", "half"): "G16-LN+PN half"}
REFERENCE = ("g1-gn", "native")
# The smoke pass measures the reference alone: its training step and its head fine-tune step
# are both code paths (a reduced-resolution recipe differs only in the resolution it is given).
SMOKE_SERIES = (REFERENCE,)


def recipe(variant: str, family: str, series: str):
    """The TrainConfig of flags/<variant>-<family>-<series>.flags, read as the command does."""
    from benchmarks.bench_pareto import base_config

    return base_config(FLAGS_DIR / f"{variant}-{family}-{series}.flags")


def _update(model, config, resolution: int, batch: int, where: str):
    """One `train_on_batch` of the compiled `model` on `batch` uint8 images at `resolution`
    (labels one-hot where the recipe's loss wants them), as a function of no arguments."""
    from keras_efficientnet.training import trainer

    images = np.random.default_rng(0).integers(0, 256, (batch, resolution, resolution, 3),
                                               dtype=np.uint8)
    labels = np.arange(batch) % 1000
    if trainer.use_one_hot(config):
        labels = keras.utils.to_categorical(labels, 1000).astype("float32")

    def step():
        check_finite(_loss(model.train_on_batch(images, labels)), where)
    return step


def training_step(config, resolution: int, batch: int):
    """One optimizer update of the recipe (its optimizer, weight decay, loss) on `batch` uint8
    images at `resolution`."""
    from keras_efficientnet.training import trainer

    model = trainer.build_model(config, resolution, 1000)
    schedule = trainer.lr_schedule(config, 1000, config.epochs, config.peak_learning_rate())
    trainer.compile_model(model, trainer.build_optimizer(config, schedule), config, 1000)
    return _update(model, config, resolution, batch, "figure 1 training")


def finetune_step(config, resolution: int, batch: int):
    """One update of the head-only fine-tune (only finetune.HEAD_LAYERS train) at the test
    resolution, the rest of the network still run forward."""
    from keras_efficientnet.training import trainer
    from keras_efficientnet.training.finetune import HEAD_LAYERS

    model = trainer.build_model(config, resolution, 1000)
    for layer in model.layers:
        layer.trainable = layer.name in HEAD_LAYERS
    trainer.compile_model(model, "sgd", config, 1000)
    return _update(model, config, resolution, batch, "figure 1 fine-tune")


def _loss(result) -> float:
    return result[0] if isinstance(result, list | tuple) else result


def measure(variant: str, family: str, series: str, args) -> dict:
    """Training and fine-tune images/s of one recipe on this machine, measured in a process of
    its own (a full run, not --smoke): memory a measured model leaves behind in TensorFlow does
    not add up across recipes (one process measuring B0-B2 and then B3 G1-GN at 300 px grew
    past 24 GiB and was killed; one measuring B3 alone stayed near 13 GiB)."""
    if args.smoke:
        return measure_here(variant, family, series, args)
    return in_own_process(f"{variant} {SERIES[(family, series)]}", measure_here, variant,
                          family, series, args)


def in_own_process(what: str, function, *arguments):
    """`function(*arguments)` in a fresh (spawned) process; one line naming `what` if that
    process dies."""
    context = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=context) as pool:
        try:
            return pool.submit(function, *arguments).result()
        except concurrent.futures.process.BrokenProcessPool:
            raise SystemExit(
                f"bench_figure1: the process measuring {what} died (killed for memory?); the "
                "variants already written are kept, run the same command to resume") from None


def measure_here(variant: str, family: str, series: str, args) -> dict:
    """What `measure` returns, measured in this process."""
    config = recipe(variant, family, series)
    if args.smoke:  # the tiny test model at tiny sizes: the path, not the figures
        config = config.replace(model=f"efficientnet-tiny-{family}")
        train_res = 32 if series == "half" else 64
        test_res, batch = 64, 4
    else:
        from keras_efficientnet.training.builders import resolutions

        (train_res, test_res), batch = resolutions(config), config.micro_batch_size
    keras.backend.clear_session()
    train = median_seconds(training_step(config, train_res, batch), warmup=args.warmup,
                           repeats=args.steps)
    tune = None
    if config.mode == "train_and_finetune":
        keras.backend.clear_session()
        tune = median_seconds(finetune_step(config, test_res, batch), warmup=args.warmup,
                              repeats=args.steps)
    return {"config": config, "train_resolution": train_res, "test_resolution": test_res,
            "batch": batch, "train_ips": batch / train, "finetune_ips": batch / tune if tune
            else None}


def hours(measured: dict) -> float:
    """Hours of one run here: the training epochs at the measured rate, then the fine-tune's."""
    config = measured["config"]
    seconds = config.epochs * IMAGENET_TRAIN_IMAGES / measured["train_ips"]
    if measured["finetune_ips"]:
        seconds += config.finetune_epochs * IMAGENET_TRAIN_IMAGES / measured["finetune_ips"]
    return seconds / 3600.0


def figure1_rows(samples: dict, args, info: dict) -> list[dict]:
    """One row per recipe from its rounds: the best round's rates (a shared machine only ever
    slows a step down), every round, and the spread."""
    from keras_efficientnet.models.presets import PAPER_TOP1

    rows = []
    for (variant, family, series), rounds in samples.items():
        best = max(rounds, key=lambda m: m["train_ips"])
        reference = max(samples[(variant, *REFERENCE)], key=lambda m: m["train_ips"])
        config = best["config"]
        rates = [m["train_ips"] for m in rounds]
        rows.append(make_row(
            "figure1", machine=info, backend=keras.backend.backend(),
            variant=f"{variant.upper()} {SERIES[(family, series)]}",
            resolution=best["train_resolution"], batch=best["batch"],
            precision=config.precision, images_per_second=best["train_ips"],
            reference=f"{variant.upper()} {SERIES[REFERENCE]}",
            reference_images_per_second=reference["train_ips"],
            model=config.model, flagfile=f"flags/{variant}-{family}-{series}.flags",
            family=family, series=series, size=variant, smoke=bool(args.smoke),
            quick=bool(args.quick), test_resolution=best["test_resolution"],
            epochs=config.epochs, finetune_epochs=(config.finetune_epochs
                                                   if best["finetune_ips"] else 0),
            images_per_second_rounds=[round(r, 3) for r in rates],
            spread=round(max(rates) / min(rates) - 1.0, 4),
            finetune_images_per_second=(round(best["finetune_ips"], 3)
                                        if best["finetune_ips"] else None),
            hours_here=round(hours(best), 1),
            warmup=args.warmup, steps=args.steps, rounds=len(rounds),
            paper_top1=PAPER_TOP1[(f"efficientnet-{variant}-{family}", series)],
            top1_source="read off the paper's Figure 1 (ImageNet validation); not measured "
                        "here"))
    return rows


def chart(path: Path, rows: list[dict]) -> Path | None:
    """Paper's top-1 against hours here (log scale), one line per series through B0-B3."""
    try:
        from benchmarks import charts

        plt = charts._pyplot()
    except ImportError:
        print(f"no chart for {path}: matplotlib is not installed here")
        return None
    fig, ax = plt.subplots(figsize=(7.5, 5))
    for (family, series), label in SERIES.items():
        own = sorted((r for r in rows if (r["family"], r["series"]) == (family, series)),
                     key=lambda r: r["size"])
        if not own:
            continue
        line, = ax.plot([r["hours_here"] for r in own], [r["paper_top1"] for r in own],
                        "o-" if series == "native" else "s--", label=label)
        for r in own:
            ax.annotate(r["size"].upper(), (r["hours_here"], r["paper_top1"]), fontsize=7,
                        xytext=(3, -8), textcoords="offset points", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("hours of one training run on this machine (measured step rate x the "
                  "recipe's epochs)")
    ax.set_ylabel("ImageNet top-1 (%), read off the paper's Figure 1")
    ax.set_title("Which recipe buys the most accuracy per hour here? (top-1: the paper's, "
                 "not ours)", fontsize=9)
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8, loc="lower right")
    return charts._save(plt, fig, path.with_suffix(".png"), rows[0]["machine"])


def readme_table(rows: list[dict]) -> str:
    """The README's Figure 1 table (markdown) from the rows: per variant and recipe, training
    images/s here (its ratio to the variant's G1-GN native, measured in the same run), the
    spread of its rounds, the fine-tune's images/s, hours of one run here and the paper's
    top-1."""
    lines = ["| recipe | train px | training images/s (x G1-GN) | spread | fine-tune images/s "
             "| hours of one run here | paper's top-1 (%) |",
             "|---|---|---|---|---|---|---|"]
    order = {label: index for index, label in enumerate(SERIES)}
    for row in sorted(rows, key=lambda r: (r["size"], order[(r["family"], r["series"])])):
        tune = row.get("finetune_images_per_second")
        lines.append(
            f"| {row['variant']} | {row['resolution']} | {row['images_per_second']:.1f} "
            f"({row['ratio_to_reference']:.2f}x) | {row['spread']:.0%} | "
            f"{'-' if tune is None else f'{tune:.1f}'} | {row['hours_here']:,.0f} | "
            f"{row['paper_top1']} |")
    return "\n".join(lines)


def front(rows: list[dict]) -> list[dict]:
    """The rows no other row beats: none reaches at least its top-1 (the paper's) in at most
    its hours here, better in one of the two. In order of hours."""
    def beats(other: dict, row: dict) -> bool:
        return (other["hours_here"] <= row["hours_here"]
                and other["paper_top1"] >= row["paper_top1"]
                and (other["hours_here"], other["paper_top1"]) != (row["hours_here"],
                                                                   row["paper_top1"]))

    return sorted((row for row in rows if not any(beats(other, row) for other in rows)),
                  key=lambda row: row["hours_here"])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps (the first traces)")
    parser.add_argument("--steps", type=int, default=3, help="timed steps per round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="interleaved rounds of every recipe; rows keep the best")
    parser.add_argument("--quick", action="store_true", help="1 round of 2 steps, B0 only")
    parser.add_argument("--smoke", action="store_true",
                        help="the tiny model at tiny sizes, rows to a temporary folder (tests)")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    parser.add_argument("--report-only", action="store_true",
                        help="measure nothing: redraw the chart and print the table from the "
                             "rows already there")
    return parser


def measured_variants(rows: list[dict], series) -> set[str]:
    """The variants (b0...) whose every recipe of `series` has its row in `rows`."""
    have = {(r["size"], r["family"], r["series"]) for r in rows}
    return {r["size"] for r in rows
            if all((r["size"], *recipe) in have for recipe in series)}


def main(argv=None) -> list[dict]:
    args = build_parser().parse_args(argv)
    if args.quick or args.smoke:
        args.rounds, args.steps, args.warmup = 1, (1 if args.smoke else 2), 1
        if args.variants == list(VARIANTS):
            args.variants = ["b0"]
    scratch = Path(tempfile.mkdtemp(prefix="bench-figure1-")) if args.smoke else None
    series = SMOKE_SERIES if args.smoke else tuple(SERIES)
    try:
        name = f"figure1_{keras.backend.backend()}" + ("_quick" if args.quick else "")
        # A smoke run's rows go to --output-dir where given (never benchmarks/results), for the
        # benchmark smoke test to read; else to its scratch folder.
        output = ((smoke_dir(args.output_dir) if args.output_dir else scratch) if args.smoke
                  else results_dir(args.output_dir))
        path = output / f"{name}.jsonl"
        rows = read_rows(path) if path.exists() else []
        if args.report_only and not rows:
            raise SystemExit(f"--report-only: no rows in {path}; measure first "
                             "(make benchmark-figure1)")
        done = measured_variants(rows, series)
        info = machine()
        for variant in [] if args.report_only else args.variants:
            if variant in done:
                print(f"  {variant}: every recipe already in {path.name}, skipped", flush=True)
                continue
            samples: dict = {}
            for round_index in range(args.rounds):
                for family, kind in series:
                    measured = measure(variant, family, kind, args)
                    samples.setdefault((variant, family, kind), []).append(measured)
                    print(f"  round {round_index + 1} {variant} {SERIES[(family, kind)]}: "
                          f"{measured['train_ips']:.1f} img/s training at "
                          f"{measured['train_resolution']} px", flush=True)
            # The variant's rows replace any partial set of its rows (all measured together).
            rows = [r for r in rows if r["size"] != variant] + figure1_rows(samples, args, info)
            write_rows(name, rows, output)
        if rows:
            drawn = chart(path, rows)
            print(f"drew {drawn} from {path}" if args.report_only
                  else f"wrote {path} and {drawn}")
            print(readme_table(rows))
            print("the cheapest recipes for their top-1 here (none other reaches as much "
                  "in as few hours): " + ", ".join(f"{row['variant']} ({row['paper_top1']}%, "
                                         f"{row['hours_here']:,.0f} h)" for row in front(rows)))
        return rows
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
