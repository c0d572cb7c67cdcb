"""Snow-17: the physics functions, the control-file sections, the CSV columns, and the golden snow case.

The golden case (``tests/data/ef5-reference/snow/``, provenance in PROVENANCE.md) was written by the
real EF5 1.2.3; the engine must reproduce every printed column and the state grids without a binary.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys

import numpy as np
import pytest

from conftest import REFERENCE, require
from hydroagent_hpc.params import SNOW_DEFAULTS, check_values
from hydroagent_hpc.sim import snow as s17
from hydroagent_hpc.sim.controlfile import parse_control, render_control
from hydroagent_hpc.sim.errors import ControlFileError
from hydroagent_hpc.sim.grids import read_tif
from hydroagent_hpc.sim.outputs import read_ts_csv

F = np.float32
SNOW_CASE = REFERENCE / "snow"
TOL = {"discharge": 0.01, "sm": 0.01, "precip": 0.01, "pet": 0.01, "fast_flow": 1e-4, "slow_flow": 1e-4,
       "temperature": 0.01, "swe": 0.01}
EPS = 1e-9
P = dict(SNOW_DEFAULTS)


def _step(precip, temp, states=(0.0, 0.0, 0.0, 0.0), jday=60, dt=1.0, textbook=False, p_atm=1000.0, **over):
    p = {**P, **over}
    return s17.snow17_step(F(precip), F(temp), jday, F(dt), *(F(p[k]) for k in s17.SNOW17_PARAMS), F(p_atm),
                           *(F(x) for x in states), textbook)


# ----------------------------------------------------------------------------- formulas
def test_seasonal_variation_as_ef5_evaluates_it():
    """EF5: 0.5*sin((jday - 81*2*pi)/366) + 0.5 (precedence), jday = tm_yday; textbook: (n-81)*2pi/366, n = jday+1."""
    for jday in (0, 80, 171, 265, 364):
        ef5 = 0.5 * math.sin((jday - 81 * 2 * math.pi) / 366.0) + 0.5
        assert s17.seasonal_variation(jday, False) == pytest.approx(ef5, abs=1e-6)
        book = 0.5 * math.sin((jday + 1 - 81) * 2 * math.pi / 366.0) + 0.5
        assert s17.seasonal_variation(jday, True) == pytest.approx(book, abs=1e-6)
    ef5_all = [s17.seasonal_variation(j, False) for j in range(366)]
    assert 0.008 < min(ef5_all) and max(ef5_all) < 0.31  # EF5's melt factor never leaves the MFMIN side
    assert s17.seasonal_variation(170, True) == pytest.approx(1.0, abs=1e-3)  # textbook peak on 21 June
    assert s17.seasonal_variation(354, True) == pytest.approx(0.0, abs=1e-3)  # and trough on 21 December


def test_atmospheric_pressure_and_lapse_rate():
    pa = s17.atmospheric_pressure(np.array([0.0, 1500.0, -10.0]))
    assert pa.dtype == np.float32
    assert pa[0] == pytest.approx(33.86 * 29.9, rel=1e-6)
    e = 15.0
    assert pa[1] == pytest.approx(33.86 * (29.9 - 0.335 * e + 0.00022 * e ** 2.4), rel=1e-6)
    assert np.isnan(pa[2])  # powf of a negative base, as in EF5
    t = s17.lapse_temperature(np.array([2.0]), np.array([1000.0]), np.array([1500.0]))
    assert t[0] == pytest.approx(2.0 - 0.0065 * 500.0, abs=1e-6)


def test_fixed_one_degree_threshold_and_accumulation():
    out, swe, ati, wq, wi, d = _step(2.0, 0.99, dt=1.0, mbase=2.0)  # snow below 1 degC (EF5's fixed PXTEMP)
    assert out == 0.0 and wi == pytest.approx(2.0 * P["scf"]) and swe == pytest.approx(wi)
    out, swe, *_ = _step(2.0, 1.0, dt=1.0)  # rain at 1 degC, no pack: all of it leaves
    assert out == pytest.approx(2.0) and swe == 0.0


def test_cold_snowfall_builds_a_heat_deficit():
    _, swe, ati, wq, wi, d = _step(3.0, -8.0, dt=1.0, scf=1.0)
    assert wi == pytest.approx(3.0) and wq == 0.0
    # dD_snow = -T*Pn/160 plus dD_T = NMF*(dt/6)*(mf/MFMAX)*(ATI - T_snow); ATI jumps to T_snow (Pn > 1.5*dt)
    assert ati == pytest.approx(-8.0) and d == pytest.approx(min(8.0 * 3.0 / 160.0, 0.33 * 3.0), rel=1e-5)


def test_non_rain_melt_uses_the_seasonal_factor():
    wi0 = 50.0
    _, swe, ati, wq, wi, d = _step(0.0, 5.0, states=(0.0, 0.0, wi0, 0.0), jday=100, dt=6.0, plwhc=0.0)
    sv = s17.seasonal_variation(100, False)
    mf = (6.0 / 6.0) * (sv * (P["mfmax"] - P["mfmin"]) + P["mfmin"])
    melt = mf * (5.0 - P["mbase"])
    assert wi == pytest.approx(wi0 - melt, rel=1e-5)


def _series(n=400, seed=3):
    rng = np.random.default_rng(seed)
    temp = np.round(-4.0 + 9.0 * np.sin(np.arange(n) / 40.0) + rng.normal(0, 2, n), 2).astype(F)
    precip = np.where(rng.random(n) < 0.3, rng.gamma(1.5, 1.5, n), 0.0).astype(F)
    return precip, temp


@pytest.mark.parametrize("textbook", [False, True])
def test_mass_balance(textbook):
    """Snow in (SCF x snowfall) + rain = outflow + SWE (+ EF5's loss of PLWHC*D on ripening)."""
    precip, temp = _series()
    dt = 3.0
    st = (0.0, 0.0, 0.0, 0.0)
    water_in = out_total = 0.0
    swe = 0.0
    for p, t in zip(precip, temp):
        scf = P["scf"] * 1.2
        water_in += float(p) * dt * (scf if t < 1.0 else 1.0)
        out, swe, *rest = _step(p, t, st, dt=dt, textbook=textbook, scf=scf, plwhc=0.2)
        st = tuple(rest)
        out_total += float(out) * dt
    assert water_in > 100.0 and out_total > 10.0
    gap = water_in - out_total - float(swe)
    if textbook:
        assert abs(gap) < 1e-3 * water_in
    else:
        assert gap > -1e-3 * water_in  # EF5 only ever loses water (Wq = Wqx, not Wqx + PLWHC*D)


def test_gauge_average_float32_matches_weighted_mean():
    rng = np.random.default_rng(0)
    v = rng.normal(10, 3, (5, 30)).astype(F)
    area = rng.uniform(0.5, 1.5, 30).astype(F)
    owner = np.array([0] * 20 + [1] * 10)
    members = s17.gauge_members([[1], []])
    out = s17.gauge_average(v, owner, area, members)
    np.testing.assert_allclose(out[:, 0], (v * area).sum(1) / area.sum(), rtol=1e-5)
    np.testing.assert_allclose(out[:, 1], (v[:, 20:] * area[20:]).sum(1) / area[20:].sum(), rtol=1e-5)


# ----------------------------------------------------------------------------- control file
def _snow_text():
    return (SNOW_CASE / "control.txt").read_text()


def _write(tmp_path, text):
    p = tmp_path / "c.txt"
    p.write_text(text.replace("=basic/", f"={SNOW_CASE}/basic/"))
    return p


def test_snow_sections_parse_and_render(tmp_path):
    cf = parse_control(require(SNOW_CASE / "control.txt"))
    tk = cf.task()
    assert (tk.snow, tk.snow_param_set, tk.temp) == ("snow17", "snowparams", "temp")
    assert cf.temp["temp"].unit == "C" and cf.temp["temp"].type == "asc"
    assert cf.param_sets["snowparams"].kind == "snow17"
    assert cf.param_sets["snowparams"].values["snow_golden"]["scf"] == 1.1
    text = render_control(cf, overrides={"scf": 1.3}, output=tmp_path / "o")
    again = parse_control(_write(tmp_path, text))
    assert again.param_sets["snowparams"].values["snow_golden"]["scf"] == 1.3
    assert again.task().snow == "snow17" and again.temp["temp"].loc == cf.temp["temp"].loc


@pytest.mark.parametrize("old,new,words", [
    ("SNOW=SNOW17", "SNOW=SNOW18", "not a snow model"),
    ("TEMP=TEMP\n", "", "no TEMP"),
    ("SNOW=SNOW17\nSNOW_PARAM_SET=SNOWPARAMS\n", "", "TEMP= is given without SNOW=SNOW17"),
    ("SNOW=SNOW17\n", "", "SNOW_PARAM_SET comes before SNOW"),
    ("UNIT=C", "UNIT=F", "not a temperature unit"),
    ("TIPM=0.2", "TIPM=1.5", "TIPM=1.5 is above 1"),
    ("SCF=1.1", "SCF=-1.0", "SCF=-1.0 is negative"),
    ("NMF=0.3\n", "", "lacks nmf"),
    ("SNOW_PARAM_SET=SNOWPARAMS", "SNOW_PARAM_SET=KWPARAMS", "not a [Snow17ParamSet]"),
    ("SNOW_PARAM_SET=SNOWPARAMS", "SNOW_PARAM_SET=NOPE", "names no such section"),
])
def test_snow_control_errors(tmp_path, old, new, words):
    text = _snow_text()
    assert old in text
    with pytest.raises(ControlFileError, match=words.replace("[", r"\[").replace("]", r"\]")):
        parse_control(_write(tmp_path, text.replace(old, new)))


def test_snow_parameters_only_with_snow():
    with pytest.raises(ValueError, match="task has no SNOW"):
        check_values({"scf": 1.0})
    assert check_values({"scf": 1.0}, snow=True) == {"scf": 1.0}


# ----------------------------------------------------------------------------- golden case
def test_engine_matches_ef5_on_the_golden_snow_case(tmp_path):
    """`hydroagent simulate` on EF5's own snow case: every column at print precision, state grids float32."""
    case = require(SNOW_CASE)
    exp = require(case / "expected")
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(case / "control.txt"),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    name = "ts.snow_golden.crest.csv"
    assert (exp / name).read_text().splitlines()[0] == (out / name).read_text().splitlines()[0]
    ours, ef5 = read_ts_csv(out / name), read_ts_csv(exp / name)
    assert np.array_equal(ours["times"], ef5["times"])
    assert ef5["swe"].max() > 50.0 and ef5["swe"][-1] < 0.8 * ef5["swe"].max()  # a pack that builds and melts
    for col, tol in TOL.items():
        diff = np.nanmax(np.abs(ours[col] - ef5[col]))
        assert diff <= tol + EPS, f"{col}: max diff {diff}"
    assert json.loads((out / "results.json").read_text())["missingQPE"] == 0
    states = sorted(exp.glob("*.tif"))
    assert {p.name.split("_")[1] for p in states if p.name.startswith("snow17")} == set(s17.STATE_NAMES)
    for state in states:
        mine, theirs = read_tif(out / state.name), read_tif(state)
        basin = theirs.data != -9999
        assert np.array_equal(basin, mine.data != -9999), state.name
        np.testing.assert_allclose(mine.data[basin], theirs.data[basin], rtol=1e-5, atol=1e-7, err_msg=state.name)


def test_textbook_physics_differs_and_conserves(tmp_path):
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    ef5 = EmbeddedSimulator(SNOW_CASE / "control.txt", cache_dir=False)
    book = EmbeddedSimulator(SNOW_CASE / "control.txt", cache_dir=False, snow_physics="textbook")
    a, b = ef5.run(), book.run()
    assert a.primary.swe is not None and b.primary.swe is not None
    assert not np.allclose(a.primary.swe, b.primary.swe)  # the seasonal melt factor is far larger in March
    with pytest.raises(Exception, match="snow_physics"):
        EmbeddedSimulator(SNOW_CASE / "control.txt", cache_dir=False, snow_physics="magic")
    # a non-snow case takes no snow parameters
    with pytest.raises(ValueError, match="task has no SNOW"):
        EmbeddedSimulator(REFERENCE / "tiny" / "control_a.txt", cache_dir=False).run({"scf": 1.0})
