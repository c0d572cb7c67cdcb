"""The one timer of the benchmarks: the median wall time of repeated calls."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from typing import Any

__all__ = ["median_seconds"]


def median_seconds(fn: Callable[[], Any], repeats: int, warm_up: bool = True) -> float:
    """Median of ``repeats`` timed calls of ``fn`` (``time.perf_counter``), after one untimed call
    when ``warm_up`` (imports, caches, page cache)."""
    if warm_up:
        fn()
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)
