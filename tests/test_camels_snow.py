"""``basin from-camels`` with temperature forcing and ``--snow``: Snow-17 in front of CREST on a real gauge.

03439000 (French Broad River at Rosman, NC; mean elevation 863 m) in the small NLDAS sample: the winter
of 1993/94 has freezing days, so Snow-17 holds back water that the snow-free basin routes at once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import CAMELS, require
from hydroagent_hpc.datasets import camels
from hydroagent_hpc.datasets.camels_basin import write_camels_basin
from hydroagent_hpc.params import SNOW_DEFAULTS, SNOW_NAMES
from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import read_grid

SAMPLE = CAMELS / "camels_us_nldas_sample"
GAUGE = "03439000"
WINDOW = {"start": "1994-01-01", "end": "1994-12-31", "warmup_days": 90}


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    require(SAMPLE)
    root = tmp_path_factory.mktemp("camels_snow")
    plain = write_camels_basin(root / "plain", root=SAMPLE, gauge_id=GAUGE, **WINDOW)
    snowy = write_camels_basin(root / "snow", root=SAMPLE, gauge_id=GAUGE, snow=True, **WINDOW)
    return plain.parent, snowy.parent


def test_temperature_files_are_the_daily_mean_of_tmax_and_tmin(pair):
    plain, snowy = pair
    f = camels.read_forcing(camels.find_forcing_file(SAMPLE, GAUGE, "nldas"), source="nldas")
    days = 90 + 365
    for folder in (plain, snowy):
        assert len(list((folder / "temp").glob("T.*.asc"))) == days
    # the file stamped 1994-01-15 00:00 holds CAMELS day 1994-01-14 (stamps end the day)
    i = int(np.flatnonzero(f.dates == np.datetime64("1994-01-14"))[0])
    grid = read_grid(snowy / "temp" / "T.19940115.asc")
    assert grid.data.shape == (1, 1)
    # written to 2 decimals; read back as EF5 reads ASCII values, rounded once to float32
    assert float(grid.data[0, 0]) == float(np.float32(f"{(f.tmax[i] + f.tmin[i]) / 2.0:.2f}"))
    meta = json.loads((plain / "basin.json").read_text())
    assert meta["temperature"]["unit"] == "degC" and meta["files"]["temp"] == days
    assert "snow" not in meta and meta["generator"]["snow"] is False


def test_without_snow_the_control_file_and_dem_are_unchanged(pair):
    plain, snowy = pair
    text = (plain / "control.txt").read_text()
    assert "[TempForcing" not in text and "Snow17" not in text and "SNOW=" not in text
    task = parse_control(plain / "control.txt").task(None)
    assert not task.snow
    # the snow basin's file is the snow-free one plus the snow lines, nothing else
    extra = [ln for ln in (snowy / "control.txt").read_text().splitlines() if ln not in text.splitlines()]
    assert set(extra) >= {"[TempForcing TEMP]", "UNIT=C", "LOC=temp", "NAME=T.YYYYMMDD.asc",
                          "[Snow17ParamSet SNOWPARAMS]", "SNOW=SNOW17", "SNOW_PARAM_SET=SNOWPARAMS", "TEMP=TEMP"}
    assert {f"{k.upper()}={SNOW_DEFAULTS[k]!r}" for k in SNOW_NAMES} <= set(extra)
    assert not [ln for ln in text.splitlines()[1:] if ln not in (snowy / "control.txt").read_text().splitlines()]


def test_snow_dem_sits_at_the_basins_mean_elevation(pair):
    plain, snowy = pair
    a, b = read_grid(plain / "basic" / "dem.asc"), read_grid(snowy / "basic" / "dem.asc")
    valid = a.data != -9999.0
    assert np.array_equal(valid, b.data != -9999.0)
    shift = b.data[valid] - a.data[valid]
    assert np.allclose(shift, shift[0], atol=1e-6) and shift[0] == round(shift[0])  # slopes unchanged
    assert float(b.data[valid].mean()) == pytest.approx(863.18, abs=0.5)  # camels_topo elev_mean
    meta = json.loads((snowy / "basin.json").read_text())
    assert meta["snow"]["elevation_m"] == pytest.approx(863.18) and meta["snow"]["params"] == dict(SNOW_DEFAULTS)


def test_snow_basin_runs_with_snow_and_its_discharge_differs(pair):
    plain, snowy = pair
    sim_a = EmbeddedSimulator(plain / "control.txt", cache_dir=False)
    sim_b = EmbeddedSimulator(snowy / "control.txt", cache_dir=False)
    assert not sim_a.has_snow and sim_b.has_snow
    assert sim_b.base_snow_params == pytest.approx(dict(SNOW_DEFAULTS))
    qa, qb = sim_a.run(), sim_b.run()
    assert np.all(np.isfinite(qb.discharge))
    assert float(np.max(np.abs(qa.discharge - qb.discharge))) > 1.0  # m3/s: snow held back, melted later
    swe = qb.primary.swe
    assert swe is not None and float(np.nanmax(swe)) > 1.0  # a snowpack built up
    # the snow parameters act on this basin: more snowfall (scf) changes the discharge again
    assert float(np.max(np.abs(sim_b.run({"scf": 1.5}).discharge - qb.discharge))) > 0.1


def test_snow_needs_temperature_and_refuses_raim(tmp_path, monkeypatch):
    require(SAMPLE)
    real = camels.read_forcing

    def no_temperature(*a, **k):
        f = real(*a, **k)
        f.tmax[:] = np.nan
        return f

    monkeypatch.setattr(camels, "read_forcing", no_temperature)
    with pytest.raises(InputError, match="--snow needs a temperature on every simulated day"):
        write_camels_basin(tmp_path / "x", root=SAMPLE, gauge_id=GAUGE, snow=True, **WINDOW)
    out = write_camels_basin(tmp_path / "y", root=SAMPLE, gauge_id=GAUGE, **WINDOW)  # fine without --snow
    assert not (out.parent / "temp").exists()
    assert json.loads((out.parent / "basin.json").read_text())["temperature"]["file"] is None
    with pytest.raises(ValueError, match="melt the snow twice"):
        write_camels_basin(tmp_path / "z", root=SAMPLE, gauge_id=GAUGE, snow=True, forcing="model_output",
                           precip_column="raim", **WINDOW)


@pytest.mark.ef5
def test_snow_camels_basin_matches_real_ef5(pair, tmp_path):
    binary = os.environ.get("HYDROAGENT_EF5")
    if not binary:
        pytest.skip("HYDROAGENT_EF5 is not set: no real EF5 binary on this machine")
    from hydroagent_hpc.sim.ef5 import EF5Simulator

    _, snowy = pair
    ours = EmbeddedSimulator(snowy / "control.txt", cache_dir=False).run()
    theirs = EF5Simulator(snowy / "control.txt", binary=binary, workdir=tmp_path).run()
    keep = ~ours.warmup
    for col in ("discharge", "swe", "temperature"):
        a = np.round(getattr(ours.primary, col)[keep], 2)
        b = getattr(theirs.primary, col)
        assert float(np.nanmax(np.abs(a - b))) <= 0.01 + 1e-9, col


def test_cli_snow_flag(tmp_path):
    require(SAMPLE)
    out = tmp_path / "cli_snow"
    r = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "basin", "from-camels", "--root", str(SAMPLE),
                        "--basin", GAUGE, "--start", "1994-06-01", "--end", "1994-06-30", "--warmup-days", "10",
                        "--snow", "--out", str(out)], capture_output=True, text=True, timeout=240)
    assert r.returncode == 0, r.stderr
    task = parse_control(out / "control.txt").task(None)
    assert task.snow and "--snow" in json.loads((out / "manifest.json").read_text())["command"]
