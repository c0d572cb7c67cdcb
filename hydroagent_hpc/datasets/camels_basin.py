"""A CAMELS-US gauge written as a daily EF5 basin that ``hydroagent simulate`` and ``calibrate`` run.

CAMELS has basin-mean series, not grids, so the folder is built like this (every choice is
recorded in ``basin.json``):

* **River network: a synthetic template.** Two kinds (``network``):

  - ``comb`` (default): a main channel along the middle row flowing east to the gauge, fed by
    tributary columns flowing north and south into it, about ``target_cells`` cells, every flow
    direction cardinal. Chosen because EF5's kinematic wave treats overland flow per unit width
    and multiplies it by the flow length Δx, so a diagonal step (Δx = the cell's diagonal)
    creates water: with impervious cells and no evaporation a D8 template with 98 % diagonal
    steps returned 1.85x the rain volume (gauge 12010000). On the comb a tributary cell's rain
    arrives as ``e·Δy·Δx_east = e·area`` exactly; only the channel row's own rain scales by
    ``Δx_east/Δy = cos(lat)``, so the comb returns 1 - (1 - cos(lat))/nrows of it (0.97 at 46° N;
    ``tests/test_datasets_basin.py``).
    Elevations fall along the channel at the CAMELS style's gradient and rise away from it.
  - ``valley``: :func:`hydroagent_hpc.sim.synth.terrain.make_terrain` draws a valley DEM (seed = the
    gauge id), D8 directions and accumulation: a more natural width function, but volumes
    inflated by EF5's scheme as above.

  The style follows the CAMELS mean slope (< 15 m/km plains, < 60 hills, else mountains). The
  cell size is then rescaled (fixed-point steps, same cells) until EF5's cell areas
  (``(0.01 deg * 110574 m)^2 cos(lat)``, :mod:`hydroagent_hpc.sim.network`) add up to the
  gauge's drainage area (``area_gages2``, else the forcing header's area) to 0.01 %. The gauge
  cell's centre is at the gauge's latitude and longitude. It is NOT the real river: timing
  within a day is not resolved by daily data anyway.
* **Forcing: uniform basin means, one 1x1-cell ESRI ASCII grid per day** (about 100 bytes;
  EF5 samples a non-co-registered grid at each DEM cell's corner, and the one cell covers the
  whole DEM). Precipitation ``precip/P.YYYYMMDD.asc`` and PET ``pet/PET.YYYYMMDD.asc`` in mm/d,
  ``FREQ=1d``. EF5 stamps mark the END of the interval, so the file and the observation stamped
  ``D 00:00`` hold CAMELS day ``D-1`` (a local-time calendar day; the few hours to UTC are
  ignored at a daily step). PET: the file's own column (model output), else Priestley-Taylor
  or Hargreaves (:func:`hydroagent_hpc.datasets.pet.choose_method`).
* **Observations** ``obs/obs.csv``: USGS daily mean flow in m3/s (``cfs * 0.028316846592``);
  days flagged ``M`` are left out (EF5 then shows ``nan``), ``A:e`` days are kept.
* **Parameters**: uniform a-priori grids (one value per grid, so a multiplier scales a
  physical value): WM = 1000 * CAMELS ``max_water_content`` m (clipped 50-1000 mm, else 150),
  FC (Ksat) = 10 * ``soil_conductivity`` cm/h (clipped 0.5-50 mm/h, else 5), B 0.5, IM 0.01,
  LEAKI 0.1 per step (EF5 leaks ``LEAKI*IR`` per time step: 0.1 a day), ALPHA 1.6, BETA 0.6,
  ALPHA0 0.8; scalars at HydroAgent's default multipliers (:data:`hydroagent_hpc.params.DEFAULTS`).
* **Temperature** (where the forcing has it on every simulated day: the NLDAS, Daymet and
  Maurer files' Tmax/Tmin, the model output's TAIR): the daily mean ``(tmax + tmin) / 2`` in degC,
  one 1x1 grid per day like precipitation, ``temp/T.YYYYMMDD.asc`` (EF5's ``[TempForcing]``
  ``TYPE=ASC UNIT=C FREQ=1d``, the same end-of-day stamps). Without ``snow`` they are written but
  not named in the control file, which is then exactly what it was before.
* **Snow-17** (``snow=True``, ``--snow``): the control file also gets ``[TempForcing TEMP]``,
  ``[Snow17ParamSet SNOWPARAMS]`` at :data:`hydroagent_hpc.params.SNOW_DEFAULTS` and
  ``SNOW=SNOW17`` in the task, and the DEM is shifted (by a whole number of metres, so its slopes
  stay the same) until its mean is the basin's mean elevation (CAMELS ``elev_mean``, else the
  forcing header): Snow-17 takes air pressure from the DEM. The temperature grid has no DEM of
  its own, so no lapse rate is applied (the basin mean is used everywhere). Without ``snow`` the
  DEM keeps the template's elevations (they matter to nothing else: routing uses differences).
  ``--precip-column raim`` (rain + the benchmark's own snowmelt) cannot be combined with it.
* **Warm-up**: ``warmup_days`` before ``start`` are simulated but not scored
  (``TIME_WARMEND``). Where the record starts later, ``spinup="repeat"`` fills those days with
  the forcing 365 days later (a repeated year, recorded as ``spinup_days`` in basin.json);
  otherwise it is an error.
"""

from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from datetime import date, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.datasets import attributes as attr_mod
from hydroagent_hpc.datasets import camels, model_output, pet
from hydroagent_hpc.params import DEFAULTS, SNOW_DEFAULTS
from hydroagent_hpc.sim.controlfile import Forcing, Gauge
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import Grid, write_asc, write_tif
from hydroagent_hpc.sim.manifest import write_manifest
from hydroagent_hpc.sim.network import build_network
from hydroagent_hpc.sim.staging import staged_folder
from hydroagent_hpc.sim.synth.landscape import GRID_FILES
from hydroagent_hpc.sim.synth.terrain import NODATA, TERRAIN_STYLES, Terrain, cell_km, make_terrain
from hydroagent_hpc.sim.templates import basin_control_text

log = logging.getLogger(__name__)

__all__ = ["write_camels_basin", "load_camels_inputs", "WRITER_VERSION", "A_PRIORI"]

WRITER_VERSION = "2"  # 2: the comb network template by default
CONTROL_NAME = "control.txt"
A_PRIORI = {"b": 0.5, "im": 0.01, "leaki": 0.1, "alpha": 1.6, "beta": 0.6, "alpha0": 0.8}
def _day(text, name: str) -> date:
    try:
        return date.fromisoformat(str(text).strip()[:10])
    except ValueError:
        raise ValueError(f"--{name} {text!r} is not a date; write YYYY-MM-DD") from None


def load_camels_inputs(root, gauge_id: str, forcing: str = "nldas", attributes=None, precip_column: str = "prcp"):
    """Forcing (with PET), streamflow and attributes of one gauge: ``(forcing, pet_mm_d, pet_method, flow, attrs)``."""
    gid = camels.check_gauge_id(gauge_id)
    if forcing == "model_output":
        mo = model_output.read_model_output(model_output.find_model_output_file(root, gid))
        f = model_output.forcing_from_model_output(mo, precip_column)
    else:
        f = camels.read_forcing(camels.find_forcing_file(root, gid, forcing), source=forcing)
    folder = Path(attributes) if attributes else attr_mod.find_attribute_folder(root)
    attrs = attr_mod.read_attributes(folder, gid) if folder is not None else None
    if attrs is None and attributes is None:
        log.warning("no CAMELS attribute tables under %s: area and location come from the forcing header", root)
    flow = camels.read_streamflow(camels.find_streamflow_file(root, gid), gid)
    if f.pet is not None:
        return f, f.pet, "file", flow, attrs
    lat = f.lat if f.lat is not None else (attrs.lat if attrs else None)
    elev = f.elev_m if f.elev_m is not None else (attrs.elev_mean_m if attrs else None)
    doy = (f.dates - f.dates.astype("datetime64[Y]")).astype(np.int64) + 1
    method = pet.choose_method(f.tmax, f.tmin)
    if method == "hargreaves" and lat is not None:
        values = pet.hargreaves(f.tmax, f.tmin, lat, doy)
    elif method != "hargreaves" and lat is not None and elev is not None:
        values = pet.priestley_taylor(f.tmax, f.tmin, f.srad, f.dayl, f.vp, elev, lat, doy)
    else:
        need = "latitude" if method == "hargreaves" else "latitude and elevation"
        raise InputError(f"{f.path}: gauge {gid} has no PET column, and the {need} {method} PET needs are unknown",
                         fix="give --attributes DIR, a camels_attributes_v2.0 folder that lists this gauge")
    return f, values, method, flow, attrs


def _series(dates: np.ndarray, values: np.ndarray, first: date, last: date, spinup: str, what: str, path: str):
    """Values for every day first..last; days before the record repeat the year after (spinup='repeat')."""
    days = np.arange(np.datetime64(first, "D"), np.datetime64(last, "D") + 1)
    d0, d1 = dates[0], dates[-1]
    if days[-1] > d1:
        raise InputError(f"{path}: the {what} ends on {d1}, before the last day needed ({days[-1]})",
                         fix="give an earlier --end")
    idx = (days - d0).astype(np.int64)
    early = idx < 0
    if early.any():
        if spinup != "repeat":
            most = int((np.datetime64(first, "D") - d0).astype(int))
            raise InputError(f"{path}: the {what} starts on {d0}, but the warm-up needs {days[0]}",
                             fix=f"give fewer --warmup-days (at most {most} here, when --start is the first scored "
                                 "day), a later --start, or --spinup repeat")
        years = np.ceil(-idx[early] / 365.0).astype(np.int64)
        idx[early] = idx[early] + 365 * years
        if np.any(idx > dates.size - 1):
            raise InputError(f"{path}: too short to repeat a year for the spin-up", fix="give fewer --warmup-days")
    return days, values[idx], int(early.sum())


def _style(attrs) -> str:
    slope = attrs.slope_mean_m_per_km if attrs is not None else None
    if slope is None:
        return "hills"
    return "plains" if slope < 15 else "hills" if slope < 60 else "mountains"


NETWORKS = ("comb", "valley")


def comb_terrain(target_cells: int, cellsize_deg: float, lat: float, lon: float, style: str) -> Terrain:
    """A comb network with only cardinal flow directions (see the module docstring).

    ``nrows`` (odd) x ``ncols`` basin cells, about 1:1.5; the middle row is the main channel
    flowing east (ESRI D8 code 1), rows above flow south (4), rows below north (64). One cell
    east of the gauge, outside the basin, receives the outflow (EF5 needs the cell below the
    gauge). FAM counts upstream cells without the cell itself (SELFFAM=false).
    """
    nrows = max(3, int(round(math.sqrt(target_cells / 1.5))) | 1)
    ncols = max(3, int(round(target_cells / nrows)))
    mid = nrows // 2
    st = TERRAIN_STYLES[style]
    dy, dx = cell_km(cellsize_deg, lat)
    rows = np.arange(nrows)[:, None]
    cols = np.arange(ncols + 1)[None, :]
    fall = st.gradient_m_per_km * dx * (ncols - cols)  # the channel falls towards the outlet (east)
    side = st.gradient_m_per_km * st.side_ratio * dy * np.abs(rows - mid) + 1.0 * (rows != mid)
    dem = st.base_m + fall + side
    ddm = np.where(rows < mid, 4, np.where(rows > mid, 64, 1)) * np.ones((1, ncols + 1))
    fam = np.where(rows < mid, rows, nrows - 1 - rows) * np.ones((1, ncols + 1))
    fam[mid, :] = (nrows - 1) * (cols[0] + 1) + cols[0]
    basin = np.ones((nrows, ncols + 1), dtype=bool)
    basin[:, ncols] = False
    ddm[:, ncols] = NODATA
    fam[:, ncols] = NODATA
    ddm[mid, ncols] = 1  # the cell below the gauge
    fam[mid, ncols] = nrows * ncols
    xll = lon - (ncols - 1 + 0.5) * cellsize_deg
    yll = lat - (nrows - 1 - mid + 0.5) * cellsize_deg
    return Terrain(dem=dem.astype(float), ddm=ddm.astype(float), fam=fam.astype(float), basin=basin,
                   gauge=(mid, ncols - 1), xll=xll, yll=yll, cellsize=cellsize_deg, target_cells=float(target_cells))


def _template(gid: str, area_km2: float, lat: float, lon: float, target_cells: int, style: str,
              network: str = "comb"):
    """Terrain with about ``target_cells`` cells, its cell size rescaled so EF5's area is ``area_km2``."""
    dy, dx = cell_km(1.0, lat)
    cs0 = math.sqrt(area_km2 / target_cells / (dy * dx))
    if network == "comb":
        terrain = comb_terrain(target_cells, cs0, lat, lon, style)
    elif network == "valley":
        terrain = make_terrain(np.random.default_rng(int(gid)), area_km2=area_km2, cellsize_deg=cs0, lat=lat,
                               lon=lon, style=TERRAIN_STYLES[style])
    else:
        raise ValueError(f"--network {network!r}: choose one of {', '.join(NETWORKS)}")
    gr, gc = terrain.gauge
    nrows = terrain.shape[0]
    cs = terrain.cellsize
    for _ in range(8):
        xll, top = lon - (gc + 0.5) * cs, lat + (gr + 0.5) * cs
        geo = (float(xll), float(top - nrows * cs), float(cs), NODATA)
        grids = (Grid(terrain.masked_dem(), *geo), Grid(terrain.ddm, *geo), Grid(terrain.fam, *geo))
        net = build_network(*grids, [Gauge(gid, cellx=gc, celly=gr)], True, False)
        area = float(net.area.sum())
        if abs(area / area_km2 - 1.0) < 1e-5:
            break
        cs *= math.sqrt(area_km2 / area)
    return terrain, grids, net, area


def _asc_1x1(path: Path, geo: tuple, value: float, fmt: str) -> None:
    xll, yll, size = geo
    path.write_text(f"ncols 1\nnrows 1\nxllcorner {xll!r}\nyllcorner {yll!r}\ncellsize {size!r}\n"
                    f"NODATA_value -9999\n{value:{fmt}}\n")


TEMP_FORCING = Forcing("TEMP", "ASC", "C", "1d", Path("temp"), "T.YYYYMMDD.asc")


def _control_text(gid: str, cell: tuple[int, int], begin: datetime, warm: datetime | None, end: datetime,
                  header: str, snow: bool = False) -> str:
    return basin_control_text(
        header=[header,
                "written by hydroagent_hpc.datasets.camels_basin; all paths relative: cd here && ef5 control.txt"],
        gauge=gid, cell=cell, precip=Forcing("PRECIP", "ASC", "mm/d", "1d", Path("precip"), "P.YYYYMMDD.asc",
                                                            kind="precip"),
        pet=Forcing("PET", "ASC", "mm/d", "1d", Path("pet"), "PET.YYYYMMDD.asc"), timestep="1d", begin=begin,
        warm=warm, end=end, grid_files=GRID_FILES, scalars=DEFAULTS, temp=TEMP_FORCING if snow else None,
        snow=dict(SNOW_DEFAULTS) if snow else None)


def _a_priori(attrs) -> dict[str, float]:
    v = dict(A_PRIORI)
    mwc = attrs.values.get("max_water_content") if attrs else None
    ks = attrs.values.get("soil_conductivity") if attrs else None
    v["wm"] = float(np.clip(1000.0 * mwc, 50.0, 1000.0)) if isinstance(mwc, float) else 150.0
    v["fc"] = float(np.clip(10.0 * ks, 0.5, 50.0)) if isinstance(ks, float) else 5.0
    return {k: round(x, 4) for k, x in v.items()}


@dataclass(frozen=True)
class _Request:
    """The checked scalar arguments of :func:`write_camels_basin`."""

    gid: str
    first: date  # first scored day
    last: date  # last scored day
    warmup_days: int

    @property
    def warm_first(self) -> date:
        return self.first - timedelta(days=self.warmup_days)


@dataclass(frozen=True)
class _Site:
    """Where the gauge is and how large its basin is (CAMELS attributes, else the forcing header)."""

    name: str
    area_km2: float
    area_source: str
    lat: float
    lon: float


@dataclass(frozen=True)
class _Daily:
    """The simulated days with their forcing, and the discharge observed within them."""

    days: np.ndarray  # datetime64[D], warm-up included
    prcp: np.ndarray  # mm/d
    pet: np.ndarray  # mm/d
    spun: int  # days filled by repeating the year after (spinup="repeat")
    q_days: np.ndarray  # datetime64[D] of the observations within ``days``
    q: np.ndarray  # m3/s, NaN where missing
    flags: dict[str, int]  # USGS qualification flags within ``days`` and their counts
    temp: np.ndarray | None = None  # degC, daily mean of tmax and tmin; None where the forcing lacks it
    temp_missing: int = 0  # simulated days without a temperature (then ``temp`` is None)


def _check_request(gauge_id: str, start: object, end: object, warmup_days: object, spinup: str,
                   target_cells: int) -> _Request:
    gid = camels.check_gauge_id(gauge_id)
    first, last = _day(start, "start"), _day(end, "end")
    if last < first:
        raise ValueError(f"--end {last} is before --start {first}")
    if isinstance(warmup_days, bool) or not isinstance(warmup_days, int) or warmup_days < 0:
        raise ValueError(f"--warmup-days {warmup_days!r} must be a whole number >= 0")
    if spinup not in ("none", "repeat"):
        raise ValueError(f"--spinup {spinup!r}: use none or repeat")
    if not 40 <= int(target_cells) <= 5000:
        raise ValueError(f"target_cells={target_cells!r} must be within 40..5000")
    return _Request(gid, first, last, warmup_days)


def _check_out(out: Path) -> None:
    """``out`` must be new, empty, or an earlier basin written here (which is then replaced)."""
    if not (out.exists() and any(out.iterdir())):
        return
    meta = out / "basin.json"
    try:
        ok = json.loads(meta.read_text()).get("generator", {}).get("module") == __name__
    except (OSError, ValueError, AttributeError):
        ok = False
    if not ok:
        raise ValueError(f"--out {out} exists and is not a basin written by from-camels; give a new or empty folder")


def _site(gid: str, f: Any, attrs: Any) -> _Site:
    area = attrs.area_km2 if attrs and attrs.area_km2 else f.area_km2
    area_src = "area_gages2 (camels_topo.txt)" if attrs and attrs.area_km2 else "forcing file header (line 3)"
    lat = attrs.lat if attrs and attrs.lat is not None else f.lat
    lon = attrs.lon if attrs else None
    if area is None or lat is None or lon is None:
        raise InputError(f"gauge {gid}: area, latitude or longitude unknown (no CAMELS attributes for it)",
                         fix="give --attributes DIR, a camels_attributes_v2.0 folder that lists this gauge")
    name = attrs.name if attrs and attrs.name else gid
    return _Site(name, float(area), area_src, float(lat), float(lon))


def _daily(req: _Request, f: Any, pet_values: np.ndarray, flow: Any, spinup: str) -> _Daily:
    """Forcing for every simulated day (spun up if asked) and the observations among them."""
    days, prcp, spun = _series(f.dates, f.prcp, req.warm_first, req.last, spinup, "forcing", f.path)
    _, pet_d, _ = _series(f.dates, pet_values, req.warm_first, req.last, spinup, "forcing", f.path)
    in_run = (flow.dates >= days[0]) & (flow.dates <= days[-1])
    q = flow.q_m3s[in_run]
    q_days = flow.dates[in_run]
    scored = (q_days >= np.datetime64(req.first)) & np.isfinite(q)
    if not scored.any():
        raise InputError(f"{flow.path}: no observed discharge between {req.first} and {req.last}",
                         fix="pick --start/--end inside the streamflow record "
                             f"({flow.dates[0]}..{flow.dates[-1]})")
    flags = {str(k): int(v) for k, v in zip(*np.unique(flow.flags[in_run], return_counts=True))}
    _, t_mean, _ = _series(f.dates, (np.asarray(f.tmax, float) + np.asarray(f.tmin, float)) / 2.0, req.warm_first,
                           req.last, spinup, "forcing", f.path)
    missing = int((~np.isfinite(t_mean)).sum())
    return _Daily(days, prcp, pet_d, spun, q_days, q, flags, None if missing else t_mean, missing)


def _clock(req: _Request, days: np.ndarray) -> tuple[datetime, datetime | None, datetime]:
    """TIME_BEGIN, TIME_WARMEND (None without a warm-up) and TIME_END: stamps end a day (see the module doc)."""
    begin = datetime.combine(days[0].astype(date), datetime.min.time())
    warm = datetime.combine(req.first + timedelta(days=1), datetime.min.time()) if req.warmup_days else None
    end = datetime.combine(req.last + timedelta(days=1), datetime.min.time())
    return begin, warm, end


def _write_grids(folder: Path, dem: Grid, ddm: Grid, fam: Grid, prior: dict[str, float], temp: bool = False) -> None:
    """The basin folders, the DEM, directions and accumulation, and one uniform grid per parameter."""
    for sub in ("basic", "params", "precip", "pet", "obs", "output", *(("temp",) if temp else ())):
        (folder / sub).mkdir(parents=True)
    write_asc(folder / "basic" / "dem.asc", dem, fmt="%.2f")
    write_asc(folder / "basic" / "ddm.asc", ddm, fmt="%d")
    write_asc(folder / "basic" / "fam.asc", fam, fmt="%d")
    for key, fname in GRID_FILES.items():
        write_tif(folder / "params" / fname, Grid(np.full(dem.data.shape, prior[key]), dem.xll, dem.yll, dem.cellsize,
                                                  NODATA))


def _write_forcing(folder: Path, dem: Grid, daily: _Daily) -> None:
    """One 1x1 grid per day covering the whole DEM, stamped at the end of its day."""
    size = (max(dem.nrows, dem.ncols) + 2) * dem.cellsize
    geo = (dem.xll - dem.cellsize, dem.yll - dem.cellsize, size)
    stamps = [(d + np.timedelta64(1, "D")).astype(date) for d in daily.days]
    for stamp, p_mm, e_mm in zip(stamps, daily.prcp, daily.pet):
        _asc_1x1(folder / "precip" / f"P.{stamp:%Y%m%d}.asc", geo, float(p_mm), ".2f")
        _asc_1x1(folder / "pet" / f"PET.{stamp:%Y%m%d}.asc", geo, float(e_mm), ".3f")
    if daily.temp is not None:
        for stamp, t_c in zip(stamps, daily.temp):
            _asc_1x1(folder / "temp" / f"T.{stamp:%Y%m%d}.asc", geo, float(t_c), ".2f")


def _at_elevation(dem: Grid, elevation_m: float) -> tuple[Grid, float]:
    """``dem`` shifted by a whole number of metres so its basin cells average ``elevation_m``; and the shift."""
    valid = dem.data != NODATA
    shift = float(round(elevation_m - float(np.mean(dem.data[valid]))))
    data = np.where(valid, dem.data + shift, NODATA)
    return Grid(data, dem.xll, dem.yll, dem.cellsize, NODATA), shift


def _write_observations(path: Path, daily: _Daily) -> None:
    """``obs.csv`` in m3/s, stamped at the end of each day; missing days are left out."""
    rows = ["Date,Discharge(m3/s)"] + [f"{(d + np.timedelta64(1, 'D')).astype(date):%Y-%m-%d} 00:00,{v:.4f}"
                                       for d, v in zip(daily.q_days, daily.q) if np.isfinite(v)]
    path.write_text("\n".join(rows) + "\n")


def _basin_meta(req: _Request, site: _Site, daily: _Daily, *, f: Any, flow: Any, attrs: Any, pet_method: str,
                network: str, style: str, cells: int, dem: Grid, model_area: float, prior: dict[str, float],
                clock: tuple[datetime, datetime | None, datetime], settings: dict[str, Any]) -> dict[str, Any]:
    """The ``basin.json`` record: every choice the writer made and where each number came from."""
    gid = req.gid
    begin, warm, t_end = clock
    if network == "comb":
        kind = "synthetic template: cardinal comb (camels_basin.comb_terrain)"
    else:
        kind = "synthetic template: D8 valley (hydroagent_hpc.sim.synth.terrain.make_terrain)"
    return {
        "name": f"camels_{gid}", "gauge": gid, "gauge_name": site.name, "synthetic": False,
        "description": f"CAMELS-US gauge {gid}: real daily basin-mean forcing and USGS discharge on a synthetic "
                       "river-network template of the right area",
        "lat": site.lat, "lon": site.lon, "area_km2": round(model_area, 3), "area_km2_source": site.area_source,
        "area_km2_requested": site.area_km2, "huc02": attrs.huc02 if attrs else None,
        "network": {"kind": kind, "style": style, "seed": int(gid) if network == "valley" else None, "cells": cells,
                    "cellsize_deg": dem.cellsize,
                    "grid": {"nrows": dem.nrows, "ncols": dem.ncols, "xllcorner": dem.xll, "yllcorner": dem.yll}},
        "timestep": "1d", "time_convention": "stamps mark the end of the day: the step, forcing files and "
                                             "observation stamped D 00:00 are CAMELS day D-1",
        "time_begin": f"{begin:%Y-%m-%d %H:%M}", "time_warmend": f"{warm:%Y-%m-%d %H:%M}" if warm else None,
        "time_end": f"{t_end:%Y-%m-%d %H:%M}", "scored_days": [str(req.first), str(req.last)],
        "warmup_days": req.warmup_days, "spinup_days": daily.spun, "forcing": {"source": f.source, "file": f.path,
                                                                                **f.notes},
        "pet_method": pet_method, "pet_mean_mm_d": round(float(np.mean(daily.pet)), 3),
        "precip_mean_mm_d": round(float(np.mean(daily.prcp)), 3),
        "obs": {"file": flow.path, "days": int(np.isfinite(daily.q).sum()),
                "missing_days": int((~np.isfinite(daily.q)).sum()), "flags": daily.flags, "unit": "m3/s",
                "conversion": "cfs * 0.028316846592"},
        "a_priori": prior, "attributes": attrs.climate() if attrs else {}, "control": CONTROL_NAME,
        "files": {"precip": len(daily.days), "pet": len(daily.days),
                  **({"temp": len(daily.days)} if daily.temp is not None else {})},
        "temperature": ({"file": "temp/T.YYYYMMDD.asc", "unit": "degC", "value": "daily mean (tmax + tmin) / 2",
                         "mean_c": round(float(np.mean(daily.temp)), 3)} if daily.temp is not None else
                        {"file": None, "why": f"the forcing has no temperature on {daily.temp_missing} of the "
                                              f"{len(daily.days)} days"}),
        "generator": settings,
    }


def write_camels_basin(out_dir: str | Path, *, root: str | Path, gauge_id: str, start: object, end: object,
                       warmup_days: int = 365, forcing: str = "nldas", attributes: str | Path | None = None,
                       spinup: str = "none", precip_column: str = "prcp", target_cells: int = 150,
                       network: str = "comb", snow: bool = False, command: str | None = None) -> Path:
    """Write one CAMELS gauge as a daily EF5 basin in ``out_dir``; return its control file.

    ``start``/``end``: first and last scored day (inclusive); ``forcing``: nldas, daymet,
    maurer, maurer_extended or model_output; ``attributes``: a camels_attributes_v2.0 folder
    (default: the one under ``root``). ``out_dir`` must not exist or be empty, or hold an
    earlier basin written by this function (it is replaced). ``snow``: run Snow-17 in front of
    CREST (temperature forcing, the DEM at the basin's mean elevation, ``SNOW=SNOW17``; see the
    module docstring); the forcing must then have a temperature on every simulated day.

    The steps: check the request and the folder; read the gauge's inputs; place the gauge
    (:func:`_site`); cut the daily series (:func:`_daily`); size the network template
    (:func:`_template`); then write grids, forcing, observations, the control file, basin.json
    and the manifest into a staged folder that replaces ``out_dir`` only when complete.
    """
    req = _check_request(gauge_id, start, end, warmup_days, spinup, target_cells)
    gid = req.gid
    out = Path(out_dir)
    _check_out(out)
    if snow and forcing == "model_output" and precip_column == "raim":
        raise ValueError("--snow with --precip-column raim would melt the snow twice (RAIM is rain plus the "
                         "benchmark's own Snow-17 melt); use --precip-column prcp")
    f, pet_values, pet_method, flow, attrs = load_camels_inputs(root, gid, forcing, attributes, precip_column)
    site = _site(gid, f, attrs)
    daily = _daily(req, f, pet_values, flow, spinup)
    style = _style(attrs)
    terrain, (dem, ddm, fam), net, model_area = _template(gid, site.area_km2, site.lat, site.lon,
                                                          int(target_cells), style, network)
    elevation = attrs.elev_mean_m if attrs is not None and attrs.elev_mean_m is not None else f.elev_m
    shift = 0.0
    if snow:
        if daily.temp is None:
            raise InputError(f"{f.path}: --snow needs a temperature on every simulated day; {daily.temp_missing} of "
                             f"{len(daily.days)} days have none", fix="use nldas, daymet or maurer forcing, or leave "
                                                                      "out --snow")
        if elevation is None:
            raise InputError(f"gauge {gid}: --snow needs the basin's mean elevation (Snow-17 takes air pressure from "
                             "the DEM), and neither the attributes nor the forcing header give it",
                             fix="give --attributes DIR, a camels_attributes_v2.0 folder that lists this gauge")
        dem, shift = _at_elevation(dem, float(elevation))
    settings = {"module": __name__, "version": WRITER_VERSION, "gauge_id": gid, "root": str(Path(root).resolve()),
                "forcing": forcing, "precip_column": precip_column if forcing == "model_output" else "prcp",
                "attributes": str(Path(attributes).resolve()) if attributes else None, "start": str(req.first),
                "end": str(req.last), "warmup_days": warmup_days, "spinup": spinup, "target_cells": int(target_cells),
                "network": network, "snow": bool(snow)}
    prior = _a_priori(attrs)
    clock = _clock(req, daily.days)
    with staged_folder(out) as tmp:
        _write_grids(tmp, dem, ddm, fam, prior, temp=daily.temp is not None)
        _write_forcing(tmp, dem, daily)
        _write_observations(tmp / "obs" / "obs.csv", daily)
        (tmp / CONTROL_NAME).write_text(_control_text(gid, terrain.gauge, *clock,
                                                      f"CAMELS-US {gid} ({site.name}), daily, synthetic network "
                                                      "template" + (", Snow-17" if snow else ""), snow))
        meta = _basin_meta(req, site, daily, f=f, flow=flow, attrs=attrs, pet_method=pet_method, network=network,
                           style=style, cells=int(net.n), dem=dem, model_area=model_area, prior=prior, clock=clock,
                           settings=settings)
        if snow:
            meta["snow"] = {"model": "SNOW17", "params": dict(SNOW_DEFAULTS), "elevation_m": float(elevation or 0.0),
                            "dem_shift_m": shift, "lapse_rate": "none (basin-mean temperature without a DEM)"}
        (tmp / "basin.json").write_text(json.dumps(meta, indent=2) + "\n")
        write_manifest(tmp, source={"dataset": "CAMELS-US", "gauge_id": gid, "forcing": f.path, "streamflow": flow.path,
                                    "attributes": attrs.sources if attrs else [],
                                    "writer": f"{__name__} v{WRITER_VERSION}"},
                       command=command or f"write_camels_basin({settings})", basin=out.name)
    log.info("wrote CAMELS basin %s: %d cells, %.1f km2, %d days (%d spin-up), PET %s", out, net.n, model_area,
             len(daily.days), daily.spun, pet_method)
    return out / CONTROL_NAME
