"""EF5 control files: a strict reader, a typed model and a writer.

Syntax (EF5 v1.2.3, ``docs/ef5-crest-spec.md`` section 4): ``[SectionType name]`` headers, then
``key=value`` pairs; a value ends at white space, so several pairs may share a line and paths
cannot hold spaces; comments are ``#``, ``//`` and ``/* ... */``; keys, section types and section
names are case-insensitive (names are lower-cased), paths keep their case.

EF5 ignores what it does not know. We do not: an unknown section or key, a missing required key,
a bad date or number fails with ``file:line``, the key and the fix (:class:`ControlFileError`).
Paths are resolved against the control file's folder (EF5 resolves them against its working
directory; the reference cases are run from their own folder, so both agree there).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from hydroagent_hpc.sim.errors import ControlFileError

__all__ = [
    "ControlFile", "Basic", "Forcing", "Gauge", "ParamSet", "Task", "parse_control", "parse_time",
    "parse_duration", "CREST_PARAMS", "KW_PARAMS",
]

CREST_PARAMS = ("wm", "b", "im", "ke", "fc", "iwu")
KW_PARAMS = ("under", "leaki", "th", "isu", "alpha", "beta", "alpha0")

_SECTIONS = {
    "basic": {"dem", "ddm", "fam", "proj", "esriddm", "selffam"},
    "precipforcing": {"type", "unit", "freq", "loc", "name"},
    "petforcing": {"type", "unit", "freq", "loc", "name"},
    "gauge": {"lat", "lon", "cellx", "celly", "obs", "basinarea", "outputts", "wantda", "wantco",
              "continueupstream", "obsfamily"},
    "basin": {"gauge"},
    "crestparamset": {"gauge", *CREST_PARAMS, *(f"{p}_grid" for p in CREST_PARAMS)},
    "kwparamset": {"gauge", *KW_PARAMS, *(f"{p}_grid" for p in KW_PARAMS)},
    "task": {"style", "model", "routing", "basin", "precip", "pet", "output", "param_set",
             "routing_param_set", "timestep", "time_begin", "time_end", "time_warmend", "states",
             "time_state", "output_grids", "defaultparamsgauge", "preload_file", "cali_param",
             "routing_cali_param", "snow", "snow_param_set", "temp", "qpf", "temp_forecast"},
    "execute": {"task"},
}
# Sections EF5 knows that the embedded engine does not run; --backend ef5 still can.
_EF5_ONLY = {"tempforcing", "crestcaliparams", "kwcaliparams", "lrparamset", "lrcaliparams",
             "sacparamset", "hymodparamset", "hpparamset", "snow17paramset", "ensembletask",
             "inundationparamset", "damparamset"}
_REQUIRED = {
    "basic": ("dem", "ddm", "fam", "proj", "esriddm", "selffam"),
    "precipforcing": ("type", "unit", "freq", "loc", "name"),
    "petforcing": ("type", "unit", "freq", "loc", "name"),
    "task": ("style", "model", "basin", "precip", "pet", "output", "param_set", "timestep",
             "time_begin", "time_end"),
}
_FORCING_TYPES = {"precipforcing": {"asc", "tif", "bif", "mrms", "trmmrt"}, "petforcing": {"asc", "tif", "bif"}}


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


@dataclass
class ParamSet:
    """Scalars per gauge plus optional grids; ``kind`` is 'crest' or 'kw'."""

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
    line: int = 0


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

    def task(self, name: str | None = None) -> Task:
        """The named task, or the first one the Execute section runs."""
        key = (name or (self.execute[0] if self.execute else "")).lower()
        if key not in self.tasks:
            raise ControlFileError(f"no task named {key!r}", str(self.path),
                                   fix=f"name one of: {', '.join(self.tasks) or '(none defined)'}")
        return self.tasks[key]


_TIME_RE = re.compile(r"^(\d{4})(\d{2})(\d{2})(\d{2})(\d{2})(\d{2})?$")
_DUR_RE = re.compile(r"^(\d*)([ymdhus])$")


def parse_time(text: str, where: str = "", key: str = "") -> datetime:
    """Parse EF5's ``YYYYMMDDHHUU[SS]`` time stamps (UTC, naive)."""
    m = _TIME_RE.match(text)
    try:
        if not m:
            raise ValueError
        parts = [int(g) if g else 0 for g in m.groups()]
        return datetime(*parts)
    except ValueError:
        raise ControlFileError(f"{key or 'time'}={text!r} is not a valid time", where.rsplit(":", 1)[0] if where else "",
                               int(where.rsplit(":", 1)[1]) if where and ":" in where else 0, key,
                               fix="write YYYYMMDDHHUU, e.g. 202006010000") from None


def parse_duration(text: str) -> tuple[int, str]:
    """``1h``, ``15u``, ``1d``, ``1m`` (month), ``1y``, ``30s`` -> (count, unit letter)."""
    m = _DUR_RE.match(text.strip().lower())
    if not m:
        raise ValueError(f"{text!r} is not a duration like 1h, 15u, 1d, 1m or 1y")
    return int(m.group(1) or 1), m.group(2)


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


def _bool(value: str, where: tuple[str, int], key: str) -> bool:
    v = value.lower()
    if v in ("true", "yes", "1", "t", "y"):
        return True
    if v in ("false", "no", "0", "f", "n"):
        return False
    raise ControlFileError(f"{key}={value!r} is not a boolean", where[0], where[1], key, fix="write true or false")


def _float(value: str, where: tuple[str, int], key: str) -> float:
    try:
        return float(value)
    except ValueError:
        raise ControlFileError(f"{key}={value!r} is not a number", where[0], where[1], key, fix="write a plain number") from None


def parse_control(path: str | Path) -> ControlFile:
    """Read and validate an EF5 control file."""
    path = Path(path)
    try:
        text = path.read_text(errors="replace")
    except FileNotFoundError:
        raise ControlFileError(f"control file not found: {path}", fix="check the path") from None
    base = path.resolve().parent
    sp = str(path)

    # Pass 1: tokenize into sections of (key, value, line) entries.
    sections: list[tuple[str, str, int, list[tuple[str, str, int]]]] = []
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
                raise ControlFileError(f"section [{m.group(1)}] needs a name", sp, lineno, fix=f"write [{m.group(1)} NAME]")
            sections.append((stype, sname, lineno, []))
            continue
        if not sections:
            raise ControlFileError(f"text before the first section: {s[:40]!r}", sp, lineno, fix="start with a [Section] header")
        for tok in s.split():
            if "=" not in tok or tok.startswith("="):
                raise ControlFileError(f"expected key=value, got {tok!r}", sp, lineno, fix="write key=value (no spaces around '=' or in values)")
            k, v = tok.split("=", 1)
            k = k.lower()
            stype = sections[-1][0]
            if k not in _SECTIONS[stype]:
                raise ControlFileError(f"unknown key {k!r} in [{stype}]", sp, lineno, k,
                                       fix=f"known keys: {', '.join(sorted(_SECTIONS[stype]))}")
            if v == "":
                raise ControlFileError(f"{k} has no value", sp, lineno, k, fix=f"write {k}=VALUE")
            sections[-1][3].append((k, v, lineno))

    # Pass 2: build the typed model.
    basic = None
    precip: dict[str, Forcing] = {}
    pet: dict[str, Forcing] = {}
    gauges: dict[str, Gauge] = {}
    basins: dict[str, list[str]] = {}
    psets: dict[str, ParamSet] = {}
    tasks: dict[str, Task] = {}
    execute: list[str] = []
    for stype, sname, hline, entries in sections:
        kv: dict[str, tuple[str, int]] = {}
        for k, v, ln in entries:
            if k not in ("gauge", "task") and stype not in ("crestparamset", "kwparamset"):
                kv[k] = (v, ln)
        for req in _REQUIRED.get(stype, ()):
            if req not in kv:
                raise ControlFileError(f"[{stype} {sname}] is missing the required key {req!r}".replace(" ]", "]"),
                                       sp, hline, req, fix=f"add {req.upper()}=... to this section")
        get = lambda k: kv[k][0]  # noqa: E731
        at = lambda k: (sp, kv[k][1] if k in kv else hline)  # noqa: E731
        if stype == "basic":
            if basic is not None:
                raise ControlFileError("a second [Basic] section", sp, hline, fix="keep one [Basic] section")
            proj = get("proj").lower()
            if proj not in ("geographic", "laea"):
                raise ControlFileError(f"PROJ={get('proj')!r} is not supported", sp, kv["proj"][1], "proj",
                                       fix="write PROJ=geographic (laea is EF5-only)" if proj != "laea" else
                                       "the embedded engine supports PROJ=geographic; run laea grids with --backend ef5")
            if proj == "laea":
                raise ControlFileError("PROJ=laea is not supported by the embedded engine", sp, kv["proj"][1], "proj",
                                       fix="reproject to geographic, or use --backend ef5")
            basic = Basic(base / get("dem"), base / get("ddm"), base / get("fam"), proj,
                          _bool(get("esriddm"), at("esriddm"), "esriddm"), _bool(get("selffam"), at("selffam"), "selffam"))
        elif stype in ("precipforcing", "petforcing"):
            ftype = get("type").lower()
            if ftype not in _FORCING_TYPES[stype]:
                raise ControlFileError(f"TYPE={get('type')!r} is not valid here", *at("type"), "type",
                                       fix=f"use one of: {', '.join(sorted(_FORCING_TYPES[stype]))}")
            if ftype not in ("asc", "tif"):
                raise ControlFileError(f"TYPE={get('type')} forcing is not supported by the embedded engine", *at("type"),
                                       "type", fix="convert the forcing to ASC or TIF grids, or use --backend ef5")
            for k in ("freq",):
                try:
                    parse_duration(get(k))
                except ValueError as exc:
                    raise ControlFileError(str(exc), *at(k), k, fix="write e.g. FREQ=1h") from None
            f = Forcing(sname, ftype, get("unit"), get("freq").lower(), base / get("loc"), get("name"), hline)
            (precip if stype == "precipforcing" else pet)[sname] = f
        elif stype == "gauge":
            g = Gauge(sname, line=hline)
            for k, (v, ln) in kv.items():
                if k in ("cellx", "celly"):
                    setattr(g, k, int(_float(v, (sp, ln), k)))
                elif k in ("lat", "lon", "basinarea"):
                    setattr(g, k, _float(v, (sp, ln), k))
                elif k == "obs":
                    g.obs = base / v
                elif k == "outputts":
                    g.outputts = _bool(v, (sp, ln), k)
            if (g.cellx is None or g.celly is None) and (g.lat is None or g.lon is None):
                raise ControlFileError(f"[Gauge {sname}] has no location", sp, hline, "cellx",
                                       fix="add CELLX= and CELLY= (zero-based column/row) or LAT= and LON=")
            gauges[sname] = g
        elif stype == "basin":
            basins[sname] = [v.lower() for k, v, _ in entries if k == "gauge"]
        elif stype in ("crestparamset", "kwparamset"):
            kind = "crest" if stype == "crestparamset" else "kw"
            names = CREST_PARAMS if kind == "crest" else KW_PARAMS
            ps = ParamSet(sname, kind, line=hline)
            current = None
            for k, v, ln in entries:
                if k == "gauge":
                    current = v.lower()
                    ps.values[current] = {}
                elif k.endswith("_grid"):
                    ps.grids[k[:-5]] = base / v
                else:
                    if current is None:
                        raise ControlFileError(f"{k.upper()} comes before any GAUGE= line", sp, ln, k,
                                               fix="put GAUGE=NAME before the parameter values it applies to")
                    ps.values[current][k] = _float(v, (sp, ln), k)
            for gname, vals in ps.values.items():
                missing = [p for p in names if p not in vals]
                if missing:
                    raise ControlFileError(f"[{stype} {sname}] gauge {gname!r} lacks {', '.join(missing)}", sp, hline,
                                           missing[0], fix=f"give all of {', '.join(n.upper() for n in names)} for every gauge")
            psets[sname] = ps
        elif stype == "task":
            for first, second in (("model", "param_set"), ("routing", "routing_param_set")):
                if second in kv and (first not in kv or kv[first][1] > kv[second][1] or
                                     (kv[first][1] == kv[second][1] and
                                      [k for k, _, _ in entries].index(first) > [k for k, _, _ in entries].index(second))):
                    raise ControlFileError(f"{second.upper()} comes before {first.upper()} in [Task {sname}]", sp,
                                           kv[second][1], second,
                                           fix=f"EF5 reads {second.upper()} in the context of {first.upper()}: "
                                               f"put {first.upper()}= above it")
            times = {}
            for k in ("time_begin", "time_end", "time_warmend", "time_state"):
                if k in kv:
                    times[k] = parse_time(kv[k][0], f"{sp}:{kv[k][1]}", k)
            try:
                parse_duration(get("timestep"))
            except ValueError as exc:
                raise ControlFileError(str(exc), *at("timestep"), "timestep", fix="write e.g. TIMESTEP=1h") from None
            t = Task(sname, get("style").lower(), get("model").lower(), get("basin").lower(), get("precip").lower(),
                     get("pet").lower(), base / get("output"), get("param_set").lower(), get("timestep").lower(),
                     times["time_begin"], times["time_end"], line=hline,
                     routing=kv["routing"][0].lower() if "routing" in kv else None,
                     routing_param_set=kv["routing_param_set"][0].lower() if "routing_param_set" in kv else None,
                     time_warmend=times.get("time_warmend"), time_state=times.get("time_state"),
                     states=base / kv["states"][0] if "states" in kv else None)
            if t.time_end <= t.time_begin:
                raise ControlFileError("TIME_END is not after TIME_BEGIN", *at("time_end"), "time_end", fix="swap or correct the times")
            tasks[sname] = t
        elif stype == "execute":
            execute.extend(v.lower() for k, v, _ in entries if k == "task")
    if basic is None:
        raise ControlFileError("no [Basic] section", sp, fix="add [Basic] with DEM, DDM, FAM, PROJ, ESRIDDM, SELFFAM")
    cf = ControlFile(path, basic, precip, pet, gauges, basins, psets, tasks, execute)
    _check_references(cf)
    return cf


def _check_references(cf: ControlFile) -> None:
    sp = str(cf.path)
    for bname, glist in cf.basins.items():
        for g in glist:
            if g not in cf.gauges:
                raise ControlFileError(f"basin {bname!r} names gauge {g!r}, which has no [Gauge] section", sp, key="gauge",
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
        checks = [("basin", t.basin, cf.basins), ("precip", t.precip, cf.precip), ("pet", t.pet, cf.pet),
                  ("param_set", t.param_set, cf.param_sets)]
        if t.routing_param_set:
            checks.append(("routing_param_set", t.routing_param_set, cf.param_sets))
        for key, val, table in checks:
            if val not in table:
                raise ControlFileError(f"task {t.name!r}: {key.upper()}={val!r} names no such section", sp, t.line, key,
                                       fix=f"use one of: {', '.join(table) or '(none defined)'}")


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


def render_control(cf: ControlFile, task: str | None = None, overrides: dict[str, float] | None = None,
                   output: Path | None = None) -> str:
    """Write a control file for one task with absolute paths and multiplier overrides.

    Only numbers reach the parameter lines (``overrides`` values are checked to be finite
    floats); names come from the parsed model, never from the caller, so nothing but numbers
    can be injected. ``output`` replaces the task's OUTPUT (and STATES) folder.
    """
    tk = cf.task(task)
    over = {k.lower(): _num(v) for k, v in (overrides or {}).items()}
    for k in over:
        if k not in CREST_PARAMS + KW_PARAMS:
            raise ValueError(f"unknown parameter {k!r}; valid: {', '.join(CREST_PARAMS + KW_PARAMS)}")
    b = cf.basic
    lines = ["[Basic]", f"DEM={_p(b.dem)}", f"DDM={_p(b.ddm)}", f"FAM={_p(b.fam)}", f"PROJ={b.proj}",
             f"ESRIDDM={'true' if b.esriddm else 'false'}", f"SELFFAM={'true' if b.selffam else 'false'}", ""]
    for sect, f in (("PrecipForcing", cf.precip[tk.precip]), ("PETForcing", cf.pet[tk.pet])):
        lines += [f"[{sect} {f.name}]", f"TYPE={f.type.upper()}", f"UNIT={f.unit}", f"FREQ={f.freq}", f"LOC={_p(f.loc)}",
                  f"NAME={f.pattern}", ""]
    gauges = cf.basins[tk.basin]
    for gname in gauges:
        g = cf.gauges[gname]
        lines.append(f"[Gauge {g.name}]")
        if g.cellx is not None and g.celly is not None:
            lines += [f"CELLX={g.cellx}", f"CELLY={g.celly}"]
        else:
            lines += [f"LAT={_num(g.lat)}", f"LON={_num(g.lon)}"]
            if g.basinarea is not None:
                lines.append(f"BASINAREA={_num(g.basinarea)}")
        if g.obs is not None:
            lines.append(f"OBS={_p(g.obs)}")
        lines += [f"OUTPUTTS={'TRUE' if g.outputts else 'FALSE'}", ""]
    lines += [f"[Basin {tk.basin}]", *(f"GAUGE={g}" for g in gauges), ""]
    for ps_name, header in ((tk.param_set, "CrestParamSet"), (tk.routing_param_set, "KWParamSet")):
        if not ps_name:
            continue
        ps = cf.param_sets[ps_name]
        names = CREST_PARAMS if ps.kind == "crest" else KW_PARAMS
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
    lines += [f"BASIN={tk.basin}", f"PRECIP={tk.precip}", f"PET={tk.pet}", f"OUTPUT={_p(out)}", f"PARAM_SET={tk.param_set}"]
    if tk.routing_param_set:
        lines.append(f"ROUTING_PARAM_SET={tk.routing_param_set}")
    lines += [f"TIMESTEP={tk.timestep}", f"TIME_BEGIN={tk.time_begin:%Y%m%d%H%M}", f"TIME_END={tk.time_end:%Y%m%d%H%M}"]
    if tk.time_warmend:
        lines.append(f"TIME_WARMEND={tk.time_warmend:%Y%m%d%H%M}")
    if tk.states is not None:
        lines.append(f"STATES={_p(out if output is not None else tk.states)}")
        if tk.time_state:
            lines.append(f"TIME_STATE={tk.time_state:%Y%m%d%H%M}")
    lines += ["", "[Execute]", f"TASK={tk.name}", ""]
    return "\n".join(lines)
