"""Fashion-MNIST: test top-1 with 95% intervals against training seconds, and across micro-batches.

Run with `make benchmark-fashion` (both experiments), `make benchmark-fashion-time` (a) or
`make benchmark-fashion-microbatch` (b); `python -m benchmarks.bench_fashion {time,microbatch}
--help` lists the options. The data is Debian's `dataset-fashion-mnist` (`make data-fashion`).

(a) `time`: each recipe of flags/fashion-mnist-*.flags (G1-BN at the test resolution; G16-GN and
    G16-LN+PN at the reduced resolution, head fine-tuned at the test resolution), for each seed:
    training plus fine-tune seconds (wall clock, evaluation excluded) and the top-1 of the final
    weights on the 10,000 `test` images, evaluated once at the end. The flagfiles' full schedules
    take longer than the 60-minute budget of one `make` target on 2 cores, so by default each run
    is shortened to `--epochs` epochs of `--updates-per-epoch` updates (a shorter schedule: the
    batches are drawn from the whole shuffled `train` split; `test` is never trained on).
(b) `microbatch`: the micro-batch experiment of bench_microbatch on Fashion-MNIST, through its
    code: the tiny G16 model with BatchNorm, GroupNorm, LayerNorm and LN+PN at micro-batches 2
    and 32, accumulated to the same global batch (same images, updates and learning rate), the
    final weights' test top-1 (BatchNorm with re-estimated statistics). `--schedule` picks one:
    - `long` (the default, rows in fashion_microbatch_long.jsonl): the native40 recipe
      (flags/fashion-mnist-g16-lnpn-native.flags: 40 px, its crops, label smoothing and
      RMSProp at 0.002 for 64 images) at global batch 64 for 3 epochs of the 55,000 `train`
      images (2,577 updates, cosine to zero after a half-epoch warm-up), no weight averaging,
      so that BatchNorm learns: that recipe's G1-BN run reached 0.785 / 0.865 / 0.883
      validation top-1 after epochs 1-3 of a 4-epoch schedule (issue 32's probe; the 22-epoch
      run's curve: 0.708 / 0.856 / 0.877), so 3 epochs put BatchNorm at micro-batch 32 above
      0.85 with a margin. Cost per run, from BatchNorm and LN+PN runs of 60 and 300 updates on
      the 2-core AMD EPYC at load ~12 (the process's CPU seconds, their difference per update):
      micro-batch 32, 0.21 CPU s an update, about 10 CPU minutes a run; micro-batch 2, 0.42
      (BN) to 0.65 (LN+PN) CPU s an update, 19-28 CPU minutes a run; about 2.2 CPU hours for
      the 8 runs of a seed (the wall clock at that load: about 3x). Each run trains in
      runs/bench-fashion-microbatch/<schedule digest>/<norm>-mb<m>-s<seed> with checkpoints
      (each epoch and every 10 minutes; SIGTERM or Ctrl-C checkpoints the step), so a stopped
      run resumes there; its seconds are the trainer's wall seconds summed over the processes
      that trained it (evaluation left out), its row says `resumed`.
    - `smoke`: the first pass, 1 epoch of 100 updates of 32 at 32 px with the regularization it
      ran with (MICROBATCH_REGULARIZATION), rows in fashion_microbatch.jsonl. After 3,200
      images no norm has trained yet (BatchNorm 0.11-0.34): a smoke pass, not a reading of the
      claim, and labelled so in its report and chart.

Every finished (recipe or norm, micro-batch, seed) run appends one JSON line to
benchmarks/results/fashion_time.jsonl or fashion_microbatch[_long].jsonl at once; a restarted run
skips the runs whose rows (same schedule) are already there, so a stopped benchmark resumes where it
stopped. The summary (mean and 95% Student-t interval over the seeds, paired differences between
recipes) and the PNG chart with error bars are computed from the rows alone. `--smoke` trains a
few updates of each kind of run and evaluates one test batch (rows to a temporary folder);
`--quick` one seed (rows marked quick, in fashion_time_quick.jsonl or
fashion_microbatch[_long]_quick.jsonl), and for `microbatch` 1 epoch of 20 updates: the whole
path, resume included, in minutes.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.charts import read_rows
from benchmarks.common import (
    add_mode_arguments,
    machine,
    make_row,
    parse_args,
    results_dir,
    validate_row,
)

REPO = Path(__file__).resolve().parents[1]
FLAGS_DIR = REPO / "flags"
BASELINE = "G1-BN native 96"
# Label -> (flagfile, trained at the reduced resolution and fine-tuned).
RECIPES = {
    BASELINE: "fashion-mnist-96-g1-bn-native.flags",
    "G16-GN 64 -> 96 + head": "fashion-mnist-96-g16-gn-reduced.flags",
    "G16-LN+PN 64 -> 96 + head": "fashion-mnist-96-g16-lnpn-reduced.flags",
}
MICROBATCH_FLAGFILE = "fashion-mnist-g16-lnpn-native.flags"
# The smoke schedule keeps the augmentation and regularization its committed rows ran with (the
# flagfiles' earlier settings), so that a resumed run measures the same recipe after the
# flagfiles dropped them for the full-length schedule; the long schedule takes the flagfile's.
MICROBATCH_REGULARIZATION = dict(crop_area_min=0.25, label_smoothing=0.1, dropout_rate=0.1,
                                 drop_connect_rate=0.1, eval_resize_ratio=256.0 / 224.0)
# The micro-batch schedules (module docstring): each option's default, and where the rows go.
MICROBATCH_SCHEDULES = {
    "long": dict(epochs=3, updates_per_epoch=0, global_batch=64, resolution=40,
                 warmup_epochs=0.5, bn_batches=64, eval_steps=0),
    "smoke": dict(epochs=1, updates_per_epoch=100, global_batch=32, resolution=32,
                  warmup_epochs=0.2, bn_batches=64, eval_steps=0),
}
MICROBATCH_FILES = {"long": "fashion_microbatch_long", "smoke": "fashion_microbatch"}
# A long run also checkpoints every this many minutes, besides each epoch's end: a stop loses
# at most that much of an epoch (18 min at micro-batch 2 here).
CHECKPOINT_MINUTES = 10.0
# Published test top-1 on Fashion-MNIST (the dataset's benchmark table and papers).
PUBLISHED = {"2-layer CNN": 0.92, "ResNet-18": 0.949, "DenseNet-BC 768K": 0.954,
             "WRN-40-4": 0.967}
CONFIDENCE = 0.95
# Preset options of --smoke and --quick per experiment (the command line's own still win). The
# smoke run trains and fine-tunes one recipe, and BatchNorm at micro-batch 2 accumulated to 4
# (the other recipes and norms run the same code as bench_pareto's and bench_microbatch's).
SMOKE = {
    "time": ["--recipes", "G16-LN+PN 64 -> 96 + head", "--seeds", "0",
             "--updates-per-epoch=2", "--warmup-epochs=0.5", "--bn-batches=2", "--eval-steps=1"],
    "microbatch": ["--norms", "BN", "--micro-batches", "2", "--global-batch=4", "--epochs=1",
                   "--updates-per-epoch=2", "--bn-batches=2", "--eval-steps=1", "--seeds", "0"],
}
# The quick micro-batch pass: every norm and micro-batch for 20 updates, scored on 1,280 test
# images (the path and the resume, not the figures).
QUICK = {"time": ["--seeds", "0"],
         "microbatch": ["--seeds", "0", "--epochs=1", "--updates-per-epoch=20",
                        "--eval-steps=20", "--bn-batches=8"]}


# ---------------------------------------------------------------- interval arithmetic


def t_cdf(x: float, df: int) -> float:
    """P(T <= x) for Student's t with `df` degrees of freedom (Simpson's rule on the density)."""
    if df < 1:
        raise ValueError(f"Student's t needs df >= 1, received {df}")
    if x < 0:
        return 1.0 - t_cdf(-x, df)
    log_norm = (math.lgamma((df + 1) / 2) - math.lgamma(df / 2)
                - 0.5 * math.log(df * math.pi))

    def density(t: float) -> float:
        return math.exp(log_norm - (df + 1) / 2 * math.log1p(t * t / df))

    intervals = 2000
    h = x / intervals
    total = density(0.0) + density(x)
    for i in range(1, intervals):
        total += (4 if i % 2 else 2) * density(i * h)
    return 0.5 + total * h / 3


def t_quantile(p: float, df: int) -> float:
    """The `p` quantile of Student's t with `df` degrees of freedom (bisection on t_cdf)."""
    if not 0 < p < 1:
        raise ValueError(f"a quantile needs 0 < p < 1, received {p}")
    if p < 0.5:
        return -t_quantile(1 - p, df)
    low, high = 0.0, 1.0
    while t_cdf(high, df) < p:
        high *= 2
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if t_cdf(middle, df) < p else (low, middle)
    return (low + high) / 2


def mean_interval(values: list[float], confidence: float = CONFIDENCE) -> dict:
    """Mean, sample standard deviation and the half-width of the two-sided Student-t interval
    for the mean (None with fewer than 2 values: one seed gives no interval)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("an interval needs at least one value")
    mean = statistics.fmean(values)
    if len(values) < 2:
        return {"n": 1, "mean": mean, "std": None, "half_width": None}
    std = statistics.stdev(values)
    quantile = t_quantile(0.5 + confidence / 2, len(values) - 1)
    return {"n": len(values), "mean": mean, "std": std,
            "half_width": quantile * std / math.sqrt(len(values))}


def paired_difference(a: dict[int, float], b: dict[int, float],
                      confidence: float = CONFIDENCE) -> dict | None:
    """Interval of mean(a - b) over the seeds both have (seed -> value); None without any.
    `separated` says whether the interval excludes zero."""
    seeds = sorted(set(a) & set(b))
    if not seeds:
        return None
    result = mean_interval([a[s] - b[s] for s in seeds], confidence)
    width = result["half_width"]
    result["seeds"] = seeds
    result["separated"] = (width is not None
                           and (result["mean"] - width > 0 or result["mean"] + width < 0))
    return result


def format_interval(result: dict, digits: int = 4) -> str:
    if result["half_width"] is None:
        return f"{result['mean']:.{digits}f} (1 seed, no interval)"
    return f"{result['mean']:.{digits}f} +/- {result['half_width']:.{digits}f}"


# ---------------------------------------------------------------- rows and resume


def run_key(variant: str, seed: int, schedule: dict, micro_batch: int | None = None) -> str:
    """The identity of one run: a row with the same key is that run, already done."""
    return json.dumps({"variant": variant, "micro_batch": micro_batch, "seed": seed,
                       "schedule": schedule}, sort_keys=True)


def done_keys(path: Path) -> set[str]:
    """The run keys of the rows already in `path` (none where it does not exist yet)."""
    if not path.exists():
        return set()
    return {row["run_key"] for row in read_rows(path) if "run_key" in row}


ROW_FIELDS = ("run_key", "seed", "top1", "seconds", "schedule")


def append_row(path: Path, row: dict, required: tuple[str, ...] = ROW_FIELDS) -> None:
    """Appends one checked row (the shared schema and the `required` fields) as a JSON line and
    flushes it to disk (a stopped run keeps it)."""
    validate_row(row)
    for field in required:
        if field not in row:
            raise ValueError(f"fashion benchmark row lacks {field!r}")
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.write(json.dumps(row, sort_keys=True) + "\n")
        f.flush()
        os.fsync(f.fileno())


def matching_rows(path: Path, schedule: dict) -> list[dict]:
    """The rows of `path` measured with `schedule` (rows of other schedules stay in the file)."""
    if not path.exists():
        return []
    return [row for row in read_rows(path) if row.get("schedule") == schedule]


def same_seed_reference(path: Path, schedule: dict, reference: str, seed: int,
                        micro_batch: int | None = None) -> float | None:
    """Images/s of the reference run of the same seed and schedule, where it was measured."""
    for row in matching_rows(path, schedule):
        if (row["variant"] == reference and row["seed"] == seed
                and row.get("micro_batch") == micro_batch):
            return row["images_per_second"]
    return None


# ---------------------------------------------------------------- (a) accuracy against time


def recipe_config(label: str, seed: int, args, model_dir: Path):
    """The TrainConfig of one recipe's run: its flagfile, shortened to the benchmark's
    schedule, evaluated on `test` at the end."""
    from benchmarks.bench_pareto import base_config

    config = base_config(FLAGS_DIR / RECIPES[label])
    changes = dict(seed=seed, model_dir=str(model_dir), resume=False, verbose=0,
                   eval_split="test", eval_steps=args.eval_steps)
    changes.update(epochs=args.epochs, updates_per_epoch=args.updates_per_epoch,
                   finetune_epochs=args.finetune_epochs, warmup_epochs=args.warmup_epochs)
    if args.smoke:
        # The path, not the figures: batches of 8, and `test` scored once at the end (the
        # trainer's per-epoch validation would build and trace a second scorer).
        changes.update(micro_batch_size=8, eval_every=0)
    return config.replace(**changes)


def train_recipe(config, bn_batches: int) -> dict:
    """Trains (and fine-tunes) `config`; seconds exclude the final test evaluation."""
    import keras

    from keras_efficientnet.training import trainer

    keras.backend.clear_session()
    train_examples, test_examples, num_classes = trainer.dataset_facts(config)
    _, test_res = trainer.resolutions(config)
    started = time.perf_counter()
    with trainer.precision_policy(config.precision):
        trained = trainer.train(config, num_classes, train_examples)
        train_seconds = time.perf_counter() - started
        weights = trained["model"].get_weights()
        if trained["average"] is not None and trained["average"].values is not None:
            weights = trained["average"].weights_like(trained["model"])
        finetune_seconds, finetune_ips = 0.0, None
        if config.mode == "train_and_finetune" and config.finetune_epochs > 0:
            tuned_started = time.perf_counter()
            model, info = trainer.finetune(config, weights, num_classes, train_examples)
            finetune_seconds = time.perf_counter() - tuned_started
            finetune_ips = info["images_per_second"]
        else:
            model = trainer.build_model(config, test_res, num_classes)
            trainer.compile_model(model, "sgd", config, num_classes)
            model.set_weights(weights)
        data = trainer.build_datasets(config, test_res, training=False, split=config.eval_split,
                                      repeat=False, num_classes=num_classes)
        steps = config.eval_steps or -(-test_examples // config.plan.examples_per_forward_pass)
        result, bn_seconds = evaluate_recipe(config, model, data, steps, num_classes, bn_batches)
    return {**result, "images_per_second": trained["images_per_second"],
            "finetune_images_per_second": finetune_ips,
            "train_seconds": train_seconds + bn_seconds, "finetune_seconds": finetune_seconds,
            "bn_seconds": bn_seconds, "updates_per_epoch": trained["updates_per_epoch"]}


def evaluate_recipe(config, model, data, steps: int, num_classes: int,
                    bn_batches: int) -> tuple[dict, float]:
    """Test top-1 and top-5 of `model`; a BatchNorm model is first scored with its moving
    averages, then with its statistics re-estimated on `bn_batches` training micro-batches
    (bench_microbatch's precise BN: after a short schedule the moving averages, momentum 0.99,
    still hold their initial values). Returns the result and the re-estimation's seconds, which
    count as training time."""
    from benchmarks.bench_microbatch import score
    from keras_efficientnet.training import trainer

    if not bn_batches:
        return trainer.evaluate(model, data, steps), 0.0
    return score(model, config, data, steps, num_classes, bn_batches)


# The flags recipe_config always replaces (tests/benchmarks/test_bench_fashion.py holds it to
# that): they are the schedule's (or the run's) and leave the digest, so that a flagfile's own
# length can change without orphaning the rows.
REPLACED_FLAGS = ("epochs", "updates_per_epoch", "finetune_epochs", "warmup_epochs", "seed",
                  "model_dir", "eval_split")


def recipes_fingerprint() -> str:
    """A digest of the three flagfiles' flag lines (comments and REPLACED_FLAGS aside), part of
    the schedule: rows measured with an earlier version of the recipes are not taken for the
    current ones."""
    lines = []
    for label, name in RECIPES.items():
        text = (FLAGS_DIR / name).read_text()
        lines += [label] + [line for line in text.splitlines() if line.startswith("--")
                            and line[2:].split("=")[0] not in REPLACED_FLAGS]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def time_schedule(args) -> dict:
    return {"epochs": args.epochs, "updates_per_epoch": args.updates_per_epoch,
            "finetune_epochs": args.finetune_epochs, "warmup_epochs": args.warmup_epochs,
            "eval_steps": args.eval_steps, "bn_batches": args.bn_batches,
            "recipes": recipes_fingerprint()}


def time_row(label: str, seed: int, config, result: dict, schedule: dict, path: Path,
             info: dict, note: str) -> dict:
    import keras

    reference_ips = same_seed_reference(path, schedule, BASELINE, seed)
    reference = BASELINE if reference_ips is not None or label == BASELINE else label
    images = config.epochs * result["updates_per_epoch"] * config.global_batch_size
    return make_row(
        "fashion_time", machine=info, backend=keras.backend.backend(), variant=label,
        resolution=config.train_resolution, batch=config.micro_batch_size,
        precision=config.precision, images_per_second=result["images_per_second"],
        reference=reference,
        reference_images_per_second=reference_ips or result["images_per_second"],
        run_key=run_key(label, seed, schedule), schedule=schedule, seed=seed, note=note,
        flagfile=f"flags/{RECIPES[label]}", model=config.model, dataset=config.dataset,
        test_resolution=config.test_resolution, epochs=config.epochs,
        updates_per_epoch=result["updates_per_epoch"], train_images=images,
        global_batch=config.global_batch_size,
        finetune_epochs=config.finetune_epochs if config.mode == "train_and_finetune" else 0,
        finetune_images_per_second=(round(result["finetune_images_per_second"], 1)
                                    if result["finetune_images_per_second"] else None),
        train_seconds=round(result["train_seconds"], 2),
        finetune_seconds=round(result["finetune_seconds"], 2),
        seconds=round(result["train_seconds"] + result["finetune_seconds"], 2),
        eval_split=config.eval_split, top1=round(result["top1"], 4),
        top5=round(result["top5"], 4),
        **({"top1_moving_averages": round(result["top1_moving_averages"], 4),
            "bn_seconds": round(result["bn_seconds"], 2),
            "bn_statistics": f"re-estimated on {schedule['bn_batches']} training micro-batches"}
           if "top1_moving_averages" in result else {}))


def result_path(args) -> Path:
    """fashion_time.jsonl, or the micro-batch schedule's file (MICROBATCH_FILES), in the results
    folder (its _quick twin for --quick)."""
    stem = (MICROBATCH_FILES[args.schedule] if args.experiment == "microbatch"
            else f"fashion_{args.experiment}")
    return results_dir(args.output_dir) / f"{args.mode.file_name(stem)}.jsonl"


def run_time(args) -> Path:
    path = result_path(args)
    schedule = time_schedule(args)
    done = done_keys(path)
    scratch = Path(tempfile.mkdtemp(prefix="bench-fashion-"))
    try:
        for seed in args.seeds:
            for label in args.recipes:
                if run_key(label, seed, schedule) in done:
                    print(f"  seed {seed} {label}: already in {path.name}, skipped", flush=True)
                    continue
                config = recipe_config(label, seed, args, scratch / f"{seed}-{len(done)}")
                result = train_recipe(config, args.bn_batches)
                row = args.mode.mark(time_row(label, seed, config, result, schedule, path,
                                              machine(), args.note))
                append_row(path, row)
                done.add(row["run_key"])
                print(f"  seed {seed} {label}: test top-1 {row['top1']:.4f}, "
                      f"{row['seconds']:.1f} s ({row['images_per_second']:.0f} img/s)",
                      flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


# ---------------------------------------------------------------- (b) micro-batch


def microbatch_schedule(args) -> dict:
    """The schedule's figures, part of each run's key. The long schedule also names itself and
    holds a digest of the flagfile it takes its recipe from, so that rows of an edited recipe
    are not taken for the current one (the smoke schedule's rows have neither)."""
    schedule = {"epochs": args.epochs, "updates_per_epoch": args.updates_per_epoch,
                "global_batch": args.global_batch, "resolution": args.resolution,
                "warmup_epochs": args.warmup_epochs, "bn_batches": args.bn_batches,
                "eval_steps": args.eval_steps}
    if args.schedule != "smoke":
        schedule.update(name=args.schedule, recipe=flagfile_digest(MICROBATCH_FLAGFILE))
    return schedule


def flagfile_digest(name: str) -> str:
    """A digest of a flagfile's flag lines (its comments aside)."""
    text = (FLAGS_DIR / name).read_text()
    lines = [line for line in text.splitlines() if line.startswith("--")]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def microbatch_base(args):
    """The shared recipe of every norm: the G16-LN+PN flagfile at one resolution, no fine-tune
    and no weight averaging (the final weights are scored), its per-example learning rate times
    the global batch (as bench_microbatch), validation off (`test` is read once, at the end).
    The smoke schedule keeps the regularization its rows ran with; the long one the flagfile's.
    Long runs checkpoint every CHECKPOINT_MINUTES too, so that they resume close to a stop."""
    from benchmarks.bench_microbatch import base_config

    base = base_config(FLAGS_DIR / MICROBATCH_FLAGFILE)
    per_sample = base.peak_learning_rate() / base.global_batch_size
    kept = (MICROBATCH_REGULARIZATION if args.schedule == "smoke"
            else {"checkpoint_minutes": CHECKPOINT_MINUTES})
    return base.replace(epochs=args.epochs, warmup_epochs=args.warmup_epochs,
                        updates_per_epoch=args.updates_per_epoch, verbose=0,
                        train_resolution=args.resolution, test_resolution=args.resolution,
                        learning_rate=0.0, learning_rate_per_sample=per_sample,
                        weight_average_decay=0.0, eval_steps=args.eval_steps, eval_every=0,
                        eval_split="test", **kept)


def run_directory(runs: Path, schedule: dict, norm: str, micro: int, seed: int) -> Path:
    """Where one run trains and checkpoints: a folder per schedule (its digest), so that a run
    of another schedule never resumes this one's checkpoints."""
    digest = hashlib.sha256(json.dumps(schedule, sort_keys=True).encode()).hexdigest()[:12]
    return runs / digest / f"{norm.lower().replace('+', '')}-mb{micro}-s{seed}"


# In each run directory: the seconds spent in the trainer so far, summed over the processes
# that trained the run (a stop mid-epoch leaves no metrics.csv row for its part of the epoch).
SECONDS_FILE = "bench_train_seconds.json"


def add_train_seconds(run_dir: Path, seconds: float) -> float:
    """Adds `seconds` to the run's SECONDS_FILE (written atomically) and returns the total."""
    from keras_efficientnet.atomic import write_atomically

    path = run_dir / SECONDS_FILE
    total = (json.loads(path.read_text())["train_seconds"] if path.exists() else 0.0) + seconds
    write_atomically(path, json.dumps({"train_seconds": round(total, 3)}) + "\n")
    return total


def train_and_score(config, bn_batches: int, eval_batch: int) -> dict:
    """Trains `config` (bench_microbatch's way, resuming from the checkpoints in its model_dir
    where it has them) and returns the test top-1 of its final weights. BatchNorm's statistics
    are re-estimated on `bn_batches` training micro-batches of the size it trained at;
    evaluation then runs at `eval_batch` images a call (inference uses no batch statistics, so
    this only saves time at micro-batch 2). `seconds`: the wall seconds inside the trainer,
    summed over every process that trained the run (a stopped one's included: each resume
    rebuilds and retraces the model, which is part of what the stop cost); evaluation is left
    out. Images/s come from them, so a resumed run's rate is the whole run's."""
    import keras

    from benchmarks.bench_microbatch import score, top1_fields
    from keras_efficientnet.training import trainer

    run_dir = Path(config.model_dir)
    resumed = (run_dir / SECONDS_FILE).exists()
    if resumed:
        print(f"  resuming {run_dir} from its last checkpoint", flush=True)
    train_examples, test_examples, num_classes = trainer.dataset_facts(config)
    started = time.perf_counter()
    try:
        trained = trainer.train(config, num_classes, train_examples)
    finally:  # a stop (SIGTERM, Ctrl-C) keeps the seconds it trained for
        run_dir.mkdir(parents=True, exist_ok=True)
        seconds = add_train_seconds(run_dir, time.perf_counter() - started)
    images = config.epochs * trained["updates_per_epoch"] * config.global_batch_size
    model = trained["model"]
    trainer.compile_model(model, "sgd", config, num_classes)
    evaluation = config.replace(micro_batch_size=eval_batch, gradient_accumulation=1)
    data = trainer.build_datasets(evaluation, config.test_resolution, training=False,
                                  split=config.eval_split, repeat=False, num_classes=num_classes)
    steps = config.eval_steps or -(-test_examples // eval_batch)
    result = {"images_per_second": images / seconds, "seconds": seconds, "resumed": resumed,
              "updates_per_epoch": trained["updates_per_epoch"],
              **top1_fields(score(model, config, data, steps, num_classes, bn_batches)[0])}
    keras.backend.clear_session()
    return result


def run_microbatch(args) -> Path:
    import keras

    from benchmarks import bench_microbatch
    from benchmarks.bench_fashion_protocol import LoadSampler
    from keras_efficientnet.training.preemption import Preempted

    path = result_path(args)
    schedule = microbatch_schedule(args)
    done = done_keys(path)
    base = microbatch_base(args)
    reference_micro = max(args.micro_batches)
    scratch = Path(tempfile.mkdtemp(prefix="bench-fashion-mb-")) if args.smoke else None
    runs = Path(args.runs_dir) if args.runs_dir else (
        scratch if scratch is not None else REPO / "runs" / (
            "bench-fashion-microbatch-quick" if args.quick else "bench-fashion-microbatch"))
    try:
        for seed in args.seeds:
            for norm in args.norms:
                for micro in sorted(args.micro_batches, reverse=True):
                    key = run_key(norm, seed, schedule, micro)
                    if key in done:
                        print(f"  seed {seed} {norm} micro-batch {micro}: already in "
                              f"{path.name}, skipped", flush=True)
                        continue
                    keras.backend.clear_session()
                    run_dir = run_directory(runs, schedule, norm, micro, seed)
                    config = bench_microbatch.run_config(
                        base, norm, micro, args.global_batch, seed, run_dir).replace(
                        resume=True)
                    with LoadSampler(args.load_every) as sampler:
                        try:
                            result = train_and_score(config, args.bn_batches,
                                                     args.global_batch)
                        except Preempted as stop:  # SIGTERM or Ctrl-C: checkpointed
                            print(f"seed {seed} {norm} micro-batch {micro}: {stop}",
                                  file=sys.stderr, flush=True)
                            raise SystemExit(stop.exit_code) from None
                    row = args.mode.mark(microbatch_row(norm, micro, seed, config, result,
                                                        args, schedule, path, key,
                                                        reference_micro, sampler.summary()))
                    append_row(path, row)
                    done.add(key)
                    print(f"  seed {seed} {norm:6s} micro-batch {micro:3d}: test top-1 "
                          f"{row['top1']:.4f}, {row['seconds']:.1f} s training "
                          f"({row['images_per_second']:.0f} img/s, load "
                          f"{row['load_average_mean']})", flush=True)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)
    return path


def microbatch_row(norm, micro, seed, config, result, args, schedule, path, key,
                   reference_micro, load: dict) -> dict:
    import keras

    from benchmarks.bench_microbatch import NORMS, REFERENCE_NORM

    reference_ips = same_seed_reference(path, schedule, REFERENCE_NORM, seed, reference_micro)
    is_reference = norm == REFERENCE_NORM and micro == reference_micro
    reference = (f"{REFERENCE_NORM} micro-batch {reference_micro}"
                 if reference_ips is not None or is_reference else f"{norm} micro-batch {micro}")
    extra = {}
    if "top1_moving_averages" in result:
        extra = {"top1_moving_averages": round(result["top1_moving_averages"], 4),
                 "bn_statistics": f"re-estimated on {args.bn_batches} training micro-batches"}
    updates = result["updates_per_epoch"]
    return make_row(
        "fashion_microbatch", machine=machine(), backend=keras.backend.backend(), variant=norm,
        resolution=args.resolution, batch=micro, precision=config.precision,
        images_per_second=result["images_per_second"], reference=reference,
        reference_images_per_second=reference_ips or result["images_per_second"],
        run_key=key, schedule=schedule, schedule_name=args.schedule, seed=seed, note=args.note,
        model=f"efficientnet-tiny-{NORMS[norm]}", dataset=config.dataset, micro_batch=micro,
        global_batch=args.global_batch, gradient_accumulation=args.global_batch // micro,
        epochs=args.epochs, updates_per_epoch=updates,
        train_images=args.epochs * updates * args.global_batch,
        learning_rate=config.peak_learning_rate(), seconds=round(result["seconds"], 2),
        resumed=bool(result.get("resumed")), eval_split=config.eval_split,
        top1=round(result["top1"], 4), **load, **extra)


# ---------------------------------------------------------------- summary and charts


def summarize(rows: list[dict], group) -> dict:
    """group(row) -> {'top1': interval, 'seconds': interval, 'top1_by_seed': {seed: top1}}."""
    groups: dict = {}
    for row in rows:
        groups.setdefault(group(row), []).append(row)
    return {key: {"top1": mean_interval([r["top1"] for r in own]),
                  "seconds": mean_interval([r["seconds"] for r in own]),
                  "top1_by_seed": {r["seed"]: r["top1"] for r in own},
                  "seeds": sorted(r["seed"] for r in own)}
            for key, own in groups.items()}


def print_comparisons(summary: dict, pairs: list[tuple]) -> None:
    for a, b in pairs:
        if a not in summary or b not in summary:
            continue
        diff = paired_difference(summary[a]["top1_by_seed"], summary[b]["top1_by_seed"])
        if diff is None:
            continue
        verdict = ("separated" if diff["separated"] else
                   "not separated by the interval" if diff["half_width"] is not None
                   else "one seed, no interval")
        print(f"  {a} - {b}: {format_interval(diff)} over seeds {diff['seeds']} ({verdict})")


def report_time(path: Path, schedule: dict) -> dict:
    rows = matching_rows(path, schedule)
    summary = summarize(rows, lambda r: r["variant"])
    print(f"\n{'recipe':32s} {'test top-1 (95% t)':>24s} {'seconds (95% t)':>22s} seeds")
    for label, s in summary.items():
        print(f"{label:32s} {format_interval(s['top1']):>24s} "
              f"{format_interval(s['seconds'], 1):>22s} {s['seeds']}")
    print_comparisons(summary, [("G16-LN+PN 64 -> 96 + head", BASELINE),
                                ("G16-LN+PN 64 -> 96 + head", "G16-GN 64 -> 96 + head"),
                                ("G16-GN 64 -> 96 + head", BASELINE)])
    if rows:
        draw_time_chart(path, rows, summary)
    return summary


# What each schedule's report and chart say it is.
SCHEDULE_LABELS = {
    "long": "long schedule",
    "smoke": "SMOKE PASS: 100 updates, before any norm has trained; not a reading of the claim",
}


def report_microbatch(path: Path, schedule: dict, name: str = "long") -> dict:
    rows = matching_rows(path, schedule)
    summary = summarize(rows, lambda r: (r["variant"], r["micro_batch"]))
    print(f"\n{SCHEDULE_LABELS[name]}: {schedule['epochs']} epoch(s) x "
          f"{schedule['updates_per_epoch'] or 'one pass of'} updates of "
          f"{schedule['global_batch']} at {schedule['resolution']} px, {path.name}")
    print(f"{'norm':6s} {'micro-batch':>11s} {'test top-1 (95% t)':>26s} seeds")
    for (norm, micro), s in sorted(summary.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        print(f"{norm:6s} {micro:11d} {format_interval(s['top1']):>26s} {s['seeds']}")
    micros = sorted({m for _, m in summary})
    norms = list(dict.fromkeys(n for n, _ in summary))
    pairs = [((n, micros[0]), (n, micros[-1])) for n in norms] if len(micros) > 1 else []
    pairs += [(("LN+PN", m), (other, m)) for m in micros for other in ("GN", "LN", "BN")]
    print_comparisons(summary, pairs)
    if rows:
        draw_microbatch_chart(path, rows, summary, SCHEDULE_LABELS[name])
    return summary


def _error(interval: dict) -> float:
    return interval["half_width"] or 0.0


def draw_time_chart(path: Path, rows: list[dict], summary: dict) -> Path | None:
    """Test top-1 against training seconds, mean with 95% intervals both ways, seeds as dots."""
    try:
        from benchmarks import charts

        plt = charts._pyplot()
    except ImportError:
        print(f"no chart for {path}: matplotlib is not installed here")
        return None
    fig, ax = plt.subplots(figsize=(7.5, 4.8))
    for marker, (label, s) in zip("osd^v", summary.items()):
        handle = ax.errorbar(s["seconds"]["mean"], s["top1"]["mean"],
                             xerr=_error(s["seconds"]), yerr=_error(s["top1"]), fmt=marker,
                             capsize=4, label=f"{label} ({len(s['seeds'])} seeds)")
        own = [r for r in rows if r["variant"] == label]
        ax.plot([r["seconds"] for r in own], [r["top1"] for r in own], ".", alpha=0.4,
                color=handle[0].get_color())
    for top1 in PUBLISHED.values():
        ax.axhline(top1, color="#9e9e9e", linestyle=":", linewidth=0.8)
    ax.text(0.01, 0.99, "dotted: published test top-1, "
            + ", ".join(f"{name} {top1}" for name, top1 in PUBLISHED.items()),
            transform=ax.transAxes, fontsize=7, color="#616161", va="top")
    first = rows[0]
    epochs = f"{first['epochs']} epoch{'s' if first['epochs'] != 1 else ''}"
    ax.set_xlabel("training + fine-tune seconds (mean, 95% t interval)")
    ax.set_ylabel("Fashion-MNIST test top-1 (mean, 95% t interval)")
    note = f" — {first['note']}" if first.get("note") else ""
    ax.set_title(f"Fashion-MNIST, {epochs} x {first['updates_per_epoch']} updates of "
                 f"{first['global_batch']}{note}", fontsize=9)
    ax.set_ylim(top=1.0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower left")
    return charts._save(plt, fig, path, first["machine"])


def draw_microbatch_chart(path: Path, rows: list[dict], summary: dict,
                          label: str = "") -> Path | None:
    """Test top-1 against the micro-batch, one line per norm, 95% intervals, seeds as dots;
    `label` (what the schedule is) heads the title."""
    try:
        from benchmarks import charts

        plt = charts._pyplot()
    except ImportError:
        print(f"no chart for {path}: matplotlib is not installed here")
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    norms = list(dict.fromkeys(n for n, _ in summary))
    for index, norm in enumerate(norms):
        shift = 1 + 0.04 * (index - (len(norms) - 1) / 2)  # side by side on the log axis
        micros = sorted(m for n, m in summary if n == norm)
        means = [summary[(norm, m)]["top1"]["mean"] for m in micros]
        errors = [_error(summary[(norm, m)]["top1"]) for m in micros]
        handle = ax.errorbar([m * shift for m in micros], means, yerr=errors, fmt="o-",
                             capsize=4, label=norm)
        own = [r for r in rows if r["variant"] == norm]
        ax.plot([r["micro_batch"] * shift for r in own], [r["top1"] for r in own], ".",
                alpha=0.4, color=handle[0].get_color())
    ax.set_xscale("log", base=2)
    ax.set_xticks(sorted({m for _, m in summary}))
    ax.get_xaxis().set_major_formatter(plt.matplotlib.ticker.ScalarFormatter())
    first = rows[0]
    ax.set_xlabel(f"micro-batch (gradients accumulated to {first['global_batch']})")
    ax.set_ylabel("test top-1 (mean, 95% t interval)")
    ax.set_title(f"{label + chr(10) if label else ''}Norms against micro-batch on "
                 f"Fashion-MNIST ({first['epochs']} epoch(s) x {first['updates_per_epoch']} "
                 f"updates of {first['global_batch']}, {first['resolution']}px)\n"
                 f"{first.get('note', '')}", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    return charts._save(plt, fig, path, first["machine"])


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    from benchmarks.bench_microbatch import NORMS

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="experiment", required=True)
    timed = commands.add_parser("time", help="(a) test top-1 against training seconds")
    timed.add_argument("--recipes", nargs="+", default=list(RECIPES), choices=list(RECIPES))
    timed.add_argument("--epochs", type=int, default=1)
    timed.add_argument("--updates-per-epoch", type=int, default=100,
                       help="updates of the flagfile's global batch (64) per epoch; "
                            "0 = one pass over the 55,000 training images")
    timed.add_argument("--finetune-epochs", type=int, default=1)
    timed.add_argument("--warmup-epochs", type=float, default=0.5)
    timed.add_argument("--bn-batches", type=int, default=64,
                       help="G1-BN: training micro-batches its statistics are re-estimated on "
                            "(timed as training); 0 = its moving averages")
    mb = commands.add_parser("microbatch", help="(b) BN, GN, LN, LN+PN at micro-batch 2 and 32")
    mb.add_argument("--schedule", choices=list(MICROBATCH_SCHEDULES), default="long",
                    help="long: 3 passes at 40 px, where BatchNorm learns (the reading of the "
                         "claim); smoke: the first 100-update pass. It sets the defaults below")
    mb.add_argument("--norms", nargs="+", default=list(NORMS), choices=list(NORMS))
    mb.add_argument("--micro-batches", nargs="+", type=int, default=[2, 32])
    mb.add_argument("--global-batch", type=int, default=None)
    mb.add_argument("--resolution", type=int, default=None)
    mb.add_argument("--epochs", type=int, default=None)
    mb.add_argument("--updates-per-epoch", type=int, default=None,
                    help="updates of --global-batch; 0 = one pass over the training split")
    mb.add_argument("--warmup-epochs", type=float, default=None)
    mb.add_argument("--bn-batches", type=int, default=None,
                    help="training micro-batches BatchNorm's statistics are re-estimated on")
    mb.add_argument("--runs-dir", default=None,
                    help="run directories, resumed from (default runs/bench-fashion-microbatch"
                         "[-quick]; --smoke: a temporary folder)")
    mb.add_argument("--load-every", type=float, default=30.0,
                    help="seconds between samples of the load average while a run trains")
    for sub in (timed, mb):
        sub.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
        sub.add_argument("--eval-steps", type=int, default=0 if sub is timed else None,
                         help="test batches (of 64, or of --global-batch); 0 = all 10,000 "
                              "test images")
        sub.add_argument("--note", default="",
                         help="written into every row and the chart title (e.g. a reduced pass)")
        sub.add_argument("--report-only", action="store_true",
                         help="train nothing: summarize and chart the rows already written")
        sub.add_argument("--output-dir", default=None,
                         help="default $KE_BENCH_RESULTS or benchmarks/results")
        add_mode_arguments(sub)
    return parser


def schedule_defaults(args) -> None:
    """The micro-batch options left out take their --schedule's values."""
    if args.experiment != "microbatch":
        return
    for name, value in MICROBATCH_SCHEDULES[args.schedule].items():
        if getattr(args, name) is None:
            setattr(args, name, value)


def check_args(parser, args) -> None:
    if args.epochs < 1 or args.updates_per_epoch < 0 or len(set(args.seeds)) != len(args.seeds):
        parser.error("--epochs must be >= 1, --updates-per-epoch >= 0 and --seeds distinct")
    if args.experiment == "microbatch":
        bad = [m for m in args.micro_batches if m < 1 or args.global_batch % m]
        if bad:
            parser.error(f"--micro-batches {bad}: each must divide --global-batch="
                         f"{args.global_batch}")
    else:
        missing = [RECIPES[label] for label in args.recipes
                   if not (FLAGS_DIR / RECIPES[label]).exists()]
        if missing:
            parser.error(f"recipe flagfiles missing from {FLAGS_DIR}: {missing}")


def main(argv=None) -> dict:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    experiment = parser.parse_args(argv).experiment  # the first word: no options precede it
    args = parse_args(parser, argv[1:], command=argv[:1], smoke=SMOKE[experiment],
                      quick=QUICK[experiment])
    schedule_defaults(args)
    check_args(parser, args)
    started = time.perf_counter()
    path = result_path(args)
    if args.experiment == "time":
        if not args.report_only:
            run_time(args)
        summary = report_time(path, time_schedule(args))
    else:
        if not args.report_only:
            run_microbatch(args)
        summary = report_microbatch(path, microbatch_schedule(args), args.schedule)
    print(f"{time.perf_counter() - started:.0f} s in all; rows in {path}", flush=True)
    return summary


if __name__ == "__main__":
    main()
