"""Synthetic hourly hydrographs shared by the metric tests (test_metrics*.py)."""

from __future__ import annotations

import numpy as np

__all__ = ["T0", "hourly", "hydrograph", "noisy", "quickflow_loop"]

T0 = np.datetime64("2021-06-01T00:00")


def hourly(n: int, step_h: float = 1.0) -> np.ndarray:
    """``n`` regular time stamps from :data:`T0`, ``step_h`` hours apart."""
    return T0 + (np.arange(n) * round(step_h * 3600)).astype("timedelta64[s]")


def hydrograph(
    n: int = 1440,
    peaks: tuple[int, ...] = (200, 560, 900, 1250),
    heights: tuple[float, ...] = (80.0, 40.0, 120.0, 60.0),
    base: float = 5.0,
    rise: int = 8,
    k: float = 0.04,
    shift: int = 0,
) -> np.ndarray:
    """Baseflow plus events: linear rise over ``rise`` steps, then exponential fall at rate ``k``."""
    t = np.arange(n, dtype=float)
    q = np.full(n, base)
    for p, h in zip(peaks, heights, strict=True):
        p = p + shift
        up = (t >= p - rise) & (t < p)
        q[up] += h * (t[up] - (p - rise)) / rise
        down = t >= p
        q[down] += h * np.exp(-k * (t[down] - p))
    return q


def noisy(q: np.ndarray, seed: int, rel: float = 0.05) -> np.ndarray:
    """Multiplicative Gaussian noise, kept positive."""
    rng = np.random.default_rng(seed)
    return np.maximum(q * (1.0 + rel * rng.standard_normal(q.size)), 0.01)


def quickflow_loop(q: np.ndarray, alpha: float) -> np.ndarray:
    """Plain Lyne-Hollick forward pass, written as the textbook recursion."""
    qf = np.zeros(q.size)
    c = 0.5 * (1 + alpha)
    for t in range(1, q.size):
        qf[t] = min(max(alpha * qf[t - 1] + c * (q[t] - q[t - 1]), 0.0), q[t])
    return qf
