"""Metrics benchmark: ``metrics.evaluate`` on a 60-day hourly window (1,440 points).

``evaluate`` runs after every simulation of an episode, so it must cost far less than a
simulator run (goal: a few milliseconds). Each row is timed in the same run as its named baseline,
a bare ``metrics.nse`` call on the same data, and reports the ratio.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from hydroagent_hpc import metrics
from hydroagent_hpc.bench.timing import median_seconds

logger = logging.getLogger(__name__)

N_HOURS = 1440
BASELINE = "metrics.nse only"


def synthetic_pair(n: int = N_HOURS, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hourly obs/sim hydrographs with five events and noise, plus their time stamps."""
    rng = np.random.default_rng(seed)
    t = np.arange(n, dtype=np.float64)
    q = np.full(n, 4.0)
    for peak, height in zip(np.linspace(0.1 * n, 0.9 * n, 5), rng.uniform(20.0, 120.0, 5), strict=True):
        rise = (t >= peak - 8) & (t < peak)
        q[rise] += height * (t[rise] - (peak - 8)) / 8.0
        fall = t >= peak
        q[fall] += height * np.exp(-0.04 * (t[fall] - peak))
    obs = q * (1.0 + 0.05 * rng.standard_normal(n))
    sim = np.roll(q, 3) * 1.1
    times = np.datetime64("2021-06-01T00") + np.arange(n).astype("timedelta64[h]")
    return obs, sim, times


def run(repeats: int = 200) -> list[dict[str, Any]]:
    """Time ``evaluate`` (clean and with 5 % gaps) against a bare NSE call; median per call."""
    obs, sim, times = synthetic_pair()
    gappy = obs.copy()
    gappy[np.random.default_rng(1).random(obs.size) < 0.05] = np.nan
    gappy[:48] = -999.0  # EF5 sentinel over the first two days

    base_s = median_seconds(lambda: metrics.nse(obs, sim), repeats)
    rows: list[dict[str, Any]] = [
        {"name": f"metrics.nse {N_HOURS} h", "baseline": BASELINE,
         "seconds_per_call": base_s, "ratio_vs_baseline": 1.0},
    ]
    for name, o in ((f"metrics.evaluate {N_HOURS} h", obs),
                    (f"metrics.evaluate {N_HOURS} h, 5 % gaps", gappy)):
        def call(o: np.ndarray = o) -> None:
            metrics.evaluate(o, sim, times)

        seconds = median_seconds(call, repeats)
        rows.append({"name": name, "baseline": BASELINE, "seconds_per_call": seconds,
                     "ratio_vs_baseline": seconds / base_s})
    for row in rows:
        logger.info("%s: %.3f ms per call (%.1fx %s)", row["name"], 1e3 * row["seconds_per_call"],
                    row["ratio_vs_baseline"], row["baseline"])
    return rows
