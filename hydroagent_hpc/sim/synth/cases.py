"""Random EF5 cases for differential testing: many small basins, each a different corner of the inputs.

A :class:`CaseSpec` fixes everything about one case: the basin (area, cell size, latitude, terrain),
the file formats (ESRI ASCII or GeoTIFF for the basic grids and the forcing), the time step (hourly,
or daily with daily forcing), the window and warm-up, missing precipitation files, one or two output
gauges (by cell or by LAT/LON), the state options (initial state grids read at the start, state
grids written mid-run) and the 13 multipliers. :func:`draw_case` draws one from a seed;
:func:`write_case` writes it as a folder that both the real EF5 and our engine run
(``cd DIR && ef5 control.txt``). The same seed gives the same files.

The multipliers are drawn across the whole bounds of :data:`hydroagent_hpc.params.PARAMS` (uniform,
or pinned to the bounds, or near the defaults), and TH and ISU, fixed in the paper, are varied in
some cases too, so the comparison covers every branch of the model that a calibration can reach.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.params import DEFAULTS, PARAMS, TUNABLE
from hydroagent_hpc.sim.controlfile import Forcing
from hydroagent_hpc.sim.forcing import forcing_file_names, step_times
from hydroagent_hpc.sim.grids import Grid, write_asc, write_tif
from hydroagent_hpc.sim.outputs import STATE_GRIDS
from hydroagent_hpc.sim.synth.evaporation import make_pet
from hydroagent_hpc.sim.synth.landscape import GRID_FILES, make_parameter_grids
from hydroagent_hpc.sim.synth.storms import CLIMATES, make_rainfall
from hydroagent_hpc.sim.synth.terrain import NODATA, TERRAIN_STYLES, Terrain, make_terrain

__all__ = ["CaseSpec", "draw_case", "write_case", "CONTROL_NAME"]

CONTROL_NAME = "control.txt"


@dataclass(frozen=True)
class CaseSpec:
    """One differential case; every field is plain data (it is recorded with each comparison)."""

    seed: int
    area_km2: float
    cellsize_deg: float
    lat: float
    lon: float
    terrain: str
    climate: str
    grid_format: str  # "asc" or "tif": the basic grids (DEM, DDM, FAM) and the forcing
    timestep: str  # "1h" or "1d"
    days: int  # scored window
    warmup_days: int  # 0: no TIME_WARMEND
    start: str  # first scored time, "YYYY-MM-DD HH:MM"
    missing_precip: float  # fraction of precipitation files deleted (never all)
    gauge_by: str  # "cell" or "latlon"
    inner_gauge: bool  # a second output gauge upstream
    initial_states: bool  # state grids stamped TIME_BEGIN are read at the start
    save_states: bool  # STATES + TIME_STATE mid-run: the state grids are written
    params: dict[str, float] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)

    @property
    def label(self) -> str:
        return (f"seed{self.seed}-{self.grid_format}-{self.timestep}-{self.days}d"
                f"{'-warm' if self.warmup_days else ''}{'-miss' if self.missing_precip else ''}"
                f"{'-2g' if self.inner_gauge else ''}{'-s0' if self.initial_states else ''}"
                f"{'-ss' if self.save_states else ''}")


def _draw_params(rng: np.random.Generator) -> dict[str, float]:
    """13 multipliers: uniform across the bounds, pinned to the bounds, or jittered defaults."""
    mode = rng.choice(["uniform", "extreme", "default"], p=[0.5, 0.3, 0.2])
    out = {}
    for name in TUNABLE:
        spec = PARAMS[name]
        lo, hi = spec.lower, spec.upper
        if mode == "uniform":
            v = rng.uniform(lo, hi)
        elif mode == "extreme":
            v = (lo, hi, rng.uniform(lo, hi))[int(rng.choice(3, p=[0.4, 0.4, 0.2]))]
        else:
            v = float(np.clip(spec.default * math.exp(rng.normal(0.0, 0.2)), lo, hi))
        out[name] = float(np.round(v, 6))
    out["th"] = float(rng.choice([10.0, 3.0, 25.0], p=[0.6, 0.2, 0.2]))
    out["isu"] = 0.0 if rng.uniform() < 0.6 else float(np.round(rng.uniform(0.0, 0.5), 6))
    return {k: out[k] for k in DEFAULTS}


def draw_case(seed: int) -> CaseSpec:
    """The case of one seed: small enough that both engines run it in well under a second."""
    rng = np.random.default_rng([seed, 0xD1FF])
    daily = rng.uniform() < 0.3
    cellsize = float(rng.choice([0.005, 0.01, 0.02, 0.05] if not daily else [0.02, 0.05, 0.1]))
    lat = float(np.round(rng.uniform(-55.0, 65.0), 3))
    cell_km2 = (111.32 * cellsize) ** 2 * math.cos(math.radians(lat))
    cells = int(rng.integers(45, 600))
    start = datetime(2020, 1, 1) + timedelta(days=int(rng.integers(0, 365)))
    return CaseSpec(
        seed=int(seed), area_km2=float(np.round(cells * cell_km2, 2)), cellsize_deg=cellsize, lat=lat,
        lon=float(np.round(rng.uniform(-170.0, 170.0), 3)), terrain=str(rng.choice(list(TERRAIN_STYLES))),
        climate=str(rng.choice(list(CLIMATES))), grid_format=str(rng.choice(["asc", "tif"])),
        timestep="1d" if daily else "1h", days=int(rng.integers(40, 120) if daily else rng.integers(3, 12)),
        warmup_days=0 if rng.uniform() < 0.4 else int(rng.integers(5, 30) if daily else rng.integers(1, 4)),
        start=f"{start:%Y-%m-%d} 00:00", missing_precip=0.0 if rng.uniform() < 0.7 else float(rng.uniform(0.05, 0.4)),
        gauge_by=str(rng.choice(["cell", "latlon"], p=[0.7, 0.3])), inner_gauge=bool(rng.uniform() < 0.4),
        initial_states=bool(rng.uniform() < 0.25), save_states=bool(rng.uniform() < 0.3),
        params=_draw_params(rng))


# --------------------------------------------------------------------------- writing
def _grid(terrain: Terrain, data: np.ndarray) -> Grid:
    return Grid(np.asarray(data, dtype=np.float64), terrain.xll, terrain.yll, terrain.cellsize, NODATA)


def _write(path: Path, grid: Grid, fmt: str, number: str = "%.4f") -> None:
    if fmt == "asc":
        write_asc(path, grid, fmt=number)
    else:
        write_tif(path, grid)


def _inner_cell(terrain: Terrain) -> tuple[int, int] | None:
    """A channel cell draining 20-70 % of the basin, not the outlet (None if there is none)."""
    fam = np.where(terrain.basin, terrain.fam, -1)
    top = fam[terrain.gauge]
    ok = (fam >= 0.2 * top) & (fam <= 0.7 * top)
    if not ok.any():
        return None
    r, c = np.argwhere(ok)[0]
    return int(r), int(c)


def _gauge_lines(name: str, cell: tuple[int, int], terrain: Terrain, by: str) -> list[str]:
    if by == "cell":
        where = [f"CELLX={cell[1]}", f"CELLY={cell[0]}"]
    else:  # the cell's centre
        lon = terrain.xll + (cell[1] + 0.5) * terrain.cellsize
        lat = terrain.yll + (terrain.shape[0] - cell[0] - 0.5) * terrain.cellsize
        where = [f"LON={lon!r}", f"LAT={lat!r}"]
    return [f"[Gauge {name}]", *where, "OUTPUTTS=TRUE", ""]


def _control(spec: CaseSpec, terrain: Terrain, begin: datetime, end: datetime, gauges: list[str],
             gauge_text: list[str], precip: Forcing, pet: Forcing, state_time: datetime | None) -> str:
    p = spec.params
    ext = spec.grid_format
    crest, kw = ("wm", "b", "im", "ke", "fc", "iwu"), ("under", "leaki", "th", "isu", "alpha", "beta", "alpha0")
    outlet = gauges[0]
    lines = [f"# differential case {spec.label}: {spec.as_dict()}", "",
             "[Basic]", f"DEM=basic/dem.{ext}", f"DDM=basic/ddm.{ext}", f"FAM=basic/fam.{ext}", "PROJ=geographic",
             "ESRIDDM=true", "SELFFAM=false", ""]
    for kind, f in (("PrecipForcing", precip), ("PETForcing", pet)):
        lines += [f"[{kind} {f.name}]", f"TYPE={f.type}", f"UNIT={f.unit}", f"FREQ={f.freq}",
                  f"LOC={f.loc.as_posix()}", f"NAME={f.pattern}", ""]
    lines += gauge_text
    lines += ["[Basin BASIN]", *(f"GAUGE={g}" for g in gauges), "",
              "[CrestParamSet CRESTPARAMS]", *(f"{k}_grid=params/{GRID_FILES[k]}" for k in ("wm", "b", "im", "fc")),
              f"GAUGE={outlet}", *(f"{k.upper()}={p[k]!r}" for k in crest), "",
              "[KWParamSet KWPARAMS]", *(f"{k}_grid=params/{GRID_FILES[k]}" for k in ("leaki", "alpha", "beta",
                                                                                       "alpha0")),
              f"GAUGE={outlet}", *(f"{k.upper()}={p[k]!r}" for k in kw), "",
              "[Task RUN]", "STYLE=SIMU", "MODEL=CREST", "ROUTING=KW", "BASIN=BASIN", f"PRECIP={precip.name}",
              f"PET={pet.name}", "OUTPUT=output", "PARAM_SET=CRESTPARAMS", "ROUTING_PARAM_SET=KWPARAMS",
              f"TIMESTEP={spec.timestep}", f"TIME_BEGIN={begin:%Y%m%d%H%M}"]
    if spec.warmup_days:
        lines.append(f"TIME_WARMEND={begin + timedelta(days=spec.warmup_days):%Y%m%d%H%M}")
    lines.append(f"TIME_END={end:%Y%m%d%H%M}")
    if spec.initial_states or spec.save_states:
        lines.append("STATES=states")
    if state_time is not None:
        lines.append(f"TIME_STATE={state_time:%Y%m%d%H%M}")
    lines += ["", "[Execute]", "TASK=RUN", ""]
    return "\n".join(lines)


def write_case(spec: CaseSpec, folder: str | Path) -> Path:
    """Write the case into ``folder`` (created; must not hold another case) and return its control file."""
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ValueError(f"{out} is not empty; give a new folder for the case")
    rng_terrain, rng_params, rng_rain, rng_pet, rng_misc = np.random.default_rng([spec.seed, 0xCA5E]).spawn(5)
    terrain = make_terrain(rng_terrain, area_km2=spec.area_km2, cellsize_deg=spec.cellsize_deg, lat=spec.lat,
                           lon=spec.lon, style=TERRAIN_STYLES[spec.terrain])
    start = datetime.strptime(spec.start, "%Y-%m-%d %H:%M")
    begin = start - timedelta(days=spec.warmup_days)
    end = start + timedelta(days=spec.days)
    steps = step_times(begin, end, spec.timestep)
    hours = int((end - begin).total_seconds() // 3600)
    climate = CLIMATES[spec.climate]
    rain_h, _ = make_rainfall(rng_rain, terrain, hours, spec.warmup_days * 24, climate, spec.area_km2,
                              begin.timetuple().tm_yday)
    for sub in ("basic", "params", "precip", "pet", "output", "states"):
        (out / sub).mkdir()
    ext = spec.grid_format
    _write(out / "basic" / f"dem.{ext}", _grid(terrain, terrain.masked_dem()), ext, "%.2f")
    _write(out / "basic" / f"ddm.{ext}", _grid(terrain, terrain.ddm), ext, "%d")
    _write(out / "basic" / f"fam.{ext}", _grid(terrain, terrain.fam), ext, "%d")
    for key, grid in make_parameter_grids(rng_params, terrain).items():
        write_tif(out / "params" / GRID_FILES[key], _grid(terrain, grid))

    daily = spec.timestep == "1d"
    rain = rain_h.reshape(-1, 24, *terrain.shape).sum(axis=1) if daily else rain_h
    precip = Forcing("RAIN", ext.upper(), "mm/d" if daily else "mm/h", spec.timestep, Path("precip"),
                     f"rain.YYYYMMDDHH.{ext}", kind="precip")
    names = forcing_file_names(precip, steps, begin)
    drop = set()
    if spec.missing_precip:
        k = min(len(names) - 1, max(1, int(round(spec.missing_precip * len(names)))))
        drop = {int(i) for i in rng_misc.choice(len(names), size=k, replace=False)}
    for t, fname in enumerate(names):
        if t not in drop:
            _write(out / "precip" / fname, _grid(terrain, rain[t]), ext)
    pet = Forcing("PET", ext.upper(), "mm/d", "1d", Path("pet"), f"PET.YYYYMMDD.{ext}")
    pet_names = forcing_file_names(pet, steps, begin)
    days = list(dict.fromkeys(pet_names))
    doy = [begin.timetuple().tm_yday + i for i in range(len(days))]
    for fname, grid in zip(days, make_pet(rng_pet, terrain, climate.pet_mm_d, spec.lat, doy, [0.0] * len(days))):
        _write(out / "pet" / fname, _grid(terrain, grid), ext, "%.2f")

    gauges, gauge_text = ["outlet"], _gauge_lines("outlet", terrain.gauge, terrain, spec.gauge_by)
    inner = _inner_cell(terrain) if spec.inner_gauge else None
    if inner is not None:
        gauges.append("inner")
        gauge_text += _gauge_lines("inner", inner, terrain, spec.gauge_by)
    if spec.initial_states:
        _write_initial_states(out / "states", terrain, begin, rng_misc)
    state_time = steps[len(steps) // 2] if spec.save_states else None
    control = out / CONTROL_NAME
    control.write_text(_control(spec, terrain, begin, end, gauges, gauge_text, precip, pet, state_time))
    return control


def _write_initial_states(folder: Path, terrain: Terrain, begin: datetime, rng: np.random.Generator) -> None:
    """Plausible start states over the basin, stamped TIME_BEGIN: soil water (mm), flows, interflow."""
    shape = terrain.shape
    values = {"w": rng.uniform(0.0, 150.0, shape), "pq": rng.exponential(0.5, shape),
              "po": rng.exponential(0.05, shape), "ir": rng.exponential(0.2, shape)}
    stamp = f"{begin:%Y%m%d_%H%M}"
    for key, name in STATE_GRIDS.items():
        data = np.where(terrain.basin, values[key], NODATA)
        write_tif(folder / f"{name}_{stamp}.tif", _grid(terrain, data), compress=True)
