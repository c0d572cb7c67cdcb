"""CAMELS-US readers, units, PET and the SAC-SMA reference, on the real CAMELS files of the test subset
(``tests/data/camels``, trimmed from the full data by ``tests/scripts/trim_camels.py``)."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import CAMELS, require
from hydroagent_hpc.datasets import attributes, camels, model_output, pet, units
from hydroagent_hpc.sim.errors import InputError


def _need(name: str):
    return require(CAMELS / name)


@pytest.fixture(scope="module")
def nh():
    return _need("camels_us_nh_testdata")


@pytest.fixture(scope="module")
def sample():
    return _need("camels_us_nldas_sample")


@pytest.fixture(scope="module")
def mo_dir():
    return _need("camels_us_model_output")


# ------------------------------------------------------------------ units and PET (no data needed)
def test_cfs_is_exactly_a_cubic_foot_and_sentinels_are_missing():
    assert units.CFS_TO_M3S == pytest.approx(0.028316846592, abs=1e-15)
    q = units.cfs_to_m3s([100.0, -999.0, -999999.0, np.nan, 0.0])
    assert q[0] == pytest.approx(2.8316846592) and np.isnan(q[1:4]).all() and q[4] == 0.0
    assert units.m3s_to_mm_per_day(1.0, 86.4) == pytest.approx(1.0)
    assert units.mm_per_day_to_m3s(units.cfs_to_mm_per_day(123.0, 500.0), 500.0) == pytest.approx(
        123 * units.CFS_TO_M3S)
    with pytest.raises(ValueError, match="area"):
        units.m3s_to_mm_per_day(1.0, 0.0)


def test_extraterrestrial_radiation_matches_fao56_example_8():
    # FAO-56 Example 8: 20 deg S, 3 September (J = 246): Ra = 32.2 MJ/m2/day
    assert pet.extraterrestrial_radiation(-20.0, 246) == pytest.approx(32.2, abs=0.1)
    # no sun at 70 N in late December, full day at midsummer
    assert pet.extraterrestrial_radiation(70.0, 355) == pytest.approx(0.0, abs=0.05)
    assert pet.extraterrestrial_radiation(70.0, 172) > 40.0


def test_hargreaves_needs_a_range_and_priestley_taylor_does_not():
    doy = np.array([196, 196])
    assert pet.hargreaves([30.0, 20.0], [15.0, 20.0], 40.0, doy)[1] == 0.0  # no range: no evaporation
    h = pet.hargreaves([30.0], [15.0], 40.0, [196])[0]
    assert 4.0 < h < 7.0  # a hot July day at 40 N
    pt = pet.priestley_taylor([22.5], [22.5], [450.0], [52000.0], [1500.0], 200.0, 40.0, [196])[0]
    assert 4.0 < pt < 8.0
    assert pet.choose_method([10, 11, 12], [10, 11, 12]) == "priestley_taylor"
    assert pet.choose_method([10, 11, 12], [2, 3, 4]) == "hargreaves"


# ------------------------------------------------------------------ forcing files
@pytest.mark.parametrize("source,method", [("daymet", "hargreaves"), ("maurer", "priestley_taylor"),
                                           ("maurer_extended", "hargreaves"), ("nldas", "priestley_taylor")])
def test_every_forcing_variant_reads_and_gets_the_right_pet_method(nh, source, method):
    f = camels.read_forcing(camels.find_forcing_file(nh, "01022500", source))
    assert f.source == source and f.gauge_id == "01022500"
    assert f.lat == pytest.approx(44.82) and f.elev_m == pytest.approx(133.0)
    assert f.area_km2 == pytest.approx(587.675987)
    assert f.dates[0] == np.datetime64("2000-01-01") and np.all(np.diff(f.dates).astype(int) == 1)
    assert pet.choose_method(f.tmax, f.tmin) == method  # the NLDAS/Maurer quirk: Tmax == Tmin
    assert np.all(f.prcp >= 0) and 2.5 < f.prcp.mean() < 5.0


def test_huc_subfolders_and_window(sample):
    f = camels.read_forcing(camels.find_forcing_file(sample, "12010000", "nldas"))
    assert "17" in f.path and f.dates[0] == np.datetime64("1993-09-29") and f.dates[-1] == np.datetime64("1998-12-31")
    w = f.window("1996-01-01", "1996-12-31")
    assert w.dates.size == 366 and w.prcp.size == 366 and w.pet is None


def test_streamflow_flags_missing_days_and_units(mo_dir):
    sf = camels.read_streamflow(camels.find_streamflow_file(mo_dir, "01031500"))
    # the subset keeps water years 2013-2015 of the record (2012-10-01..2014-12-31), the last 92 days missing
    assert sf.flag_counts() == {"A": 462, "A:e": 268, "M": 92}
    assert sf.dates[0] == np.datetime64("2012-10-01") and sf.dates.size == 822
    assert np.isnan(sf.q_cfs[sf.flags == "M"]).all() and np.isfinite(sf.q_cfs[sf.flags != "M"]).all()
    assert sf.q_m3s[0] == pytest.approx(1500.0 * 0.028316846592)


def test_obs_run_of_the_model_output_is_the_flow_over_the_forcing_header_area(mo_dir):
    """Checks our cfs -> mm/day conversion against CAMELS' own OBS_RUN (and which area CAMELS used)."""
    mo = model_output.read_model_output(mo_dir / "01031500" / "01031500_05_model_output.txt")
    sf = camels.read_streamflow(mo_dir / "01031500" / "01031500_streamflow_qc.txt")
    f = camels.read_forcing(mo_dir / "01031500" / "01031500_lump_cida_forcing_leap.txt")
    a, b = np.isin(sf.dates, mo.dates), np.isin(mo.dates, sf.dates)
    q = units.cfs_to_mm_per_day(sf.q_cfs[a], f.area_km2)
    obs = mo["obs_run"][b]
    ok = np.isfinite(q) & (obs > 0.05)
    assert np.median(q[ok] / obs[ok]) == pytest.approx(1.0, abs=2e-4)


def test_our_priestley_taylor_reproduces_the_camels_pet(mo_dir):
    """Daymet forcing of 01031500 -> our PT; the benchmark file's PET column is CAMELS' own PT."""
    mo = model_output.read_model_output(mo_dir / "01031500" / "01031500_05_model_output.txt")
    f = camels.read_forcing(mo_dir / "01031500" / "01031500_lump_cida_forcing_leap.txt")
    doy = (f.dates - f.dates.astype("datetime64[Y]")).astype(int) + 1
    ours = pet.priestley_taylor(f.tmax, f.tmin, f.srad, f.dayl, f.vp, f.elev_m, f.lat, doy)[np.isin(f.dates, mo.dates)]
    theirs = mo["pet"][np.isin(mo.dates, f.dates)]
    assert np.corrcoef(ours, theirs)[0, 1] > 0.99
    assert ours.mean() == pytest.approx(theirs.mean(), rel=0.05)


def test_attributes_keep_ids_as_strings_and_give_area_location_climate(nh):
    a = attributes.read_attributes(nh / "camels_attributes_v2.0", "01013500")
    assert a.gauge_id == "01013500" and a.huc02 == "01" and "Fish River" in a.name
    assert a.area_km2 == pytest.approx(2252.7)
    assert a.lat == pytest.approx(47.23739) and a.lon == pytest.approx(-68.58264)
    assert a.climate()["aridity"] == pytest.approx(0.63055865946247) and a.frac_snow == pytest.approx(0.3134, abs=1e-3)
    assert isinstance(a.values["max_water_content"], float)
    table = attributes.read_attribute_table(nh / "camels_attributes_v2.0" / "camels_topo.txt")
    assert len(table) == 671 and all(len(k) == 8 for k in table)


def test_published_sacsma_scores(mo_dir):
    mo = model_output.read_model_output(model_output.find_model_output_file(mo_dir, "13331500"))
    sf = camels.read_streamflow(camels.find_streamflow_file(mo_dir, "13331500"))
    r = model_output.reference_nse(mo, "2003-10-01", "2013-09-30", sf)
    assert r["end"] == "2010-12-31" and r["days"] == 2649 and r["nse"] == pytest.approx(0.704, abs=1e-3)
    mo1 = model_output.read_model_output(model_output.find_model_output_file(mo_dir, "01031500"))
    sf1 = camels.read_streamflow(camels.find_streamflow_file(mo_dir, "01031500"))
    whole = model_output.reference_nse(mo1, "1980-10-01", "2014-12-31", sf1)  # the subset starts 2012-10-01
    assert whole["end"] == "2014-09-30"  # the zeros after the USGS record ends are not scored
    f = model_output.forcing_from_model_output(mo1, "raim")
    assert f.pet is not None and f.notes["precip_column"] == "RAIM" and f.prcp.sum() == pytest.approx(mo1["raim"].sum())


# ------------------------------------------------------------------ bad files name file, line and fix
def test_bad_forcing_files_name_the_line_and_the_fix(nh, tmp_path):
    src = camels.find_forcing_file(nh, "01022500", "nldas").read_text().splitlines()
    cases = {
        "header": (src[:3] + ["Year Mnth Day prcp"] + src[4:], ":4:", "expected 'Year Mnth Day Hr"),
        "gap": (src[:10] + src[11:], ":11:", "skips 1 day"),
        "text": (src[:20] + [src[20].replace("\t", "\tabc\t", 1)] + src[21:], ":21:", "values where the header"),
        "nan": (src[:7] + ["2000 01 04 12\t1\tx\t1\t0\t1\t1\t1"] + src[8:], ":8:", "not a number"),
    }
    for name, (lines, where, what) in cases.items():
        p = tmp_path / f"{name}_01022500_lump_nldas_forcing_leap.txt"
        p.write_text("\n".join(lines) + "\n")
        with pytest.raises(InputError) as err:
            camels.read_forcing(p, gauge_id="01022500")
        assert where in str(err.value) and what in str(err.value) and "fix:" in str(err.value), name


def test_bad_streamflow_rows(tmp_path):
    p = tmp_path / "01013500_streamflow_qc.txt"
    p.write_text("01013500 1993 09 29   514.00 A\n01013500 1993 09 30   501.00 Q\n")
    with pytest.raises(InputError, match=r":2: unknown quality flag 'Q'"):
        camels.read_streamflow(p)
    p.write_text("01013500 1993 09 29   514.00 A\n1013500 1993 09 30   501.00 A\n")
    with pytest.raises(InputError, match=r":2: gauge id 1013500"):
        camels.read_streamflow(p)
    with pytest.raises(ValueError, match="leading zeros"):
        camels.check_gauge_id(1013500)


def test_missing_files_say_where_to_look(sample):
    with pytest.raises(InputError, match="no daymet forcing file"):
        camels.find_forcing_file(sample, "12010000", "daymet")
    with pytest.raises(ValueError, match="unknown"):
        camels.find_forcing_file(sample, "12010000", "era5")
