"""Bad simulator input gets one located error, up front (issue 13, item 1).

Every number the simulator reads (control-file keys, ESRI ASCII and GeoTIFF headers, forcing
values, observation rows) is fed generated values from seeded generators: bad ones must raise a
:class:`~hydroagent_hpc.errors.HydroAgentError` that names the file, the line or header key and
the fix, before anything large is allocated; acceptable ones must either run to a finite result
or end in a :class:`HydroAgentError` too. Nothing may hang, allocate without bound, or escape as a
bare Python or numpy exception. The case is a self-made 4 x 4 basin written into ``tmp_path``
(no shared data needed).
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
import resource
import signal
import struct
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import ControlFileError, InputError
from hydroagent_hpc.sim.forcing import read_observations
from hydroagent_hpc.sim.grids import Grid, read_asc, read_tif, write_asc, write_tif

ROOT = Path(__file__).resolve().parents[1]
SECONDS_PER_CASE = 30

# ----------------------------------------------------------------------------- the case


# ESRI codes: E=1, S=4, W=16. Column 1 is the river (flows south, off the grid at row 3);
# column 0 drains east into it, columns 2 and 3 west.
DDM = np.array([[1, 4, 16, 16]] * 4, dtype=float)
FAM = np.array([[0, 3, 1, 0], [0, 7, 1, 0], [0, 11, 1, 0], [0, 15, 1, 0]], dtype=float)
DEM = np.array([[100 - 10 * r + 5 * abs(c - 1) for c in range(4)] for r in range(4)], dtype=float)
XLL, YLL, CS = -97.5, 35.0, 0.01
BEGIN = datetime(2020, 6, 1, 0, 0)
HOURS = 6

CONTROL = """\
[Basic]
DEM=basic/dem.asc
DDM=basic/ddm.asc
FAM=basic/fam.asc
PROJ=geographic
ESRIDDM=true
SELFFAM=false

[PrecipForcing RAIN]
TYPE=ASC
UNIT=mm/h
FREQ=1h
LOC=precip
NAME=rain.YYYYMMDDHH.asc

[PETForcing PET]
TYPE=ASC
UNIT=mm/d
FREQ=1d
LOC=pet
NAME=PET.YYYYMMDD.asc

[Gauge Outlet]
CELLX=1
CELLY=3
OBS=obs/obs.csv
OUTPUTTS=TRUE

[Gauge Inner]
LAT=35.025
LON=-97.485
BASINAREA=8.2
OUTPUTTS=TRUE

[Basin B]
GAUGE=Outlet
GAUGE=Inner

[CrestParamSet C]
GAUGE=Outlet
WM=100.0
B=0.5
IM=5.0
KE=0.8
FC=5.0
IWU=50.0

[KWParamSet K]
GAUGE=Outlet
UNDER=0.5
LEAKI=0.1
TH=2
ISU=0.0
ALPHA=1.5
BETA=0.6
ALPHA0=1.0

[Task Run]
STYLE=SIMU
MODEL=CREST
ROUTING=KW
BASIN=B
PRECIP=RAIN
PET=PET
OUTPUT=output
PARAM_SET=C
ROUTING_PARAM_SET=K
TIMESTEP=1h
TIME_BEGIN=202006010000
TIME_END=202006010600
TIME_WARMEND=202006010100
STATES=states
TIME_STATE=202006010300

[Execute]
TASK=Run
"""


def make_case(root: Path) -> Path:
    """Write the 4 x 4 basin (grids, 6 hours of rain, daily PET, observations); return its control file."""
    for sub in ("basic", "precip", "pet", "obs", "output", "states"):
        (root / sub).mkdir(parents=True, exist_ok=True)
    for name, data in (("dem", DEM), ("ddm", DDM), ("fam", FAM)):
        write_asc(root / "basic" / f"{name}.asc", Grid(data, XLL, YLL, CS))
    for h in range(1, HOURS + 1):
        t = BEGIN + timedelta(hours=h)
        write_asc(root / "precip" / f"rain.{t:%Y%m%d%H}.asc", Grid(np.full((4, 4), 2.0 + h), XLL, YLL, CS))
    for day in (1, 2):
        write_asc(root / "pet" / f"PET.202006{day:02d}.asc", Grid(np.full((4, 4), 3.0), XLL, YLL, CS))
    rows = ["Date,Discharge(m3/s)"] + [f"{BEGIN + timedelta(hours=h):%Y-%m-%d %H:%M},{0.5 + 0.1 * h:.2f}"
                                       for h in range(1, HOURS + 1)]
    (root / "obs" / "obs.csv").write_text("\n".join(rows) + "\n")
    control = root / "control.txt"
    control.write_text(CONTROL)
    return control


def set_key(control: Path, section: str, key: str, value: str) -> int:
    """Replace ``KEY=...`` inside ``[section]`` (first match); return its line number."""
    lines = control.read_text().splitlines()
    inside = False
    for i, line in enumerate(lines):
        if line.startswith("["):
            inside = line.lower().startswith(f"[{section.lower()}")
        elif inside and line.upper().startswith(f"{key.upper()}="):
            lines[i] = f"{key}={value}"
            control.write_text("\n".join(lines) + "\n")
            return i + 1
    raise AssertionError(f"no {key} in [{section}]")


# ----------------------------------------------------------------------------- guards


@pytest.fixture(autouse=True)
def _deadline() -> Iterator[None]:
    """No case may hang: each gets SECONDS_PER_CASE of wall time (SIGALRM in the main thread)."""

    def expire(signum, frame):
        raise TimeoutError(f"case ran longer than {SECONDS_PER_CASE} s")

    old = signal.signal(signal.SIGALRM, expire)
    signal.alarm(SECONDS_PER_CASE)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def _located(exc: BaseException, path: Path, key: str | None = None, line: int | None = None) -> None:
    """The error names the file, the line (``file:line``) or key, and the fix."""
    msg = str(exc)
    assert isinstance(exc, HydroAgentError), f"{type(exc).__name__}: {msg}"
    assert str(path) in msg or path.name in msg, msg
    if line is not None:
        assert f"{path}:{line}:" in msg, msg
    if key is not None:
        assert key.lower() in msg.lower(), msg
    assert "fix:" in msg, msg


def _run_or_clear_error(control: Path) -> str:
    """Load and run; return 'ok' or 'error', failing on anything but HydroAgentError or bad output."""
    try:
        res = EmbeddedSimulator(control, cache_dir=False).run()
    except HydroAgentError as exc:
        assert "fix:" in str(exc), str(exc)
        return "error"
    assert np.all(np.isfinite(res.discharge))
    return "ok"


# ----------------------------------------------------------------------------- generators

_NUM = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")


def _numbers(rng: random.Random, n: int, integer: bool = False) -> list[str]:
    """Generated numeric-looking text: non-finite, overflowing, negative, zero, fractional, junk, normal."""
    junk = ["nan", "NaN", "inf", "-inf", "Infinity", "1e400", "-1e400", "0", "-0", "abc", "0x10", "1_000", "1,5",
            "--1", "1e", ".", "+", "١٢", "1e-400"]
    out = list(rng.sample(junk, min(n // 2, len(junk))))
    while len(out) < n:
        kind = rng.randrange(6)
        if kind == 0:
            out.append(f"-{rng.uniform(0.001, 1e3):.4g}")
        elif kind == 1:
            out.append(f"{rng.uniform(0.0, 10.0):.3f}" if not integer else str(rng.randint(0, 5)))
        elif kind == 2:
            out.append(f"1e{rng.randint(6, 300)}")
        elif kind == 3:
            out.append(f"{rng.randint(0, 5)}.{rng.randint(1, 9)}")
        elif kind == 4:
            out.append(str(rng.randint(-5, 2 ** 70)))
        else:
            out.append(f"{rng.uniform(0.0, 2.0):.2e}")
    return out


def _finite(text: str) -> float | None:
    if not _NUM.match(text):
        return None
    v = float(text)
    return v if math.isfinite(v) else None


# Per parameter key: (lower bound or None, where None means a negative value is clamped by EF5 and warned,
# upper bound). The documented ranges of sim/controlfile.py.
_PARAM_RANGE = {"wm": None, "b": None, "im": None, "ke": 0.0, "fc": None, "iwu": None, "under": 0.0, "leaki": None,
                "th": 0.0, "isu": 0.0, "alpha": None, "beta": None, "alpha0": None}


def _param_verdict(key: str, text: str) -> str:
    v = _finite(text)
    if v is None:
        return "refuse"
    upper = 1e12 if key == "th" else 1e6
    if abs(v) > upper:
        return "refuse"
    if v < 0:
        return "refuse" if _PARAM_RANGE[key] is not None else "warn"
    return "accept"


def _gauge_verdict(key: str, text: str) -> str:
    v = _finite(text)
    if v is None:
        return "refuse"
    if key in ("cellx", "celly"):
        return "accept" if v >= 0 and v == int(v) and v <= 1e9 else "refuse"
    if key == "lat":
        return "accept" if -90 <= v <= 90 else "refuse"
    if key == "lon":
        return "accept" if -180 <= v <= 360 else "refuse"
    return "accept" if 0 < v <= 1e8 else "refuse"  # basinarea


_CONTROL_CASES: list[tuple[str, str, str, str]] = []
for _i, (_section, _key) in enumerate([("CrestParamSet", k) for k in ("wm", "b", "im", "ke", "fc", "iwu")] +
                                      [("KWParamSet", k) for k in ("under", "leaki", "th", "isu", "alpha", "beta",
                                                                   "alpha0")] +
                                      [("Gauge Outlet", "cellx"), ("Gauge Outlet", "celly"), ("Gauge Inner", "lat"),
                                       ("Gauge Inner", "lon"), ("Gauge Inner", "basinarea")]):
    for _v in _numbers(random.Random(1000 + _i), 16, integer=_key in ("cellx", "celly")):
        _verdict = _gauge_verdict(_key, _v) if _section.startswith("Gauge") else _param_verdict(_key, _v)
        _CONTROL_CASES.append((_section, _key, _v, _verdict))


@pytest.mark.parametrize("section,key,value,verdict", _CONTROL_CASES,
                         ids=[f"{k}={v}" for _, k, v, _ in _CONTROL_CASES])
def test_control_numbers(tmp_path, caplog, section, key, value, verdict):
    control = make_case(tmp_path)
    line = set_key(control, section, key, value)
    caplog.set_level(logging.WARNING)
    if verdict == "refuse":
        with pytest.raises(Exception) as ei:
            parse_control(control)
        _located(ei.value, control, key, line)
        assert isinstance(ei.value, ControlFileError)
        return
    parse_control(control)
    if verdict == "warn":
        assert any(f"{control}:{line}" in r.getMessage() and key.upper() in r.getMessage() for r in caplog.records), \
            [r.getMessage() for r in caplog.records]
    _run_or_clear_error(control)


def _duration_cases() -> list[tuple[str, str, str, str]]:
    rng = random.Random(7)
    values = ["0h", "00d", "-1h", "1.5h", "h", "1x", "1H", "99999999999d", "1000000y", "", " 1h", "1hh", "0u", "0s",
              "3h", "1d", "7u", "120y", "1201m", "1e3h"]
    values += [f"{rng.randint(0, 3)}{rng.choice('ymdhusx')}" for _ in range(10)]
    values += [f"{rng.randint(10 ** 6, 10 ** 12)}{rng.choice('hus')}" for _ in range(6)]
    cases = []
    for v in values:
        m = re.match(r"^(\d*)([ymdhus])$", v.strip().lower()) if v == v.strip() else None
        secs = {"s": 1, "u": 60, "h": 3600, "d": 86400, "m": 30 * 86400, "y": 365 * 86400}
        ok = bool(m) and int(m.group(1) or 1) >= 1 and int(m.group(1) or 1) * secs[m.group(2)] <= 100 * 365 * 86400 \
            if m else False
        for section, key in (("Task", "timestep"), ("PrecipForcing", "freq"), ("PETForcing", "freq")):
            if v == "":
                continue
            # EF5 refuses a precipitation FREQ finer than the NAME's finest date field (here HH)
            finer = section == "PrecipForcing" and bool(m) and m.group(2) in "us"
            cases.append((section, key, v, "accept" if ok and not finer else "refuse"))
    return cases


_DURATION_CASES = _duration_cases()


@pytest.mark.parametrize("section,key,value,verdict", _DURATION_CASES,
                         ids=[f"{s}-{k}={v}" for s, k, v, _ in _DURATION_CASES])
def test_control_durations(tmp_path, section, key, value, verdict):
    """TIMESTEP=0h looped forever; huge counts overflowed datetime; FREQ=0h hung the forcing reader."""
    control = make_case(tmp_path)
    line = set_key(control, section, key, value)
    if verdict == "refuse":
        with pytest.raises(Exception) as ei:
            parse_control(control)
        _located(ei.value, control, key, line)
        return
    parse_control(control)
    _run_or_clear_error(control)


def _unit_cases() -> list[tuple[str, str, str]]:
    rng = random.Random(11)
    values = ["mm/0h", "mm/-1h", "mm/1e3h", "mm/h", "mm/100d", "mm/99999999999999999999d", "mm/", "mm", "mm/1.5h",
              "mm/00d", "in/h", "mm/3h", "C"]
    values += [f"mm/{rng.randint(0, 2)}{rng.choice(['h', 'd', 'u', 'x', 'min', 'hr'])}" for _ in range(8)]
    out = []
    for v in values:
        m = re.match(r"^([a-z]+)/(\d*)([a-z]+)$", v.lower())
        secs = {"s": 1, "u": 60, "min": 60, "h": 3600, "hr": 3600, "d": 86400, "m": 30 * 86400, "y": 365 * 86400}
        ok = bool(m) and m.group(3) in secs and 1 <= int(m.group(2) or 1) and \
            int(m.group(2) or 1) * secs[m.group(3)] <= 100 * 365 * 86400
        out.append(("PrecipForcing", v, "accept" if ok else "refuse"))
        out.append(("PETForcing", v, "accept" if ok or v == "C" else "refuse"))
    return out


_UNIT_CASES = _unit_cases()


@pytest.mark.parametrize("section,value,verdict", _UNIT_CASES, ids=[f"{s}-{v}" for s, v, _ in _UNIT_CASES])
def test_control_units(tmp_path, section, value, verdict):
    """UNIT=mm/0h divided by zero when the forcing was loaded."""
    control = make_case(tmp_path)
    line = set_key(control, section, "unit", value)
    if verdict == "refuse":
        with pytest.raises(Exception) as ei:
            parse_control(control)
        _located(ei.value, control, "unit", line)
        return
    parse_control(control)
    _run_or_clear_error(control)


def _time_cases() -> list[tuple[str, str, str]]:
    rng = random.Random(13)
    cases = []
    for key in ("time_begin", "time_end", "time_warmend", "time_state"):
        for _ in range(8):
            t = BEGIN + timedelta(minutes=rng.randint(-600, 900))
            cases.append((key, f"{t:%Y%m%d%H%M}", ""))
        for bad in ("202013010000", "202006320000", "202006012500", "2020", "20200601000x", "000006010000"):
            cases.append((key, bad, "refuse"))
    return cases


_TIME_CASES = _time_cases()


def _time_verdict(key: str, value: str) -> str:
    times = {"time_begin": BEGIN, "time_end": BEGIN + timedelta(hours=HOURS),
             "time_warmend": BEGIN + timedelta(hours=1), "time_state": BEGIN + timedelta(hours=3)}
    try:
        times[key] = datetime.strptime(value, "%Y%m%d%H%M")
    except ValueError:
        return "refuse"
    b, e = times["time_begin"], times["time_end"]
    if e <= b:
        return "refuse" if key != "time_begin" else "refuse-end"
    for k in ("time_warmend", "time_state"):
        if not b <= times[k] <= e:
            return "refuse" if k == key else f"refuse-{k[5:]}"
    return "accept"


@pytest.mark.parametrize("key,value", [c[:2] for c in _TIME_CASES], ids=[f"{k}={v}" for k, v, _ in _TIME_CASES])
def test_control_times(tmp_path, key, value):
    """TIME_WARMEND after TIME_END (or a state time outside the window) is refused at its line."""
    control = make_case(tmp_path)
    line = set_key(control, "Task", key, value)
    verdict = _time_verdict(key, value)
    if verdict.startswith("refuse"):
        with pytest.raises(Exception) as ei:
            parse_control(control)
        if verdict == "refuse":
            _located(ei.value, control, key, line)
        else:
            other = {"refuse-end": "time_end", "refuse-warmend": "time_warmend", "refuse-state": "time_state"}[verdict]
            _located(ei.value, control, other)
        return
    parse_control(control)
    _run_or_clear_error(control)


def test_duplicate_keys_and_sections_are_refused(tmp_path):
    control = make_case(tmp_path)
    text = control.read_text()
    control.write_text(text.replace("WM=100.0\n", "WM=100.0\nWM=nan\n"))
    with pytest.raises(ControlFileError) as ei:
        parse_control(control)
    _located(ei.value, control, "wm", control.read_text().splitlines().index("WM=nan") + 1)
    control.write_text(text.replace("[Basin B]", "[Gauge Outlet]\nCELLX=2\nCELLY=2\n\n[Basin B]"))
    with pytest.raises(ControlFileError) as ei:
        parse_control(control)
    lines = control.read_text().splitlines()
    _located(ei.value, control, "gauge", len(lines) - lines[::-1].index("[Gauge Outlet]"))


# ----------------------------------------------------------------------------- window size and memory


def test_steps_are_counted_before_they_are_built(tmp_path, monkeypatch):
    """~94 million one-second steps ran 47 s before a traceback; now the count is refused at once."""
    control = make_case(tmp_path)
    set_key(control, "Task", "timestep", "1s")
    set_key(control, "Task", "time_end", "202306010000")
    line = set_key(control, "Task", "timestep", "1s")
    set_key(control, "PrecipForcing", "freq", "1s")
    set_key(control, "PrecipForcing", "name", "rain.YYYYMMDDHHUUSS.asc")
    set_key(control, "PETForcing", "freq", "1s")
    count = int((datetime(2023, 6, 1) - BEGIN).total_seconds())
    t0 = time.perf_counter()
    with pytest.raises(InputError) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    assert time.perf_counter() - t0 < 5.0
    _located(ei.value, control, "HYDROAGENT_MAX_STEPS", line)
    assert f"{count:,}" in str(ei.value), str(ei.value)
    monkeypatch.setenv("HYDROAGENT_MAX_STEPS", "5")
    set_key(control, "Task", "timestep", "1h")
    set_key(control, "Task", "time_end", "202006010600")
    for key in ("PrecipForcing", "PETForcing"):
        set_key(control, key, "freq", "1h" if key == "PrecipForcing" else "1d")
    set_key(control, "PrecipForcing", "name", "rain.YYYYMMDDHH.asc")  # EF5 leaves UUSS literal at FREQ=1h
    with pytest.raises(InputError, match=r"(?s)\b6 steps.*limit of 5.*HYDROAGENT_MAX_STEPS"):
        EmbeddedSimulator(control, cache_dir=False)
    monkeypatch.setenv("HYDROAGENT_MAX_STEPS", "6")
    assert EmbeddedSimulator(control, cache_dir=False).run().discharge.size == 6


def test_memory_is_estimated_before_forcing_is_loaded(tmp_path, monkeypatch):
    control = make_case(tmp_path)
    monkeypatch.setenv("HYDROAGENT_MAX_MEMORY_MB", "0.001")
    with pytest.raises(InputError) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    _located(ei.value, control, "HYDROAGENT_MAX_MEMORY_MB")
    for bad in ("abc", "-1", "nan", "0"):
        monkeypatch.setenv("HYDROAGENT_MAX_MEMORY_MB", bad)
        with pytest.raises(HydroAgentError, match="HYDROAGENT_MAX_MEMORY_MB"):
            EmbeddedSimulator(control, cache_dir=False)


@pytest.mark.parametrize("env", ["HYDROAGENT_MAX_CELLS", "HYDROAGENT_MAX_STEPS"])
@pytest.mark.parametrize("bad", ["abc", "-5", "1.5", "inf", ""])
def test_limit_variables_are_checked(tmp_path, monkeypatch, env, bad):
    control = make_case(tmp_path)
    monkeypatch.setenv(env, bad)
    if bad == "":
        EmbeddedSimulator(control, cache_dir=False)  # empty = unset, the default applies
        return
    with pytest.raises(HydroAgentError, match=env):
        EmbeddedSimulator(control, cache_dir=False)


# ----------------------------------------------------------------------------- ESRI ASCII headers

_ASC_KEYS = ("ncols", "nrows", "xllcorner", "yllcorner", "cellsize", "NODATA_value")


def _asc_verdict(key: str, text: str) -> str:
    v = _finite(text)
    if v is None:
        return "refuse"
    if key in ("ncols", "nrows"):
        if v != int(v) or v < 1:
            return "refuse"
        return "accept-if-4" if v == 4 else "mismatch"
    if key == "cellsize":
        return "accept" if v >= 1e-12 else "refuse"
    return "accept"


def _asc_cases() -> list[tuple[str, str, str, str]]:
    out = []
    for i, key in enumerate(_ASC_KEYS):
        for which in ("dem", "precip"):
            for v in _numbers(random.Random(2000 + 10 * i + (which == "precip")), 12,
                              integer=key in ("ncols", "nrows")) + (["4", "4.0", "200000"] if i < 2 else []):
                out.append((which, key, v, _asc_verdict(key, v)))
    return out


_ASC_CASES = _asc_cases()


def _grid_file(root: Path, which: str) -> Path:
    return root / "basic" / "dem.asc" if which == "dem" else root / "precip" / "rain.2020060103.asc"


@pytest.mark.parametrize("which,key,value,verdict", _ASC_CASES, ids=[f"{w}-{k}={v}" for w, k, v, _ in _ASC_CASES])
def test_asc_headers(tmp_path, which, key, value, verdict):
    """`ncols inf` was an OverflowError; negative sizes and cell sizes ran or ended in numpy messages."""
    control = make_case(tmp_path)
    path = _grid_file(tmp_path, which)
    lines = path.read_text().split("\n")
    lineno = _ASC_KEYS.index(key) + 1
    lines[lineno - 1] = f"{key} {value}"
    path.write_text("\n".join(lines))
    if verdict == "refuse":
        with pytest.raises(Exception) as ei:
            read_asc(path)
        _located(ei.value, path, key.lower(), lineno)
        with pytest.raises(HydroAgentError):
            EmbeddedSimulator(control, cache_dir=False)
        return
    if verdict == "mismatch":
        with pytest.raises(Exception) as ei:
            read_asc(path)
        _located(ei.value, path)
        return
    read_asc(path)
    _run_or_clear_error(control)


def _token_cases() -> list[tuple[str, int, str]]:
    rng = random.Random(17)
    tokens = ["abc", "1,2", "--1", "0x1", "1e", "*", "1.2.3", "NULL"]
    return [(rng.choice(("dem", "precip", "pet")), rng.randrange(16), rng.choice(tokens)) for _ in range(24)]


_TOKEN_CASES = _token_cases()


@pytest.mark.parametrize("which,pos,token", _TOKEN_CASES, ids=[f"{w}-{p}-{t}" for w, p, t in _TOKEN_CASES])
def test_non_numeric_grid_values_name_file_and_line(tmp_path, which, pos, token):
    control = make_case(tmp_path)
    path = {"dem": tmp_path / "basic" / "dem.asc", "precip": tmp_path / "precip" / "rain.2020060104.asc",
            "pet": tmp_path / "pet" / "PET.20200602.asc"}[which]
    lines = path.read_text().split("\n")
    row, col = divmod(pos, 4)
    values = lines[6 + row].split()
    values[col] = token
    lines[6 + row] = " ".join(values)
    path.write_text("\n".join(lines))
    with pytest.raises(Exception) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    _located(ei.value, path, line=7 + row)
    assert token in str(ei.value)


# ----------------------------------------------------------------------------- GeoTIFF headers


def _patch_dims(path: Path, width: int, height: int) -> None:
    """Rewrite ImageWidth/ImageLength in place as LONG values: a tiny file declaring a huge grid."""
    import tifffile

    with tifffile.TiffFile(path) as tf:
        offsets = {code: tf.pages[0].tags[code].offset for code in (256, 257)}
        byteorder = tf.byteorder
    with open(path, "r+b") as fh:
        for code, value in ((256, width), (257, height)):
            fh.seek(offsets[code])
            fh.write(struct.pack(byteorder + "HHII", code, 4, 1, value))


def _tif_cases() -> list[tuple[str, tuple]]:
    rng = random.Random(19)
    out: list[tuple[str, tuple]] = [("dims", (200_000, 200_000)), ("dims", (0, 4)), ("dims", (4, 0)),
                                    ("dims", (2 ** 31, 2)), ("dims", (70_000, 70_000))]
    for bad in (math.nan, math.inf, -math.inf, 0.0, -0.01, 1e-320):
        out.append(("scale", (bad, CS)))
        out.append(("scale", (CS, bad)))
        if not math.isfinite(bad):
            out.append(("tie", (bad, YLL + 4 * CS)))
            out.append(("tie", (XLL, bad)))
    out.append(("scale", (CS, 2 * CS)))
    for _ in range(10):
        out.append(("truncate", (rng.randrange(8, 400),)))
    for _ in range(16):
        out.append(("flip", (rng.randrange(8, 400), rng.randrange(1, 256))))
    return out


_TIF_CASES = _tif_cases()


def _write_tif_case(path: Path, kind: str, args: tuple) -> None:
    import tifffile

    write_tif(path, Grid(DEM.copy(), XLL, YLL, CS))
    if kind == "dims":
        _patch_dims(path, *args)
    elif kind in ("scale", "tie"):
        scale = (args[0], args[1], 0.0) if kind == "scale" else (CS, CS, 0.0)
        tie = (0.0, 0.0, 0.0, args[0], args[1], 0.0) if kind == "tie" else (0.0, 0.0, 0.0, XLL, YLL + 4 * CS, 0.0)
        tifffile.imwrite(path, DEM.astype(np.float32), photometric="minisblack", metadata=None,
                         extratags=[(33550, "d", 3, scale, True), (33922, "d", 6, tie, True)])
    elif kind == "truncate":
        data = path.read_bytes()
        path.write_bytes(data[: args[0]])
    else:
        data = bytearray(path.read_bytes())
        pos = args[0] % len(data)
        data[pos] ^= args[1]
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("kind,args", _TIF_CASES, ids=[f"{k}{a}" for k, a in _TIF_CASES])
def test_tif_headers(tmp_path, kind, args):
    """A 2 KB GeoTIFF declaring 200,000 x 200,000 cells tried to allocate 149 GiB; now its size is checked first."""
    path = tmp_path / "grid.tif"
    _write_tif_case(path, kind, args)
    rss0 = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    try:
        g = read_tif(path)
    except HydroAgentError as exc:
        _located(exc, path)
        if kind in ("dims", "scale", "tie"):
            words = ("cells", "pixelscale", "tiepoint", "square", "width", "length")
            assert any(w in str(exc).lower() for w in words), str(exc)
        return
    finally:
        assert (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - rss0) < 512 * 1024  # KiB: no huge allocation
    assert kind in ("truncate", "flip"), f"{kind}{args} was accepted"
    assert g.cellsize > 0 and math.isfinite(g.xll) and math.isfinite(g.yll) and g.data.size >= 1


# ----------------------------------------------------------------------------- network


def _cycle_cases() -> list[tuple[int, int, int, int]]:
    rng = random.Random(23)
    out = []
    while len(out) < 20:
        r, c = rng.randrange(4), rng.randrange(4)
        dr, dc = rng.choice([(0, 1), (1, 0), (0, -1), (-1, 0), (1, 1), (-1, -1), (1, -1), (-1, 1)])
        if 0 <= r + dr < 4 and 0 <= c + dc < 4:
            out.append((r, c, r + dr, c + dc))
    return out


_CYCLE_CASES = _cycle_cases()
_TOWARD = {(0, 1): 1, (1, 1): 2, (1, 0): 4, (1, -1): 8, (0, -1): 16, (-1, -1): 32, (-1, 0): 64, (-1, 1): 128}


@pytest.mark.parametrize("r0,c0,r1,c1", _CYCLE_CASES, ids=[f"{a}{b}-{c}{d}" for a, b, c, d in _CYCLE_CASES])
def test_flow_direction_cycles(tmp_path, caplog, r0, c0, r1, c1):
    """A DDM whose cells point at each other ran silently; a cycle through a gauge is refused, elsewhere warned."""
    control = make_case(tmp_path)
    ddm = DDM.copy()
    ddm[r0, c0] = _TOWARD[(r1 - r0, c1 - c0)]
    ddm[r1, c1] = _TOWARD[(r0 - r1, c0 - c1)]
    path = tmp_path / "basic" / "ddm.asc"
    write_asc(path, Grid(ddm, XLL, YLL, CS))
    gauges = {(3, 1), (1, 1)}
    caplog.set_level(logging.WARNING)
    if {(r0, c0), (r1, c1)} & gauges:
        with pytest.raises(InputError) as ei:
            EmbeddedSimulator(control, cache_dir=False)
        _located(ei.value, path, "cycle")
        return
    try:
        EmbeddedSimulator(control, cache_dir=False)
    except HydroAgentError as exc:  # FAM now undercounts the traced basin, say
        assert "fix:" in str(exc)
    assert any("cycle" in r.getMessage() and str(path) in r.getMessage() for r in caplog.records), \
        [r.getMessage() for r in caplog.records]


_DDM_CASES = [(v, random.Random(31 + i).randrange(16)) for i, v in
              enumerate([4.5, 3.0, 256.0, -1.0, 1e300, -1e300, 0.5, 1.0000001, 2 ** 63, 5.0, 7.0, 127.0])]


@pytest.mark.parametrize("value,pos", _DDM_CASES, ids=[f"{v:g}@{p}" for v, p in _DDM_CASES])
def test_flow_direction_codes_are_whole_codes(tmp_path, value, pos):
    """A DDM value of 4.5 was truncated to the code 4 (and 1e300 wrapped around int64) without a word."""
    control = make_case(tmp_path)
    ddm = DDM.copy()
    ddm[divmod(pos, 4)] = value
    path = tmp_path / "basic" / "ddm.asc"
    write_asc(path, Grid(ddm, XLL, YLL, CS), fmt="%.17g")
    with pytest.raises(InputError) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    _located(ei.value, path, "ESRI codes")


def test_parameter_grid_holes_are_warned(tmp_path, caplog):
    control = make_case(tmp_path)
    (tmp_path / "params").mkdir()
    wm = np.full((4, 4), 1.0)
    wm[1, 1], wm[2, 1] = -9999.0, np.nan
    write_tif(tmp_path / "params" / "wm.tif", Grid(wm, XLL, YLL, CS))
    control.write_text(control.read_text().replace("[CrestParamSet C]\n", "[CrestParamSet C]\nwm_grid=params/wm.tif\n"))
    caplog.set_level(logging.WARNING)
    EmbeddedSimulator(control, cache_dir=False)
    msgs = [r.getMessage() for r in caplog.records if "wm.tif" in r.getMessage()]
    assert msgs and "2 of the basin's 16 cells" in msgs[0] and "WM grid" in msgs[0], msgs


def test_parameter_grids_come_from_the_cache_until_a_grid_changes(tmp_path, caplog, monkeypatch):
    """A second simulator of the same basin reads no parameter grid (the sampled values are cached under the
    files' stat identity) and still warns of holes; an edited grid is read again."""
    from hydroagent_hpc.sim import embedded

    control = make_case(tmp_path)
    (tmp_path / "params").mkdir()
    wm = np.full((4, 4), 1.5)
    wm[1, 1] = -9999.0
    write_tif(tmp_path / "params" / "wm.tif", Grid(wm, XLL, YLL, CS))
    control.write_text(control.read_text().replace("[CrestParamSet C]\n", "[CrestParamSet C]\nwm_grid=params/wm.tif\n"))
    cache = tmp_path / "cache"
    first = EmbeddedSimulator(control, cache_dir=cache)
    assert len(list(cache.glob("paramgrids-*.npz"))) == 1

    def no_reading(path):
        raise AssertionError(f"{path} was read although it did not change")

    caplog.set_level(logging.WARNING)
    with monkeypatch.context() as m:
        m.setattr(embedded, "read_tif", no_reading)
        second = EmbeddedSimulator(control, cache_dir=cache)
    assert np.array_equal(first._grid_values["wm"], second._grid_values["wm"], equal_nan=True)
    assert any("1 of the basin's 16 cells" in r.getMessage() for r in caplog.records)
    assert np.array_equal(first.run().discharge, second.run().discharge)
    wm[:] = 3.0
    write_tif(tmp_path / "params" / "wm.tif", Grid(wm, XLL, YLL, CS))
    third = EmbeddedSimulator(control, cache_dir=cache)
    assert np.all(third._grid_values["wm"] == 3.0)
    assert len(list(cache.glob("paramgrids-*.npz"))) == 2
    uncached = EmbeddedSimulator(control, cache_dir=False)
    assert np.array_equal(third._grid_values["wm"], uncached._grid_values["wm"])


def test_negative_cellsize_is_refused(tmp_path):
    control = make_case(tmp_path)
    for name in ("dem", "ddm", "fam"):
        p = tmp_path / "basic" / f"{name}.asc"
        p.write_text(p.read_text().replace("cellsize 0.01", "cellsize -0.01"))
    with pytest.raises(InputError) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    _located(ei.value, tmp_path / "basic" / "dem.asc", "cellsize", 5)


@pytest.mark.parametrize("field,value", [("cellsize", "20"), ("cellsize", "1e-9"), ("yllcorner", "95"),
                                         ("yllcorner", "-200"), ("xllcorner", "500"), ("xllcorner", "-1000")])
def test_geographic_extent_is_in_degrees(tmp_path, field, value):
    control = make_case(tmp_path)
    for name in ("dem", "ddm", "fam"):
        p = tmp_path / "basic" / f"{name}.asc"
        lines = p.read_text().split("\n")
        k = [ln.split()[0].lower() for ln in lines[:6]].index(field)
        lines[k] = f"{field} {value}"
        p.write_text("\n".join(lines))
    with pytest.raises(InputError) as ei:
        EmbeddedSimulator(control, cache_dir=False)
    _located(ei.value, tmp_path / "basic" / "dem.asc", "geographic")


# ----------------------------------------------------------------------------- observations


def _has_data_line(lines: list[str]) -> bool:
    """Non-blank lines other than a header (the first non-blank line, without a digit before its first comma)."""
    rest = [ln for ln in lines if ln.strip()]
    return any(i > 0 or any(ch.isdigit() for ch in ln.partition(",")[0]) for i, ln in enumerate(rest))


def _obs_cases() -> list[tuple[str, str]]:
    rng = random.Random(29)
    junk = ["hello", "2020-06-01,abc", "x,y,z", "2020-13-01 00:00,1", "06/32/2020 01:00,2", "", "Date,Q", ";;"]
    cases = []
    for _ in range(12):
        lines = [rng.choice(junk) for _ in range(rng.randint(1, 6))]
        cases.append(("none" if _has_data_line(lines) else "empty", "\n".join(lines)))
    cases += [("empty", ""), ("empty", "Date,Discharge(m3/s)\n"), ("empty", "\n\nDate,Q\n\n")]
    for _ in range(8):
        good = [f"{BEGIN + timedelta(hours=h):%Y-%m-%d %H:%M},{rng.uniform(0, 5):.2f}" for h in range(1, 7)]
        good.insert(rng.randrange(len(good)), rng.choice(junk[:5]))
        cases.append(("some", "Date,Q\n" + "\n".join(good)))
    for bad in ("inf", "-inf", "1e400"):
        cases.append(("infinite", f"Date,Q\n2020-06-01 01:00,1.0\n2020-06-01 02:00,{bad}\n"))
    cases.append(("outside", "Date,Q\n1999-01-01 01:00,1.0\n1999-01-01 02:00,2.0\n"))
    return cases


_OBS_CASES = _obs_cases()


@pytest.mark.parametrize("kind,text", _OBS_CASES, ids=[f"{k}{i}" for i, (k, _) in enumerate(_OBS_CASES)])
def test_observation_files(tmp_path, caplog, kind, text):
    """An observation file from which no row parses was read as 'no observations' without a word.

    Now: data lines of which none parses are refused; a file without data lines (header only) is warned."""
    control = make_case(tmp_path)
    path = tmp_path / "obs" / "obs.csv"
    path.write_text(text)
    caplog.set_level(logging.WARNING)
    if kind == "empty":
        assert read_observations(path) == {}
        assert any(str(path) in r.getMessage() and "no rows" in r.getMessage() for r in caplog.records)
        return
    if kind in ("none", "infinite"):
        with pytest.raises(InputError) as ei:
            read_observations(path)
        _located(ei.value, path, line=3 if kind == "infinite" else None)
        with pytest.raises(InputError):
            EmbeddedSimulator(control, cache_dir=False)
        return
    EmbeddedSimulator(control, cache_dir=False)
    assert any(str(path) in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]


# ----------------------------------------------------------------------------- the command line


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (6 * 2 ** 30, 6 * 2 ** 30))


def _cli_cases() -> list[tuple[str, Callable[[Path], None]]]:
    def key(section: str, k: str, v: str) -> Callable[[Path], None]:
        return lambda root: set_key(root / "control.txt", section, k, v) and None

    def header(v: str) -> Callable[[Path], None]:
        def edit(root: Path) -> None:
            p = root / "basic" / "dem.asc"
            p.write_text(p.read_text().replace("ncols 4", f"ncols {v}"))
        return edit

    def value(root: Path) -> None:
        p = root / "precip" / "rain.2020060102.asc"
        p.write_text(p.read_text().replace("4 4 4 4", "4 4 four 4", 1))

    def big_tif(root: Path) -> None:
        write_tif(root / "basic" / "dem.tif", Grid(DEM.copy(), XLL, YLL, CS))
        _patch_dims(root / "basic" / "dem.tif", 200_000, 200_000)
        set_key(root / "control.txt", "Basic", "dem", "basic/dem.tif")

    def long_window(root: Path) -> None:
        for s, k, v in (("Task", "timestep", "1s"), ("Task", "time_end", "202306010000"),
                        ("PrecipForcing", "freq", "1s"), ("PETForcing", "freq", "1s")):
            set_key(root / "control.txt", s, k, v)

    return [("timestep-0h", key("Task", "timestep", "0h")), ("cellx-inf", key("Gauge Outlet", "cellx", "inf")),
            ("ncols-inf", header("inf")), ("ncols-negative", header("-4")),
            ("wm-nan", key("CrestParamSet", "wm", "nan")),
            ("warmend-after-end", key("Task", "time_warmend", "202006020000")), ("forcing-word", value),
            ("tif-200000", big_tif), ("94M-steps", long_window)]


_CLI_CASES = _cli_cases()


@pytest.mark.parametrize("name,edit", _CLI_CASES, ids=[n for n, _ in _CLI_CASES])
def test_cli_simulate_bad_input_exits_2_without_traceback(tmp_path, name, edit):
    control = make_case(tmp_path)
    edit(tmp_path)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(control), "--no-cache"],
                          capture_output=True, text=True, timeout=SECONDS_PER_CASE - 5, env=env,
                          preexec_fn=_limit_memory)
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error:")]
    assert len(errors) == 1, proc.stderr
    assert str(tmp_path) in errors[0], errors[0]
    assert "fix:" in proc.stderr


# ----------------------------------------------------------------------------- basin description


def test_basin_json_null_location_falls_back_to_the_gauges_lat_lon(tmp_path):
    """basin.json with ``lat``/``lon`` null and a LAT/LON gauge: the control file's coordinates, not NaN."""
    import json

    from hydroagent_hpc.sim.basin import load_basin

    control = make_case(tmp_path)
    control.write_text(control.read_text().replace("CELLX=1\nCELLY=3\nOBS=obs/obs.csv",
                                                   "LAT=35.005\nLON=-97.485\nOBS=obs/obs.csv"))
    (tmp_path / "basin.json").write_text(json.dumps({"lat": None, "lon": None, "area_km2": 1.0}))
    b = load_basin(tmp_path)
    assert (b.lat, b.lon) == (35.005, -97.485)
