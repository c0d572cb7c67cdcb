"""EF5 control files: a strict reader, a typed model and a writer.

Syntax (EF5 v1.2.3, ``docs/ef5-crest-spec.md`` section 4): ``[SectionType name]`` headers, then
``key=value`` pairs; a value ends at white space, so several pairs may share a line and paths
cannot hold spaces; comments are ``#``, ``//`` and ``/* ... */``; keys, section types and section
names are case-insensitive (names are lower-cased), paths keep their case.

EF5 ignores what it does not know. We do not: an unknown section or key, a key given twice, a
section defined twice, a missing required key, a bad date, duration or number fails with
``file:line``, the key and the fix (:class:`ControlFileError`). Paths are resolved against the
control file's folder (EF5 resolves them against its working directory; the reference cases are
run from their own folder, so both agree there).

Every number is checked where it is read (a plain decimal number, finite, in range):

* parameter scalars: ``|value| <= 1e6`` (``TH``, a count of cells: ``<= 1e12``); a negative
  ``KE``, ``UNDER``, ``TH`` or ``ISU`` is refused; a negative value of another CREST/KW parameter is one
  EF5 silently replaces (``WM`` by 100, ``B`` and ``FC`` by 1, ...), so it is accepted with a
  warning that says what EF5 uses instead; Snow-17 values (``[Snow17ParamSet]``) must be ``>= 0``
  except ``MBASE`` (a temperature), and ``TIPM <= 1``;
* snow: ``SNOW=SNOW17`` needs ``SNOW_PARAM_SET`` (a ``[Snow17ParamSet]``, after ``SNOW``) and ``TEMP`` (a
  ``[TempForcing]`` with ``UNIT=C``, TYPE ASC or TIF, optional ``DEM=`` for the lapse rate); either
  without ``SNOW`` is an error (EF5 would ignore them);
* gauges: ``CELLX``/``CELLY`` whole numbers ``>= 0``; ``LAT`` in [-90, 90]; ``LON`` in
  [-180, 360]; ``BASINAREA`` in (0, 1e8] km2;
* durations (``TIMESTEP``, ``FREQ``) and the time part of ``UNIT``: a count of at least 1, at
  most 100 years in all;
* times: ``TIME_BEGIN < TIME_END``; ``TIME_WARMEND`` and ``TIME_STATE`` inside that window.

The parser is one tokenizer (:func:`_tokenize`) and one builder per section type
(``_build_basic``, ``_build_forcing``, ``_build_gauge``, ``_build_basin``, ``_build_param_set``,
``_build_task``, ``_build_execute``), then a cross-reference check.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from hydroagent_hpc.sim.errors import ControlFileError

log = logging.getLogger(__name__)

__all__ = [
    "ControlFile", "Basic", "Forcing", "Gauge", "ParamSet", "Task", "parse_control", "parse_time",
    "parse_duration", "parse_unit", "duration_seconds", "CREST_PARAMS", "KW_PARAMS", "SNOW17_PARAMS",
    "MAX_DURATION_S",
]

CREST_PARAMS = ("wm", "b", "im", "ke", "fc", "iwu")
KW_PARAMS = ("under", "leaki", "th", "isu", "alpha", "beta", "alpha0")
SNOW17_PARAMS = ("uadj", "mbase", "mfmax", "mfmin", "tipm", "nmf", "plwhc", "scf")  # EF5's Models.tbl order
_KIND_PARAMS = {"crest": CREST_PARAMS, "kw": KW_PARAMS, "snow17": SNOW17_PARAMS}

_SECTIONS = {
    "basic": {"dem", "ddm", "fam", "proj", "esriddm", "selffam"},
    "precipforcing": {"type", "unit", "freq", "loc", "name"},
    "petforcing": {"type", "unit", "freq", "loc", "name"},
    "tempforcing": {"type", "unit", "freq", "loc", "name", "dem"},
    "gauge": {"lat", "lon", "cellx", "celly", "obs", "basinarea", "outputts", "wantda", "wantco",
              "continueupstream", "obsfamily"},
    "basin": {"gauge"},
    "crestparamset": {"gauge", *CREST_PARAMS, *(f"{p}_grid" for p in CREST_PARAMS)},
    "kwparamset": {"gauge", *KW_PARAMS, *(f"{p}_grid" for p in KW_PARAMS)},
    "snow17paramset": {"gauge", *SNOW17_PARAMS, *(f"{p}_grid" for p in SNOW17_PARAMS)},
    "task": {"style", "model", "routing", "basin", "precip", "pet", "output", "param_set",
             "routing_param_set", "timestep", "time_begin", "time_end", "time_warmend", "states",
             "time_state", "output_grids", "defaultparamsgauge", "preload_file", "cali_param",
             "routing_cali_param", "snow", "snow_param_set", "temp", "qpf", "temp_forecast"},
    "execute": {"task"},
}
# Sections EF5 knows that the embedded engine does not run; --backend ef5 still can.
_EF5_ONLY = {"crestcaliparams", "kwcaliparams", "lrparamset", "lrcaliparams", "snow17caliparams",
             "sacparamset", "hymodparamset", "hpparamset", "ensembletask", "inundationparamset", "damparamset"}
_REQUIRED = {
    "basic": ("dem", "ddm", "fam", "proj", "esriddm", "selffam"),
    "precipforcing": ("type", "unit", "freq", "loc", "name"),
    "petforcing": ("type", "unit", "freq", "loc", "name"),
    "tempforcing": ("type", "unit", "freq", "loc", "name"),
    "task": ("style", "model", "basin", "precip", "pet", "output", "param_set", "timestep",
             "time_begin", "time_end"),
}
_FORCING_TYPES = {"precipforcing": {"asc", "tif", "bif", "mrms", "trmmrt"}, "petforcing": {"asc", "tif", "bif"},
                  "tempforcing": {"asc", "tif"}}


@dataclass
class Basic:
    dem: Path
    ddm: Path
    fam: Path
    proj: str
    esriddm: bool
    selffam: bool


@dataclass
class Forcing:
    name: str
    type: str
    unit: str
    freq: str
    loc: Path
    pattern: str
    line: int = 0
    # "precip": EF5 fills the NAME's date fields only down to FREQ's unit (finer ones stay literal,
    # and a missing one is an error); PET and temperature fill every field they have (DatedName.cpp).
    kind: str = "pet"
    dem: Path | None = None  # [TempForcing] DEM=: the temperature grid's elevations (lapse rate)


@dataclass
class Gauge:
    name: str
    cellx: int | None = None
    celly: int | None = None
    lat: float | None = None
    lon: float | None = None
    obs: Path | None = None
    basinarea: float | None = None
    outputts: bool = True
    line: int = 0
    where: str = ""  # ``file:line`` of the section, for errors found later (off the grid, say)


@dataclass
class ParamSet:
    """Scalars per gauge plus optional grids; ``kind`` is 'crest', 'kw' or 'snow17'."""

    name: str
    kind: str
    values: dict[str, dict[str, float]] = field(default_factory=dict)  # gauge -> param -> scalar
    grids: dict[str, Path] = field(default_factory=dict)  # param -> grid path
    line: int = 0


@dataclass
class Task:
    name: str
    style: str
    model: str
    basin: str
    precip: str
    pet: str
    output: Path
    param_set: str
    timestep: str
    time_begin: datetime
    time_end: datetime
    routing: str | None = None
    routing_param_set: str | None = None
    time_warmend: datetime | None = None
    states: Path | None = None
    time_state: datetime | None = None
    snow: str | None = None  # SNOW=SNOW17
    snow_param_set: str | None = None
    temp: str | None = None  # TEMP=: a [TempForcing] section
    line: int = 0
    lines: dict[str, int] = field(default_factory=dict)  # key -> line of the control file


@dataclass
class ControlFile:
    path: Path
    basic: Basic
    precip: dict[str, Forcing]
    pet: dict[str, Forcing]
    gauges: dict[str, Gauge]
    basins: dict[str, list[str]]
    param_sets: dict[str, ParamSet]
    tasks: dict[str, Task]
    execute: list[str]
    temp: dict[str, Forcing] = field(default_factory=dict)  # [TempForcing] sections

    def task(self, name: str | None = None) -> Task:
        """The named task, or the first one the Execute section runs."""
        key = (name or (self.execute[0] if self.execute else "")).lower()
        if key not in self.tasks:
            raise ControlFileError(f"no task named {key!r}", str(self.path),
                                   fix=f"name one of: {', '.join(self.tasks) or '(none defined)'}")
        return self.tasks[key]


_TIME_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})?$")
_DUR_RE = re.compile(r"^(\d*)([ymdhus])$")
_UNIT_RE = re.compile(r"^([a-z]+)/(\d*)([a-z]+)$")
_NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_SECONDS = {"s": 1, "u": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "m": 30 * 86400, "y": 365 * 86400}
MAX_DURATION_S = 100 * 365 * 86400  # the longest TIMESTEP, FREQ or UNIT span: 100 years
_PARAM_MAX = 1e6
_TH_MAX = 1e12
# A negative value EF5 replaces silently (warned), and what it uses instead.
_EF5_REPLACES_NEGATIVE = {"wm": "EF5 uses WM=100", "b": "EF5 uses B=1", "fc": "EF5 uses FC=1",
                          "alpha": "EF5 uses ALPHA=1", "beta": "EF5 uses BETA=0.6", "alpha0": "EF5 uses ALPHA0=1",
                          "im": "EF5 clips the impervious fraction to 0", "leaki": "EF5 clips LEAKI to 0",
                          "iwu": "EF5 clips the initial soil water to 0"}
_MUST_BE_NONNEGATIVE = {"uadj": "UADJ is a wind function (mm/mb per 6 h)", "mfmax": "MFMAX is a melt factor",
                        "mfmin": "MFMIN is a melt factor", "tipm": "TIPM is a weight in [0, 1]",
                        "nmf": "NMF is a negative-melt factor given as a positive number",
                        "plwhc": "PLWHC is a fraction of the ice", "scf": "SCF multiplies snowfall",
                        "ke": "a negative KE turns evaporation into a water source",
                        "under": "a negative UNDER gives interflow a negative speed",
                        "th": "TH is a count of upstream cells", "isu": "ISU is an initial water depth rate"}


def parse_time(text: str, where: str = "", key: str = "") -> datetime:
    """Parse EF5's ``YYYYMMDDHHUU[SS]`` time stamps (UTC, naive); ``where`` is ``file:line``."""
    m = _TIME_RE.match(text)
    try:
        if not m:
            raise ValueError
        y, mo, d, h, mi, sec = (int(g) if g else 0 for g in m.groups())
        return datetime(y, mo, d, h, mi, sec)
    except ValueError:
        path, _, line = where.rpartition(":") if ":" in where else (where, "", "0")
        raise ControlFileError(f"{key or 'time'}={text!r} is not a valid time", path, int(line or 0), key,
                               fix="write YYYYMMDDHHUU, e.g. 202006010000") from None


def duration_seconds(count: int, unit: str) -> int:
    """Seconds of ``count`` units; a month is 30 days and a year 365 (EF5's unit rule)."""
    return count * _SECONDS[unit]


# The date fields of a forcing NAME, coarsest first, and the finest field each FREQ unit fills.
NAME_FIELDS = ("YYYY", "MM", "DD", "HH", "UU", "SS")
NAME_FIELDS_BY_UNIT = {"y": 0, "m": 1, "d": 2, "h": 3, "u": 4, "s": 5}


def parse_duration(text: str) -> tuple[int, str]:
    """``1h``, ``15u``, ``1d``, ``1m`` (month), ``1y``, ``30s`` -> (count, unit letter).

    The count is at least 1 (``0h`` would never advance) and the whole span at most 100 years
    (:data:`MAX_DURATION_S`); anything else raises ``ValueError``.
    """
    m = _DUR_RE.match(text.strip().lower())
    if not m:
        raise ValueError(f"{text!r} is not a duration like 1h, 15u, 1d, 1m or 1y")
    count, unit = int(m.group(1) or 1), m.group(2)
    if count < 1:
        raise ValueError(f"{text!r} is a zero duration: time would never advance")
    if duration_seconds(count, unit) > MAX_DURATION_S:
        raise ValueError(f"{text!r} is longer than 100 years")
    return count, unit


def parse_unit(text: str) -> tuple[str, int]:
    """A forcing UNIT ``LENGTH/[COUNT]SPAN`` (``mm/h``, ``mm/3h``, ``mm/100d``) -> (length, seconds).

    Only the time part counts for EF5. ``ValueError`` for anything else, a zero count, or a span
    over 100 years.
    """
    m = _UNIT_RE.match(text.strip().lower())
    if not m or m.group(3) not in _SECONDS:
        raise ValueError(f"UNIT={text!r} is not a rate EF5 understands")
    count = int(m.group(2) or 1)
    if count < 1:
        raise ValueError(f"UNIT={text!r} has a zero time span")
    span = count * _SECONDS[m.group(3)]
    if span > MAX_DURATION_S:
        raise ValueError(f"UNIT={text!r} spans more than 100 years")
    return m.group(1), span


def _strip_comments(text: str) -> list[str]:
    """Remove ``/* */`` (keeping line breaks), ``//`` and ``#`` comments; return lines."""
    text = re.sub(r"/\*.*?\*/", lambda m: "\n" * m.group(0).count("\n"), text, flags=re.S)
    out = []
    for line in text.split("\n"):
        for mark in ("#", "//"):
            i = line.find(mark)
            if i >= 0:
                line = line[:i]
        out.append(line)
    return out


Where = tuple[str, int]


def _bool(value: str, where: Where, key: str) -> bool:
    v = value.lower()
    if v in ("true", "yes", "1", "t", "y"):
        return True
    if v in ("false", "no", "0", "f", "n"):
        return False
    raise ControlFileError(f"{key}={value!r} is not a boolean", where[0], where[1], key, fix="write true or false")


def _float(value: str, where: Where, key: str, lower: float | None = None, upper: float | None = None,
           positive: bool = False, integer: bool = False) -> float:
    """A plain decimal number, finite, optionally whole and inside ``[lower, upper]`` (``> 0`` if ``positive``).

    ``inf``, ``nan``, hex, ``1_000`` and numbers that overflow a double are refused: EF5 reads
    numbers with ``strtod`` and such values only fail later, far from this line.
    """
    want = f"a number in [{lower:g}, {upper:g}]" if lower is not None and upper is not None else "a finite number"
    if not _NUMBER_RE.match(value):
        raise ControlFileError(f"{key}={value!r} is not a number", where[0], where[1], key,
                               fix=f"write a plain decimal number such as 1.5 or 2e-3 ({want})")
    v = float(value)
    if v in (float("inf"), float("-inf")):
        raise ControlFileError(f"{key}={value!r} overflows a double (it is not finite)", where[0], where[1], key,
                               fix=f"write {want}")
    if integer and v != int(v):
        raise ControlFileError(f"{key}={value!r} is not a whole number", where[0], where[1], key,
                               fix="write a whole number (a zero-based column or row)")
    if (lower is not None and v < lower) or (upper is not None and v > upper) or (positive and v <= 0):
        rng = (f"in (0, {upper:g}]" if positive else f"in [{lower:g}, {upper:g}]") if upper is not None else ">= 0"
        raise ControlFileError(f"{key}={value} is out of range: {key.upper()} must be {rng}", where[0], where[1], key,
                               fix=f"give {key.upper()} a value {rng}")
    return v


def _duration(value: str, where: Where, key: str) -> str:
    try:
        parse_duration(value)
    except ValueError as exc:
        raise ControlFileError(f"{key}: {exc}", where[0], where[1], key,
                               fix=f"write e.g. {key.upper()}=1h "
                                   f"(a count >= 1 of s, u, h, d, m or y; at most 100 years)") from None
    return value.lower()


@dataclass
class _Section:
    """One ``[Type name]`` section as tokenized: ``entries`` are (key, value, line) in file order."""

    stype: str
    sname: str
    line: int
    path: str
    base: Path
    entries: list[tuple[str, str, int]] = field(default_factory=list)

    @property
    def title(self) -> str:
        return f"[{self.stype} {self.sname}]" if self.sname else f"[{self.stype}]"

    def single(self, repeatable: tuple[str, ...] = ()) -> dict[str, tuple[str, int]]:
        """Keys that may appear once -> (value, line); a second occurrence is an error."""
        kv: dict[str, tuple[str, int]] = {}
        for k, v, ln in self.entries:
            if k in repeatable:
                continue
            if k in kv:
                raise ControlFileError(f"{k.upper()} is given twice in {self.title} (first at line {kv[k][1]})",
                                       self.path, ln, k, fix=f"keep one {k.upper()}= in this section")
            kv[k] = (v, ln)
        for req in _REQUIRED.get(self.stype, ()):
            if req not in kv:
                raise ControlFileError(f"{self.title} is missing the required key {req!r}", self.path, self.line, req,
                                       fix=f"add {req.upper()}=... to this section")
        return kv


def _tokenize(text: str, sp: str, base: Path) -> list[_Section]:
    """Pass 1: split into sections of (key, value, line) entries, refusing unknown sections and keys."""
    sections: list[_Section] = []
    for lineno, line in enumerate(_strip_comments(text), start=1):
        s = line.strip()
        if not s:
            continue
        if s.startswith("["):
            m = re.match(r"^\[\s*([A-Za-z0-9_]+)\s*([^\]\s]*)\s*\]$", s)
            if not m:
                raise ControlFileError(f"malformed section header {s!r}", sp, lineno, fix="write [SectionType name]")
            stype, sname = m.group(1).lower(), m.group(2).lower()
            if stype in _EF5_ONLY:
                raise ControlFileError(f"section [{m.group(1)}] is not supported by the embedded engine", sp, lineno,
                                       fix="remove it, or run this control file with --backend ef5")
            if stype not in _SECTIONS:
                raise ControlFileError(f"unknown section [{m.group(1)}]", sp, lineno,
                                       fix=f"use one of: {', '.join(sorted(_SECTIONS))}")
            if stype not in ("basic", "execute") and not sname:
                raise ControlFileError(f"section [{m.group(1)}] needs a name", sp, lineno,
                                       fix=f"write [{m.group(1)} NAME]")
            sections.append(_Section(stype, sname, lineno, sp, base))
            continue
        if not sections:
            raise ControlFileError(f"text before the first section: {s[:40]!r}", sp, lineno,
                                   fix="start with a [Section] header")
        for tok in s.split():
            if "=" not in tok or tok.startswith("="):
                raise ControlFileError(f"expected key=value, got {tok!r}", sp, lineno,
                                       fix="write key=value (no spaces around '=' or in values)")
            k, v = tok.split("=", 1)
            k = k.lower()
            stype = sections[-1].stype
            if k not in _SECTIONS[stype]:
                raise ControlFileError(f"unknown key {k!r} in [{stype}]", sp, lineno, k,
                                       fix=f"known keys: {', '.join(sorted(_SECTIONS[stype]))}")
            if v == "":
                raise ControlFileError(f"{k} has no value", sp, lineno, k, fix=f"write {k}=VALUE")
            sections[-1].entries.append((k, v, lineno))
    return sections


def _build_basic(sec: _Section) -> Basic:
    kv = sec.single()
    proj = kv["proj"][0].lower()
    if proj not in ("geographic", "laea"):
        raise ControlFileError(f"PROJ={kv['proj'][0]!r} is not supported", sec.path, kv["proj"][1], "proj",
                               fix="write PROJ=geographic (laea is EF5-only)")
    if proj == "laea":
        raise ControlFileError("PROJ=laea is not supported by the embedded engine", sec.path, kv["proj"][1], "proj",
                               fix="reproject to geographic, or use --backend ef5")
    b = sec.base
    return Basic(b / kv["dem"][0], b / kv["ddm"][0], b / kv["fam"][0], proj,
                 _bool(kv["esriddm"][0], (sec.path, kv["esriddm"][1]), "esriddm"),
                 _bool(kv["selffam"][0], (sec.path, kv["selffam"][1]), "selffam"))


def _build_forcing(sec: _Section) -> Forcing:
    kv = sec.single()
    at = lambda k: (sec.path, kv[k][1])  # noqa: E731
    ftype = kv["type"][0].lower()
    if ftype not in _FORCING_TYPES[sec.stype]:
        raise ControlFileError(f"TYPE={kv['type'][0]!r} is not valid here", *at("type"), "type",
                               fix=f"use one of: {', '.join(sorted(_FORCING_TYPES[sec.stype]))}")
    if ftype not in ("asc", "tif"):
        raise ControlFileError(f"TYPE={kv['type'][0]} forcing is not supported by the embedded engine", *at("type"),
                               "type", fix="convert the forcing to ASC or TIF grids, or use --backend ef5")
    unit = kv["unit"][0]
    if sec.stype == "tempforcing":
        if unit.strip().lower() != "c":
            raise ControlFileError(f"UNIT={unit!r} is not a temperature unit", *at("unit"), "unit",
                                   fix="write UNIT=C (EF5 reads temperature in degrees Celsius only)")
    elif not (sec.stype == "petforcing" and unit.strip().lower() == "c"):  # C: temperature for Hamon PET (EF5 only)
        try:
            parse_unit(unit)
        except ValueError as exc:
            raise ControlFileError(str(exc), *at("unit"), "unit",
                                   fix="write e.g. UNIT=mm/h, mm/3h, mm/d or mm/100d (a count >= 1 of s, u, min, h, "
                                       "hr, d, m or y)") from None
    freq = _duration(kv["freq"][0], at("freq"), "freq")
    kind = {"precipforcing": "precip", "tempforcing": "temp"}.get(sec.stype, "pet")
    if kind == "precip":
        need = NAME_FIELDS[:NAME_FIELDS_BY_UNIT[parse_duration(freq)[1]] + 1]
        absent = [f for f in need if f not in kv["name"][0]]
        if absent:
            raise ControlFileError(f"FREQ={freq} needs the date field(s) {', '.join(absent)} in NAME="
                                   f"{kv['name'][0]!r} (EF5: 'The file name was specified with improper resolution')",
                                   *at("freq"), "freq", fix=f"put every date field down to FREQ's unit in NAME "
                                                            f"({''.join(need)}), or give a coarser FREQ")
    dem = sec.base / kv["dem"][0] if "dem" in kv else None
    return Forcing(sec.sname, ftype, unit, freq, sec.base / kv["loc"][0], kv["name"][0], sec.line, kind=kind, dem=dem)


def _build_gauge(sec: _Section) -> Gauge:
    g = Gauge(sec.sname, line=sec.line, where=f"{sec.path}:{sec.line}")
    for k, (v, ln) in sec.single().items():
        at = (sec.path, ln)
        if k in ("cellx", "celly"):
            setattr(g, k, int(_float(v, at, k, lower=0, upper=1e9, integer=True)))
        elif k == "lat":
            g.lat = _float(v, at, k, lower=-90.0, upper=90.0)
        elif k == "lon":
            g.lon = _float(v, at, k, lower=-180.0, upper=360.0)
        elif k == "basinarea":
            g.basinarea = _float(v, at, k, upper=1e8, positive=True)
        elif k == "obs":
            g.obs = sec.base / v
        elif k == "outputts":
            g.outputts = _bool(v, at, k)
    if (g.cellx is None or g.celly is None) and (g.lat is None or g.lon is None):
        raise ControlFileError(f"[Gauge {sec.sname}] has no location", sec.path, sec.line, "cellx",
                               fix="add CELLX= and CELLY= (zero-based column/row) or LAT= and LON=")
    return g


def _build_basin(sec: _Section) -> list[str]:
    sec.single(repeatable=("gauge",))
    return [v.lower() for k, v, _ in sec.entries if k == "gauge"]


def _param_value(key: str, value: str, where: Where) -> float:
    """A parameter scalar: finite, ``|v| <= 1e6`` (TH ``<= 1e12``); negatives refused or warned (module doc)."""
    upper = _TH_MAX if key == "th" else _PARAM_MAX
    v = _float(value, where, key, lower=-upper, upper=upper)
    if key == "tipm" and v > 1.0:
        raise ControlFileError(f"TIPM={value} is above 1: 1-TIPM is raised to a fractional power (NaN in EF5)",
                               where[0], where[1], key, fix="give TIPM a value in [0, 1] (typically 0.05-0.2)")
    if v < 0 and key != "mbase":  # MBASE is a temperature (degC): any sign
        if key in _MUST_BE_NONNEGATIVE:
            raise ControlFileError(f"{key.upper()}={value} is negative: {_MUST_BE_NONNEGATIVE[key]}", where[0],
                                   where[1], key, fix=f"give {key.upper()} a value >= 0")
        log.warning("%s:%d: %s=%s is negative; %s (give a value >= 0 to silence this)", where[0], where[1],
                    key.upper(), value, _EF5_REPLACES_NEGATIVE[key])
    return v


def _build_param_set(sec: _Section) -> ParamSet:
    kind = sec.stype[:-len("paramset")]
    names = _KIND_PARAMS[kind]
    ps = ParamSet(sec.sname, kind, line=sec.line)
    current: str | None = None
    seen: dict[str, int] = {}
    grid_lines: dict[str, int] = {}
    for k, v, ln in sec.entries:
        if k == "gauge":
            current = v.lower()
            if current in ps.values:
                raise ControlFileError(f"gauge {current!r} is listed twice in {sec.title}", sec.path, ln, "gauge",
                                       fix="give each gauge's values once")
            ps.values[current] = {}
            seen = {}
        elif k.endswith("_grid"):
            if k in grid_lines:
                raise ControlFileError(f"{k} is given twice in {sec.title} (first at line {grid_lines[k]})", sec.path,
                                       ln, k, fix=f"keep one {k}=")
            grid_lines[k] = ln
            ps.grids[k[:-5]] = sec.base / v
        else:
            if current is None:
                raise ControlFileError(f"{k.upper()} comes before any GAUGE= line", sec.path, ln, k,
                                       fix="put GAUGE=NAME before the parameter values it applies to")
            if k in seen:
                raise ControlFileError(f"{k.upper()} is given twice for gauge {current!r} in {sec.title} "
                                       f"(first at line {seen[k]})", sec.path, ln, k, fix=f"keep one {k.upper()}=")
            seen[k] = ln
            ps.values[current][k] = _param_value(k, v, (sec.path, ln))
    for gname, vals in ps.values.items():
        missing = [p for p in names if p not in vals]
        if missing:
            raise ControlFileError(f"{sec.title} gauge {gname!r} lacks {', '.join(missing)}", sec.path, sec.line,
                                   missing[0], fix=f"give all of {', '.join(n.upper() for n in names)} for every gauge")
    return ps


def _build_task(sec: _Section) -> Task:
    kv = sec.single()
    sp, order = sec.path, [k for k, _, _ in sec.entries]
    at = lambda k: (sp, kv[k][1])  # noqa: E731
    for first, second in (("model", "param_set"), ("routing", "routing_param_set"), ("snow", "snow_param_set")):
        if second in kv and (first not in kv or kv[first][1] > kv[second][1] or
                             (kv[first][1] == kv[second][1] and order.index(first) > order.index(second))):
            raise ControlFileError(f"{second.upper()} comes before {first.upper()} in [Task {sec.sname}]", sp,
                                   kv[second][1], second,
                                   fix=f"EF5 reads {second.upper()} in the context of {first.upper()}: "
                                       f"put {first.upper()}= above it")
    times = {k: parse_time(kv[k][0], f"{sp}:{kv[k][1]}", k)
             for k in ("time_begin", "time_end", "time_warmend", "time_state") if k in kv}
    timestep = _duration(kv["timestep"][0], at("timestep"), "timestep")
    begin, end = times["time_begin"], times["time_end"]
    if end <= begin:
        raise ControlFileError("TIME_END is not after TIME_BEGIN", *at("time_end"), "time_end",
                               fix="swap or correct the times")
    for k, role in (("time_warmend", "the end of the warm-up"), ("time_state", "the time states are saved")):
        if k in times and not begin <= times[k] <= end:
            raise ControlFileError(f"{k.upper()}={kv[k][0]} ({role}) is outside the window "
                                   f"{begin:%Y%m%d%H%M}..{end:%Y%m%d%H%M}", *at(k), k,
                                   fix=f"give {k.upper()} between TIME_BEGIN and TIME_END")
    low = lambda k: kv[k][0].lower() if k in kv else None  # noqa: E731
    snow = low("snow")
    if snow is not None and snow != "snow17":
        raise ControlFileError(f"SNOW={kv['snow'][0]!r} is not a snow model EF5 knows", *at("snow"), "snow",
                               fix="write SNOW=SNOW17 (EF5's only snow model), or remove SNOW")
    for key in ("snow_param_set", "temp"):
        if snow is not None and key not in kv:
            raise ControlFileError(f"[Task {sec.sname}] has SNOW={kv['snow'][0]} but no {key.upper()}", sp, sec.line,
                                   key, fix=f"add {key.upper()}=NAME (EF5 refuses a snow task without it)")
        if snow is None and key in kv:
            raise ControlFileError(f"{key.upper()}= is given without SNOW=SNOW17", *at(key), key,
                                   fix="add SNOW=SNOW17 above it, or remove it (EF5 ignores it without SNOW)")
    return Task(sec.sname, kv["style"][0].lower(), kv["model"][0].lower(), kv["basin"][0].lower(),
                kv["precip"][0].lower(), kv["pet"][0].lower(), sec.base / kv["output"][0],
                kv["param_set"][0].lower(), timestep, begin, end, line=sec.line, routing=low("routing"),
                routing_param_set=low("routing_param_set"), time_warmend=times.get("time_warmend"),
                time_state=times.get("time_state"), states=sec.base / kv["states"][0] if "states" in kv else None,
                snow=snow, snow_param_set=low("snow_param_set"), temp=low("temp"),
                lines={k: ln for k, (_, ln) in kv.items()})


def _build_execute(sec: _Section) -> list[str]:
    sec.single(repeatable=("task",))
    return [v.lower() for k, v, _ in sec.entries if k == "task"]


# Section type -> (builder, the table of the model it fills); names within a table are unique.
_BUILDERS: dict[str, tuple[Callable[[_Section], object], str]] = {
    "basic": (_build_basic, "basic"), "precipforcing": (_build_forcing, "precip"),
    "petforcing": (_build_forcing, "pet"), "tempforcing": (_build_forcing, "temp"),
    "gauge": (_build_gauge, "gauges"), "basin": (_build_basin, "basins"),
    "crestparamset": (_build_param_set, "param_sets"), "kwparamset": (_build_param_set, "param_sets"),
    "snow17paramset": (_build_param_set, "param_sets"),
    "task": (_build_task, "tasks"), "execute": (_build_execute, "execute"),
}


def parse_control(path: str | Path) -> ControlFile:
    """Read and validate an EF5 control file."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise ControlFileError(f"control file not found: {path}", fix="check the path") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise ControlFileError(f"control file cannot be read: {path} ({exc.strerror})", fix="check the path") from None
    sp = str(path)
    tables: dict[str, dict] = {"precip": {}, "pet": {}, "temp": {}, "gauges": {}, "basins": {}, "param_sets": {},
                               "tasks": {}}
    defined: dict[tuple[str, str], int] = {}
    basic: Basic | None = None
    execute: list[str] = []
    for sec in _tokenize(text, sp, path.resolve().parent):
        builder, table = _BUILDERS[sec.stype]
        if sec.stype == "basic" and basic is not None:
            raise ControlFileError("a second [Basic] section", sp, sec.line, fix="keep one [Basic] section")
        if table in tables:
            first = defined.setdefault((table, sec.sname), sec.line)
            if first != sec.line:
                raise ControlFileError(f"{sec.title} is defined twice (first at line {first}): a {sec.stype} "
                                       f"section named {sec.sname!r} already exists", sp, sec.line, sec.stype,
                                       fix="rename or remove one of them")
        built = builder(sec)
        if sec.stype == "basic":
            basic = built  # type: ignore[assignment]
        elif sec.stype == "execute":
            execute.extend(built)  # type: ignore[arg-type]
        else:
            tables[table][sec.sname] = built
    if basic is None:
        raise ControlFileError("no [Basic] section", sp, fix="add [Basic] with DEM, DDM, FAM, PROJ, ESRIDDM, SELFFAM")
    cf = ControlFile(path, basic, tables["precip"], tables["pet"], tables["gauges"], tables["basins"],
                     tables["param_sets"], tables["tasks"], execute, tables["temp"])
    _check_references(cf)
    return cf


def _check_references(cf: ControlFile) -> None:
    sp = str(cf.path)
    for bname, glist in cf.basins.items():
        for g in glist:
            if g not in cf.gauges:
                raise ControlFileError(f"basin {bname!r} names gauge {g!r}, which has no [Gauge] section", sp,
                                       key="gauge",
                                       fix=f"define [Gauge {g}] or remove it (gauges: {', '.join(cf.gauges)})")
    for ps in cf.param_sets.values():
        for g in ps.values:
            if g not in cf.gauges:
                raise ControlFileError(f"parameter set {ps.name!r} names unknown gauge {g!r}", sp, ps.line, "gauge",
                                       fix=f"use one of: {', '.join(cf.gauges)}")
    for tname in cf.execute:
        if tname not in cf.tasks:
            raise ControlFileError(f"[Execute] runs task {tname!r}, which is not defined", sp, key="task",
                                   fix=f"define [Task {tname}] (tasks: {', '.join(cf.tasks) or 'none'})")
    for t in cf.tasks.values():
        checks: list[tuple[str, str, Mapping[str, object]]] = [
            ("basin", t.basin, cf.basins), ("precip", t.precip, cf.precip), ("pet", t.pet, cf.pet),
            ("param_set", t.param_set, cf.param_sets)]
        if t.routing_param_set:
            checks.append(("routing_param_set", t.routing_param_set, cf.param_sets))
        if t.snow_param_set:
            checks.append(("snow_param_set", t.snow_param_set, cf.param_sets))
        if t.temp:
            checks.append(("temp", t.temp, cf.temp))
        for key, val, table in checks:
            if val not in table:
                raise ControlFileError(f"task {t.name!r}: {key.upper()}={val!r} names no such section", sp,
                                       t.lines.get(key, t.line), key,
                                       fix=f"use one of: {', '.join(table) or '(none defined)'}")
        if t.snow_param_set and cf.param_sets[t.snow_param_set].kind != "snow17":
            raise ControlFileError(f"task {t.name!r}: SNOW_PARAM_SET={t.snow_param_set!r} is not a [Snow17ParamSet]",
                                   sp, t.lines.get("snow_param_set", t.line), "snow_param_set",
                                   fix="name a [Snow17ParamSet] section")


def _num(v: float) -> str:
    """A number as EF5 reads it (``repr`` round-trips a float exactly)."""
    if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v or v in (float("inf"), float("-inf")):
        raise ValueError(f"only finite numbers reach a control file, got {v!r}")
    return repr(float(v))


def _p(path) -> str:
    text = str(path)
    if any(ch.isspace() for ch in text):
        raise ValueError(f"EF5 cannot read paths with spaces: {text!r}; move the data to a path without spaces")
    return text


def render_control(cf: ControlFile, task: str | None = None, overrides: Mapping[str, float] | None = None,
                   output: Path | None = None) -> str:
    """Write a control file for one task with absolute paths and multiplier overrides.

    Only numbers reach the parameter lines (``overrides`` values are checked to be finite
    floats); names come from the parsed model, never from the caller, so nothing but numbers
    can be injected. ``output`` replaces the task's OUTPUT (and STATES) folder.
    """
    tk = cf.task(task)
    over = {k.lower(): _num(v) for k, v in (overrides or {}).items()}
    known = CREST_PARAMS + KW_PARAMS + (SNOW17_PARAMS if tk.snow else ())
    for k in over:
        if k not in known:
            raise ValueError(f"unknown parameter {k!r}; valid: {', '.join(known)}")
    b = cf.basic
    lines = ["[Basic]", f"DEM={_p(b.dem)}", f"DDM={_p(b.ddm)}", f"FAM={_p(b.fam)}", f"PROJ={b.proj}",
             f"ESRIDDM={'true' if b.esriddm else 'false'}", f"SELFFAM={'true' if b.selffam else 'false'}", ""]
    for sect, f in (("PrecipForcing", cf.precip[tk.precip]), ("PETForcing", cf.pet[tk.pet])):
        lines += [f"[{sect} {f.name}]", f"TYPE={f.type.upper()}", f"UNIT={f.unit}", f"FREQ={f.freq}",
                  f"LOC={_p(f.loc)}", f"NAME={f.pattern}", ""]
    if tk.temp:
        f = cf.temp[tk.temp]
        lines += [f"[TempForcing {f.name}]", f"TYPE={f.type.upper()}", f"UNIT={f.unit}", f"FREQ={f.freq}",
                  f"LOC={_p(f.loc)}", f"NAME={f.pattern}", *([f"DEM={_p(f.dem)}"] if f.dem else []), ""]
    gauges = cf.basins[tk.basin]
    for gname in gauges:
        g = cf.gauges[gname]
        lines.append(f"[Gauge {g.name}]")
        if g.lat is not None and g.lon is not None:  # EF5 places a gauge by LAT/LON whenever LAT is set
            lines += [f"LAT={_num(g.lat)}", f"LON={_num(g.lon)}"]
        else:  # the [Gauge] builder guarantees CELLX and CELLY when LAT/LON are absent
            lines += [f"CELLX={g.cellx}", f"CELLY={g.celly}"]
        if g.basinarea is not None:  # EF5 searches for BASINAREA however the gauge was placed
            lines.append(f"BASINAREA={_num(g.basinarea)}")
        if g.obs is not None:
            lines.append(f"OBS={_p(g.obs)}")
        lines += [f"OUTPUTTS={'TRUE' if g.outputts else 'FALSE'}", ""]
    lines += [f"[Basin {tk.basin}]", *(f"GAUGE={g}" for g in gauges), ""]
    for ps_name, header in ((tk.param_set, "CrestParamSet"), (tk.routing_param_set, "KWParamSet"),
                            (tk.snow_param_set, "Snow17ParamSet")):
        if not ps_name:
            continue
        ps = cf.param_sets[ps_name]
        names = _KIND_PARAMS[ps.kind]
        lines.append(f"[{header} {ps.name}]")
        lines += [f"{p}_grid={_p(path)}" for p, path in ps.grids.items()]
        for gname, vals in ps.values.items():
            lines.append(f"GAUGE={gname}")
            lines += [f"{p.upper()}={over.get(p, _num(vals[p]))}" for p in names]
        lines.append("")
    out = output if output is not None else tk.output
    lines += [f"[Task {tk.name}]", f"STYLE={tk.style.upper()}", f"MODEL={tk.model.upper()}"]
    if tk.routing:
        lines.append(f"ROUTING={tk.routing.upper()}")
    lines += [f"BASIN={tk.basin}", f"PRECIP={tk.precip}", f"PET={tk.pet}", f"OUTPUT={_p(out)}",
              f"PARAM_SET={tk.param_set}"]
    if tk.routing_param_set:
        lines.append(f"ROUTING_PARAM_SET={tk.routing_param_set}")
    if tk.snow:
        lines += [f"SNOW={tk.snow.upper()}", f"SNOW_PARAM_SET={tk.snow_param_set}", f"TEMP={tk.temp}"]
    lines += [f"TIMESTEP={tk.timestep}", f"TIME_BEGIN={tk.time_begin:%Y%m%d%H%M}", f"TIME_END={tk.time_end:%Y%m%d%H%M}"]
    if tk.time_warmend:
        lines.append(f"TIME_WARMEND={tk.time_warmend:%Y%m%d%H%M}")
    if tk.states is not None:
        lines.append(f"STATES={_p(out if output is not None else tk.states)}")
        if tk.time_state:
            lines.append(f"TIME_STATE={tk.time_state:%Y%m%d%H%M}")
    lines += ["", "[Execute]", f"TASK={tk.name}", ""]
    return "\n".join(lines)
