"""Forcing file names, units, frequencies, observation parsing, flow-direction codes."""

from __future__ import annotations

import shutil
from datetime import datetime

import numpy as np
import pytest

from hydroagent_hpc.sim.controlfile import Forcing
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.forcing import forcing_file_names, load_forcing, read_observations, step_times, unit_factor
from hydroagent_hpc.sim.grids import Grid, read_asc, write_asc
from hydroagent_hpc.sim.outputs import read_ts_csv


@pytest.mark.parametrize("unit,factor", [("mm/h", 1.0), ("mm/3h", 1 / 3), ("mm/d", 1 / 24), ("mm/100d", 1 / 2400),
                                         ("mm/1m", 1 / 720), ("mm/y", 1 / 8760), ("mm/15u", 4.0), ("cm/h", 1.0)])
def test_unit_factor_uses_time_part_only(unit, factor):
    assert unit_factor(unit) == pytest.approx(factor)


@pytest.mark.parametrize("bad", ["mm", "mm/fortnight", "C"])
def test_bad_units(bad):
    with pytest.raises(InputError):
        unit_factor(bad)


def test_file_names_end_of_interval_and_patterns(tmp_path):
    begin = datetime(2020, 6, 1, 0, 0)
    steps = step_times(begin, datetime(2020, 6, 1, 1, 0), "15u")
    assert [s.minute for s in steps] == [15, 30, 45, 0]
    f = Forcing("p", "asc", "mm/h", "15u", tmp_path, "r.YYYYMMDD_HHUU.asc")
    assert forcing_file_names(f, steps, begin) == ["r.20200601_0015.asc", "r.20200601_0030.asc", "r.20200601_0045.asc",
                                                   "r.20200601_0100.asc"]
    hourly = step_times(begin, datetime(2020, 6, 2, 0, 0), "1h")
    d = Forcing("e", "asc", "mm/d", "1d", tmp_path, "PET.YYYYMMDD.asc")
    names = forcing_file_names(d, hourly, begin)
    assert set(names) == {"PET.20200602.asc"}  # steps in (D-1 00:00, D 00:00] read day D
    m = Forcing("c", "asc", "mm/d", "1m", tmp_path, "PET_MM.asc")
    assert set(forcing_file_names(m, hourly, begin)) == {"PET_07.asc"}  # the one-month shift
    three = Forcing("r", "asc", "mm/3h", "3h", tmp_path, "r.YYYYMMDDHH.asc")
    assert forcing_file_names(three, hourly[:6], begin) == ["r.2020060103.asc"] * 3 + ["r.2020060106.asc"] * 3


def test_three_hourly_files_are_reused_and_converted(tmp_path, reference_dir):
    case = tmp_path / "tiny"
    shutil.copytree(reference_dir / "tiny", case, ignore=shutil.ignore_patterns("expected_*", "precip"))
    (case / "precip").mkdir()
    dem = read_asc(case / "basic" / "dem.asc")
    for h in range(3, 73, 3):
        t = datetime(2020, 6, 1) + (datetime(2020, 6, 1, 1) - datetime(2020, 6, 1)) * h
        write_asc(case / "precip" / f"r3.{t:%Y%m%d%H}.asc",
                  Grid(np.full(dem.data.shape, 6.0), dem.xll, dem.yll, dem.cellsize))
    p = case / "control_a.txt"
    p.write_text(p.read_text().replace("UNIT=mm/h\nFREQ=1h", "UNIT=mm/3h\nFREQ=3h")
                 .replace("rain.YYYYMMDDHH", "r3.YYYYMMDDHH"))
    sim = EmbeddedSimulator(p, cache_dir=False)
    np.testing.assert_allclose(sim.precip, 2.0)  # 6 mm per 3 h = 2 mm/h, every hourly step
    assert sim.missing_precip == 0


def test_rates_are_ef5s_float_products(tmp_path):
    """EF5: rate = grid value (float) * float(3600 / seconds); 5.73 mm/d is 0.23875001f mm/h there, not
    the double quotient's 0.23875f (a one-ulp PET shifts every later soil water and flow by ulps)."""
    dem = Grid(np.zeros((1, 2)), 0.0, 0.0, 0.1)
    write_asc(tmp_path / "PET.20200602.asc", Grid(np.array([[5.73, 2.0]]), 0.0, 0.0, 0.1))
    f = Forcing("e", "asc", "mm/d", "1d", tmp_path, "PET.YYYYMMDD.asc")
    begin = datetime(2020, 6, 1)
    series = load_forcing(f, step_times(begin, datetime(2020, 6, 1, 1), "1h"), begin, dem, np.array([0, 0]),
                          np.array([0, 1]))
    want = np.float32(5.73) * np.float32(3600.0 / 86400.0)
    assert series.values[0, 0] == want == np.float32(0.23875001) != np.float32(5.73 / 24.0)
    assert series.values[0, 1] == np.float32(2.0) * np.float32(3600.0 / 86400.0)


def test_observation_formats(tmp_path):
    f = tmp_path / "obs.csv"
    f.write_text("Date,Q\n2020-06-01 01:00,1.5\n06/01/2020 02:00,2.5\n2020/06/01T03:00:00,3.5\nbad line\n"
                 "2020-06-01 04:00,-999\n2020-06-01 05:00,notanumber\n")
    obs = read_observations(f)
    assert obs == {datetime(2020, 6, 1, 1): 1.5, datetime(2020, 6, 1, 2): 2.5, datetime(2020, 6, 1, 3): 3.5,
                   datetime(2020, 6, 1, 4): -999.0}
    with pytest.raises(InputError, match="observation file not found"):
        read_observations(tmp_path / "none.csv")


def _esri_to_taudem(codes: np.ndarray) -> np.ndarray:
    table = {1: 1, 128: 2, 64: 3, 32: 4, 16: 5, 8: 6, 4: 7, 2: 8}
    out = codes.copy()
    for e, t in table.items():
        out[codes == e] = t
    return out


def test_taudem_codes_and_selffam_true_give_the_same_run(tmp_path, reference_dir):
    """ESRIDDM=false with TauDEM codes, SELFFAM=true with FAM+1 and TH+1: EF5's golden output."""
    case = tmp_path / "tiny"
    shutil.copytree(reference_dir / "tiny", case)
    ddm = read_asc(case / "basic" / "ddm.asc")
    ddm.data = _esri_to_taudem(ddm.data)
    write_asc(case / "basic" / "ddm.asc", ddm)
    fam = read_asc(case / "basic" / "fam.asc")
    fam.data = fam.data + 1
    write_asc(case / "basic" / "fam.asc", fam)
    p = case / "control_b.txt"
    p.write_text(p.read_text().replace("ESRIDDM=true", "ESRIDDM=false").replace("SELFFAM=false", "SELFFAM=true")
                 .replace("TH=2 ", "TH=3 "))
    res = EmbeddedSimulator(p, cache_dir=False).run()
    ref = read_ts_csv(case / "expected_b" / "ts.outlet.crest.csv")
    assert np.max(np.abs(res.discharge - ref["discharge"])) <= 0.005 + 1e-9


def test_clamps(reference_dir):
    sim = EmbeddedSimulator(reference_dir / "tiny" / "control_b.txt", cache_dir=False)
    npar = sim.node_params({"wm": -5, "b": -1, "fc": -2, "im": 250, "alpha": -1, "beta": -1, "alpha0": -1,
                            "leaki": 3, "iwu": 50})
    assert np.all(npar.wm == 100) and np.all(npar.b == 1) and np.all(npar.fc == 1) and np.all(npar.im == 1)
    assert np.all(npar.alpha == 1) and np.all(npar.beta == 0.6) and np.all(npar.alpha0 == 1) and np.all(npar.leaki == 1)
    assert np.all(npar.w0 == 0)  # IWU x WM/100 with the negative WM, then clipped at 0 (EF5's order)
    npar = sim.node_params({"leaki": -1, "im": -3})
    assert np.all(npar.leaki == 0) and np.all(npar.im == 0)


def test_render_name_template_equals_the_character_rule():
    """The precompiled template gives what EF5's first-place, character-by-character rule gives,
    including patterns whose fields overlap or repeat."""
    from datetime import datetime

    from hydroagent_hpc.sim.controlfile import NAME_FIELDS
    from hydroagent_hpc.sim.forcing import render_name
    from hydroagent_hpc.sim.forcing import render_name_by_characters as by_characters

    patterns = ["rain.YYYYMMDDHH.tif", "PET.YYYYMMDD.asc", "x_YYYY_YYYY_MM.tif", "MMMDDD.HHUUSS", "YYYYYMM",
                "plain.tif", "SSUUHHDDMMYYYY", "q.YYYYMMDDHHUU"]
    for pattern in patterns:
        for finest in range(len(NAME_FIELDS)):
            for t in (datetime(2020, 5, 20, 7, 30, 15), datetime(1999, 12, 31, 23, 0)):
                assert render_name(pattern, t, finest) == by_characters(pattern, t, finest), (pattern, finest)
