"""CAMELS-US time series: basin-mean forcing and USGS daily streamflow, strictly read.

File facts (Newman et al. 2014, doi:10.5065/D6MW2F4D; Newman et al. 2015, HESS 19, 209-223;
see ``tests/data/camels/PROVENANCE.md``):

* Forcing ``basin_mean_forcing/<source>/[<HUC02>/]<id>_lump_<tag>_forcing_leap.txt`` with
  ``source``/``tag`` daymet/cida, nldas/nldas, maurer/maurer, maurer_extended/maurer: line 1
  gauge latitude (deg), line 2 mean elevation (m), line 3 basin area (m2), line 4 the column
  header ``Year Mnth Day Hr dayl(s) prcp(mm/day) srad(W/m2) swe(mm) tmax(C) tmin(C) vp(Pa)``
  (capitalised in NLDAS/Maurer), then one row per day, space or tab separated (maurer_extended
  has unpadded months and days). ``swe`` is always 0. In the original NLDAS and Maurer files
  ``Tmax == Tmin`` (the daily mean twice).
* Streamflow ``usgs_streamflow/[<HUC02>/]<id>_streamflow_qc.txt``, no header:
  ``gauge_id year month day discharge_cfs flag``; flags ``A`` (approved), ``A:e`` (approved,
  estimated), ``P``/``P:e`` (provisional), ``M`` (missing, value -999.00).

Every reader checks the layout and fails with ``file:line``, what is wrong and the fix
(:class:`~hydroagent_hpc.sim.errors.InputError`). Dates are calendar days (``datetime64[D]``);
rows must be consecutive days.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.datasets.units import cfs_to_m3s
from hydroagent_hpc.sim.errors import InputError

log = logging.getLogger(__name__)

__all__ = ["FORCING_SOURCES", "BasinForcing", "Streamflow", "find_forcing_file", "find_streamflow_file",
           "read_forcing", "read_streamflow", "check_gauge_id", "bad_file"]

# source folder -> the tag in the file name
FORCING_SOURCES = {"daymet": "cida", "nldas": "nldas", "maurer": "maurer", "maurer_extended": "maurer"}
_COLUMNS = ("year", "mnth", "day", "hr", "dayl", "prcp", "srad", "swe", "tmax", "tmin", "vp")
_FLAGS = {"A", "A:e", "P", "P:e", "M", "A:<", "A:>", "P:<", "P:>", "E"}
_ID_RE = re.compile(r"^\d{8}$")


def bad_file(path, line: int, message: str, fix: str) -> InputError:
    """An :class:`InputError` that names the file and line."""
    where = f"{path}:{line}: " if line else f"{path}: "
    return InputError(where + message, fix=fix)


def check_gauge_id(gauge_id) -> str:
    """A USGS/CAMELS gauge id as an 8-digit string (leading zeros kept)."""
    if isinstance(gauge_id, int) and not isinstance(gauge_id, bool):
        raise ValueError(f"gauge id {gauge_id!r} is a number: write it as an 8-digit string with its leading zeros, "
                         f"e.g. '{gauge_id:08d}'")
    text = str(gauge_id).strip()
    if not _ID_RE.match(text):
        raise ValueError(f"gauge id {gauge_id!r} is not 8 digits; write it as a string with its leading zeros, "
                         "e.g. '01013500'")
    return text


@dataclass
class BasinForcing:
    """Daily basin-mean forcing of one gauge (NaN where a column does not exist)."""

    gauge_id: str
    source: str
    path: str
    dates: np.ndarray  # datetime64[D]
    prcp: np.ndarray  # mm/day
    tmax: np.ndarray  # degC
    tmin: np.ndarray  # degC
    srad: np.ndarray  # W/m2, mean over the daylight period
    vp: np.ndarray  # Pa
    dayl: np.ndarray  # s
    lat: float | None = None  # header line 1
    elev_m: float | None = None  # header line 2
    area_km2: float | None = None  # header line 3 (m2) / 1e6
    pet: np.ndarray | None = None  # mm/day, only where the source has it (model output)
    notes: dict = field(default_factory=dict)

    def window(self, start, end) -> BasinForcing:
        """The days ``start..end`` inclusive (``datetime64[D]`` or ISO dates)."""
        a, b = np.datetime64(start, "D"), np.datetime64(end, "D")
        keep = (self.dates >= a) & (self.dates <= b)
        cut: dict[str, Any] = {k: (getattr(self, k)[keep] if getattr(self, k) is not None else None)
               for k in ("dates", "prcp", "tmax", "tmin", "srad", "vp", "dayl", "pet")}
        return BasinForcing(self.gauge_id, self.source, self.path, lat=self.lat, elev_m=self.elev_m,
                            area_km2=self.area_km2, notes=dict(self.notes), **cut)


@dataclass
class Streamflow:
    """Daily USGS discharge of one gauge; ``q_cfs`` is NaN where the flag is ``M`` or the value -999."""

    gauge_id: str
    path: str
    dates: np.ndarray  # datetime64[D]
    q_cfs: np.ndarray
    flags: np.ndarray  # str

    @property
    def q_m3s(self) -> np.ndarray:
        return cfs_to_m3s(self.q_cfs)

    def flag_counts(self) -> dict[str, int]:
        names, counts = np.unique(self.flags, return_counts=True)
        return {str(n): int(c) for n, c in zip(names, counts)}


def _find(root: Path, name: str, prefer: str | None) -> list[Path]:
    hits = sorted(p for p in Path(root).rglob(name) if p.is_file())
    if prefer:
        preferred = [p for p in hits if prefer in p.relative_to(root).parts[:-1]]
        if preferred:
            return preferred
        # a same-named file under another source's folder is not this source (maurer vs maurer_extended)
        hits = [p for p in hits if not set(p.relative_to(root).parts[:-1]) & set(FORCING_SOURCES)]
    return hits


def find_forcing_file(root, gauge_id: str, source: str = "nldas") -> Path:
    """The forcing file of ``gauge_id`` for ``source`` under a CAMELS folder (with or without HUC folders)."""
    gid = check_gauge_id(gauge_id)
    if source not in FORCING_SOURCES:
        raise ValueError(f"forcing source {source!r} is unknown; use one of {', '.join(FORCING_SOURCES)} "
                         "(or model_output for the SAC-SMA benchmark files)")
    name = f"{gid}_lump_{FORCING_SOURCES[source]}_forcing_leap.txt"
    hits = _find(Path(root), name, source)
    if not hits:
        raise InputError(f"no {source} forcing file {name} under {root}",
                         fix=f"point --root at a CAMELS folder holding basin_mean_forcing/{source}/, or pick another "
                             "--forcing")
    if len(hits) > 1:
        log.warning("%d files named %s under %s; using %s", len(hits), name, root, hits[0])
    return hits[0]


def find_streamflow_file(root, gauge_id: str) -> Path:
    """``<id>_streamflow_qc.txt`` under ``root`` (preferring a ``usgs_streamflow`` folder)."""
    gid = check_gauge_id(gauge_id)
    hits = _find(Path(root), f"{gid}_streamflow_qc.txt", None)
    if not hits:
        raise InputError(f"no streamflow file {gid}_streamflow_qc.txt under {root}",
                         fix="point --root at a CAMELS folder holding usgs_streamflow/")
    usgs = [p for p in hits if "usgs_streamflow" in p.parts]
    return (usgs or hits)[0]


def _header_number(path: Path, lineno: int, text: str, what: str) -> float:
    try:
        return float(text.split()[0])
    except (ValueError, IndexError):
        raise bad_file(path, lineno, f"expected the {what} as a number, got {text.strip()[:40]!r}",
                       "a CAMELS forcing file starts with latitude, elevation (m) and area (m2) on three lines"
                       ) from None


def _column_key(name: str) -> str:
    return name.split("(")[0].strip().lower()


def _check_days(path: Path, dates: np.ndarray, first_line: int) -> None:
    if dates.size < 2:
        return
    step = np.diff(dates).astype(np.int64)
    bad = np.nonzero(step != 1)[0]
    if bad.size:
        i = int(bad[0])
        what = "repeats" if step[i] == 0 else "goes back" if step[i] < 0 else f"skips {step[i] - 1} day(s)"
        raise bad_file(path, first_line + i + 1, f"the date {dates[i + 1]} {what} after {dates[i]}",
                       "rows must be consecutive days; take the file from the original CAMELS archive")


def read_forcing(path, source: str | None = None, gauge_id: str | None = None) -> BasinForcing:
    """Read a CAMELS basin-mean forcing file (any of the four sources)."""
    p = Path(path)
    try:
        lines = p.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise InputError(f"forcing file not found: {p}", fix="check --root and --basin") from None
    if len(lines) < 5:
        raise bad_file(p, len(lines), "too short for a CAMELS forcing file (3 header lines, a column header, rows)",
                       "take the file from basin_mean_forcing/ of CAMELS-US")
    lat = _header_number(p, 1, lines[0], "gauge latitude")
    elev = _header_number(p, 2, lines[1], "mean elevation")
    area_m2 = _header_number(p, 3, lines[2], "basin area in m2")
    names = [_column_key(c) for c in lines[3].split()]
    if names[:4] != ["year", "mnth", "day", "hr"] or sorted(names) != sorted(_COLUMNS):
        raise bad_file(p, 4, f"unexpected column header {lines[3].strip()[:90]!r}",
                       "expected 'Year Mnth Day Hr dayl(s) prcp(mm/day) srad(W/m2) swe(mm) tmax(C) tmin(C) vp(Pa)'")
    rows = []
    for lineno, line in enumerate(lines[4:], start=5):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != len(names):
            raise bad_file(p, lineno, f"{len(parts)} values where the header has {len(names)}",
                           "every row needs Year Mnth Day Hr and the seven forcing values")
        try:
            rows.append([float(x) for x in parts])
        except ValueError:
            raise bad_file(p, lineno, f"a value is not a number: {line.strip()[:80]!r}",
                           "replace it with a number (CAMELS forcing has no missing values)") from None
    data = np.array(rows, dtype=np.float64)
    col = {n: data[:, i] for i, n in enumerate(names)}
    try:
        dates = np.array([f"{int(y):04d}-{int(m):02d}-{int(d):02d}" for y, m, d in
                          zip(col["year"], col["mnth"], col["day"])], dtype="datetime64[D]")
    except ValueError as exc:
        raise bad_file(p, 5, f"a row holds an impossible date ({exc})", "fix Year, Mnth and Day") from None
    _check_days(p, dates, 5)
    for key in ("prcp", "tmax", "tmin", "srad", "vp", "dayl"):
        bad = ~np.isfinite(col[key])
        if bad.any():
            i = int(np.argmax(bad))
            raise bad_file(p, 5 + i, f"{key} is not finite on {dates[i]}", "CAMELS forcing has no gaps; re-download")
    neg = col["prcp"] < 0
    if neg.any():
        i = int(np.argmax(neg))
        raise bad_file(p, 5 + i, f"negative precipitation {col['prcp'][i]} on {dates[i]}",
                       "precipitation is >= 0 mm/day")
    name_id = p.name.split("_")[0]
    gid = check_gauge_id(gauge_id or name_id)
    src = source or next((s for s in ("maurer_extended", "daymet", "nldas", "maurer") if s in p.parts),
                         "daymet" if "_cida_" in p.name else "nldas" if "_nldas_" in p.name else "maurer")
    return BasinForcing(gid, src, str(p), dates, col["prcp"], col["tmax"], col["tmin"], col["srad"], col["vp"],
                        col["dayl"], lat=lat, elev_m=elev, area_km2=area_m2 / 1e6)


def read_streamflow(path, gauge_id: str | None = None) -> Streamflow:
    """Read ``<id>_streamflow_qc.txt``; -999 and flag ``M`` become NaN, other flags are kept."""
    p = Path(path)
    try:
        lines = p.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        raise InputError(f"streamflow file not found: {p}", fix="check --root and --basin") from None
    want = check_gauge_id(gauge_id) if gauge_id else None
    dates, q, flags = [], [], []
    first = None
    for lineno, line in enumerate(lines, start=1):
        parts = line.split()
        if not parts:
            continue
        if len(parts) != 6:
            raise bad_file(p, lineno, f"{len(parts)} fields where 6 are expected: {line.strip()[:80]!r}",
                           "each row is 'gauge_id year month day discharge_cfs flag'")
        gid, y, m, d, value, flag = parts
        if want is None:
            want = check_gauge_id(gid)
        if gid != want:
            raise bad_file(p, lineno, f"gauge id {gid} where the file is for {want}", "one gauge per streamflow file")
        if flag not in _FLAGS:
            raise bad_file(p, lineno, f"unknown quality flag {flag!r}",
                           f"USGS daily-value flags are {', '.join(sorted(_FLAGS))}")
        try:
            dates.append(f"{int(y):04d}-{int(m):02d}-{int(d):02d}")
            v = float(value)
        except ValueError:
            raise bad_file(p, lineno, f"year, month, day or discharge is not a number: {line.strip()[:80]!r}",
                           "write numbers; a missing day is -999.00 with flag M") from None
        if first is None:
            first = lineno
        q.append(np.nan if flag == "M" or v <= -998.0 else v)
        if flag != "M" and v < 0 and v > -998.0:
            raise bad_file(p, lineno, f"negative discharge {v} with flag {flag}",
                           "discharge is >= 0 or -999 with flag M")
        flags.append(flag)
    if not dates or want is None or first is None:
        raise bad_file(p, 0, "no rows", "take the file from usgs_streamflow/ of CAMELS-US")
    try:
        days = np.array(dates, dtype="datetime64[D]")
    except ValueError as exc:
        raise bad_file(p, first, f"a row holds an impossible date ({exc})", "fix year, month and day") from None
    _check_days(p, days, first)
    return Streamflow(want, str(p), days, np.array(q, dtype=np.float64), np.array(flags))
