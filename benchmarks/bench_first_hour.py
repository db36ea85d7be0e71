"""How soon the commands answer a newcomer (issue 35): first output line, errors, exit, predict.

Run with `python -m benchmarks.bench_first_hour`. Each command runs as a user runs it (a fresh
`python -m keras_efficientnet...` process, its output on a pipe), and the clock reads when each
output line arrives:

- `train first line`: the training command's first line (what it loads), then it is stopped;
- `error: ...`: bad input the commands refuse in one line, before TensorFlow loads: ImageNet
  weights for a G16 preset, an unknown recipe, a missing image folder, a missing model file;
- `train exit after summary` (not under --smoke): a one-update run of the smoke recipe, from its
  summary's last line to the process's exit (the interpreter's last garbage collection once
  took 6-10 s here);
- `predict first result` (not under --smoke): `keras-efficientnet-predict` on 10 digits images
  with that run's model, to its first result line.

The reference, measured in the same run, is `python -c "import tensorflow"`: a ratio below 1
says the answer came before TensorFlow could have loaded. One JSON row per case (the latency
schema of benchmarks/common.py, the median of --rounds) to benchmarks/results/first_hour.jsonl;
`--smoke` measures the cases that need no training once (rows to a temporary folder), `--quick`
everything once (first_hour_quick.jsonl). A loaded machine stretches every figure: the rows
carry its load.
"""

from __future__ import annotations

import argparse
import os
import selectors
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # measure_predict's digits import loads it

from benchmarks.common import add_mode_arguments, machine, parse_args, write_rows

REPO = Path(__file__).resolve().parents[1]
# Two rounds: the second must not meet the first's run directories (a first-line run is killed
# holding its run's lock, and the next run there says so first).
SMOKE = ["--rounds=2", "--no-run"]
QUICK = ["--rounds=1"]
PREDICT_IMAGES = 10
REFERENCE = "python -c 'import tensorflow'"


def timed_lines(argv: list[str], *, stop_after_first: bool = False, timeout: float = 600,
                cwd: Path = REPO) -> tuple[list[tuple[float, str]], float, int]:
    """Runs `argv` with stdout and stderr on one pipe: ([(seconds, line)] as the lines
    arrived, seconds to exit, exit status). `stop_after_first`: kill it after its first line."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", PYTHONPATH=str(REPO))
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=cwd,
                            env=env, start_new_session=True)
    lines, pending = [], b""
    with selectors.DefaultSelector() as selector:
        selector.register(proc.stdout, selectors.EVENT_READ)
        while True:
            left = timeout - (time.perf_counter() - start)
            if left <= 0 or not selector.select(left):
                proc.kill()
                raise TimeoutError(f"{' '.join(argv)} did not finish in {timeout:.0f} s")
            chunk = os.read(proc.stdout.fileno(), 65536)
            now = time.perf_counter() - start
            if not chunk:
                break
            *complete, pending = (pending + chunk).split(b"\n")
            lines += [(now, line.decode(errors="replace")) for line in complete]
            if stop_after_first and lines:
                proc.kill()
                break
    status = proc.wait()
    return lines, time.perf_counter() - start, status


def _module(name: str, *args: str) -> list[str]:
    return [sys.executable, "-m", name, *args]


def reference_seconds() -> float:
    _, seconds, status = timed_lines([sys.executable, "-c", "import tensorflow"])
    if status:
        raise RuntimeError("python -c 'import tensorflow' failed: no reference")
    return seconds


def error_cases(folder: Path) -> dict[str, list[str]]:
    """Bad input, one case a line: the command refuses each before TensorFlow loads."""
    train = "keras_efficientnet.train"
    return {
        "error: --weights=imagenet for a G16 preset": _module(
            train, "--model=efficientnet-b0-g16-lnpn", "--weights=imagenet",
            f"--model_dir={folder / 'refused'}"),
        "error: --recipe=nosuch": _module(train, "--recipe=nosuch"),
        "error: --dataset=folder: a missing folder": _module(
            train, "--recipe=smoke", f"--dataset=folder:{folder / 'missing'}",
            f"--model_dir={folder / 'refused'}"),
        "error: predict a missing model file": _module(
            "keras_efficientnet.cli.predict", f"--model_file={folder / 'missing.keras'}",
            str(folder)),
    }


def measure_error(argv: list[str]) -> float:
    lines, seconds, status = timed_lines(argv)
    if status != 2 or not lines or not lines[-1][1].startswith("error: "):
        raise RuntimeError(f"{' '.join(argv)}: expected one error line and exit status 2, "
                           f"received {status}: {[line for _, line in lines][-3:]}")
    return seconds


def measure_first_line(folder: Path) -> float:
    lines, _, _ = timed_lines(_module("keras_efficientnet.train", "--recipe=smoke",
                                      f"--model_dir={folder / 'first-line'}"),
                              stop_after_first=True)
    if not lines or not lines[0][1].startswith("loading: "):
        raise RuntimeError(f"the training command's first line says nothing of what loads: "
                           f"{lines[:1]}")
    return lines[0][0]


def measure_run(folder: Path) -> tuple[float, Path]:
    """Seconds from a one-update training run's last line (its summary) to its exit; the
    model file it wrote."""
    run = folder / "run"
    lines, seconds, status = timed_lines(_module(
        "keras_efficientnet.train", "--recipe=smoke", f"--model_dir={run}",
        "--updates_per_epoch=1", "--eval_steps=1", "--finetune_epochs=0"))
    if status or not lines:
        raise RuntimeError(f"the training run failed ({status}): {lines[-5:]}")
    return seconds - lines[-1][0], run / "model.keras"


def measure_predict(model: Path) -> float:
    from keras_efficientnet.datasets.sources import digits

    images = sorted(digits.prepare_digits().rglob("*.png"))[:PREDICT_IMAGES]
    lines, _, status = timed_lines(_module("keras_efficientnet.cli.predict",
                                           f"--model_file={model}", *map(str, images)))
    if status or not lines or lines[0][1] != str(images[0]):
        raise RuntimeError(f"predict failed ({status}): {lines[:3]}")
    return lines[0][0]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="runs of each case (median)")
    parser.add_argument("--no-run", dest="run", action="store_false",
                        help="skip the cases that train (exit after summary, predict)")
    parser.add_argument("--output-dir", "--output_dir", dest="output_dir", default=None,
                        help="default $KE_BENCH_RESULTS or benchmarks/results")
    add_mode_arguments(parser)
    args = parse_args(parser, argv, smoke=SMOKE, quick=QUICK)
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, received {args.rounds}")
    seconds: dict[str, list[float]] = {}
    references = []
    with tempfile.TemporaryDirectory(prefix="ke-first-hour-") as tmp:
        for index in range(args.rounds):  # interleaved, so that a load change hits every case
            folder = Path(tmp) / f"round-{index}"  # each round's runs start from nothing
            folder.mkdir()
            references.append(reference_seconds())
            seconds.setdefault("train first line", []).append(measure_first_line(folder))
            for name, command in error_cases(folder).items():
                seconds.setdefault(name, []).append(measure_error(command))
            if args.run:
                wait, model = measure_run(folder)
                seconds.setdefault("train exit after summary", []).append(wait)
                seconds.setdefault(f"predict first result ({PREDICT_IMAGES} images)",
                                   []).append(measure_predict(model))
    reference = statistics.median(references)
    where = machine()
    rows = [{"benchmark": "command_latency", "machine": where, "backend": "tensorflow",
             "variant": name, "latency_seconds": round(statistics.median(values), 3),
             "rounds": len(values), "reference": REFERENCE,
             "reference_seconds": round(reference, 3),
             "ratio_to_reference": round(statistics.median(values) / reference, 4)}
            for name, values in seconds.items()]
    for row in rows:
        print(f"{row['variant']:45s} {row['latency_seconds']:7.2f} s  "
              f"({row['ratio_to_reference']:.2f} x {REFERENCE}: {reference:.2f} s)")
    path = write_rows(args.mode.file_name("first_hour"), [args.mode.mark(r) for r in rows],
                      args.output_dir)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
