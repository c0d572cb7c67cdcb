"""Synthetic daily potential evapotranspiration (PET, mm/d) on a basin's grid.

A seasonal cycle (``mean + amplitude * cos(2 pi (day - midsummer) / 365.25)``, floored at
0.3 mm/d; midsummer is 15 July in the northern hemisphere), halved on days with 12 or more rainy
hours (cloud), a day-to-day log-normal wiggle (sigma 0.1), and a fixed spatial pattern: 15 % lower
at the basin's highest ground plus a faint random field. The climate's mean and amplitude come
from :data:`hydroagent_hpc.sim.synth.storms.CLIMATES`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from hydroagent_hpc.sim.synth.terrain import Terrain, smooth_field

__all__ = ["make_pet"]


def make_pet(rng: np.random.Generator, terrain: Terrain, pet_mm_d: tuple[float, float], lat: float,
             day_of_year: Sequence[float], rainy_hours: Sequence[float]) -> list[np.ndarray]:
    """One PET grid (mm/d, rounded to 0.01) per day, for days given by day of year and rainy hours."""
    mean, amp = pet_mm_d
    midsummer = 196.0 if lat >= 0 else 14.0
    basin, dem = terrain.basin, terrain.dem
    lo, hi = float(dem[basin].min()), float(dem[basin].max())
    height = np.clip((dem - lo) / max(hi - lo, 1e-6), 0.0, 1.0)
    space = (1.0 - 0.15 * height) * np.exp(0.05 * smooth_field(rng, terrain.shape, max(min(terrain.shape) / 4.0, 1.5)))
    out = []
    for doy, wet in zip(day_of_year, rainy_hours):
        level = max(0.3, mean + amp * math.cos(2.0 * math.pi * (doy - midsummer) / 365.25))
        level *= (1.0 - 0.5 * min(1.0, wet / 12.0)) * math.exp(rng.normal(0.0, 0.1))
        out.append(np.round(level * space, 2))
    return out
