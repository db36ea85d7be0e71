"""Shared benchmark plumbing: machine description, warm-up-then-time loops and JSON rows."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path

RESULTS_DIR = Path(__file__).resolve().parent / "results"


def machine() -> dict:
    """Where a figure was measured: CPU model, core count, platform and library versions."""
    cpu = platform.processor() or "unknown"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version()}
    try:
        import keras

        info["keras"] = keras.__version__
        info["backend"] = keras.backend.backend()
    except ImportError:
        pass
    if info.get("backend") == "tensorflow":
        import tensorflow as tf

        info["tensorflow"] = tf.__version__
    return info


def time_calls(fn, *, warmup: int, repeats: int) -> float:
    """Median seconds of `fn()` over `repeats` calls after `warmup` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    times.sort()
    return times[len(times) // 2]


def write_rows(name: str, rows: list[dict]) -> Path:
    """Writes `rows` as JSON lines to benchmarks/results/<name>.jsonl (atomically)."""
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    path = RESULTS_DIR / f"{name}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    with open(tmp, "w") as f:
        for row in rows:
            f.write(json.dumps(row, sort_keys=True) + "\n")
    os.replace(tmp, path)
    return path
