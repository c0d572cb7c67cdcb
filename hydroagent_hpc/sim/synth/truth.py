"""The hidden truth of a synthetic basin and how it is observed.

* :func:`draw_truth`: true multipliers for the 13 parameters, drawn log-uniformly from a low or a
  high interval per parameter (:data:`TRUTH_RANGES`), inside HydroAgent's bounds but away from
  them and from the defaults; th and isu at their fixed values.
* :func:`implausibility`: whether a simulated hydrograph looks like a river of that size.
* :func:`observe`: the "observed" discharge: the true flow seen through a slowly drifting clock
  (a smooth time warp of at most 0.5-1.5 h) and a noisy rating: heteroscedastic AR(1) log-normal
  error (sigma 0.05-0.09, lag-one correlation 0.9, mean-corrected) plus a small additive white
  floor, clipped at zero and rounded to 0.001 m3/s.
"""

from __future__ import annotations

import math

import numpy as np
from scipy.ndimage import gaussian_filter1d

from hydroagent_hpc.params import DEFAULTS, PARAM_NAMES, PARAMS

__all__ = ["TRUTH_RANGES", "draw_truth", "implausibility", "observe"]

# Where the hidden truth is drawn: a low and a high interval per multiplier (None = not used),
# inside HydroAgent's bounds, away from them and from the default. Log-uniform within a side.
TRUTH_RANGES: dict[str, tuple] = {
    "wm": ((0.35, 0.75), (1.4, 3.0)), "b": ((0.3, 0.7), (1.4, 2.4)), "im": ((0.2, 0.7), None),
    "ke": ((0.85, 0.93), (1.07, 1.15)), "fc": ((0.3, 0.7), (1.3, 1.8)), "iwu": ((8.0, 16.0), (40.0, 70.0)),
    "under": ((0.3, 0.7), (1.5, 4.0)), "leaki": ((0.3, 0.7), (1.5, 3.0)), "alpha": ((0.4, 0.75), (1.4, 2.4)),
    "beta": ((0.75, 0.88), (1.12, 1.3)), "alpha0": (None, (0.25, 1.25)),
}


def draw_truth(rng: np.random.Generator) -> dict[str, float]:
    """True multipliers for all 13 parameters (EF5 order); th and isu at their fixed values."""
    out = {}
    for name in PARAM_NAMES:
        if PARAMS[name].fixed:
            out[name] = float(DEFAULTS[name])
            continue
        sides = [s for s in TRUTH_RANGES[name] if s is not None]
        lo, hi = sides[int(rng.integers(len(sides)))]
        out[name] = round(float(math.exp(rng.uniform(math.log(lo), math.log(hi)))), 4)
    return out


def implausibility(q: np.ndarray, keep: np.ndarray, area: float, base_flow: bool = True) -> float:
    """0 for a believable hydrograph, else how far off (log10 units).

    The window's peak must lie between 0.02 and 6 times ``area**-0.3`` m3/s per km2 (about 0.004-1.1
    at 329 km2, 0.0008-0.25 at 40,000 km2) and the 5th percentile flow must be above 1e-4 of it
    (a recession onto non-zero base flow, not a dry channel), unless ``base_flow`` is False
    (without a warm-up CREST starts from a dry channel).
    """
    post = q[keep]
    peak = float(post.max())
    if peak <= 0:
        return 10.0
    specific, envelope = peak / area, area ** -0.3
    off = max(0.0, math.log10(0.02 * envelope / specific), math.log10(specific / (6.0 * envelope)))
    low = float(np.percentile(post, 5))
    return off + (0.0 if low > 1e-4 * peak or not base_flow else 1.0)


def observe(rng: np.random.Generator, q: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, dict]:
    """'Observed' discharge: the truth seen through a drifting clock and a noisy rating."""
    n = q.size
    shift = float(rng.uniform(0.5, 1.5))
    warp = gaussian_filter1d(rng.standard_normal(n + 400), 24.0, mode="wrap")[200:200 + n]
    warp *= shift / max(float(np.abs(warp).max()), 1e-12)
    t = np.arange(n, dtype=np.float64)
    seen = np.interp(t + warp, t, q)  # obs at t shows the flow of time t + warp(t)
    sigma, phi = float(rng.uniform(0.05, 0.09)), 0.9
    z = rng.standard_normal(n)
    e = np.empty(n)
    e[0] = sigma * z[0]
    for i in range(1, n):
        e[i] = phi * e[i - 1] + math.sqrt(1.0 - phi * phi) * sigma * z[i]
    floor = 0.002 * float(q[keep].mean()) + 0.001
    obs = seen * np.exp(e - 0.5 * sigma * sigma) + rng.normal(0.0, floor, n)
    obs = np.round(np.maximum(obs, 0.0), 3)
    model = {"timing": {"kind": "smooth clock warp", "max_shift_h": round(shift, 4), "smoothing_h": 24.0,
                        "realised_max_shift_h": round(float(np.abs(warp).max()), 4)},
             "multiplicative": {"kind": "AR(1) log-normal, mean-corrected", "sigma_log": round(sigma, 4), "phi": phi},
             "additive": {"kind": "white Gaussian, clipped at 0", "sd_m3s": round(floor, 6)},
             "rounding_m3s": 0.001}
    return obs, model
