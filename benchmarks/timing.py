"""How every benchmark times a call, standard library only.

The timm children (`timm_peer`, `timm_deploy`) run under another interpreter without Keras or
TensorFlow and import this module as the project's own benchmarks do, so a figure and its
peer's are timed by the same code. The first calls of a step trace or compile it: `warmup`
calls run untimed first."""

from __future__ import annotations

import time
from collections.abc import Callable


def median_seconds(fn: Callable[[], object], *, warmup: int, repeats: int) -> float:
    """Seconds of one `fn()`: the median of `repeats` timed calls after `warmup` untimed ones
    (for an even count, the upper of the two middle timings)."""
    if repeats < 1:
        raise ValueError(f"repeats must be >= 1, got {repeats}")
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        times.append(time.perf_counter() - started)
    return sorted(times)[len(times) // 2]


def best_seconds(fn: Callable[[], object], *, warmup: int, batches: int,
                 repeats: int) -> float:
    """Seconds of one `fn()`: the best of `repeats` timings of `batches` calls in a row each,
    divided by `batches`, after `warmup` untimed calls."""
    if repeats < 1 or batches < 1:
        raise ValueError(f"repeats and batches must be >= 1, got {repeats} and {batches}")
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        for _ in range(batches):
            fn()
        best = min(best, (time.perf_counter() - started) / batches)
    return best
