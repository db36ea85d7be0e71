"""Shared benchmark plumbing: machine description, the JSON row schema and result files (timing:
`benchmarks.timing`)."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from benchmarks import charts

# The results' readers, re-exported.
from benchmarks.charts import STEP_CALLS_FIELDS, read_rows, step_calls_per_epoch  # noqa: F401
from keras_efficientnet.runs.environment import environment

RESULTS_DIR = Path(__file__).resolve().parent / "results"
# Where results go instead of benchmarks/results (tests and smoke runs point it elsewhere).
RESULTS_ENV = "KE_BENCH_RESULTS"

# Every row of every benchmark carries these fields (more may follow, per benchmark).
ROW_SCHEMA = {
    "benchmark": str,            # which measurement: train, inference, layer_fwd_bwd, ...
    "machine": dict,             # where it ran: CPU, cores, accelerator, library versions
    "backend": str,              # tensorflow, jax, torch
    "variant": str,              # the configuration measured
    "resolution": (int, type(None)),  # image (or feature map) side; None where it has none
    "batch": int,
    "precision": str,            # float32, mixed_bfloat16, uint8 (host pipeline output), ...
    "images_per_second": float,
    "reference": str,            # the variant it is compared with, measured in the same run
    "ratio_to_reference": float,  # images_per_second / the reference's (> 1 is faster)
}
# A latency row (how soon a command answers: bench_first_hour) has no images per second: it
# carries these instead, its ratio being latency_seconds / the reference's (< 1 is sooner).
LATENCY_SCHEMA = {
    "benchmark": str, "machine": dict, "variant": str, "latency_seconds": float,
    "reference": str, "ratio_to_reference": float,
}


@dataclasses.dataclass(frozen=True)
class RunMode:
    """How a benchmark run was asked for: `smoke` (a few steps at tiny sizes, to check that it
    runs; rows to a temporary folder), `quick` (fewer rounds; rows marked `"quick": true` in
    <name>_quick.jsonl, beside the full run's, which they never overwrite) and `resume_key` (the
    identity `benchmarks.targets` gives a run, written into every row so that a rerun of the
    same code and configuration on the same machine can skip it)."""

    smoke: bool = False
    quick: bool = False
    resume_key: str | None = None

    def file_name(self, name: str) -> str:
        return f"{name}_quick" if self.quick else name

    def mark(self, row: dict) -> dict:
        """`row` with this mode's fields (none for a plain full run)."""
        marks = {"smoke": self.smoke, "quick": self.quick}
        row = {**row, **{k: True for k, v in marks.items() if v}}
        if self.resume_key:
            row["resume_key"] = self.resume_key
        return row


def add_mode_arguments(parser: argparse.ArgumentParser) -> None:
    """--smoke, --quick and the hidden --resume-key of every benchmark (see RunMode)."""
    parser.add_argument("--smoke", action="store_true",
                        help="a few steps at tiny sizes, to check that the benchmark runs: rows "
                             "go to --output-dir or a temporary folder, never benchmarks/results")
    parser.add_argument("--quick", action="store_true",
                        help="fewer rounds and smaller sizes (make benchmark-quick): rows marked "
                             "quick, in <name>_quick.jsonl")
    parser.add_argument("--resume-key", default=None, help=argparse.SUPPRESS)


def parse_args(parser: argparse.ArgumentParser, argv: Sequence[str] | None, *,
               smoke: Sequence[str] = (), quick: Sequence[str] = (),
               command: Sequence[str] = ()) -> argparse.Namespace:
    """Parses `argv` (default sys.argv[1:]) with `parser` (which has add_mode_arguments' options
    and --output-dir). Under --smoke or --quick the preset options `smoke` or `quick` are
    parsed first, so that options given on the command line still win; `command` (a
    subcommand) goes before everything. Sets `args.mode` (a RunMode), and under --smoke an
    output folder outside benchmarks/results."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args([*command, *argv])
    if args.smoke and args.quick:
        parser.error("--smoke and --quick exclude each other: choose one")
    preset = smoke if args.smoke else quick if args.quick else ()
    if preset:
        args = parser.parse_args([*command, *preset, *argv])
    args.mode = RunMode(smoke=args.smoke, quick=args.quick, resume_key=args.resume_key)
    if args.smoke:
        try:
            args.output_dir = str(smoke_dir(args.output_dir))
        except ValueError as error:
            parser.error(str(error))
    return args


def smoke_dir(output_dir: str | os.PathLike | None = None) -> Path:
    """Where a smoke run writes: `output_dir`, else $KE_BENCH_RESULTS, else a new temporary
    folder; never benchmarks/results or a folder inside it (ValueError)."""
    chosen = output_dir or os.environ.get(RESULTS_ENV)
    if not chosen:
        path = Path(tempfile.mkdtemp(prefix="ke-bench-smoke-"))
        print(f"smoke run: rows go to {path}", flush=True)
        return path
    path = Path(chosen).resolve()
    if path == RESULTS_DIR or RESULTS_DIR in path.parents:
        raise ValueError(f"--smoke writes no rows to {RESULTS_DIR}: received --output-dir "
                         f"{chosen}; give another folder, or none for a temporary one")
    return path


class NonFiniteLossError(RuntimeError):
    """A benchmarked step produced a NaN or infinite loss: its timing means nothing."""


def free_ports(count: int) -> list[int]:
    """`count` TCP ports on 127.0.0.1 that were free a moment ago (for local TF_CONFIG clusters;
    another process may still take one before it is bound again)."""
    sockets = [socket.socket() for _ in range(count)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def check_finite(value, where: str) -> float:
    """Returns `value` as a float, or raises NonFiniteLossError naming `where`."""
    number = float(value)
    if not math.isfinite(number):
        raise NonFiniteLossError(f"non-finite loss {number} while benchmarking {where}: the "
                                 "figure would be meaningless, so the benchmark stops here")
    return number


def accelerator() -> dict:
    """The GPU as nvidia-smi names it (name, driver, memory), or {} without one."""
    if not shutil.which("nvidia-smi"):
        return {}
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,memory.total",
             "--format=csv,noheader"], capture_output=True, text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return {}
    lines = [line.strip() for line in out.stdout.splitlines() if line.strip()]
    if not lines:
        return {}
    name, driver, memory = (part.strip() for part in (lines[0].split(",") + ["", ""])[:3])
    return {"gpu": name, "gpu_count": len(lines), "driver": driver, "gpu_memory": memory}


def machine(**extra) -> dict:
    """Where a figure was measured: CPU model, cores, load, platform, the libraries this process
    has imported (keras, its backend, tensorflow, jax, torch, timm), whether TensorFlow's oneDNN
    was on where TensorFlow is loaded, and `extra` (e.g. the GPU)."""
    info = environment(libraries=("timm",))
    info.update(platform=platform.platform(),
                # A shared machine's other load lowers images/s: say how busy it was.
                load_average_1m=round(os.getloadavg()[0], 2))
    info.update(extra)
    return info


def make_row(benchmark: str, *, machine: dict, backend: str, variant: str,
             resolution: int | None, batch: int, precision: str, images_per_second: float,
             reference: str, reference_images_per_second: float, **extra) -> dict:
    """One result row in the shared schema; the ratio is computed here, never by hand."""
    row = {"benchmark": benchmark, "machine": machine, "backend": backend, "variant": variant,
           "resolution": resolution, "batch": int(batch), "precision": precision,
           "images_per_second": round(float(images_per_second), 3),
           "reference": reference,
           "ratio_to_reference": round(float(images_per_second)
                                       / float(reference_images_per_second), 4)}
    row.update(extra)
    validate_row(row)
    return row


def validate_row(row: dict) -> None:
    """Raises ValueError naming the field when `row` does not follow ROW_SCHEMA (or
    LATENCY_SCHEMA, for a row that measures latency_seconds)."""
    latency = "latency_seconds" in row
    schema = LATENCY_SCHEMA if latency else ROW_SCHEMA
    for field, kind in schema.items():
        if field not in row:
            raise ValueError(f"benchmark row lacks {field!r}: {sorted(row)}")
        value = row[field]
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or isinstance(value, bool):
            raise ValueError(f"benchmark row field {field!r} must be {kind}, received "
                             f"{row[field]!r}")
    for field in ("latency_seconds" if latency else "images_per_second", "ratio_to_reference"):
        if not (math.isfinite(row[field]) and row[field] > 0):
            raise ValueError(f"benchmark row field {field!r} must be finite and > 0, "
                             f"received {row[field]!r}")
    if not {"cpu", "cores"} <= set(row["machine"]):
        raise ValueError(f"benchmark row's machine must name cpu and cores: {row['machine']}")


def results_dir(output_dir: str | os.PathLike | None = None) -> Path:
    """`output_dir`, else $KE_BENCH_RESULTS, else benchmarks/results."""
    return Path(output_dir or os.environ.get(RESULTS_ENV) or RESULTS_DIR)


def write_rows(name: str, rows: list[dict], output_dir: str | os.PathLike | None = None) -> Path:
    """Checks `rows` against the schema and writes them as JSON lines to <dir>/<name>.jsonl
    (atomically); returns the path."""
    for row in rows:
        validate_row(row)
    directory = results_dir(output_dir)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.jsonl"
    # The same temp-and-rename as keras_efficientnet.atomic, kept here: importing any module of
    # the package imports Keras, which bench_gpu's parent process (no TensorFlow) must not.
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path


def write_results(name: str, rows: list[dict], output_dir: str | os.PathLike | None = None,
                  mode: RunMode = RunMode()) -> tuple[Path, Path | None]:
    """Writes <name>.jsonl (<name>_quick.jsonl for a quick run, rows marked by `mode`) and
    renders its .png next to it; returns both paths (the chart's is None, with the reason
    printed, where matplotlib is not installed)."""
    path = write_rows(mode.file_name(name), [mode.mark(row) for row in rows], output_dir)
    chart = charts.render(path)
    print(f"wrote {path}" + (f" and {chart}" if chart else ""))
    return path, chart
