"""``basin from-camels``: a real CAMELS gauge as a daily EF5 basin, run by the embedded engine, the
environment and the command line; the daily step itself; the data manifest."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import CAMELS, require
from hydroagent_hpc.datasets import camels, pet
from hydroagent_hpc.datasets.camels_basin import write_camels_basin
from hydroagent_hpc.sim import forcing as forcing_mod
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.manifest import read_manifest, verify_manifest

SAMPLE = CAMELS / "camels_us_nldas_sample"
ATTRS = CAMELS / "camels_us_nh_testdata" / "camels_attributes_v2.0"
MODEL_OUTPUT = CAMELS / "camels_us_model_output"
CFS = 0.028316846592


def _cli(*args, timeout=240):
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", *args], capture_output=True, text=True,
                          timeout=timeout)


@pytest.fixture(scope="module")
def basin(tmp_path_factory):
    require(SAMPLE)
    out = tmp_path_factory.mktemp("camels") / "naselle"
    write_camels_basin(out, root=SAMPLE, gauge_id="12010000", start="1996-10-01", end="1998-09-30", warmup_days=365)
    return out


@pytest.fixture(scope="module")
def sim(basin):
    return EmbeddedSimulator(basin / "control.txt", cache_dir=False)


def test_layout_control_and_daily_files(basin):
    text = (basin / "control.txt").read_text()
    for line in ("TIMESTEP=1d", "UNIT=mm/d", "FREQ=1d", "TYPE=ASC", "TIME_BEGIN=199510020000",
                 "TIME_WARMEND=199610020000", "TIME_END=199810010000", "[Gauge 12010000]"):
        assert line in text, line
    days = 365 + 730
    assert len(list((basin / "precip").glob("P.*.asc"))) == days
    assert len(list((basin / "pet").glob("PET.*.asc"))) == days
    assert (basin / "precip" / "P.19951003.asc").stat().st_size < 160  # one 1x1 grid per day, ~100 bytes
    meta = json.loads((basin / "basin.json").read_text())
    assert meta["timestep"] == "1d" and meta["pet_method"] == "priestley_taylor" and meta["spinup_days"] == 0
    assert meta["network"]["kind"].startswith("synthetic template") and meta["synthetic"] is False


def test_area_is_the_gauges_drainage_area(basin, sim):
    meta = json.loads((basin / "basin.json").read_text())
    assert meta["area_km2_source"].startswith("area_gages2")
    assert meta["area_km2_requested"] == 142.18  # camels_topo.txt
    assert float(sim.net.area.sum()) == pytest.approx(142.18, rel=1e-5)  # EF5's own cell areas
    assert 100 <= sim.net.n <= 220 and sim.dt_hours == 24.0


def test_forcing_and_observations_line_up_with_camels_days(sim):
    f = camels.read_forcing(camels.find_forcing_file(SAMPLE, "12010000", "nldas"))
    flow = camels.read_streamflow(camels.find_streamflow_file(SAMPLE, "12010000"))
    doy = (f.dates - f.dates.astype("datetime64[Y]")).astype(int) + 1
    pt = pet.priestley_taylor(f.tmax, f.tmin, f.srad, f.dayl, f.vp, f.elev_m, f.lat, doy)
    for k in (0, 100, 500, len(sim.steps) - 1):
        day = np.datetime64(sim.steps[k], "D") - np.timedelta64(1, "D")  # the step ending D 00:00 is day D-1
        i, j = int(np.nonzero(f.dates == day)[0][0]), int(np.nonzero(flow.dates == day)[0][0])
        assert sim.precip_mean[k, 0] * 24 == pytest.approx(f.prcp[i], abs=0.006)
        assert sim.pet_mean[k, 0] * 24 == pytest.approx(pt[i], abs=6e-4)
        assert sim.observed["12010000"][k] == pytest.approx(flow.q_cfs[j] * CFS, abs=6e-5)
    assert sim.warmup.sum() == 365 and (~sim.warmup).sum() == 730


def _relocated(basin, text: str) -> str:
    """The control text with every relative path made absolute (to write it elsewhere)."""
    for key in ("=basic/", "=params/", "OBS=obs/"):
        text = text.replace(key, key.replace("=", f"={basin}/"))
    return text.replace("LOC=precip", f"LOC={basin / 'precip'}").replace("LOC=pet", f"LOC={basin / 'pet'}")


def test_daily_step_agrees_with_an_hourly_run_of_the_same_forcing(basin, sim, tmp_path):
    """TIMESTEP=1h over the same daily files (EF5 reuses a file until its FREQ is up) holds each day's rate
    for 24 hours: the water that leaves must be the same, and so must the daily flows, to routing detail."""
    text = _relocated(basin, (basin / "control.txt").read_text()).replace("TIMESTEP=1d", "TIMESTEP=1h")
    (tmp_path / "hourly.txt").write_text(text)
    hourly = EmbeddedSimulator(tmp_path / "hourly.txt", cache_dir=False)
    assert len(hourly.steps) == 24 * len(sim.steps) and hourly.dt_hours == 1.0
    assert np.allclose(hourly.precip_mean[23::24, 0], sim.precip_mean[:, 0])
    impervious = {"im": 100.0, "ke": 0.0, "alpha0": 0.0}  # linear hillslopes: volumes depend on the network only
    for params in (impervious, None):
        qd, qh = sim.run(params).discharge, hourly.run(params).discharge
        vol_d, vol_h = float(qd.sum() * 86400.0), float(qh.sum() * 3600.0)
        assert vol_d == pytest.approx(vol_h, rel=0.02)
        daily_mean_h = qh.reshape(-1, 24).mean(axis=1)
        keep = ~sim.warmup
        err = (np.sum((qd[keep] - daily_mean_h[keep]) ** 2)
               / np.sum((daily_mean_h[keep] - daily_mean_h[keep].mean()) ** 2))
        assert 1.0 - err > 0.9


def test_environment_and_diagnostics_at_a_daily_step(basin, sim):
    from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.env.episode import run_episode
    from hydroagent_hpc.env.prompts import format_timestep
    from hydroagent_hpc.sim.basin import load_basin

    b = load_basin(basin)
    assert b.timestep == "1d" and b.window_start == "1996-10-02 00:00" and b.area_km2 == pytest.approx(142.18, rel=1e-5)
    assert format_timestep(b.timestep) == "1 day"
    env = CalibrationEnv(b, sim, replace(preset("paper"), max_simulations=12, patience=None, stop_at_target=False))
    ep = run_episode(make_optimizer_policy("dds", seed=1, budget=12), env)
    assert ep.counters["simulations"] == 12 and ep.best_nse is not None and 0.3 < ep.best_nse < 1.0
    assert ep.sims[0].metrics["n_points"] == 730 and ep.sims[0].metrics["dt_h"] == 24.0
    view = next(t.observation for t in ep.turns if t.tool == "run_simulation" and t.ok)
    hydro = view["hydrograph"]
    # 730 days in 60 bins: 12-13 days each, bin_hours is their mean
    assert hydro["bin_hours"] == pytest.approx(24 * 730 / 60, abs=0.01) and len(hydro["sim"]) == 60
    assert hydro["start"] == "1996-10-02 00:00" and all(v is not None for v in hydro["obs"])


def test_forcing_cache_serves_a_second_load(basin, tmp_path, monkeypatch):
    first = EmbeddedSimulator(basin / "control.txt", cache_dir=tmp_path)

    def boom(*a, **k):
        raise AssertionError("forcing re-read although it is cached")

    monkeypatch.setattr("hydroagent_hpc.sim.embedded.load_forcing", boom)
    second = EmbeddedSimulator(basin / "control.txt", cache_dir=tmp_path)
    assert np.array_equal(first.precip, second.precip) and np.array_equal(first.pet, second.pet)


def test_forcing_finer_than_the_step_is_refused(basin, tmp_path):
    text = (basin / "control.txt").read_text().replace("UNIT=mm/d\nFREQ=1d\nLOC=precip",
                                                       "UNIT=mm/d\nFREQ=1h\nLOC=precip").replace(
        "NAME=P.YYYYMMDD.asc", "NAME=P.YYYYMMDDHH.asc")
    (tmp_path / "c.txt").write_text(_relocated(basin, text))
    with pytest.raises(InputError, match="FREQ=1h, finer than TIMESTEP=1d"):
        EmbeddedSimulator(tmp_path / "c.txt", cache_dir=False)
    f = forcing_mod.Forcing("x", "asc", "mm/d", "1d", basin, "P.YYYYMMDD.asc")
    forcing_mod.check_frequency(f, "1d")
    forcing_mod.check_frequency(f, "1h")


def test_warmup_before_the_record_needs_spinup(tmp_path):
    require(SAMPLE)
    kw = dict(root=SAMPLE, gauge_id="03439000", start="1993-10-01", end="1994-09-30", warmup_days=365)
    with pytest.raises(InputError, match="--spinup repeat"):
        write_camels_basin(tmp_path / "a", **kw)
    write_camels_basin(tmp_path / "a", spinup="repeat", **kw)
    meta = json.loads((tmp_path / "a" / "basin.json").read_text())
    assert meta["spinup_days"] == 363  # 1992-10-01..1993-09-28 repeat the year after
    a = (tmp_path / "a" / "precip" / "P.19921002.asc").read_text().splitlines()[-1]
    b = (tmp_path / "a" / "precip" / "P.19931002.asc").read_text().splitlines()[-1]
    assert a == b
    with pytest.raises(ValueError, match="not a basin written by from-camels"):
        (tmp_path / "foreign").mkdir()
        (tmp_path / "foreign" / "notes.txt").write_text("mine")
        write_camels_basin(tmp_path / "foreign", **{**kw, "warmup_days": 0})
    with pytest.raises(ValueError, match="before --start"):
        write_camels_basin(tmp_path / "b", **{**kw, "end": "1993-01-01"})


def test_cli_from_model_output_simulates_and_verifies(tmp_path):
    require(MODEL_OUTPUT)
    require(ATTRS)
    out = tmp_path / "minam"
    proc = _cli("basin", "from-camels", "--root", str(MODEL_OUTPUT), "--basin", "13331500", "--forcing", "model_output",
                "--attributes", str(ATTRS), "--start", "2001-10-01", "--end", "2002-09-30", "--warmup-days", "365",
                "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str(out / "control.txt")
    meta = json.loads((out / "basin.json").read_text())
    assert meta["pet_method"] == "file" and meta["area_km2"] == pytest.approx(618.93, rel=1e-4)
    manifest = read_manifest(out)
    assert manifest["basin"] == "minam" and "from-camels" in manifest["command"]
    assert manifest["file_count"] == len([p for p in out.rglob("*") if p.is_file()]) - 1
    proc = _cli("simulate", str(out / "control.txt"), "--metrics")
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert summary["n_points"] == 365 and np.isfinite(summary["NSE"])
    rows = (out / "output" / "ts.13331500.crest.csv").read_text().splitlines()
    assert rows[1].startswith("2001-10-02 00:00,") and rows[2].startswith("2001-10-03 00:00,") and len(rows) == 366
    assert _cli("data", "verify", str(out)).returncode == 0  # outputs are not part of the manifest
    pfile = out / "precip" / "P.20020101.asc"
    pfile.write_text(pfile.read_text().replace("\n0.00\n", "\n9.99\n") if "\n0.00\n" in pfile.read_text()
                     else pfile.read_text() + " ")
    (out / "pet" / "PET.21000101.asc").write_text("x")
    proc = _cli("data", "verify", str(out))
    assert proc.returncode == 1
    assert "P.20020101.asc" in proc.stdout and "PET.21000101.asc: not in the manifest" in proc.stdout


def test_manifest_problems_one_by_one(small_basin_dir, tmp_path):
    import shutil

    assert verify_manifest(small_basin_dir) == []  # the synthetic generator writes one
    b = tmp_path / "b"
    shutil.copytree(small_basin_dir, b)
    assert verify_manifest(b) == []
    (b / "obs" / "obs.csv").write_text("Date,Discharge(m3/s)\n")
    (b / "params" / "wm.tif").unlink()
    (b / "output" / "ts.x.csv").write_text("outputs are ignored")
    problems = verify_manifest(b)
    assert len(problems) == 2 and any("obs.csv" in p and "bytes" in p for p in problems)
    assert any("wm.tif: listed in the manifest but missing" in p for p in problems)
    (b / "manifest.json").unlink()
    assert verify_manifest(b) == [] and "no manifest.json" in verify_manifest(b, required=True)[0]
    (b / "manifest.json").write_text("{")
    assert "not readable JSON" in verify_manifest(b)[0]


def _volume_ratio(control) -> float:
    """Outflow over rain volume with every cell impervious and no evaporation (all rain must leave)."""
    sim = EmbeddedSimulator(control, cache_dir=False)
    r = sim.run({"im": 100.0, "ke": 0.0, "alpha0": 0.0})
    area_m2 = float(sim.net.area[sim.weights[0] > 0].sum()) * 1e6
    rain_m3 = float(sim.precip_mean[:, 0].sum()) * sim.dt_hours * 1e-3 * area_m2
    return float(np.nansum(r.discharge)) * sim.dt_hours * 3600.0 / rain_m3


def test_the_comb_template_keeps_the_water_balance_and_the_valley_does_not(basin, tmp_path):
    """EF5's kinematic wave multiplies unit-width overland flow by the flow length, so diagonal steps create
    water; the default comb template has only cardinal steps and returns the rain volume."""
    import math

    meta = json.loads((basin / "basin.json").read_text())
    assert meta["network"]["kind"].startswith("synthetic template: cardinal comb")
    rows = meta["network"]["grid"]["nrows"]
    expected = 1.0 - (1.0 - math.cos(math.radians(meta["lat"]))) / rows  # the channel row's own rain only
    assert _volume_ratio(basin / "control.txt") == pytest.approx(expected, abs=0.005)
    codes = np.loadtxt(basin / "basic" / "ddm.asc", skiprows=6)
    assert set(np.unique(codes[codes > 0]).astype(int)) <= {1, 4, 16, 64}  # cardinal ESRI codes only
    valley = tmp_path / "valley"
    write_camels_basin(valley, root=SAMPLE, gauge_id="12010000", start="1996-10-01", end="1998-09-30",
                       warmup_days=365, network="valley")
    assert _volume_ratio(valley / "control.txt") > 1.3  # EF5's scheme on D8 diagonals, reproduced faithfully
    with pytest.raises(ValueError, match="--network 'grid'"):
        write_camels_basin(tmp_path / "x", root=SAMPLE, gauge_id="12010000", start="1996-10-01", end="1998-09-30",
                           warmup_days=365, network="grid")
