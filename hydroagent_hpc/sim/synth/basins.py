"""Synthetic twin basins: a complete EF5 case with hidden "true" multipliers and noisy observations.

``synthesize_basin`` writes one basin folder that real EF5 can run (``cd DIR && ef5 control.txt``;
all paths are relative):

* ``basic/dem.asc ddm.asc fam.asc``: generated terrain, pit-filled, D8 and accumulation by
  pyflwdir (:mod:`hydroagent_hpc.sim.synth.terrain`); ESRI codes, FAM excluding self, -9999 outside;
* ``params/*.tif``: a-priori grids for wm, b, im, fc (ksat), leaki, alpha, beta, alpha0
  (:mod:`hydroagent_hpc.sim.synth.landscape`);
* ``precip/rain.YYYYMMDDHH.tif``: hourly rain (mm/h) for every step, dry hours included
  (:mod:`hydroagent_hpc.sim.synth.storms`); ``pet/PET.YYYYMMDD.tif``: daily PET (mm/d), seasonal;
* ``control.txt``: one SIMU task, CREST + KW, TIMESTEP=1h, warm-up to TIME_WARMEND, every
  multiplier at HydroAgent's defaults (``params.DEFAULTS``);
* ``obs/obs.csv``: the outlet discharge simulated with hidden true multipliers, plus a smooth
  timing warp (clock error up to 0.5-1.5 h) and heteroscedastic error (AR(1) log-normal, sigma
  0.05-0.09, plus a small additive floor);
* ``truth.json``: the true multipliers (13, EF5 order), the error model and its parameters, the
  seed, and what the defaults and the truth score against the observations;
* ``basin.json``: metadata (actual traced area, cells, window, storms, generator settings);
  ``output/``: an empty folder for EF5's output;
* ``manifest.json``: every file with its size and SHA-256 (:mod:`hydroagent_hpc.sim.manifest`),
  written last, checked before a campaign starts.

Everything comes from ``numpy.random.default_rng(seed)`` (spawned per component): the same seed
gives byte-identical files. ``DEMO_BASINS`` are four twins of the paper's held-out gauges;
``build_demo_basins`` writes them.
"""

from __future__ import annotations

import json
import logging
import math
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics import nse
from hydroagent_hpc.params import DEFAULTS
from hydroagent_hpc.sim.controlfile import Forcing
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.forcing import forcing_file_names, step_times
from hydroagent_hpc.sim.grids import Grid, write_asc, write_tif
from hydroagent_hpc.sim.manifest import MANIFEST_NAME, write_manifest
from hydroagent_hpc.sim.staging import staged_folder
from hydroagent_hpc.sim.synth.evaporation import make_pet
from hydroagent_hpc.sim.synth.landscape import GRID_FILES, make_parameter_grids
from hydroagent_hpc.sim.synth.storms import CLIMATES, make_rainfall
from hydroagent_hpc.sim.synth.terrain import NODATA, TERRAIN_STYLES, Terrain, cell_km, make_terrain
from hydroagent_hpc.sim.synth.truth import TRUTH_RANGES, draw_truth, implausibility, observe
from hydroagent_hpc.sim.templates import basin_control_text

log = logging.getLogger(__name__)

__all__ = ["GENERATOR_VERSION", "SynthSettings", "DemoBasin", "DEMO_BASINS", "synthesize_basin", "build_demo_basins",
           "read_truth", "auto_cellsize", "estimate_cells", "draw_truth", "TRUTH_RANGES", "synth_control_text"]

GENERATOR_VERSION = "1"
CONTROL_NAME = "control.txt"
MAX_AUTO_CELLS = 3500  # ~0.6 s for a 90-day hourly run of the embedded engine here
MIN_AUTO_CELLS = 150
MIN_CELLS = 40  # below this TH=10 leaves hardly any channel
MAX_CELLS = 50_000
MAX_DAYS = 400
TRUTH_DRAWS = 12  # candidate truths drawn before keeping the closest to plausible
_LADDER = (0.0025, 0.005, 0.01, 0.02, 0.025, 0.03, 0.04, 0.05, 0.0625, 0.08, 0.1, 0.125, 0.2, 0.25, 0.5)
_NAME_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


@dataclass(frozen=True)
class DemoBasin:
    """A synthetic twin of one of the paper's held-out gauges (not the real river)."""

    name: str
    gauge_id: str  # the USGS gauge it is modelled on
    gauge_name: str
    area_km2: float
    cellsize_deg: float
    seed: int
    lat: float
    lon: float
    start: str  # the paper's evaluation window start
    terrain: str
    climate: str
    resolution: str  # the cell size in words and why

    @property
    def description(self) -> str:
        return (f"synthetic twin modelled on USGS {self.gauge_id} ({self.gauge_name}, {self.area_km2:,.0f} km2); "
                "generated terrain, rain and discharge, NOT the real river")


DEMO_BASINS = (
    DemoBasin("syn_02338660", "02338660", "New River at GA 100, near Corinth, GA", 328.93, 0.01, 2338660,
              33.2357, -84.9876, "2018-07-01", "piedmont", "humid",
              "0.01 deg (1.1 x 0.93 km, ~1.0 km2), ~330 cells: the MRMS/CONUS-grid resolution"),
    DemoBasin("syn_01403060", "01403060", "Raritan River below Calco Dam at Bound Brook, NJ", 2033.14, 0.015, 1403060,
              40.55111111, -74.54833333, "2018-11-11", "hills", "humid",
              "0.015 deg (1.7 x 1.3 km, ~2.1 km2), ~1,000 cells: keeps the demo campaign (6,000 runs) near "
              "ten minutes; 0.01 deg gives ~2,200 cells"),
    DemoBasin("syn_06279500", "06279500", "Bighorn River at Kane, WY", 40792.33, 0.0625, 6279500,
              44.75852989, -108.1815559, "2018-06-13", "mountains", "semiarid",
              "0.0625 deg (6.9 x 4.9 km, ~34 km2), ~1,200 cells: 0.01 deg would be ~47,000 cells, 40x the run time"),
    DemoBasin("syn_07144100", "07144100", "Little Arkansas River near Sedgwick, KS", 3209.0, 0.02, 7144100,
              37.88306739, -97.4244864, "2019-03-30", "plains", "subhumid",
              "0.02 deg (2.2 x 1.75 km, ~3.9 km2), ~830 cells: 0.01 deg gives ~3,300 cells"),
)


# --------------------------------------------------------------------------- sizes
def estimate_cells(area_km2: float, cellsize_deg: float, lat: float) -> float:
    """Cells a basin of ``area_km2`` covers at this cell size and latitude."""
    dy, dx = cell_km(cellsize_deg, lat)
    return area_km2 / (dy * dx)


def auto_cellsize(area_km2: float, lat: float) -> float:
    """0.01 deg unless that gives more than 3,500 cells (coarser) or fewer than 150 (finer)."""
    if estimate_cells(area_km2, 0.01, lat) > MAX_AUTO_CELLS:
        coarser = [c for c in _LADDER if c > 0.01 and estimate_cells(area_km2, c, lat) <= MAX_AUTO_CELLS]
        return coarser[0] if coarser else _LADDER[-1]
    if estimate_cells(area_km2, 0.01, lat) < MIN_AUTO_CELLS:
        finer = [c for c in reversed(_LADDER) if c < 0.01 and estimate_cells(area_km2, c, lat) >= MIN_AUTO_CELLS]
        return finer[0] if finer else _LADDER[0]
    return 0.01


# --------------------------------------------------------------------------- arguments
def _parse_start(start: object) -> datetime:
    if isinstance(start, datetime):
        t = start
    else:
        try:
            t = datetime.fromisoformat(str(start).strip().replace(" ", "T"))
        except ValueError:
            raise ValueError(f"start={start!r} is not a date; write YYYY-MM-DD or 'YYYY-MM-DD HH:00'") from None
    if t.tzinfo is not None or t.minute or t.second or t.microsecond:
        raise ValueError(f"start={start!r} must be a whole UTC hour without a time zone; write e.g. 2021-06-01")
    return t


def _int(value: object, name: str, lowest: int, fix: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lowest:
        raise ValueError(f"{name}={value!r} must be an integer >= {lowest}; {fix}")
    return int(value)


def _real(value: object, name: str, fix: str) -> float:
    if (isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating))
            or not math.isfinite(value)):
        raise ValueError(f"{name}={value!r} must be a finite number; {fix}")
    return float(value)


@dataclass(frozen=True)
class SynthSettings:
    """The checked settings of one synthetic basin: what :func:`synthesize_basin` builds from.

    Make one with :meth:`from_arguments` (every argument checked, the cell size chosen when
    ``None``). :meth:`as_dict` is the ``generator`` record of ``basin.json``; the same settings
    give the same dict, so a finished basin is recognised by comparing it.
    """

    name: str
    area_km2: float
    window_days: int
    warmup_days: int
    seed: int
    cellsize_deg: float
    start: datetime  # first scored hour (TIME_WARMEND), UTC without a time zone
    lat: float
    lon: float
    terrain: str
    climate: str
    paper_gauge_id: str | None
    description: str

    @classmethod
    def from_arguments(cls, name: object, area_km2: object, window_days: object, warmup_days: object, seed: object,
                       cellsize_deg: object, start: object, lat: object, lon: object, terrain: object,
                       climate: object, paper_gauge_id: str | None, description: str) -> SynthSettings:
        """Check every argument (a ValueError names the argument and the fix)."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
            raise ValueError(f"name={name!r}: use a letter then letters, digits or underscores (it names the EF5 "
                             "gauge), e.g. syn_basin1")
        area = _real(area_km2, "area_km2", "give the drainage area in km2, e.g. 329")
        if area <= 0:
            raise ValueError(f"area_km2={area_km2!r} must be > 0; give the drainage area in km2, e.g. 329")
        window = _int(window_days, "window_days", 1, "give the evaluation window in whole days, e.g. 60")
        warmup = _int(warmup_days, "warmup_days", 0, "give the warm-up in whole days (0 for none), e.g. 30")
        if window + warmup > MAX_DAYS:
            raise ValueError(f"window_days + warmup_days = {window + warmup} is more than {MAX_DAYS} days of hourly "
                             "files; shorten the window or the warm-up")
        seed_ = _int(seed, "seed", 0, "give a non-negative integer")
        lat_ = _real(lat, "lat", "give the gauge latitude in degrees")
        lon_ = _real(lon, "lon", "give the gauge longitude in degrees")
        if abs(lat_) > 70:
            raise ValueError(f"lat={lat_} is outside -70..70 (geographic cells get too narrow); pick a lower latitude")
        if not -180 <= lon_ <= 180:
            raise ValueError(f"lon={lon_} is outside -180..180; give a longitude in degrees east (west is negative)")
        cs = _cellsize(cellsize_deg, area, lat_)
        if terrain not in TERRAIN_STYLES:
            raise ValueError(f"terrain={terrain!r} is unknown; use one of {', '.join(TERRAIN_STYLES)}")
        if climate not in CLIMATES:
            raise ValueError(f"climate={climate!r} is unknown; use one of {', '.join(CLIMATES)}")
        return cls(name=name, area_km2=area, window_days=window, warmup_days=warmup, seed=seed_, cellsize_deg=cs,
                   start=_parse_start(start), lat=lat_, lon=lon_, terrain=str(terrain), climate=str(climate),
                   paper_gauge_id=paper_gauge_id, description=description)

    @property
    def begin(self) -> datetime:
        """First simulated hour: the warm-up's start."""
        return self.start - timedelta(days=self.warmup_days)

    @property
    def end(self) -> datetime:
        """Last simulated hour (TIME_END)."""
        return self.start + timedelta(days=self.window_days)

    def as_dict(self) -> dict[str, Any]:
        """The ``generator`` record of basin.json (key order fixed: it is written as JSON)."""
        return {"module": __name__, "version": GENERATOR_VERSION, "name": self.name,
                "area_km2": self.area_km2, "window_days": self.window_days, "warmup_days": self.warmup_days,
                "seed": self.seed, "cellsize_deg": self.cellsize_deg, "start": f"{self.start:%Y-%m-%d %H:%M}",
                "lat": self.lat, "lon": self.lon, "terrain": self.terrain, "climate": self.climate,
                "paper_gauge_id": self.paper_gauge_id, "description": self.description}


def _cellsize(cellsize_deg: object, area: float, lat: float) -> float:
    """The checked cell size (chosen by :func:`auto_cellsize` when None), within the cell-count limits."""
    if cellsize_deg is None:
        cs = auto_cellsize(area, lat)
    else:
        cs = _real(cellsize_deg, "cellsize_deg", "give the cell size in degrees, e.g. 0.01, or None to choose")
        if not 0 < cs <= 1:
            raise ValueError(f"cellsize_deg={cellsize_deg!r} must be in (0, 1] degrees, e.g. 0.01, or None to choose")
    cells = estimate_cells(area, cs, lat)
    if cells < MIN_CELLS:
        raise ValueError(f"area_km2={area:g} at cellsize_deg={cs:g} is only {cells:.0f} cells "
                         f"(TH=10 needs >= {MIN_CELLS}); "
                         "give a smaller cellsize_deg (or None) or a larger area")
    if cells > MAX_CELLS:
        raise ValueError(f"area_km2={area:g} at cellsize_deg={cs:g} is {cells:,.0f} cells (at most {MAX_CELLS:,}); "
                         "give a larger cellsize_deg, or None to choose one that runs in about a second")
    return cs


# --------------------------------------------------------------------------- writers
def _tif(path: Path, terrain: Terrain, data: ArrayLike, compress: bool = False) -> None:
    write_tif(path, Grid(np.asarray(data, dtype=np.float64), terrain.xll, terrain.yll, terrain.cellsize, NODATA),
              compress=compress)


def _num(v: float) -> str:
    return repr(float(v))


def synth_control_text(s: SynthSettings, gauge: str, cell: tuple[int, int], temp: Forcing | None = None,
                       snow: Mapping[str, float] | None = None, snow_grids: Mapping[str, str] | None = None) -> str:
    """The ``control.txt`` of a synthetic basin made with ``s``: its header, the gauge ``gauge`` at ``cell``
    (row, column), hourly rain and daily PET from the basin folder, the parameter grids and default multipliers;
    with ``temp`` (the temperature forcing), ``snow`` (Snow-17 values) and ``snow_grids`` (their grids) the
    snow sections too (:mod:`hydroagent_hpc.sim.synth.snow`)."""
    return basin_control_text(
        header=[f"{s.name}: {s.description or 'synthetic basin'}",
                f"written by hydroagent_hpc.sim.synth.basins v{GENERATOR_VERSION}, seed {s.seed}; "
                "the true multipliers are",
                "in truth.json. Every path is relative: cd <this folder> && ef5 control.txt (output/ exists)."],
        gauge=gauge, cell=cell, precip=Forcing("RAIN", "TIF", "mm/h", "1h", Path("precip"), "rain.YYYYMMDDHH.tif",
                                                       kind="precip"),
        pet=Forcing("PET", "TIF", "mm/d", "1d", Path("pet"), "PET.YYYYMMDD.tif"), timestep="1h", begin=s.begin,
        warm=s.start, end=s.end, grid_files=GRID_FILES, scalars=DEFAULTS, temp=temp, snow=snow, snow_grids=snow_grids)


def _write_json(path: Path, data: dict[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2) + "\n")


def _write_obs(path: Path, times: Sequence[datetime], values: Sequence[float] | np.ndarray) -> None:
    rows = ["Date,Discharge(m3/s)"] + [f"{t:%Y-%m-%d %H:%M},{v:.3f}" for t, v in zip(times, values)]
    path.write_text("\n".join(rows) + "\n")


def _write_inputs(folder: Path, s: SynthSettings, rngs: Sequence[np.random.Generator]) -> dict[str, Any]:
    """Terrain, grids, forcing and the control file; returns what the metadata needs."""
    r_terrain, r_params, r_rain, r_pet = rngs
    start, begin, end = s.start, s.begin, s.end
    steps = step_times(begin, end, "1h")
    terrain = make_terrain(r_terrain, area_km2=s.area_km2, cellsize_deg=s.cellsize_deg, lat=s.lat,
                           lon=s.lon, style=TERRAIN_STYLES[s.terrain])
    rain, events = make_rainfall(r_rain, terrain, len(steps), s.warmup_days * 24, CLIMATES[s.climate],
                                 s.area_km2, begin.timetuple().tm_yday + begin.hour / 24.0)
    grids = make_parameter_grids(r_params, terrain)
    folder.mkdir(parents=True, exist_ok=True)
    for sub in ("basic", "params", "precip", "pet", "obs", "output"):
        (folder / sub).mkdir()
    geo = (terrain.xll, terrain.yll, terrain.cellsize, NODATA)
    write_asc(folder / "basic" / "dem.asc", Grid(terrain.masked_dem(), *geo), fmt="%.2f")
    write_asc(folder / "basic" / "ddm.asc", Grid(terrain.ddm, *geo), fmt="%d")
    write_asc(folder / "basic" / "fam.asc", Grid(terrain.fam, *geo), fmt="%d")
    for key, fname in GRID_FILES.items():
        _tif(folder / "params" / fname, terrain, grids[key])
    rain_f = Forcing("rain", "tif", "mm/h", "1h", folder / "precip", "rain.YYYYMMDDHH.tif", kind="precip")
    for t, fname in enumerate(forcing_file_names(rain_f, steps, begin)):
        _tif(folder / "precip" / fname, terrain, rain[t], compress=True)
    # Daily PET: the file stamped D serves the steps in (D-1 00:00, D 00:00], as EF5 reads it.
    pet_f = Forcing("pet", "tif", "mm/d", "1d", folder / "pet", "PET.YYYYMMDD.tif")
    pet_names = forcing_file_names(pet_f, steps, begin)
    pet_files = list(dict.fromkeys(pet_names))
    day_of = np.array([pet_files.index(n) for n in pet_names])
    wet = rain[:, terrain.basin].mean(axis=1) > 0.2
    days = range(len(pet_files))
    pets = make_pet(r_pet, terrain, CLIMATES[s.climate].pet_mm_d, s.lat,
                    [steps[int(np.argmax(day_of == k))].timetuple().tm_yday for k in days],
                    [float(wet[day_of == k].sum()) for k in days])
    for fname, grid in zip(pet_files, pets):
        _tif(folder / "pet" / fname, terrain, grid, compress=True)
    (folder / CONTROL_NAME).write_text(synth_control_text(s, s.name, terrain.gauge))
    # One missing value (-999) until the truth has been simulated: a header-only file would be
    # reported (rightly, for a user's basin) as an observation file with nothing to score against.
    _write_obs(folder / "obs" / "obs.csv", steps[:1], [-999.0])
    return {"terrain": terrain, "steps": steps, "events": events, "pet_files": len(pet_files), "begin": begin,
            "start": start, "end": end, "precip_mm": float(rain[:, terrain.basin].mean(axis=1).sum())}


def _write_truth(folder: Path, s: SynthSettings, r_truth: np.random.Generator,
                 r_noise: np.random.Generator) -> dict[str, Any]:
    """Simulate the hidden truth, write obs.csv and truth.json; return network facts."""
    sim = EmbeddedSimulator(folder / CONTROL_NAME, cache_dir=False)
    keep = ~sim.warmup
    area = float(sim.net.area.sum())
    q_default = sim.run().discharge
    best = None
    tries = 0
    while tries < TRUTH_DRAWS:
        tries += 1
        cand = draw_truth(r_truth)
        q = sim.run(cand).discharge
        # Identifiable but not absurd: the defaults should score between -10 and 0.85 against it.
        fit = nse(q[keep], q_default[keep], min_points=2)  # the candidate truth as the observations
        bad = implausibility(q, keep, area, base_flow=s.warmup_days > 0) + max(0.0, fit - 0.85, (-10.0 - fit) / 10.0)
        if best is None or bad < best[0]:
            best = (bad, cand, q)
        if bad == 0.0:
            break
    else:
        log.warning("%s: none of %d truth draws gave a plausible, identifiable hydrograph; keeping the closest",
                    s.name, tries)
    assert best is not None  # at least one draw ran
    _, truth, q_true = best
    obs, noise = observe(r_noise, q_true, keep)
    _write_obs(folder / "obs" / "obs.csv", sim.steps, obs)
    _write_json(folder / "truth.json", {
        "note": "HIDDEN: the multipliers that made obs/obs.csv. Agents must not read this file.",
        "basin": s.name, "generator_version": GENERATOR_VERSION, "seed": s.seed,
        "multipliers": truth, "defaults": dict(DEFAULTS), "noise": noise,
        "area_km2_requested": s.area_km2, "area_km2": round(area, 3), "cellsize_deg": s.cellsize_deg,
        "cells": sim.net.n,
        "diagnostics": {
            "nse_truth_vs_obs": round(nse(obs[keep], q_true[keep], min_points=2), 4),
            "nse_defaults_vs_obs": round(nse(obs[keep], q_default[keep], min_points=2), 4),
            "peak_q_m3s": round(float(q_true[keep].max()), 3), "mean_q_m3s": round(float(q_true[keep].mean()), 4),
            "min_q_m3s": round(float(q_true[keep].min()), 4), "truth_draws": tries},
    })
    return {"area": area, "nodes": sim.net.n, "channel_cells": int(np.sum(sim.net.fac > DEFAULTS["th"]))}


def _write_basin(folder: Path, s: SynthSettings) -> None:
    t0 = time.perf_counter()
    r_terrain, r_params, r_rain, r_pet, r_truth, r_noise = np.random.default_rng(s.seed).spawn(6)
    inp = _write_inputs(folder, s, (r_terrain, r_params, r_rain, r_pet))
    t1 = time.perf_counter()
    net = _write_truth(folder, s, r_truth, r_noise)
    terrain, steps = inp["terrain"], inp["steps"]
    _write_json(folder / "basin.json", {
        "name": s.name, "synthetic": True, "description": s.description, "paper_gauge_id": s.paper_gauge_id,
        "gauge": s.name, "gauge_cell": {"cellx": terrain.gauge[1], "celly": terrain.gauge[0]},
        "lat": s.lat, "lon": s.lon, "area_km2": round(net["area"], 3), "area_km2_requested": s.area_km2,
        "cellsize_deg": s.cellsize_deg, "nodes": net["nodes"], "channel_cells": net["channel_cells"],
        "grid": {"nrows": terrain.shape[0], "ncols": terrain.shape[1], "xllcorner": terrain.xll,
                 "yllcorner": terrain.yll},
        "timestep": "1h", "window_days": s.window_days, "warmup_days": s.warmup_days,
        "time_begin": f"{inp['begin']:%Y-%m-%d %H:%M}", "time_warmend": f"{inp['start']:%Y-%m-%d %H:%M}",
        "time_end": f"{inp['end']:%Y-%m-%d %H:%M}", "steps": len(steps), "control": CONTROL_NAME,
        "obs": "obs/obs.csv", "truth": "truth.json", "terrain": s.terrain, "climate": s.climate,
        "precip_basin_total_mm": round(inp["precip_mm"], 2), "storms": [e.as_dict(steps) for e in inp["events"]],
        "files": {"precip": len(steps), "pet": inp["pet_files"]},
        "generator": s.as_dict(),
    })
    write_manifest(folder, source={"dataset": "synthetic", "generator": f"{__name__} v{GENERATOR_VERSION}",
                                   "seed": s.seed, "paper_gauge_id": s.paper_gauge_id},
                   command=f"synthesize_basin({s.as_dict()})", basin=s.name)
    log.info("%s: %d cells, %d steps; inputs %.1f s, truth and obs %.1f s", s.name, net["nodes"], len(steps),
             t1 - t0, time.perf_counter() - t1)


# --------------------------------------------------------------------------- public API
def _is_synthetic(folder: Path) -> bool:
    try:
        meta = json.loads((folder / "basin.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and isinstance(meta.get("generator"), dict) and \
        meta["generator"].get("module") == __name__


def synthesize_basin(out_dir: str | Path, *, name: str, area_km2: float, window_days: int = 60, warmup_days: int = 30,
                     seed: int = 0, cellsize_deg: float | None = None, start: str = "2021-06-01", lat: float = 35.0,
                     lon: float = -97.0, terrain: str = "hills", climate: str = "humid",
                     paper_gauge_id: str | None = None, description: str = "") -> Path:
    """Write a synthetic basin into ``out_dir`` and return the path of its control file.

    ``cellsize_deg=None`` picks 0.01 deg, coarser if the basin would exceed 3,500 cells, finer if
    it would have fewer than 150 (see :func:`auto_cellsize`). ``terrain`` is one of
    ``TERRAIN_STYLES`` (plains, piedmont, hills, mountains), ``climate`` one of ``CLIMATES``
    (humid, subhumid, semiarid). An existing ``out_dir`` must be empty or an earlier synthetic
    basin (it is replaced); the basin is built beside it and moved in place at the end.
    """
    s = SynthSettings.from_arguments(name, area_km2, window_days, warmup_days, seed, cellsize_deg, start, lat, lon,
                                     terrain, climate, paper_gauge_id, description)
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or (any(out.iterdir()) and not _is_synthetic(out))):
        raise ValueError(f"out_dir={str(out)!r} exists and is not a synthetic basin; give a new or empty folder")
    t0 = time.perf_counter()
    with staged_folder(out) as tmp:
        _write_basin(tmp, s)
    log.info("wrote synthetic basin %s in %.1f s", out, time.perf_counter() - t0)
    return out / CONTROL_NAME


def _demo_settings(spec: DemoBasin, window_days: int, warmup_days: int) -> SynthSettings:
    return SynthSettings.from_arguments(spec.name, spec.area_km2, window_days, warmup_days, spec.seed,
                                        spec.cellsize_deg, spec.start, spec.lat, spec.lon, spec.terrain, spec.climate,
                                        spec.gauge_id, spec.description)


def _is_complete(folder: Path, settings: SynthSettings) -> bool:
    """True if ``folder`` holds a finished basin written with exactly these settings."""
    try:
        meta = json.loads((folder / "basin.json").read_text())
    except (OSError, ValueError):
        return False
    if meta.get("generator") != settings.as_dict():
        return False
    needed = [CONTROL_NAME, MANIFEST_NAME, "truth.json", "obs/obs.csv", "basic/dem.asc", "basic/ddm.asc",
              "basic/fam.asc", *(f"params/{f}" for f in GRID_FILES.values())]
    if not all((folder / p).is_file() for p in needed):
        return False
    files = meta.get("files", {})
    return (len(list((folder / "precip").glob("rain.*.tif"))) == files.get("precip")
            and len(list((folder / "pet").glob("PET.*.tif"))) == files.get("pet"))


def build_demo_basins(root: str | Path, *, window_days: int = 60, warmup_days: int = 30,
                      force: bool = False) -> list[Path]:
    """Write the four ``DEMO_BASINS`` under ``root/<name>``; return their control files.

    A basin whose folder is complete and was written with the same settings is kept unless
    ``force``.
    """
    root = Path(root)
    out = []
    for spec in DEMO_BASINS:
        folder = root / spec.name
        if not force and _is_complete(folder, _demo_settings(spec, window_days, warmup_days)):
            log.info("%s is up to date", folder)
        else:
            synthesize_basin(folder, name=spec.name, area_km2=spec.area_km2, window_days=window_days,
                             warmup_days=warmup_days, seed=spec.seed, cellsize_deg=spec.cellsize_deg,
                             start=spec.start, lat=spec.lat, lon=spec.lon, terrain=spec.terrain,
                             climate=spec.climate, paper_gauge_id=spec.gauge_id, description=spec.description)
        out.append(folder / CONTROL_NAME)
    return out


def read_truth(basin_dir: str | Path) -> dict[str, Any]:
    """The hidden truth of a synthetic basin: ``multipliers`` (13, EF5 order), ``noise``, seed, sizes."""
    path = Path(basin_dir) / "truth.json"
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path} not found: {basin_dir} is not a synthetic basin "
                         "(write one with synthesize_basin or `hydroagent basin synth`)") from None
