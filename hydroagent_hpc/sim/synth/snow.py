"""Snow cases: a synthetic basin with temperature forcing and Snow-17 switched on.

:func:`make_snow_case` writes a basin with :func:`~hydroagent_hpc.sim.synth.basins.synthesize_basin`
and then adds what a snow run needs, so the same case runs on EF5 (``cd DIR && ef5 control.txt``)
and on the embedded engine:

* ``temp/``: air temperature grids (degC), hourly (``FREQ=1h``, ``temp.YYYYMMDDHH.*``) or daily means
  (``FREQ=1d``, ``temp.YYYYMMDD.*``), as GeoTIFF or ESRI ASCII; ``coarse=True`` writes them on a grid
  three times coarser than the DEM with its own elevation grid (``temp/temp_dem.tif``, ``DEM=``), so
  EF5 applies its -6.5 degC/km lapse rate;
* ``params/snow_mfmax.tif`` when ``mfmax_grid``: a melt-factor grid (with one exact 0, which EF5
  reads as 0.01);
* precipitation: two storms added to the generated rain, a snowstorm early in the window and a rain
  storm late in it (rain on snow);
* the control file rewritten with ``[TempForcing TEMP]``, ``[Snow17ParamSet SNOWPARAMS]`` and
  ``SNOW=SNOW17``; the manifest rewritten.

Temperature is a ramp from ``t_start`` to ``t_end`` (degC at the outlet's elevation) over the run, a
daily cycle of ``diurnal`` degC peaking at 21 UTC, -6.5 degC/km with elevation and a little
seeded spatial noise; values are rounded to 0.01 degC so ASCII and GeoTIFF cases read the same
numbers. ``missing`` temperature files (never the first) are removed: EF5 reads them as 0 degC.
Everything is seeded: the same arguments give the same files.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from hydroagent_hpc.params import SNOW_DEFAULTS, SNOW_NAMES
from hydroagent_hpc.sim.controlfile import Forcing
from hydroagent_hpc.sim.forcing import forcing_file_names, step_times
from hydroagent_hpc.sim.grids import Grid, read_grid, read_tif, write_asc, write_tif
from hydroagent_hpc.sim.manifest import write_manifest
from hydroagent_hpc.sim.synth.basins import CONTROL_NAME, SynthSettings, synth_control_text, synthesize_basin

__all__ = ["SnowCase", "make_snow_case", "SNOW_CASES"]

NODATA = -9999.0


@dataclass(frozen=True)
class SnowCase:
    """The settings of one snow case (see the module docstring)."""

    name: str = "syn_snow"
    seed: int = 11
    area_km2: float = 60.0
    window_days: int = 10
    warmup_days: int = 2
    start: str = "2021-03-01"
    lat: float = 45.0
    lon: float = -110.0
    terrain: str = "mountains"
    t_start: float = -8.0
    t_end: float = 9.0
    diurnal: float = 4.0
    temp_type: str = "TIF"  # or "ASC"
    temp_freq: str = "1h"  # or "1d"
    coarse: bool = False
    missing: int = 0
    mfmax_grid: bool = False
    snow: Mapping[str, float] = field(default_factory=dict)  # overrides of SNOW_DEFAULTS
    storms: Sequence[tuple[float, int, float]] = ((0.15, 18, 1.5), (0.75, 8, 3.0))  # (run fraction, hours, mm/h)
    cellsize_deg: float | None = None  # None: synthesize_basin's choice
    time_state: str | None = None  # YYYYMMDDHHUU: STATES=output and TIME_STATE (EF5 saves every state grid there)

    def snow_values(self) -> dict[str, float]:
        return {k: float(self.snow.get(k, SNOW_DEFAULTS[k])) for k in SNOW_NAMES}


#: A few contrasting cases for differential tests against EF5 (small: ~60 cells, 12 days hourly).
SNOW_CASES = (
    SnowCase("snow_tif_hourly", seed=11),
    SnowCase("snow_asc_daily", seed=12, temp_type="ASC", temp_freq="1d", t_start=-6.0, t_end=8.0,
             snow={"scf": 1.2, "mfmax": 1.6, "mfmin": 0.2, "plwhc": 0.1, "tipm": 0.3, "nmf": 0.3, "uadj": 0.1,
                   "mbase": 0.5}),
    SnowCase("snow_coarse_lapse", seed=13, coarse=True, mfmax_grid=True, missing=3, t_start=-10.0, t_end=12.0,
             diurnal=6.0, snow={"plwhc": 0.2, "nmf": 0.5}),
)


def _temperature(case: SnowCase, dem: np.ndarray, ref_z: float, t_frac: float, hour: float,
                 noise: np.ndarray) -> np.ndarray:
    base = case.t_start + (case.t_end - case.t_start) * t_frac
    cycle = case.diurnal * np.cos(2.0 * np.pi * (hour - 21.0) / 24.0)
    return np.round(base + cycle - 0.0065 * (dem - ref_z) + noise, 2)


def _write(path: Path, grid: Grid, kind: str) -> None:
    if kind == "ASC":
        write_asc(path, grid, fmt="%.2f")
    else:
        write_tif(path, grid)


def make_snow_case(out_dir: str | Path, case: SnowCase = SnowCase()) -> Path:
    """Write the snow case into ``out_dir`` (replacing an earlier synthetic basin there); return its control file."""
    if case.temp_type not in ("TIF", "ASC") or case.temp_freq not in ("1h", "1d"):
        raise ValueError(f"temp_type={case.temp_type!r}, temp_freq={case.temp_freq!r}: use TIF or ASC, and 1h or 1d")
    control = synthesize_basin(out_dir, name=case.name, area_km2=case.area_km2, window_days=case.window_days,
                               warmup_days=case.warmup_days, seed=case.seed, start=case.start, lat=case.lat,
                               lon=case.lon, terrain=case.terrain, climate="humid", cellsize_deg=case.cellsize_deg,
                               description="snow case (Snow-17 with temperature forcing)")
    folder = control.parent
    meta = json.loads((folder / "basin.json").read_text())
    settings = SynthSettings.from_arguments(**{k: meta["generator"][k] for k in (
        "name", "area_km2", "window_days", "warmup_days", "seed", "cellsize_deg", "start", "lat", "lon", "terrain",
        "climate", "paper_gauge_id", "description")})
    rng = np.random.default_rng(case.seed + 1_000_003)
    dem_grid = read_grid(folder / "basic" / "dem.asc")
    dem = np.where(dem_grid.data == NODATA, np.nan, dem_grid.data)
    filled = np.where(np.isnan(dem), np.nanmean(dem), dem)
    ref_z = float(np.nanmin(dem))
    steps = step_times(settings.begin, settings.end, "1h")
    _add_storms(folder, case, steps, dem_grid)

    # the temperature grid: the DEM's, or 3x coarser with its own elevation grid
    (folder / "temp").mkdir()
    if case.coarse:
        f = 3
        nr, nc = -(-filled.shape[0] // f), -(-filled.shape[1] // f)
        pad = np.full((nr * f, nc * f), np.nan)
        pad[:filled.shape[0], :filled.shape[1]] = filled
        tdem: np.ndarray = np.asarray(np.nanmean(pad.reshape(nr, f, nc, f), axis=(1, 3)))
        cs = dem_grid.cellsize * f
        top = dem_grid.top
        t_geo = (dem_grid.xll, top - nr * cs, cs, NODATA)
        t_elev: np.ndarray = np.round(tdem, 2)
        write_tif(folder / "temp" / "temp_dem.tif", Grid(t_elev, *t_geo))
    else:
        t_geo = (dem_grid.xll, dem_grid.yll, dem_grid.cellsize, NODATA)
        t_elev = filled
    noise = np.round(rng.normal(0.0, 0.3, t_elev.shape), 2)
    suffix = "asc" if case.temp_type == "ASC" else "tif"
    pattern = f"temp.YYYYMMDD{'HH' if case.temp_freq == '1h' else ''}.{suffix}"
    tf = Forcing("TEMP", case.temp_type, "C", case.temp_freq, Path("temp"), pattern,
                 dem=Path("temp/temp_dem.tif") if case.coarse else None)
    names = list(dict.fromkeys(forcing_file_names(
        Forcing("t", "tif", "C", case.temp_freq, folder / "temp", pattern), steps, settings.begin)))
    total_h = (settings.end - settings.begin).total_seconds() / 3600.0
    for name in names:
        stamp = _stamp(name, case.temp_freq)
        if case.temp_freq == "1d":  # the daily mean of the day ending at the stamp
            hours = [stamp - timedelta(hours=h) for h in range(24)]
        else:
            hours = [stamp]
        fracs = [max(0.0, (t - settings.begin).total_seconds() / 3600.0) / total_h for t in hours]
        vals: np.ndarray = np.asarray(np.mean([_temperature(case, t_elev, ref_z, fr, t.hour, noise)
                                               for t, fr in zip(hours, fracs)], axis=0))
        _write(folder / "temp" / name, Grid(np.round(vals, 2), *t_geo), case.temp_type)
    if case.missing:
        drop = rng.choice(np.arange(1, len(names)), size=min(case.missing, len(names) - 1), replace=False)
        for k in sorted(drop):
            (folder / "temp" / names[k]).unlink()
    snow_grids = {}
    if case.mfmax_grid:
        shape = dem_grid.data.shape
        field_ = np.round(np.clip(1.0 + 0.3 * rng.standard_normal(shape), 0.4, 1.8), 3)
        basin = np.argwhere(dem_grid.data != NODATA)
        r, c = basin[len(basin) // 2]
        field_[r, c] = 0.0  # EF5 turns an exact 0 into 0.01
        write_tif(folder / "params" / "snow_mfmax.tif", Grid(field_, dem_grid.xll, dem_grid.yll, dem_grid.cellsize,
                                                             NODATA))
        snow_grids["mfmax"] = "snow_mfmax.tif"
    text = synth_control_text(settings, settings.name, (meta["gauge_cell"]["celly"], meta["gauge_cell"]["cellx"]),
                              temp=tf, snow=case.snow_values(), snow_grids=snow_grids)
    if case.time_state:
        end_line = f"TIME_END={settings.end:%Y%m%d%H%M}"
        text = text.replace(end_line, f"{end_line}\nSTATES=output\nTIME_STATE={case.time_state}")
    (folder / CONTROL_NAME).write_text(text)
    meta["snow_case"] = {k: (list(v) if isinstance(v, tuple) else v) for k, v in asdict(case).items()}
    meta["snow_case"]["snow"] = case.snow_values()
    (folder / "basin.json").write_text(json.dumps(meta, indent=2) + "\n")
    write_manifest(folder, source={"dataset": "synthetic", "generator": __name__, "seed": case.seed},
                   command=f"make_snow_case({case!r})", basin=case.name)
    return folder / CONTROL_NAME


def _stamp(name: str, freq: str) -> datetime:
    digits = name.split(".")[1]
    return datetime.strptime(digits, "%Y%m%d%H" if freq == "1h" else "%Y%m%d")


def _add_storms(folder: Path, case: SnowCase, steps: list[datetime], dem: Grid) -> None:
    """Add each storm's uniform rate (mm/h) over the basin to the hourly rain files it covers."""
    basin = dem.data != NODATA
    n = len(steps)
    for frac, hours, rate in case.storms:
        first = int(frac * n)
        for t in steps[first:first + hours]:
            p = folder / "precip" / f"rain.{t:%Y%m%d%H}.tif"
            g = read_tif(p)
            data = np.where(basin, g.data + rate, g.data)
            write_tif(p, Grid(data, g.xll, g.yll, g.cellsize, g.nodata), compress=True)
