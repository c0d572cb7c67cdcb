"""Forcing as EF5 reads it: time-stamped grid files, units, frequencies, and the observation CSV.

EF5 facts (``docs/ef5-crest-spec.md`` section 5):

* Forcing times are ``TIME_BEGIN + k*FREQ``; the step ending at ``t`` reads the file of the first
  forcing time ``>= t`` (time stamps mark the end of the interval a file covers). With a monthly
  climatology this is why a run starting on 1 June reads ``PET_07``.
* File names come from the NAME pattern with ``YYYY MM DD HH UU SS`` replaced.
* A missing file is all zeros; missing precipitation files are counted (``missingQPE``).
* Precipitation: nodata, NaN, zero and negative values become 0. PET: values that are not ``> 0`` become 0;
  EF5 never tests PET against nodata, so a positive NODATA_value is used as a PET value (warned).
  ``+inf`` where EF5 would use it is an error (deliberate: EF5 would carry it into the water balance).
* Units: only the time part of UNIT counts; rate in mm/h = value * 3600 / seconds(unit span) (EF5: the
  float value times the float factor, a float product),
  a month being 30 days and a year 365 days. ``mm/100d`` is 0.01 mm/day.
* A grid with the DEM's rows and columns is co-registered; otherwise each DEM cell samples the
  forcing at the DEM cell's upper-left corner (nearest cell), and outside the grid reads 0.
"""

from __future__ import annotations

import calendar
import functools
import hashlib
import logging
import math
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.sim.controlfile import (
    NAME_FIELDS,
    NAME_FIELDS_BY_UNIT,
    Forcing,
    duration_seconds,
    parse_duration,
    parse_unit,
)
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import Grid, read_grid, read_tif, untagged_sentinel_error
from hydroagent_hpc.sim.limits import current_limits
from hydroagent_hpc.sim.snow import lapse_temperature

log = logging.getLogger(__name__)

__all__ = ["ForcingSeries", "step_times", "load_forcing", "load_temperature", "unit_factor", "read_observations",
           "add_duration", "forcing_file_names", "render_name", "render_name_by_characters", "check_frequency",
           "count_steps"]

_UNIT_SECONDS = {"s": 1, "u": 60, "h": 3600, "d": 86400, "m": 30 * 86400, "y": 365 * 86400}


@dataclass
class ForcingSeries:
    """Per-step, per-node rates in mm/h and what was missing."""

    values: np.ndarray  # [T, N]
    missing: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def add_duration(t: datetime, count: int, unit: str) -> datetime:
    """``t`` plus ``count`` units; months and years are calendar steps (day clamped).

    A result past year 9999 (``datetime``'s range) is an :class:`InputError`, not an overflow.
    """
    try:
        if unit in ("m", "y"):
            months = count * (12 if unit == "y" else 1)
            y, m = divmod(t.month - 1 + months, 12)
            year, month = t.year + y, m + 1
            day = min(t.day, calendar.monthrange(year, month)[1]) if 1 <= year <= 9999 else t.day
            return t.replace(year=year, month=month, day=day)
        return t + timedelta(seconds=duration_seconds(count, unit))
    except (OverflowError, ValueError):
        raise InputError(f"{t:%Y-%m-%d %H:%M} plus {count}{unit} is past the year 9999",
                         fix="move TIME_BEGIN/TIME_END or shorten TIMESTEP/FREQ") from None


def count_steps(begin: datetime, end: datetime, timestep: str) -> int:
    """How many steps ``step_times`` would return, computed without building them."""
    count, unit = parse_duration(timestep)
    if unit in ("m", "y"):
        raise InputError(f"TIMESTEP={timestep} (months or years) is not supported by the embedded engine",
                         fix="use a fixed step such as 1h or 1d")
    return max(0, (end - begin) // timedelta(seconds=duration_seconds(count, unit)))


def step_times(begin: datetime, end: datetime, timestep: str) -> list[datetime]:
    """End times of every step: ``begin + dt, begin + 2dt, ... <= end``.

    The count is checked against ``HYDROAGENT_MAX_STEPS`` (:mod:`~hydroagent_hpc.sim.limits`)
    before the list is built.
    """
    n = count_steps(begin, end, timestep)
    current_limits().check_steps(n, f"TIMESTEP={timestep} from {begin:%Y-%m-%d %H:%M} to {end:%Y-%m-%d %H:%M}")
    count, unit = parse_duration(timestep)
    dt = timedelta(seconds=duration_seconds(count, unit))
    return [begin + dt * (k + 1) for k in range(n)]


def check_frequency(f: Forcing, timestep: str) -> None:
    """EF5 needs every forcing's FREQ >= TIMESTEP (``docs/ef5-crest-spec.md`` section 5).

    With a finer FREQ, EF5 reads only the file stamped at each step's end and silently skips the
    others (a daily run over hourly rain would see 1 hour in 24), so the engine refuses it.
    Months and years count as 30 and 365 days here, as in the unit rule.
    """
    fc, fu = parse_duration(f.freq)
    tc, tu = parse_duration(timestep)
    if fc * _UNIT_SECONDS[fu] < tc * _UNIT_SECONDS[tu]:
        raise InputError(f"forcing [{f.name}] has FREQ={f.freq}, finer than TIMESTEP={timestep}: EF5 would read one "
                         f"file per step and skip the rest", fix=f"aggregate the forcing to FREQ={timestep} "
                         f"(e.g. daily sums in mm/d for TIMESTEP=1d), or run at TIMESTEP={f.freq}")


def unit_factor(unit: str) -> float:
    """Multiplier from the file's unit to mm/h, using only the time part (EF5's rule)."""
    u = unit.strip().lower()
    if u == "c":
        raise InputError("UNIT=C (temperature, Hamon PET) is not supported by the embedded engine",
                         fix="give PET in a rate unit such as mm/d, or use --backend ef5")
    try:
        length, span = parse_unit(u)
    except ValueError as exc:
        raise InputError(str(exc), fix="write e.g. mm/h, mm/3h, mm/d or mm/100d") from None
    if length != "mm":
        log.warning("UNIT=%s: EF5 ignores the length part; values are taken as mm", unit)
    return 3600.0 / span


def forcing_file_names(f: Forcing, steps: list[datetime], begin: datetime) -> list[str]:
    """The file each step reads: the first forcing time >= the step's end time."""
    count, unit = parse_duration(f.freq)
    finest = NAME_FIELDS_BY_UNIT[unit] if f.kind == "precip" else len(NAME_FIELDS) - 1
    names = []
    ft = begin
    last: tuple[datetime, str] | None = None
    for t in steps:
        while ft < t:
            ft = add_duration(ft, count, unit)
        if last is None or last[0] != ft:  # daily PET under hourly steps: one name for 24 steps
            last = (ft, render_name(f.pattern, ft, finest))
        names.append(last[1])
    return names


@functools.lru_cache(maxsize=64)
def _name_template(pattern: str, finest: int) -> tuple[tuple[str, int], ...] | None:
    """``pattern`` split into (literal before, field index) pieces and a final (literal, -1), or None
    when two fields overlap (then :func:`render_name` replaces character by character)."""
    spans = sorted((at, len(field_), i) for i, field_ in enumerate(NAME_FIELDS[:finest + 1])
                   if (at := pattern.find(field_)) >= 0)
    pieces, pos = [], 0
    for at, length, i in spans:
        if at < pos:
            return None
        pieces.append((pattern[pos:at], i))
        pos = at + length
    pieces.append((pattern[pos:], -1))
    return tuple(pieces)


def render_name(pattern: str, t: datetime, finest: int = len(NAME_FIELDS) - 1) -> str:
    """The file name of time ``t``: EF5's ``DatedName`` rules.

    Each field of :data:`NAME_FIELDS` down to index ``finest`` is replaced at its *first* place in
    the pattern (found before anything is replaced); later repeats, and fields finer than
    ``finest``, stay literal. Precipitation's ``finest`` is FREQ's unit (``rain.YYYYMMDDHH.tif``
    with FREQ=1d reads ``rain.20200520HH.tif``); PET and temperature fill every field.
    """
    template = _name_template(pattern, finest)
    if template is None:
        return render_name_by_characters(pattern, t, finest)
    values = _field_values(t)
    return "".join(lit + (values[i] if i >= 0 else "") for lit, i in template)


def _field_values(t: datetime) -> tuple[str, ...]:
    return (f"{t.year:04d}", f"{t.month:02d}", f"{t.day:02d}", f"{t.hour:02d}", f"{t.minute:02d}", f"{t.second:02d}")


def render_name_by_characters(pattern: str, t: datetime, finest: int = len(NAME_FIELDS) - 1) -> str:
    """:func:`render_name` by EF5's rule taken literally, one field at a time over the characters; the
    reference :func:`render_name`'s precompiled template is tested against, and its fallback when two
    fields overlap."""
    chars = list(pattern)
    for field_, value in zip(NAME_FIELDS[:finest + 1], _field_values(t)):
        at = pattern.find(field_)
        if at >= 0:
            chars[at:at + len(field_)] = value
    return "".join(chars)


def _sample(grid: Grid, dem: Grid, rows: np.ndarray, cols: np.ndarray, kind: str = "precip",
            path: Path | None = None) -> np.ndarray:
    """The grid's value at every node, as EF5's ``PrecipReader``/``PETReader::Read`` keep it, else 0.

    Precipitation (``PrecipReader.cpp:79-104``): ``value != noData && value > 0``. PET
    (``PETReader.cpp:53-76``): only ``value > 0``; EF5 does not test PET against the grid's nodata
    value, so a positive NODATA_value (9999, say) in a basin cell is used as a PET of 9999 (in the
    file's unit), here too, with a warning. Both: NaN, 0 and negative values (a negative nodata
    included) read 0. A ``+inf`` that EF5 would use is an :class:`InputError` (a deliberate
    difference: EF5 would carry it into the water balance).
    """
    if grid.same_shape(dem):
        v = grid.data[rows, cols]
        inside = np.ones(v.shape, dtype=bool)
    else:
        x, y = dem.cell_corners(cols, rows)
        c, r, inside = grid.locate(x, y)
        v = np.where(inside, grid.data[r, c], 0.0)
    # EF5 compares the float value with the float nodata value (the ASCII reader rounds both to float)
    is_nodata = v.astype(np.float32) == np.float32(grid.nodata)
    used = inside & (v > 0.0) & (~is_nodata if kind == "precip" else True)
    where = path or grid.path
    if np.isinf(v[used]).any():
        i = int(np.nonzero(used & np.isinf(v))[0][0])
        raise InputError(f"{where}: the {kind} value at the basin cell (col {int(cols[i])}, row {int(rows[i])}) is "
                         f"infinite; EF5 would carry it into the water balance",
                         fix="write a finite value, or the grid's NODATA_value" + (" (0 or negative: EF5 reads no PET "
                                                                                   "nodata test)" if kind == "pet"
                                                                                   else ""))
    if kind == "pet" and (used & is_nodata).any():
        log.warning("%s: %d basin cell(s) hold the positive NODATA_value %g; EF5 does not test PET for nodata and "
                    "uses it as a PET value, and so does this engine (write a negative nodata value to read 0)",
                    where, int(np.sum(used & is_nodata)), grid.nodata)
    return np.where(used, v, 0.0)


def load_forcing(f: Forcing, steps: list[datetime], begin: datetime, dem: Grid, rows: np.ndarray,
                 cols: np.ndarray) -> ForcingSeries:
    """Read every file the steps need once, sample it at the nodes, convert to mm/h."""
    # EF5: rate = grid value (float) * convert (float(3600.0 / seconds)), a float product
    factor = np.float32(unit_factor(f.unit))

    def read(path: Path) -> np.ndarray:
        v = _sample(read_grid(path), dem, rows, cols, "pet" if f.kind == "pet" else "precip", path).astype(np.float32)
        return (v * factor).astype(np.float64)

    return _read_series(f, steps, begin, rows.size, np.float64, read, what="forcing", missing_as="zero",
                        section="that forcing section")


def _sample_temperature(grid: Grid, dem: Grid, rows: np.ndarray, cols: np.ndarray, path: Path,
                        grid_dem: Grid | None) -> np.ndarray:
    """One temperature grid at the basin cells, as EF5's ``TempReader::Read`` (float32, degC).

    Same shape as the DEM: the cell's value. Otherwise the value at the DEM cell's upper-left corner,
    moved to the cell's elevation with the lapse rate when ``grid_dem`` (``[TempForcing] DEM=``) has
    the temperature grid's shape. Nodata and cells outside the grid read 0 degC. A non-finite value
    that is not the nodata value is an error (EF5 would carry NaN into the snowpack).
    """
    data = grid.data.astype(np.float32)
    nodata = np.float32(grid.nodata)
    if grid.same_shape(dem):
        v = data[rows, cols]
        ok = v != nodata
    else:
        x, y = dem.cell_corners(cols, rows)
        c, r, inside = grid.locate(x, y)
        v = data[r, c]
        ok = inside & (v != nodata)
        if grid_dem is not None and grid_dem.same_shape(grid):
            v = lapse_temperature(v, grid_dem.data.astype(np.float32)[r, c], dem.data.astype(np.float32)[rows, cols])
    if not grid.has_nodata:
        # deliberate: -9999 in a grid without nodata (a tag-less GeoTIFF) is a temperature to EF5
        src = (rows, cols) if grid.same_shape(dem) else (r, c)
        bad = np.nonzero(ok & grid.untagged_sentinels()[src])[0]
        if bad.size:
            raise untagged_sentinel_error(grid, int(src[0][bad[0]]), int(src[1][bad[0]]), "temperature",
                                          "a temperature (degC)")
    v = np.where(ok, v, np.float32(0.0)).astype(np.float32)
    if not np.all(np.isfinite(v)):
        raise InputError(f"{path}: {int(np.sum(~np.isfinite(v)))} basin cell(s) hold a non-finite temperature",
                         fix="fill the grid or mark the cells with its nodata value (read as 0 degC, as EF5 does)")
    return v


def load_temperature(f: Forcing, steps: list[datetime], begin: datetime, dem: Grid, rows: np.ndarray,
                     cols: np.ndarray) -> ForcingSeries:
    """Air temperature (degC, float32) at every step and basin cell, as EF5 reads ``[TempForcing]``.

    The same file timing as the other forcing (the first forcing time ``>=`` the step's end); a missing
    file is 0 degC (``TempReader.cpp:53-59``; ``Simulator.cpp:862`` logs "Assuming zeros"), counted and
    logged; no file at all is an error. With ``DEM=`` (a GeoTIFF; EF5 loads it with its TIF reader only)
    a grid coarser than the DEM is lapsed at -6.5 degC/km to each cell's elevation (``TempReader.cpp:87-96``).
    """
    grid_dem = None
    if f.dem is not None:
        if f.dem.suffix.lower() == ".asc":
            raise InputError(f"[TempForcing {f.name}] DEM={f.dem}: EF5 reads this DEM only as GeoTIFF and silently "
                             "drops the lapse rate for an .asc file", fix="convert it to a float32 GeoTIFF")
        if not f.dem.exists():
            raise InputError(f"[TempForcing {f.name}] DEM={f.dem} does not exist (EF5 would warn and drop the "
                             "lapse rate)", fix="check DEM= or remove it")
        grid_dem = read_tif(f.dem)
    warned = False

    def read(path: Path) -> np.ndarray:
        nonlocal warned
        grid = read_grid(path)
        if grid_dem is not None and not grid.same_shape(dem) and not grid_dem.same_shape(grid) and not warned:
            log.warning("[TempForcing %s] DEM=%s is not the shape of %s: no lapse rate (as in EF5)", f.name, f.dem,
                        path)
            warned = True
        return _sample_temperature(grid, dem, rows, cols, path, grid_dem)

    return _read_series(f, steps, begin, rows.size, np.float32, read, what="temperature forcing",
                        missing_as="0 degC as EF5 does", section="that [TempForcing] section")


def _read_series(f: Forcing, steps: list[datetime], begin: datetime, n: int, dtype: Any,
                 read: Callable[[Path], np.ndarray], *, what: str, missing_as: str, section: str) -> ForcingSeries:
    """Every step's values from the file it reads, each distinct file read once by ``read``.

    A missing file is zeros (EF5's "Assuming zeros"), counted and logged; no file at all is an error.
    """
    names = forcing_file_names(f, steps, begin)
    cache: dict[str, np.ndarray] = {}
    missing: list[str] = []
    out = np.zeros((len(steps), n), dtype=dtype)
    zeros = np.zeros(n, dtype=dtype)
    for t, name in enumerate(names):
        if name not in cache:
            path = f.loc / name
            if path.exists():
                cache[name] = read(path)
            else:
                cache[name] = zeros
                missing.append(str(path))
        out[t] = cache[name]
    if missing and len(missing) == len(cache):
        raise InputError(f"{what} [{f.name}]: none of the {len(cache)} files the run needs exists "
                         f"(first: {missing[0]})", fix=f"check LOC and NAME of {section}")
    if missing:
        log.warning("%d %s %s file(s) missing, read as %s (first: %s)", len(missing), f.name, what.split()[0],
                    missing_as, missing[0])
    return ForcingSeries(out, missing, sorted(set(names)))


def forcing_checksum(f: Forcing, steps: list[datetime], begin: datetime) -> str:
    """A content checksum of every file a forcing section needs for these steps (for caching)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{f.unit}|{f.freq}|{f.pattern}".encode())
    for name in sorted(set(forcing_file_names(f, steps, begin))):
        p = f.loc / name
        h.update(name.encode())
        if p.exists():
            h.update(p.read_bytes())
        else:
            h.update(b"<missing>")
    return h.hexdigest()


_OBS_ISO = re.compile(r"^\s*(\d{4}).(\d{1,2}).(\d{1,2}).(\d{1,2}).(\d{1,2})(?:.(\d{1,2}))?\s*$")
_OBS_US = re.compile(r"^\s*(\d{1,2})/(\d{1,2})/(\d{4}).(\d{1,2}).(\d{1,2})\s*$")


def _obs_row(line: str) -> tuple[datetime, str] | None:
    """(time, value text) of a ``time,value[,...]`` row, or None when the time does not parse."""
    ts, sep, val = line.partition(",")
    if not sep:
        return None
    try:
        m = _OBS_ISO.match(ts)
        if m:
            y, mo, d, hh, mi, sec = (int(x) if x else 0 for x in m.groups())
            return datetime(y, mo, d, hh, mi, sec), val
        m = _OBS_US.match(ts)
        if m:
            mo, d, y, hh, mi = (int(x) for x in m.groups())
            return datetime(y, mo, d, hh, mi), val
    except ValueError:
        return None
    return None


def read_observations(path: Path) -> dict[datetime, float]:
    """Observed discharge (m3/s) by UTC time, from ``time,value`` rows.

    Values are kept as written: EF5 copies -999 through, and so does the output CSV; metrics
    mask values <= -998; ``nan`` is a missing value. The first non-blank line, if it has no digit
    before its first comma, is the header; any other line that does not parse is skipped with one warning
    that counts them. Data lines of which none parses, and an infinite value, are
    :class:`InputError` (with ``file:line``); a file with no data line at all (header only, as a
    synthetic basin writes it before its truth is simulated) is a warning.
    """
    if not path.exists():
        raise InputError(f"observation file not found: {path}", fix="check OBS= in the [Gauge] section")
    obs: dict[datetime, float] = {}
    skipped: list[tuple[int, str]] = []
    lines = path.read_text(errors="replace").splitlines()
    first = True
    for lineno, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        header, first = first, False
        row = _obs_row(line)
        try:
            if row is None:
                raise ValueError
            value = float(row[1].split(",")[0])
        except ValueError:
            if not header or any(ch.isdigit() for ch in line.partition(",")[0]):  # else: the header line
                skipped.append((lineno, line))
            continue
        if math.isinf(value):
            raise InputError(f"{path}:{lineno}: discharge {row[1].strip()[:30]!r} is not finite",
                             fix="write the measured value, or -999 (or nan) for a missing observation")
        obs[row[0]] = value
    if not obs and skipped:
        raise InputError(f"{path}: no row could be read as 'time,discharge' ({len(skipped)} data line(s); line "
                         f"{skipped[0][0]} reads {skipped[0][1][:60]!r})",
                         fix="write rows like '2020-06-01 01:00,1.5' (or '06/01/2020 01:00,1.5'), one per time")
    if not obs:
        log.warning("%s: the observation file holds no rows (only a header or nothing): nothing to score against", path)
    if skipped:
        log.warning("%s: %d line(s) could not be read as 'time,discharge' and were skipped (first: line %d, %r)",
                    path, len(skipped), skipped[0][0], skipped[0][1][:60])
    return obs
