"""Synthetic hourly rainfall: storm events with spatial structure, on a basin's grid.

Three kinds of event, each placed so that it crosses the basin:

* ``convective``: a cluster of moving elliptic Gaussian rain cells (radius 4-12 km, aspect up to
  2.5, peak 10-50 mm/h, life 2-6 h) steered by a common wind from the west-southwest; larger
  basins get more cells per cluster. Most likely in midsummer and over small basins
  (:func:`convective_probability`);
* ``frontal``: a Gaussian rain band 20-60 km wide sweeping across the domain at 10-35 km/h with
  2-10 mm/h along its axis (at most 48 h);
* ``drizzle``: light patchy rain (0.2-0.8 mm/h) for 4-18 h.

Every event is modulated by a fixed random texture (log-normal, sigma 0.45) and a mild orographic
factor (+25 % at the basin's top), then scaled towards a basin-mean depth drawn from the
climate's event-depth distribution (gamma, shape 2): convective events by a factor 0.5-1.5,
fronts 0.5-2, never above 75 (convective) or 30 (frontal) mm/h. Event start times are a Poisson
process (at least 12 h apart), topped up with one storm early in the warm-up and with a few in the
evaluation window. Rates are mm/h, rounded to 0.01, below 0.1 set to zero (so dry hours exist).
Everything comes from the generator passed in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hydroagent_hpc.sim.synth.terrain import Terrain, cell_km, smooth_field

__all__ = ["Climate", "CLIMATES", "StormEvent", "make_rainfall", "convective_probability"]

MAX_RATE_MM_H = 100.0
_PEAK_CAP = {"convective": 75.0, "frontal": 30.0, "drizzle": 5.0}  # mm/h, after depth scaling
_SCALE = {"convective": (0.5, 1.5), "frontal": (0.5, 2.0)}  # how far depth scaling may go


@dataclass(frozen=True)
class Climate:
    """Storm statistics of a climate type."""

    events_per_30d: float  # mean number of storm events per 30 days
    event_depth_mm: float  # mean basin-average depth of a storm event
    convective_share: float  # probability that a storm event is convective (else frontal)
    drizzle_per_30d: float  # mean number of drizzle spells per 30 days
    pet_mm_d: tuple[float, float]  # (annual mean, seasonal amplitude) of PET, mm/d


CLIMATES = {
    "humid": Climate(6.0, 20.0, 0.55, 4.0, (3.0, 2.0)),
    "subhumid": Climate(5.0, 18.0, 0.65, 3.0, (3.6, 2.6)),
    "semiarid": Climate(3.5, 14.0, 0.75, 2.0, (4.0, 3.0)),
}


@dataclass(frozen=True)
class StormEvent:
    """What one event put on the grid (for the basin's metadata)."""

    kind: str
    start_step: int  # index of the first step it rains in
    hours: int
    basin_depth_mm: float  # basin-mean depth
    peak_mm_h: float  # highest cell rate

    def as_dict(self, step_times) -> dict:
        i = min(max(self.start_step, 0), len(step_times) - 1)
        return {"kind": self.kind, "start": f"{step_times[i]:%Y-%m-%d %H:%M}", "hours": self.hours,
                "basin_depth_mm": round(self.basin_depth_mm, 2), "peak_mm_h": round(self.peak_mm_h, 2)}


def _event_times(rng, nsteps: int, warm_steps: int, climate: Climate) -> list[int]:
    """Start steps of storm events: Poisson arrivals, topped up to one early in the warm-up (if it
    lasts a day or more) and to a few inside the evaluation window (one per 12 days, at least 2)."""
    mean_gap = 30.0 * 24.0 / climate.events_per_30d
    starts = []
    t = -rng.uniform(0.0, mean_gap)
    while True:
        t += max(12.0, rng.exponential(mean_gap))
        if t >= nsteps - 6:
            break
        starts.append(int(t))
    if warm_steps >= 24 and not any(0 <= s < 0.6 * warm_steps for s in starts):
        starts.append(int(rng.integers(0, int(0.6 * warm_steps))))  # wet the basin before the window
    window = nsteps - warm_steps
    need = max(2, int(round(window / 24.0 / 12.0)))
    last = nsteps - min(36, max(window // 3, 1))
    inside = [s for s in starts if warm_steps <= s < last]
    while len(inside) < need and last > warm_steps:
        s = int(rng.integers(warm_steps, last))
        inside.append(s)
        starts.append(s)
    return sorted(starts)


def _hit_point(rng, x, y, basin):
    k = int(rng.integers(basin.sum()))
    return float(x[basin][k]), float(y[basin][k])


def _convective(rng, x, y, basin, area_km2):
    """A cluster of moving elliptic rain cells; returns rates [hours, nrows, ncols] from the start."""
    heading = math.radians(rng.normal(20.0, 40.0))
    speed = rng.uniform(15.0, 45.0)
    vx, vy = speed * math.cos(heading), speed * math.sin(heading)
    n_cells = 1 + int(rng.poisson(min(0.5 + area_km2 / 1500.0, 12.0)))
    spread = 2 + n_cells // 2
    out = np.zeros((spread + 6,) + x.shape)
    for _ in range(n_cells):
        hx, hy = _hit_point(rng, x, y, basin)
        hx += rng.normal(0.0, 5.0)
        hy += rng.normal(0.0, 5.0)
        a = rng.uniform(4.0, 12.0)
        b = a / rng.uniform(1.0, 2.5)
        theta = rng.uniform(0.0, math.pi)
        peak = rng.uniform(10.0, 50.0)
        life = int(rng.integers(2, 7))
        tc = int(rng.integers(0, spread))
        ct, st = math.cos(theta), math.sin(theta)
        for k in range(life):
            dt_mid = k + 0.5 - life / 2.0
            cx, cy = hx + vx * dt_mid, hy + vy * dt_mid
            u = (x - cx) * ct + (y - cy) * st
            v = -(x - cx) * st + (y - cy) * ct
            bell = np.exp(-0.5 * (u * u / (a * a) + v * v / (b * b)))
            out[tc + k] += peak * math.sin(math.pi * (k + 0.5) / life) * bell
    return out


def _frontal(rng, x, y):
    """A rain band sweeping across the domain."""
    heading = math.radians(rng.normal(20.0, 45.0))
    nx, ny = math.cos(heading), math.sin(heading)
    speed = rng.uniform(10.0, 35.0)
    width = rng.uniform(20.0, 60.0)
    peak = rng.uniform(2.0, 10.0)
    s = x * nx + y * ny  # distance along the band's direction of travel
    s0, s1 = float(s.min()) - 1.5 * width, float(s.max()) + 1.5 * width
    hours = int(min(48, math.ceil((s1 - s0) / speed)))
    front = s0 + speed * (np.arange(hours) + 0.5)
    return peak * np.exp(-0.5 * ((s[None] - front[:, None, None]) / width) ** 2)


def _drizzle(rng, shape, scale_cells):
    """Light patchy rain, constant in time."""
    hours = int(rng.integers(4, 19))
    rate = rng.uniform(0.2, 0.8)
    patch = np.clip(0.4 + smooth_field(rng, shape, scale_cells), 0.0, 1.5)
    return np.broadcast_to(rate * patch, (hours,) + shape).copy()


def convective_probability(climate: Climate, area_km2: float, day_of_year: float, lat: float) -> float:
    """Chance that a storm event is convective: most likely in midsummer and over small basins."""
    midsummer = 196.0 if lat >= 0 else 14.0
    summer = 0.5 + 0.5 * math.cos(2.0 * math.pi * (day_of_year - midsummer) / 365.25)
    return climate.convective_share * (0.25 + 0.75 * summer) * min(1.0, math.sqrt(3000.0 / area_km2))


def make_rainfall(rng: np.random.Generator, terrain: Terrain, nsteps: int, warm_steps: int,
                  climate: Climate, area_km2: float, first_day_of_year: float) -> tuple[np.ndarray, list[StormEvent]]:
    """Hourly rain rates ``[nsteps, nrows, ncols]`` (float32, mm/h) and the events that made them.

    Step ``t`` covers the hour ending ``t + 1`` hours after the start; ``first_day_of_year`` is
    the (fractional) day of year of the start, for the season.
    """
    nrows, ncols = terrain.shape
    lat = terrain.yll + nrows * terrain.cellsize / 2.0
    dy, dx = cell_km(terrain.cellsize, lat)
    rr, cc = np.mgrid[0:nrows, 0:ncols]
    y = (nrows - 1 - rr + 0.5) * dy
    x = (cc + 0.5) * dx
    basin = terrain.basin
    dem = terrain.dem
    relief = float(dem[basin].max() - dem[basin].min()) or 1.0
    orographic = 1.0 + 0.25 * (dem - dem[basin].min()) / relief
    texture_cells = max(min(nrows, ncols) / 6.0, 1.5)
    rain = np.zeros((nsteps, nrows, ncols), dtype=np.float64)
    events: list[StormEvent] = []
    kinds = []
    for t0 in _event_times(rng, nsteps, warm_steps, climate):
        p = convective_probability(climate, area_km2, first_day_of_year + t0 / 24.0, lat)
        kinds.append((t0, "convective" if rng.uniform() < p else "frontal"))
    n_drizzle = int(rng.poisson(climate.drizzle_per_30d * nsteps / (30.0 * 24.0)))
    for _ in range(n_drizzle):
        kinds.append((int(rng.integers(0, nsteps)), "drizzle"))
    for t0, kind in kinds:
        if kind == "convective":
            part = _convective(rng, x, y, basin, area_km2)
        elif kind == "frontal":
            part = _frontal(rng, x, y)
        else:
            part = _drizzle(rng, (nrows, ncols), texture_cells)
        texture = np.exp(0.45 * smooth_field(rng, (nrows, ncols), texture_cells) - 0.1)
        part = part * (texture * orographic)
        if kind != "drizzle":
            depth = float(part[:, basin].mean(axis=1).sum())
            wanted = rng.gamma(2.0, climate.event_depth_mm / 2.0)
            lo, hi = _SCALE[kind]
            factor = min(hi, max(lo, wanted / depth if depth > 0 else 1.0), _PEAK_CAP[kind] / float(part.max()))
            part *= factor
        np.minimum(part, _PEAK_CAP[kind], out=part)
        a, b = max(t0, 0), min(t0 + part.shape[0], nsteps)
        if b <= a:
            continue
        part = part[a - t0:b - t0]
        rain[a:b] += part
        events.append(StormEvent(kind, a, b - a, float(part[:, basin].mean(axis=1).sum()), float(part.max())))
    np.minimum(rain, MAX_RATE_MM_H, out=rain)
    rain = np.round(rain, 2)
    rain[rain < 0.1] = 0.0
    events.sort(key=lambda e: (e.start_step, e.kind))
    return rain.astype(np.float32), events
