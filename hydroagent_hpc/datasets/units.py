"""Discharge units: ft3/s, m3/s and depth per day over a basin.

* ``1 ft = 0.3048 m`` exactly (international foot, 1959), so ``1 ft3/s = 0.3048**3 m3/s =
  0.028316846592 m3/s`` exactly (CAMELS' readme rounds it to 0.0283168466).
* A flow ``Q`` (m3/s) over a basin of ``A`` km2 is a depth rate ``Q * 86400 / (A * 1e6)`` m/day
  ``= Q * 86.4 / A`` mm/day (Newman et al. 2015, HESS 19, 209-223, the CAMELS ``OBS_RUN``).

Missing values: CAMELS and USGS files write -999 (or -999999) for a missing day; the converters
here map every value <= -998 and every non-finite value to NaN, so a sentinel can never be
scaled into a plausible-looking number.
"""

from __future__ import annotations

import numpy as np

__all__ = ["CFS_TO_M3S", "MISSING_THRESHOLD", "as_missing", "cfs_to_m3s", "m3s_to_mm_per_day", "mm_per_day_to_m3s",
           "cfs_to_mm_per_day"]

CFS_TO_M3S = 0.3048 ** 3  # 0.028316846592, exact
MISSING_THRESHOLD = -998.0  # HydroAgent's rule: values <= -998 are missing


def as_missing(values) -> np.ndarray:
    """A float array with sentinels (<= -998) and non-finite values replaced by NaN."""
    v = np.asarray(values, dtype=np.float64)
    return np.where(np.isfinite(v) & (v > MISSING_THRESHOLD), v, np.nan)


def _area(area_km2: float) -> float:
    a = float(area_km2)
    if not np.isfinite(a) or a <= 0.0:
        raise ValueError(f"basin area {area_km2!r} km2 must be a positive number; take it from the CAMELS "
                         "attributes (area_gages2) or the forcing file's third header line (m2)")
    return a


def cfs_to_m3s(q_cfs) -> np.ndarray:
    """ft3/s to m3/s: ``Q * 0.028316846592``; missing values become NaN."""
    return as_missing(q_cfs) * CFS_TO_M3S


def m3s_to_mm_per_day(q_m3s, area_km2: float) -> np.ndarray:
    """m3/s to mm/day over ``area_km2``: ``Q * 86.4 / A``."""
    return as_missing(q_m3s) * 86.4 / _area(area_km2)


def mm_per_day_to_m3s(q_mm_d, area_km2: float) -> np.ndarray:
    """mm/day over ``area_km2`` to m3/s: ``q * A / 86.4``."""
    return as_missing(q_mm_d) * _area(area_km2) / 86.4


def cfs_to_mm_per_day(q_cfs, area_km2: float) -> np.ndarray:
    """ft3/s to mm/day over ``area_km2`` (CAMELS' ``Q_cfs * 0.0283168466 * 86400 / area_m2 * 1000``)."""
    return m3s_to_mm_per_day(cfs_to_m3s(q_cfs), area_km2)
