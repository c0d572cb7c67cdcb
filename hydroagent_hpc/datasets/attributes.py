"""CAMELS-US catchment attributes (Addor et al. 2017, HESS 21, 5293-5313, doi:10.5065/D6G73C3Q).

``camels_attributes_v2.0/camels_<group>.txt``: ``;`` separated, one header line, first column
``gauge_id`` (8 digits with leading zeros; kept as a string here). Groups: ``name`` (huc_02,
gauge_name), ``topo`` (gauge_lat, gauge_lon, elev_mean m, slope_mean m/km, area_gages2 km2,
area_geospa_fabric km2), ``clim`` (p_mean, pet_mean mm/day, aridity = PET/P, frac_snow, ...),
``hydro`` (q_mean mm/day, runoff_ratio, baseflow_index, ...), ``soil`` (soil_depth_statsgo m,
soil_porosity, soil_conductivity cm/h, max_water_content m, ...), ``vege``, ``geol`` and, in
some copies, ``hydroatlas`` and ``noahmp``. Values that parse as numbers are floats; empty
fields are None; text stays text.

The area to use for unit conversions is ``area_gages2`` (the USGS drainage area CAMELS uses
for its mm/day runoff); the forcing header's area is the GIS polygon area and may differ by a
few per cent.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from hydroagent_hpc.datasets.camels import bad_file, check_gauge_id
from hydroagent_hpc.sim.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["Attributes", "read_attribute_table", "read_attributes", "find_attribute_folder"]


@dataclass
class Attributes:
    """The attributes of one gauge; the common ones as fields, everything in ``values``."""

    gauge_id: str
    name: str | None
    huc02: str | None
    lat: float | None
    lon: float | None
    elev_mean_m: float | None
    slope_mean_m_per_km: float | None
    area_km2: float | None  # area_gages2
    area_geospa_fabric_km2: float | None
    p_mean_mm_d: float | None
    pet_mean_mm_d: float | None
    aridity: float | None
    frac_snow: float | None
    q_mean_mm_d: float | None
    runoff_ratio: float | None
    values: dict = field(default_factory=dict)
    sources: list = field(default_factory=list)

    def climate(self) -> dict:
        """The climate indices (``camels_clim``) present for this gauge."""
        keys = ("p_mean", "pet_mean", "p_seasonality", "frac_snow", "aridity", "high_prec_freq", "high_prec_dur",
                "high_prec_timing", "low_prec_freq", "low_prec_dur", "low_prec_timing")
        return {k: self.values[k] for k in keys if k in self.values}


def _value(text: str):
    t = text.strip()
    if t == "":
        return None
    try:
        return float(t)
    except ValueError:
        return t


def read_attribute_table(path) -> dict[str, dict]:
    """One ``camels_<group>.txt`` as ``{gauge_id: {column: value}}``."""
    p = Path(path)
    lines = p.read_text(errors="replace").splitlines()
    if not lines or not lines[0].lower().startswith("gauge_id;"):
        raise bad_file(p, 1, "the first line is not a ';' separated header starting with gauge_id",
                       "take the file from camels_attributes_v2.0/ of CAMELS-US")
    header = [h.strip() for h in lines[0].split(";")]
    out: dict[str, dict] = {}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line.strip():
            continue
        parts = line.split(";")
        if len(parts) != len(header):
            raise bad_file(p, lineno, f"{len(parts)} fields where the header has {len(header)}",
                           "each row has one value per header column, separated by ';'")
        try:
            gid = check_gauge_id(parts[0])
        except ValueError as exc:
            raise bad_file(p, lineno, str(exc), "keep gauge ids as 8 digits with their leading zeros") from None
        out[gid] = {h: _value(v) for h, v in zip(header[1:], parts[1:])}
    return out


def find_attribute_folder(root) -> Path | None:
    """``camels_attributes_v2.0`` under ``root`` (or ``root`` itself if it holds camels_topo.txt)."""
    r = Path(root)
    if (r / "camels_topo.txt").is_file():
        return r
    hits = sorted(p.parent for p in r.rglob("camels_topo.txt"))
    return hits[0] if hits else None


def _num(values: dict, key: str) -> float | None:
    v = values.get(key)
    return float(v) if isinstance(v, float) else None


def read_attributes(folder, gauge_id: str) -> Attributes:
    """Every ``camels_*.txt`` in ``folder`` merged for one gauge."""
    gid = check_gauge_id(gauge_id)
    f = Path(folder)
    files = sorted(f.glob("camels_*.txt"))
    if not files:
        raise InputError(f"no camels_*.txt attribute tables in {f}",
                         fix="give --attributes a camels_attributes_v2.0 folder")
    values: dict = {}
    sources = []
    for path in files:
        table = read_attribute_table(path)
        if gid in table:
            values.update(table[gid])
            sources.append(path.name)
    if "area_gages2" not in values:
        raise InputError(f"gauge {gid} is not in {f / 'camels_topo.txt'}",
                         fix="give --attributes a camels_attributes_v2.0 folder that covers this gauge "
                             "(the full CAMELS tables have 671 basins)")
    name = values.get("gauge_name")
    huc = values.get("huc_02")
    return Attributes(
        gauge_id=gid, name=str(name).strip() if name is not None else None,
        huc02=f"{int(huc):02d}" if isinstance(huc, float) else None,
        lat=_num(values, "gauge_lat"), lon=_num(values, "gauge_lon"), elev_mean_m=_num(values, "elev_mean"),
        slope_mean_m_per_km=_num(values, "slope_mean"), area_km2=_num(values, "area_gages2"),
        area_geospa_fabric_km2=_num(values, "area_geospa_fabric"), p_mean_mm_d=_num(values, "p_mean"),
        pet_mean_mm_d=_num(values, "pet_mean"), aridity=_num(values, "aridity"), frac_snow=_num(values, "frac_snow"),
        q_mean_mm_d=_num(values, "q_mean"), runoff_ratio=_num(values, "runoff_ratio"), values=values, sources=sources)
