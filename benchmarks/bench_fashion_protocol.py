"""Fashion-MNIST with the paper's protocol: each recipe's full schedule as the user runs it.

Run with `make benchmark-fashion-protocol` (`EXPERIMENT=native40|table96`); `python -m
benchmarks.bench_fashion_protocol --help` lists the options. The data is Debian's
`dataset-fashion-mnist` (`make data-fashion`).

Experiments (recipes are flags/fashion-mnist-*.flags, written by flags/generate.py):
- `native40`: G1-BN, G1-GN, G16-GN and G16-LN+PN trained and tested at 40 px, 22 epochs: is the
  paper's model on a par with EfficientNet at native resolution?
- `table96`: test resolution 96, 12 epochs: G1-BN native, G1-GN / G16-GN / G16-LN+PN native with
  their head fine-tune, and G16-GN / G16-LN+PN trained at 64 px (train = test mod 32, 0.44 of the
  pixels) with the head fine-tuned at 96 px.

Each (recipe, seed) is the training command itself, `python -m keras_efficientnet.train
--flagfile=... --seed=S --model_dir=runs/bench-fashion/<recipe>-s<S>`, in its own run directory,
so a stopped benchmark resumes from the run's last checkpoint (the trainer's own resume). Then one
evaluation of the shipped model on `test` (one pass and flip test-time augmentation), the only
time the test split is read, and one JSON row in benchmarks/results/fashion_protocol.jsonl with
the per-epoch validation curve against training seconds (metrics.csv). A row already there for
the same recipe text and seed is not rerun. The load average is sampled while a run trains, so
each row says whether its seconds are quiet.

The runs' own seconds depend on what else the machine was doing. `--speed-rounds N` (with
`--speed-only`, nothing else) therefore measures each recipe's training and fine-tune images/s in
N interleaved rounds of one short epoch (the same command, 60 updates; rows in
fashion_protocol_speed.jsonl, to run on a quiet machine), and the report reads the curves again
with seconds = images seen / those rates: each recipe's time to the reference's final
validation top-1 (claim b) no longer depends on the load its run trained under. A fine-tuned
recipe's curve ends with one more point, after its fine-tune (its images at its rate).

`--quick` runs every recipe for 2 epochs of 20 updates (rows marked `"quick": true`, runs under
runs/bench-fashion-quick) as a check of the whole path in minutes; `--smoke` does one epoch of 2
updates on the embedded digits into a temporary folder (the test suite's check).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from benchmarks.bench_fashion import append_row, done_keys, mean_interval, paired_difference
from benchmarks.charts import read_rows
from benchmarks.common import machine, make_row, results_dir, smoke_dir
from keras_efficientnet.atomic import write_atomically

REPO = Path(__file__).resolve().parents[1]
FLAGS_DIR = REPO / "flags"
RESULTS_FILE = "fashion_protocol.jsonl"
# Experiment -> recipe (flags/fashion-mnist-<recipe>.flags) -> its label in rows and charts.
EXPERIMENTS = {
    "native40": {
        "g1-bn-native": "G1-BN native 40",
        "g1-gn-native": "G1-GN native 40",
        "g16-gn-native": "G16-GN native 40",
        "g16-lnpn-native": "G16-LN+PN native 40",
    },
    "table96": {
        "96-g1-bn-native": "G1-BN native 96",
        "96-g1-gn-native": "G1-GN native 96 + head",
        "96-g16-gn-native": "G16-GN native 96 + head",
        "96-g16-lnpn-native": "G16-LN+PN native 96 + head",
        "96-g16-gn-reduced": "G16-GN 64 -> 96 + head",
        "96-g16-lnpn-reduced": "G16-LN+PN 64 -> 96 + head",
    },
}
REFERENCE = {"native40": "g1-bn-native", "table96": "96-g1-bn-native"}
# Flags each run sets itself: they leave the recipe's digest (seed and place are the run's).
RUN_FLAGS = ("seed", "model_dir", "resume")
QUICK = {"epochs": 2, "updates_per_epoch": 20, "eval_steps": 4, "warmup_epochs": 0.5}
SMOKE = {"epochs": 1, "updates_per_epoch": 2, "eval_steps": 1, "warmup_epochs": 0.5,
         "dataset": "digits", "eval_split": "validation", "micro_batch_size": 8,
         "finetune_batch_size": 8}
# The speed pass (--speed-rounds): each recipe's training command for one epoch of a few updates
# (and its head fine-tune, as long), only to read the trainer's images/s for the two phases.
SPEED = {"epochs": 1, "updates_per_epoch": 60, "eval_steps": 1, "warmup_epochs": 0.5}
SPEED_QUICK_UPDATES = 20
SPEED_FILE = "fashion_protocol_speed.jsonl"
LOAD_SAMPLE_SECONDS = 30.0
# A run whose mean 1-minute load average (its own process included) stays under this had the
# machine's cores to itself: 2 cores, one busy run uses about 1-2.
QUIET_LOAD = 2.5


def flagfile(recipe: str) -> Path:
    return FLAGS_DIR / f"fashion-mnist-{recipe}.flags"


def recipe_digest(recipe: str, overrides: dict) -> str:
    """The recipe's flag lines (comments and the run's own flags aside) and the overrides: a row
    measured with another version of the recipe is not taken for this one."""
    lines = [line for line in flagfile(recipe).read_text().splitlines()
             if line.startswith("--") and line[2:].split("=")[0] not in RUN_FLAGS]
    lines += [f"--{k}={v}" for k, v in sorted(overrides.items())]
    return hashlib.sha256("\n".join(lines).encode()).hexdigest()[:16]


def run_key(recipe: str, seed: int, overrides: dict) -> str:
    return json.dumps({"recipe": recipe, "seed": seed,
                       "digest": recipe_digest(recipe, overrides)}, sort_keys=True)


class LoadSampler:
    """Samples the 1-minute load average every `every` seconds in a daemon thread."""

    def __init__(self, every: float = LOAD_SAMPLE_SECONDS):
        self.every, self.samples = every, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while True:
            self.samples.append(os.getloadavg()[0])
            if self._stop.wait(self.every):
                return

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=self.every + 5)

    def summary(self) -> dict:
        samples = self.samples or [os.getloadavg()[0]]
        mean = sum(samples) / len(samples)
        return {"load_average_mean": round(mean, 2), "load_average_max": round(max(samples), 2),
                "quiet": mean < QUIET_LOAD}


def command(recipe: str, seed: int, run_dir: Path, overrides: dict, *extra: str) -> list[str]:
    flags = [f"--flagfile={flagfile(recipe)}", f"--seed={seed}", f"--model_dir={run_dir}"]
    flags += [f"--{k}={v}" for k, v in sorted(overrides.items())]
    return [sys.executable, "-m", "keras_efficientnet.train", *flags, *extra]


def run_command(argv: list[str], log: Path, timeout: float) -> None:
    """Runs one command of the benchmark, its output appended to `log`; a failure raises with
    the log's last lines (a run that hangs is stopped at `timeout` seconds)."""
    with open(log, "a") as out:
        out.write(f"$ {' '.join(argv)}\n")
        out.flush()
        try:
            result = subprocess.run(argv, stdout=out, stderr=subprocess.STDOUT, cwd=REPO,
                                    timeout=timeout, env={**os.environ, "PYTHONUNBUFFERED": "1"})
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"{' '.join(argv[2:5])} did not finish in {timeout:.0f} s; "
                               f"see {log}") from None
    if result.returncode:
        tail = log.read_text(errors="replace").splitlines()[-8:]
        raise RuntimeError(f"exit {result.returncode}: {' '.join(argv[2:5])}; {log}:\n"
                           + "\n".join(tail))


RUN_KEY_FILE = "bench_run_key.json"


def recipe_values(recipe: str, overrides: dict) -> dict[str, str]:
    """The recipe's flags as written (`--name=value`; a bare `--name` is "true"), the run's own
    flags aside, then the overrides."""
    values = {}
    for line in flagfile(recipe).read_text().splitlines():
        if line.startswith("--"):
            name, _, value = line[2:].partition("=")
            if name not in RUN_FLAGS:
                values[name] = value if _ else "true"
    values.update({k: str(v) for k, v in overrides.items()})
    return values


def _same(recorded, written: str) -> bool:
    if isinstance(recorded, bool):
        return recorded == (written.lower() in ("true", "1"))
    if isinstance(recorded, int | float):
        try:
            return abs(float(written) - recorded) <= 1e-9 * max(1.0, abs(recorded))
        except ValueError:
            return False
    return str(recorded) == written


def recorded_differences(run_dir: Path, recipe: str, overrides: dict) -> list[str]:
    """The recipe flags whose value in the run's config.json differs from the recipe now (flags
    that config.json does not record are not compared)."""
    path = run_dir / "config.json"
    if not path.is_file():
        return []
    saved = json.loads(path.read_text()).get("config", {})
    return [f"--{name} (run {saved[name]!r}, recipe {value!r})"
            for name, value in recipe_values(recipe, overrides).items()
            if name in saved and not _same(saved[name], value)]


def run_dir_is_stale(run_dir: Path, key: str, recipe: str, overrides: dict) -> str | None:
    """Why `run_dir` holds a run of another version of the recipe (None: it is this version's,
    or empty). A directory the benchmark started records its run key; an older one without the
    key counts as this version's while unfinished (it resumes as before) and, once finished,
    when its config.json agrees with every flag of the recipe."""
    marker = run_dir / RUN_KEY_FILE
    if marker.is_file():
        recorded = json.loads(marker.read_text()).get("run_key")
        return None if recorded == key else "it was started for another version of the recipe"
    if not (run_dir / "results.json").is_file():
        return None
    differences = recorded_differences(run_dir, recipe, overrides)
    return ("it finished with " + "; ".join(differences)) if differences else None


def read_curve(run_dir: Path) -> list[dict]:
    """The run's per-epoch validation against seconds, from its metrics.csv."""
    from keras_efficientnet.runs import record

    rows = record.read_metrics(record.RunFiles(run_dir).metrics)
    return [{"epoch": int(r["epoch"]), **{k: r.get(k) for k in
                                          ("val_top1", "top1", "train_seconds", "wall_seconds")}}
            for r in rows]


def finished(run_dir: Path) -> dict | None:
    """The run's results.json once its whole schedule (and fine-tune) has run, else None."""
    path = run_dir / "results.json"
    if not path.is_file() or not (run_dir / "model.keras").is_file():
        return None
    return json.loads(path.read_text())


def train_images(trained: dict) -> int:
    """Images the training phase saw: epochs x updates x global batch (plan.updates_per_epoch:
    --updates_per_epoch, else whole batches of one pass)."""
    config, batch = trained["config"], trained["global_batch_size"]
    updates = config["updates_per_epoch"] or trained["train_examples"] // batch
    return config["epochs"] * updates * batch


def finetune_cost(trained: dict) -> tuple[int, float | None]:
    """Images the head fine-tune saw and its seconds at its measured rate (0 and None for a
    recipe without one): the trainer's metrics.csv has rows for the training epochs only."""
    config = trained["config"]
    if config["mode"] != "train_and_finetune" or not trained.get("finetune_images_per_second"):
        return 0, None
    batch = trained.get("finetune_global_batch_size") or trained["global_batch_size"]
    updates = config["updates_per_epoch"] or trained["train_examples"] // batch
    images = config["finetune_epochs"] * updates * batch
    return images, images / trained["finetune_images_per_second"]


def onednn_state(trained: dict) -> str | None:
    """'on' or 'off': whether the training process ran TensorFlow's oneDNN kernels, as its
    results say (None from results written before they said). Rows before this recorded
    TF_ENABLE_ONEDNN_OPTS itself ('0')."""
    state = (trained.get("environment") or {}).get("onednn")
    return None if state is None else ("on" if state else "off")


def protocol_row(experiment: str, recipe: str, seed: int, args, overrides: dict, key: str,
                 trained: dict, scored: dict, curve: list[dict], load: dict,
                 reference_ips: float | None) -> dict:
    config = trained["config"]
    images = trained.get("images_per_second") or 0.0
    last = curve[-1] if curve else {}
    label = EXPERIMENTS[experiment][recipe]
    finetuned = config["mode"] == "train_and_finetune"
    is_reference = recipe == REFERENCE[experiment]
    tune_images, tune_seconds = finetune_cost(trained)
    return make_row(
        "fashion_protocol", machine=machine(), backend="tensorflow", variant=label,
        resolution=config["train_resolution"], batch=config["micro_batch_size"],
        precision=config["precision"], images_per_second=images,
        reference=(EXPERIMENTS[experiment][REFERENCE[experiment]]
                   if reference_ips or is_reference else label),
        reference_images_per_second=reference_ips or images,
        experiment=experiment, recipe=recipe, flagfile=f"flags/{flagfile(recipe).name}",
        run_key=key, schedule={"digest": json.loads(key)["digest"], **overrides},
        seed=seed, quick=bool(args.quick), smoke=bool(args.smoke),
        overrides=overrides, model=config["model"], dataset=config["dataset"],
        train_resolution=config["train_resolution"], test_resolution=config["test_resolution"],
        epochs=config["epochs"], finetune_epochs=config["finetune_epochs"] if finetuned else 0,
        train_images=train_images(trained), finetune_images=tune_images,
        finetune_seconds=round(tune_seconds, 1) if tune_seconds else None,
        finetune_images_per_second=(round(trained["finetune_images_per_second"], 2)
                                    if tune_seconds else None),
        top1=round(scored["top1"], 4), top5=round(scored["top5"], 4),
        flip_top1=round(scored["flip_top1"], 4) if "flip_top1" in scored else None,
        test_images=scored.get("images"), eval_split=scored["split"],
        val_top1_before_finetune=trained.get("top1_before_finetune"),
        val_top1=trained.get("top1"), curve=curve,
        train_seconds=last.get("train_seconds"), seconds=round(trained["wall_seconds"], 1),
        onednn=onednn_state(trained), **load)


def evaluate_run(recipe, seed, run_dir, overrides, split, log, timeout) -> dict:
    """Scores the shipped model on `split` once (one pass and, as the recipe asks, flips)."""
    out = run_dir / "results-evaluate.json"
    run_command(command(recipe, seed, run_dir, overrides, "--mode=evaluate",
                        f"--eval_split={split}"), log, timeout)
    scored = json.loads(out.read_text())
    scored["split"] = split
    return scored


def pass_overrides(args) -> dict:
    """The flags a smoke or quick pass sets over each recipe (none for the full schedule)."""
    return dict(SMOKE if args.smoke else QUICK if args.quick else {})


def run_one(experiment: str, recipe: str, seed: int, args, path: Path, runs: Path) -> dict:
    overrides = pass_overrides(args)
    key = run_key(recipe, seed, overrides)
    run_dir = runs / f"{recipe}-s{seed}"
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir.parent / f"{recipe}-s{seed}.log"
    # A run of another version of the recipe is neither resumed nor reused: the training
    # command starts afresh (--noresume moves the earlier run into run_dir/previous/).
    stale = run_dir_is_stale(run_dir, key, recipe, overrides)
    if stale:
        print(f"  {run_dir}: {stale}; training afresh (the earlier run moves to "
              f"{run_dir / 'previous'})", flush=True)
    write_atomically(run_dir / RUN_KEY_FILE, json.dumps({"run_key": key}) + "\n")
    with LoadSampler(args.load_every) as sampler:
        if stale or finished(run_dir) is None:  # else a stopped benchmark trained it already
            extra = ("--noresume",) if stale else ()
            run_command(command(recipe, seed, run_dir, overrides, *extra), log,
                        args.run_timeout)
    trained = finished(run_dir)
    if trained is None:
        raise RuntimeError(f"{run_dir} has no results.json and model.keras after training")
    split = "validation" if args.smoke else "test"
    scored = evaluate_run(recipe, seed, run_dir, overrides, split, log, args.run_timeout)
    reference = None
    if recipe != REFERENCE[experiment]:
        for row in read_rows(path) if path.exists() else []:
            if (row.get("recipe") == REFERENCE[experiment] and row["seed"] == seed
                    and row.get("quick") == bool(args.quick)):
                reference = row["images_per_second"]
    row = protocol_row(experiment, recipe, seed, args, overrides, key, trained, scored,
                       read_curve(run_dir), sampler.summary(), reference)
    append_row(path, row)
    return row


# ---------------------------------------------------------------- the speed pass

def speed_overrides(args) -> dict:
    """One short epoch of the recipe (the smoke pass's, on digits, under --smoke)."""
    if args.smoke:
        return dict(SMOKE)
    return {**SPEED, "updates_per_epoch": (SPEED_QUICK_UPDATES if args.quick
                                           else SPEED["updates_per_epoch"])}


def speed_key(recipe: str, round_: int, overrides: dict) -> str:
    return json.dumps({"recipe": recipe, "round": round_,
                       "digest": recipe_digest(recipe, overrides)}, sort_keys=True)


def measure_speed(experiment: str, recipe: str, round_: int, args, path: Path, runs: Path,
                  reference_ips: float | None) -> dict:
    """Runs the recipe's training command for one short epoch (and its fine-tune) in a fresh
    directory and writes a row of the trainer's own images/s for each phase: the first step of
    each leaves tracing out, every later one counts its input pipeline too, as in a full run."""
    overrides = speed_overrides(args)
    run_dir = runs / "speed" / f"{recipe}-r{round_}"
    shutil.rmtree(run_dir, ignore_errors=True)  # a stopped measurement starts again
    run_dir.mkdir(parents=True)
    log = run_dir.parent / f"{recipe}-r{round_}.log"
    with LoadSampler(args.load_every) as sampler:
        run_command(command(recipe, 0, run_dir, overrides), log, args.run_timeout)
    trained = finished(run_dir)
    if trained is None:
        raise RuntimeError(f"{run_dir} has no results.json and model.keras after training")
    config = trained["config"]
    images = trained["images_per_second"]
    _, tune_seconds = finetune_cost(trained)
    label = EXPERIMENTS[experiment][recipe]
    reference = EXPERIMENTS[experiment][REFERENCE[experiment]]
    row = make_row(
        "fashion_protocol_speed", machine=machine(), backend="tensorflow", variant=label,
        resolution=config["train_resolution"], batch=config["micro_batch_size"],
        precision=config["precision"], images_per_second=images,
        reference=reference if reference_ips else label,
        reference_images_per_second=reference_ips or images,
        experiment=experiment, recipe=recipe, flagfile=f"flags/{flagfile(recipe).name}",
        run_key=speed_key(recipe, round_, overrides), round=round_, overrides=overrides,
        updates=overrides["updates_per_epoch"], smoke=bool(args.smoke), quick=bool(args.quick),
        train_resolution=config["train_resolution"], test_resolution=config["test_resolution"],
        finetune_images_per_second=(round(trained["finetune_images_per_second"], 3)
                                    if tune_seconds else None),
        seconds=round(trained["wall_seconds"], 1),
        onednn=onednn_state(trained),
        **sampler.summary())
    append_row(path, row, required=("run_key", "round", "recipe"))
    shutil.rmtree(run_dir, ignore_errors=True)
    return row


def speed_pass(experiment: str, recipes: list[str], args, path: Path, runs: Path) -> None:
    """`--speed-rounds` rounds, the recipes interleaved within each (the reference first, so
    that each row's ratio is to the reference measured in the same round); rounds already in
    the file are skipped."""
    done = {r["run_key"]: r for r in (read_rows(path) if path.exists() else [])
            if "run_key" in r}
    ordered = sorted(recipes, key=lambda r: r != REFERENCE[experiment])
    for round_ in range(args.speed_rounds):
        reference_ips = None
        for recipe in ordered:
            key = speed_key(recipe, round_, speed_overrides(args))
            if key in done:
                print(f"  speed round {round_} {recipe}: already in {path.name}, skipped",
                      flush=True)
                if recipe == REFERENCE[experiment]:
                    reference_ips = done[key]["images_per_second"]
                continue
            row = measure_speed(experiment, recipe, round_, args, path, runs, reference_ips)
            if recipe == REFERENCE[experiment]:
                reference_ips = row["images_per_second"]
            print(f"  speed round {round_} {recipe}: {row['images_per_second']:.0f} img/s "
                  f"training, fine-tune {row['finetune_images_per_second']}, load "
                  f"{row['load_average_mean']}", flush=True)


def speed_rates(path: Path, experiment: str, quick: bool, smoke: bool) -> dict:
    """Per recipe: the best round's training and fine-tune images/s (a shared machine only ever
    slows a run down), the spread over rounds and whether every round was quiet."""
    rows = [r for r in (read_rows(path) if path.exists() else [])
            if r.get("experiment") == experiment and bool(r.get("quick")) == quick
            and bool(r.get("smoke")) == smoke and current(r)]
    rates: dict = {}
    for row in rows:
        rates.setdefault(row["recipe"], []).append(row)
    out = {}
    for recipe, group in rates.items():
        train = [r["images_per_second"] for r in group]
        tune = [r["finetune_images_per_second"] for r in group
                if r.get("finetune_images_per_second")]
        out[recipe] = {"train": max(train), "finetune": max(tune) if tune else None,
                       "rounds": len(group), "spread": round(max(train) / min(train) - 1, 4),
                       "quiet": all(r.get("quiet") for r in group),
                       "load_average_mean": max(r["load_average_mean"] for r in group)}
    return out


# ---------------------------------------------------------------- reading the rows


def timeline(row: dict, rates: dict | None = None) -> list[dict]:
    """The run's validation top-1 against training seconds: one point per training epoch (its
    metrics.csv curve) and, for a recipe with a head fine-tune, one more after it (the shipped
    model's validation top-1 at the fine-tune's seconds added). With `rates` (the recipe's quiet
    images/s from `--speed`: `train` and `finetune`), the seconds are the images seen so far at
    those rates instead of the run's own, loaded, clock."""
    per_epoch = row["train_images"] / row["epochs"] if row.get("epochs") else None
    points = []
    for point in row["curve"]:
        seconds = point["train_seconds"]
        if rates is not None:
            seconds = point["epoch"] * per_epoch / rates["train"]
        points.append({"epoch": point["epoch"], "val_top1": point["val_top1"],
                       "train_seconds": seconds, "finetuned": False})
    if row.get("finetune_images") and row.get("val_top1") is not None and points:
        if rates is not None and rates.get("finetune"):
            extra = row["finetune_images"] / rates["finetune"]
        else:
            extra = row.get("finetune_seconds")
        if extra is not None and points[-1]["train_seconds"] is not None:
            points.append({"epoch": points[-1]["epoch"], "val_top1": row["val_top1"],
                           "train_seconds": points[-1]["train_seconds"] + extra,
                           "finetuned": True})
    return points


def first_reach(curve: list[dict], target: float) -> float | None:
    """Training seconds at the end of the first epoch whose validation top-1 reaches `target`
    (None when it never does)."""
    for point in curve:
        if point["val_top1"] is not None and point["val_top1"] >= target:
            return point["train_seconds"]
    return None


def summarize(rows: list[dict], experiment: str, rates: dict | None = None) -> dict:
    """Per recipe: test top-1 (one pass, flip), seconds, images/s as mean and 95% t interval;
    the seconds to first reach the reference's mean final validation top-1 (a fine-tuned
    recipe's last point is after its fine-tune). With `rates` (`speed_rates`), the same seconds
    again at each recipe's quiet rates: `quiet_seconds` for the whole run and
    `quiet_seconds_to_target`."""
    rates = rates or {}
    own = [r for r in rows if r.get("experiment") == experiment]
    by_recipe: dict = {}
    for row in own:
        by_recipe.setdefault(row["recipe"], []).append(row)
    reference = by_recipe.get(REFERENCE[experiment], [])
    target = (sum(r["curve"][-1]["val_top1"] for r in reference) / len(reference)
              if reference else None)
    summary = {}
    for recipe, group in by_recipe.items():
        reach = [first_reach(timeline(r), target) if target else None for r in group]
        summary[recipe] = {
            "label": EXPERIMENTS[experiment][recipe], "seeds": sorted(r["seed"] for r in group),
            "top1": mean_interval([r["top1"] for r in group]),
            "flip_top1": (mean_interval([r["flip_top1"] for r in group])
                          if all(r.get("flip_top1") is not None for r in group) else None),
            "train_seconds": mean_interval([r["train_seconds"] for r in group]),
            "images_per_second": mean_interval([r["images_per_second"] for r in group]),
            "quiet": all(r.get("quiet") for r in group),
            "top1_by_seed": {r["seed"]: r["top1"] for r in group},
            "target": target,
            "seconds_to_target": (mean_interval([s for s in reach if s is not None])
                                  if any(s is not None for s in reach) else None),
            "reached": sum(s is not None for s in reach),
            "final_val_top1": mean_interval([r["curve"][-1]["val_top1"] for r in group]),
            "final_top1": mean_interval([timeline(r)[-1]["val_top1"] for r in group]),
        }
        rate = rates.get(recipe)
        if rate is not None:
            lines = [timeline(r, rate) for r in group]
            quiet_reach = [first_reach(line, target) if target else None for line in lines]
            summary[recipe].update({
                "rate": rate,
                "quiet_seconds": mean_interval([line[-1]["train_seconds"] for line in lines]),
                "quiet_seconds_to_target": (
                    mean_interval([q for q in quiet_reach if q is not None])
                    if any(q is not None for q in quiet_reach) else None)})
    _reference_reaching_each(summary, reference, rates.get(REFERENCE[experiment]))
    return summary


def _reference_reaching_each(summary: dict, reference: list[dict], rate: dict | None) -> None:
    """Claim (b) read the other way: per recipe, the quiet seconds the reference's curves take
    to first reach that recipe's mean final top-1 (`reference_quiet_seconds_to_final`, over the
    reference seeds that reach it, `reference_reached_final` of them). For a recipe that ends
    below the target, this is the reference's time to the accuracy the recipe buys."""
    if not reference or rate is None:
        return
    lines = [timeline(r, rate) for r in reference]
    for s in summary.values():
        if "quiet_seconds" not in s:
            continue
        reach = [first_reach(line, s["final_top1"]["mean"]) for line in lines]
        found = [q for q in reach if q is not None]
        s["reference_quiet_seconds_to_final"] = mean_interval(found) if found else None
        s["reference_reached_final"] = len(found)


def _interval(result: dict | None, digits: int = 4) -> str:
    if result is None:
        return "-"
    if result["half_width"] is None:
        return f"{result['mean']:.{digits}f} (1 seed)"
    return f"{result['mean']:.{digits}f} +/- {result['half_width']:.{digits}f}"


def claim_b(summary: dict, experiment: str) -> list[str]:
    """One line per recipe: when it first reaches the reference's final validation top-1 at
    the quiet rates, against the reference's own time to it (or how far below it ends)."""
    reference = summary.get(REFERENCE[experiment])
    if reference is None or reference["target"] is None:
        return []
    lines = [f"claim (b), target {reference['target']:.4f} (the reference's mean final "
             "validation top-1); seconds at the speed pass's quiet rates:"]
    base = reference.get("quiet_seconds_to_target")
    for recipe, s in summary.items():
        if "quiet_seconds" not in s:
            lines.append(f"  {s['label']}: no speed row (--speed-rounds)")
            continue
        reach = s["quiet_seconds_to_target"]
        seeds = len(s["seeds"])
        if reach is None:
            line = (f"  {s['label']}: never reaches it ({seeds} seed(s)); ends at "
                    f"{_interval(s['final_top1'])}, "
                    f"{reference['target'] - s['final_top1']['mean']:.4f} below, after "
                    f"{s['quiet_seconds']['mean']:.0f} s")
            back = s.get("reference_quiet_seconds_to_final")
            if back is not None:
                line += (f"; the reference first reaches {s['final_top1']['mean']:.4f} after "
                         f"{_interval(back, 0)} s in {s['reference_reached_final']} of "
                         f"{len(reference['seeds'])} seed(s), "
                         f"{back['mean'] / s['quiet_seconds']['mean']:.2f}x this recipe's")
            lines.append(line)
            continue
        ratio = (f", {reach['mean'] / base['mean']:.2f}x the reference's"
                 if base and recipe != REFERENCE[experiment] else "")
        lines.append(f"  {s['label']}: reaches it after {_interval(reach, 0)} s in "
                     f"{s['reached']} of {seeds} seed(s){ratio}")
    return lines


def current(row: dict) -> bool:
    """Whether `row` was measured with its recipe's flagfile as it is now (rows of earlier
    versions stay in the file, as history, and are left out of the reading)."""
    return (flagfile(row["recipe"]).is_file() and json.loads(row["run_key"])["digest"]
            == recipe_digest(row["recipe"], row.get("overrides") or {}))


def current_rows(path: Path, experiment: str, quick: bool = False,
                 smoke: bool = False) -> list[dict]:
    """The rows the report reads: `experiment`'s, of the pass asked for, of the recipes as
    they are now (`current`)."""
    return [r for r in (read_rows(path) if path.exists() else [])
            if bool(r.get("quick")) == quick and bool(r.get("smoke")) == smoke
            and r.get("experiment") == experiment and current(r)]


def _figure(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cpu(name: str | None) -> str:
    """A CPU's model name without its trademarks and clock ('Intel Xeon', 'AMD EPYC')."""
    if not name:
        return "not recorded"
    name = re.sub(r"\((R|TM|tm)\)", "", name).split(" @")[0].replace(" Processor", "")
    return " ".join(name.split())


def seeds_table(rows: list[dict], experiment: str) -> str:
    """Every run of `experiment` as a Markdown table, recipes in the experiment's order and
    seeds ascending: test top-1 (one pass, flip), its difference from the reference recipe's
    run at the same seed, final validation top-1 (and before the head fine-tune, where a recipe
    has one), and the images/s, mean load, oneDNN state and CPU the run trained under
    (docs/results.md holds it verbatim)."""
    order = list(EXPERIMENTS[experiment])
    reference = {r["seed"]: r["top1"] for r in rows if r["recipe"] == REFERENCE[experiment]}
    tuned = any(r.get("val_top1_before_finetune") is not None for r in rows)
    header = ([f"{experiment} run", "seed", "test top-1", "with flip",
               f"minus {EXPERIMENTS[experiment][REFERENCE[experiment]]}, same seed",
               "final validation top-1"] + (["before the head fine-tune"] if tuned else [])
              + ["images/s as trained", "mean load", "oneDNN", "CPU"])
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in sorted(rows, key=lambda r: (order.index(r["recipe"]), r["seed"])):
        base = reference.get(row["seed"])
        diff = ("-" if base is None or row["recipe"] == REFERENCE[experiment]
                else f"{row['top1'] - base:+.4f}")
        cells = ([row["variant"], str(row["seed"]), f"{row['top1']:.4f}",
                  _figure(row.get("flip_top1")), diff, _figure(row.get("val_top1"))]
                 + ([_figure(row.get("val_top1_before_finetune"))] if tuned else [])
                 + [f"{row['images_per_second']:.0f}", _figure(row.get("load_average_mean"), 1),
                    row.get("onednn") or "not recorded",
                    _cpu((row.get("machine") or {}).get("cpu"))])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report(path: Path, experiment: str, quick: bool, smoke: bool = False) -> dict:
    rows = current_rows(path, experiment, quick, smoke)
    rates = speed_rates(path.with_name(SPEED_FILE), experiment, quick, smoke)
    summary = summarize(rows, experiment, rates)
    kind = " (smoke pass)" if smoke else " (quick pass)" if quick else ""
    print(f"\n{experiment}{kind}: {len(summary)} recipes")
    print(f"{'recipe':28s} {'test top-1':>18s} {'flip':>18s} {'train s':>16s} "
          f"{'img/s':>14s} {'s to target':>16s} seeds quiet")
    for s in summary.values():
        print(f"{s['label']:28s} {_interval(s['top1']):>18s} {_interval(s['flip_top1']):>18s} "
              f"{_interval(s['train_seconds'], 0):>16s} "
              f"{_interval(s['images_per_second'], 0):>14s} "
              f"{_interval(s['seconds_to_target'], 0):>16s} {s['seeds']} {s['quiet']}")
    if rates:
        print(f"\nat the speed pass's quiet rates ({SPEED_FILE}, best round):")
        print(f"{'recipe':28s} {'train img/s':>12s} {'fine-tune':>10s} {'rounds':>6s} "
              f"{'spread':>7s} {'run s':>16s} quiet")
        for s in summary.values():
            rate = s.get("rate")
            if rate is None:
                continue
            tune = f"{rate['finetune']:.0f}" if rate["finetune"] else "-"
            print(f"{s['label']:28s} {rate['train']:12.0f} {tune:>10s} {rate['rounds']:6d} "
                  f"{rate['spread']:7.2f} {_interval(s['quiet_seconds'], 0):>16s} "
                  f"{rate['quiet']}")
        for line in claim_b(summary, experiment):
            print(line)
    reference = summary.get(REFERENCE[experiment])
    for recipe, s in summary.items():
        if reference is None or recipe == REFERENCE[experiment]:
            continue
        diff = paired_difference(s["top1_by_seed"], reference["top1_by_seed"])
        if diff is not None:
            print(f"  {s['label']} - {reference['label']}: {_interval(diff)} "
                  f"({'separated' if diff['separated'] else 'not separated'})")
    if rows:
        print(f"\nevery run (docs/results.md):\n{seeds_table(rows, experiment)}")
    if rows and summary:
        draw_curves(path.with_name(f"fashion_protocol_{experiment}"
                                   f"{'_quick' if quick else ''}.png"), rows, experiment, rates)
    return summary


def seed_points(lines: list[list[dict]]) -> list[list[dict]]:
    """The seeds' `timeline` points grouped for a mean and a band: one group per training epoch
    that every seed's curve has and validated (matched by epoch number, not position, so that a
    run whose curve lost an epoch's row cannot shift the others), then the fine-tuned points
    when every seed has one."""
    by_epoch = [{q["epoch"]: q for q in line if not q["finetuned"]} for line in lines]
    common = sorted(set.intersection(*(set(e) for e in by_epoch))) if by_epoch else []
    points = [[seed[e] for seed in by_epoch] for e in common]
    points = [p for p in points if all(q["val_top1"] is not None for q in p)]
    finetuned = [line[-1] for line in lines if line and line[-1]["finetuned"]]
    if points and len(finetuned) == len(lines):
        points.append(finetuned)
    return points


def draw_curves(png: Path, rows: list[dict], experiment: str,
                rates: dict | None = None) -> Path | None:
    """Validation top-1 against training seconds: per recipe, the mean over seeds at each epoch
    with a band from the lowest to the highest seed. Where `rates` (the speed pass) covers every
    recipe drawn, the seconds are at those quiet rates, else each run's own."""
    try:
        from benchmarks import charts

        plt = charts._pyplot()
    except ImportError:
        print(f"no chart for {png}: matplotlib is not installed here")
        return None
    fig, ax = plt.subplots(figsize=(8, 5))
    by_recipe: dict = {}
    for row in rows:
        if row.get("experiment") == experiment:
            by_recipe.setdefault(row["recipe"], []).append(row)
    quiet_axis = bool(rates) and all(recipe in rates for recipe in by_recipe)
    for recipe, group in by_recipe.items():
        lines = [timeline(r, rates[recipe] if quiet_axis else None) for r in group]
        points = seed_points(lines)
        if not points:
            continue
        seconds = [sum(q["train_seconds"] for q in p) / len(p) for p in points]
        means = [sum(q["val_top1"] for q in p) / len(p) for p in points]
        seeds = f"{len(group)} seed{'s' if len(group) != 1 else ''}"
        quiet = ("" if quiet_axis or all(r.get("quiet") for r in group)
                 else ", seconds loaded")
        handle, = ax.plot(seconds, means, "o-", markersize=3,
                          label=f"{EXPERIMENTS[experiment][recipe]} ({seeds}{quiet})")
        ax.fill_between(seconds, [min(q["val_top1"] for q in p) for p in points],
                        [max(q["val_top1"] for q in p) for p in points],
                        color=handle.get_color(), alpha=0.15)
        finals = [(line[-1]["train_seconds"], line[-1]["val_top1"]) for line in lines
                  if line and line[-1]["finetuned"]]
        if finals:
            ax.plot(*zip(*finals), "*", color=handle.get_color(), markersize=9)
    ax.set_xlabel("training seconds at the speed pass's quiet rates (images seen / images/s)"
                  if quiet_axis else "training seconds (validation and checkpoints excluded)")
    ax.set_ylabel("validation top-1 (band: lowest to highest seed)")
    ax.set_title(f"Fashion-MNIST, {experiment}: validation top-1 against training time "
                 "(stars: after the head fine-tune)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7, loc="lower right")
    return charts._save(plt, fig, png, chart_machine(rows, rates if quiet_axis else None,
                                                     list(by_recipe)))


def chart_machine(rows: list[dict], rates: dict | None, recipes: list[str]) -> dict:
    """The machine line under a curves chart. On the quiet axis the seconds are the speed
    pass's, so its load (the highest mean load of the drawn recipes' speed rounds) replaces the
    load the first training run started under."""
    machine = dict(rows[0]["machine"])
    if rates:
        machine["load_average_1m"] = (f"{max(rates[r]['load_average_mean'] for r in recipes):.2f}"
                                      " (speed pass)")
    return machine


# ---------------------------------------------------------------- command line


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("experiment", choices=list(EXPERIMENTS))
    parser.add_argument("--recipes", nargs="+", default=None,
                        help="a subset of the experiment's recipes (default: all)")
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--quick", action="store_true",
                        help="2 epochs of 20 updates per run: the whole path in minutes")
    parser.add_argument("--smoke", action="store_true",
                        help="1 epoch of 2 updates on digits, rows and runs in a temporary "
                             "folder (tests)")
    parser.add_argument("--runs-dir", default=None,
                        help="run directories (default runs/bench-fashion[-quick])")
    parser.add_argument("--run-timeout", type=float, default=6 * 3600.0,
                        help="seconds one training or evaluation command may take")
    parser.add_argument("--load-every", type=float, default=LOAD_SAMPLE_SECONDS)
    parser.add_argument("--speed-rounds", type=int, default=0,
                        help="after the training runs, measure each recipe's training and "
                             "fine-tune images/s this many rounds (one short epoch each, "
                             "interleaved; run it on a quiet machine), rows in "
                             f"{SPEED_FILE}; the report then gives seconds at those rates")
    parser.add_argument("--speed-only", action="store_true",
                        help="train no full schedule: only the speed pass and the report")
    parser.add_argument("--report-only", action="store_true",
                        help="train nothing: summarize and chart the rows already written")
    parser.add_argument("--output-dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    return parser


def main(argv=None) -> dict:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.speed_rounds < 0 or (args.speed_only and not args.speed_rounds):
        parser.error(f"--speed-rounds must be a whole number >= 0 (>= 1 with --speed-only), "
                     f"received {args.speed_rounds}")
    recipes = args.recipes or list(EXPERIMENTS[args.experiment])
    unknown = [r for r in recipes if r not in EXPERIMENTS[args.experiment]]
    if unknown:
        parser.error(f"--recipes {unknown} are not in {args.experiment}: "
                     f"{list(EXPERIMENTS[args.experiment])}")
    missing = [str(flagfile(r)) for r in recipes if not flagfile(r).is_file()]
    if missing:
        parser.error(f"recipe flagfiles missing: {missing} (python flags/generate.py)")
    scratch = Path(tempfile.mkdtemp(prefix="bench-fashion-protocol-")) if args.smoke else None
    # A smoke run's rows go to --output-dir where given (never benchmarks/results), so that the
    # benchmark smoke test can read them; its runs stay in the scratch folder.
    output = ((smoke_dir(args.output_dir) if args.output_dir else scratch) if args.smoke
              else results_dir(args.output_dir))
    runs = Path(args.runs_dir) if args.runs_dir else (
        scratch / "runs" if args.smoke
        else REPO / "runs" / ("bench-fashion-quick" if args.quick else "bench-fashion"))
    path = output / RESULTS_FILE
    try:
        if not args.report_only and not args.speed_only:
            done = done_keys(path)
            for seed in args.seeds:
                for recipe in recipes:
                    key = run_key(recipe, seed, pass_overrides(args))
                    if key in done:
                        print(f"  seed {seed} {recipe}: already in {path.name}, skipped",
                              flush=True)
                        continue
                    started = time.perf_counter()
                    row = run_one(args.experiment, recipe, seed, args, path, runs)
                    print(f"  seed {seed} {recipe}: test top-1 {row['top1']:.4f}"
                          f" (flip {row['flip_top1']}), {row['train_seconds']} s training at "
                          f"{row['images_per_second']:.0f} img/s, load "
                          f"{row['load_average_mean']}; {time.perf_counter() - started:.0f} s",
                          flush=True)
        if not args.report_only and args.speed_rounds:
            speed_pass(args.experiment, recipes, args, path.with_name(SPEED_FILE), runs)
        return report(path, args.experiment, args.quick, args.smoke)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
