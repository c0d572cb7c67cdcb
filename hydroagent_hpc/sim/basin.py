"""Basins on disk: a folder with an EF5 ``control.txt`` (and, for generated basins, ``basin.json``).

``load_basin(folder)`` returns the :class:`~hydroagent_hpc.types.Basin` the prompts and the
environment use. Ids are strings. The target NSE is 0.8075 for the paper's canonical gauge
02338660 (and its synthetic twin) and 0.7 otherwise, unless ``basin.json`` sets ``target_nse``.
Hidden truth (``truth.json``) is never read here: agents must not see it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import read_grid
from hydroagent_hpc.types import Basin

__all__ = ["load_basin", "default_target", "CANONICAL_GAUGE", "CANONICAL_TARGET", "DEFAULT_TARGET"]

CANONICAL_GAUGE = "02338660"
CANONICAL_TARGET = 0.8075
DEFAULT_TARGET = 0.7


def default_target(gauge_id: str | None) -> float:
    """The paper's per-gauge target: 0.8075 for 02338660, 0.7 for every other gauge."""
    return CANONICAL_TARGET if gauge_id == CANONICAL_GAUGE else DEFAULT_TARGET


def load_basin(folder: str | Path, control: str = "control.txt") -> Basin:
    """Describe the basin in ``folder`` from ``basin.json`` if present, else from its control file."""
    root = Path(folder)
    cfile = root / control
    if not cfile.exists():
        raise InputError(f"{root}: no {control} in the basin folder", fix="point --basin at a folder made by "
                         "`hydroagent basin synth` or holding an EF5 control.txt")
    meta_path = root / "basin.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    cf = parse_control(cfile)
    task = cf.task()
    gauges = cf.basins[task.basin]
    primary = next((g for g in gauges if cf.gauges[g].obs is not None), gauges[0])
    g = cf.gauges[primary]
    warm = task.time_warmend
    start = warm or task.time_begin
    area = meta.get("area_km2", g.basinarea)
    if area is None:
        sim = EmbeddedSimulator(cfile)
        area = float(sim.net.area[_upstream(sim, primary)].sum())
    lat, lon = meta.get("lat", g.lat), meta.get("lon", g.lon)
    if lat is None or lon is None:
        if g.cellx is not None and g.celly is not None:  # the centre of the gauge's cell
            dem = read_grid(cf.basic.dem)
            x, y = dem.cell_corners(np.array([g.cellx]), np.array([g.celly]))
            lon, lat = float(x[0]) + dem.cellsize / 2, float(y[0]) - dem.cellsize / 2
        elif g.lat is not None and g.lon is not None:  # basin.json says null: the control file's LAT/LON
            lat, lon = g.lat, g.lon
        else:  # the [Gauge] parser refuses a gauge without a location; this guards a hand-built one
            raise InputError(f"{g.where or cfile}: gauge {primary!r} has no location",
                             fix="add CELLX= and CELLY= or LAT= and LON= to the [Gauge] section")
    paper_id = meta.get("paper_gauge_id") or (primary if primary.isdigit() and len(primary) == 8 else None)
    basin_id = str(meta.get("name") or primary)
    return Basin(
        basin_id=basin_id, name=str(meta.get("gauge_name") or meta.get("name") or primary),
        control=str(cfile.resolve()),
        area_km2=round(float(area), 3), lat=float(lat), lon=float(lon), timestep=task.timestep,
        window_start=f"{start:%Y-%m-%d %H:%M}", window_end=f"{task.time_end:%Y-%m-%d %H:%M}",
        warmup_start=f"{task.time_begin:%Y-%m-%d %H:%M}" if warm else None,
        target_nse=float(meta.get("target_nse", default_target(paper_id))), paper_gauge_id=paper_id,
        synthetic=bool(meta.get("synthetic", False)), notes=_notes(meta))


def _notes(meta: dict) -> str:
    parts = []
    if meta.get("climate"):
        parts.append(f"climate: {meta['climate']}")
    if meta.get("terrain"):
        parts.append(f"terrain: {meta['terrain']}")
    if meta.get("land_cover"):
        parts.append(f"land cover: {meta['land_cover']}")
    if meta.get("synthetic"):
        parts.append("synthetic twin basin (generated terrain, rain and discharge)")
    return "; ".join(parts)


def _upstream(sim, gauge: str):
    import numpy as np

    gi = sim.net.gauge_names.index(gauge)
    return np.isin(sim.net.owner, [gi, *sim.net.upstream_gauges[gi]])
