"""Synthetic twin basins: complete EF5 cases, deterministic, with a hidden truth the obs reflect."""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import FrozenInstanceError, replace
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from hydroagent_hpc.params import DEFAULTS, PARAM_NAMES, PARAMS
from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.grids import read_grid
from hydroagent_hpc.sim.synth import basins as synthetic
from hydroagent_hpc.sim.synth.basins import (
    DEMO_BASINS,
    TRUTH_RANGES,
    auto_cellsize,
    build_demo_basins,
    draw_truth,
    estimate_cells,
    read_truth,
    synthesize_basin,
)
from hydroagent_hpc.sim.synth.terrain import TERRAIN_STYLES, make_terrain

SMALL = dict(name="syn_test", area_km2=120.0, window_days=6, warmup_days=2, seed=11, start="2021-07-01")


def _nse(sim, obs):
    return 1.0 - np.sum((sim - obs) ** 2) / np.sum((obs - obs.mean()) ** 2)


def _checksums(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def basin(tmp_path_factory) -> Path:
    return synthesize_basin(tmp_path_factory.mktemp("syn") / "a", **SMALL).parent


@pytest.fixture(scope="module")
def sim(basin) -> EmbeddedSimulator:
    return EmbeddedSimulator(basin / "control.txt", cache_dir=False)


def test_layout_is_a_complete_ef5_case(basin):
    for rel in ("control.txt", "basin.json", "truth.json", "obs/obs.csv", "basic/dem.asc", "basic/ddm.asc",
                "basic/fam.asc", *(f"params/{f}.tif" for f in ("wm", "b", "im", "ksat", "leaki", "alpha", "beta",
                                                            "alpha0"))):
        assert (basin / rel).is_file(), rel
    assert (basin / "output").is_dir()
    steps = (SMALL["window_days"] + SMALL["warmup_days"]) * 24
    assert len(list((basin / "precip").glob("rain.*.tif"))) == steps
    assert (basin / "pet" / "PET.20210701.tif").is_file()
    lines = (basin / "obs" / "obs.csv").read_text().splitlines()
    assert lines[0] == "Date,Discharge(m3/s)" and len(lines) == steps + 1
    assert lines[1].startswith("2021-06-29 01:00,")


def test_control_file_order_defaults_and_relative_paths(basin):
    text = (basin / "control.txt").read_text()
    for first, then in (("MODEL=", "PARAM_SET="), ("ROUTING=", "ROUTING_PARAM_SET=")):
        assert text.index(first) < text.index(then)
    assert str(basin) not in text  # relative paths only
    cf = parse_control(basin / "control.txt")
    task = cf.task()
    assert (task.timestep, f"{task.time_begin:%Y%m%d%H}", f"{task.time_warmend:%Y%m%d%H}",
            f"{task.time_end:%Y%m%d%H}") == ("1h", "2021062900", "2021070100", "2021070700")
    crest, kw = cf.param_sets[task.param_set], cf.param_sets[task.routing_param_set]
    values = {**crest.values["syn_test"], **kw.values["syn_test"]}
    assert values == dict(DEFAULTS)
    assert set(crest.grids) == {"wm", "b", "im", "fc"}
    assert set(kw.grids) == {"leaki", "alpha", "beta", "alpha0"}
    assert cf.basic.esriddm and not cf.basic.selffam


def test_loads_runs_and_matches_the_requested_area(basin, sim):
    result = sim.run()
    assert np.all(np.isfinite(result.discharge)) and result.discharge.max() > 0
    assert sim.missing_precip == 0 and sim.missing_pet == 0
    meta = json.loads((basin / "basin.json").read_text())
    area = float(sim.net.area.sum())
    assert abs(area / SMALL["area_km2"] - 1.0) < 0.15
    assert meta["area_km2"] == pytest.approx(area, abs=1e-3) and meta["nodes"] == sim.net.n
    assert meta["synthetic"] is True


def test_fam_matches_the_traced_network_and_the_gauge_is_a_channel(sim):
    net = sim.net
    upstream = np.ones(net.n)
    for i in range(net.n - 1, 0, -1):  # down[i] < i: one reverse pass accumulates
        upstream[net.down[i]] += upstream[i]
    assert np.array_equal(net.fac, upstream - 1.0)  # FAM excludes the cell itself (SELFFAM=false)
    th = DEFAULTS["th"]
    assert net.fac[net.gauge_nodes[0]] > th
    assert np.sum(net.fac > th) >= 5


def test_ddm_codes_and_nodata_outside(basin):
    ddm = read_grid(basin / "basic" / "ddm.asc")
    codes = set(np.unique(ddm.data[ddm.valid()]).astype(int))
    assert codes <= {1, 2, 4, 8, 16, 32, 64, 128}
    assert (~ddm.valid()).any()


def test_parameter_grids_are_structured_and_plausible(basin, sim):
    ranges = {"wm": (50, 300), "b": (0.1, 2), "im": (0, 0.3), "ksat": (0.3, 20), "leaki": (0.01, 0.2),
              "alpha": (0.5, 5), "beta": (0.4, 0.8), "alpha0": (0.2, 2.5)}
    for name, (lo, hi) in ranges.items():
        v = read_grid(basin / "params" / f"{name}.tif").data[sim.net.rows, sim.net.cols]
        assert lo <= v.min() and v.max() <= hi, name
        assert v.std() > 0, name


def test_precipitation_has_storms_and_dry_hours(sim):
    p = sim.precip  # [steps, nodes] mm/h
    assert p.max() > 5.0
    assert np.any(p.max(axis=1) == 0.0)
    pet = sim.pet
    assert 0.0 < pet.min() and pet.max() < 15.0 / 24.0  # mm/h, from daily mm/d files


def test_truth_is_inside_the_bounds_and_away_from_the_defaults(basin):
    truth = read_truth(basin)
    m = truth["multipliers"]
    assert list(m) == list(PARAM_NAMES)
    for name, v in m.items():
        spec = PARAMS[name]
        assert spec.lower <= v <= spec.upper, name
        if spec.fixed:
            assert v == spec.default
        else:
            assert v != spec.default
    assert m["th"] == 10.0 and m["isu"] == 0.0
    assert truth["seed"] == SMALL["seed"] and truth["noise"]["multiplicative"]["sigma_log"] > 0


@pytest.mark.parametrize("seed", range(20))
def test_truth_draws_respect_the_ranges(seed):
    m = draw_truth(np.random.default_rng(seed))
    for name, sides in TRUTH_RANGES.items():
        assert any(s is not None and s[0] <= m[name] <= s[1] for s in sides), name
        assert PARAMS[name].lower < m[name] < PARAMS[name].upper


def test_truth_reproduces_the_observations_and_the_defaults_do_not(basin, sim):
    keep = ~sim.warmup
    obs = sim.observed[sim.primary][keep]
    assert np.all(np.isfinite(obs)) and obs.min() >= 0
    truth = read_truth(basin)["multipliers"]
    q_true = sim.run(truth).discharge[keep]
    q_def = sim.run().discharge[keep]
    nse_true, nse_def = _nse(q_true, obs), _nse(q_def, obs)
    assert nse_true > 0.8
    assert nse_def < nse_true - 0.1
    assert not np.array_equal(q_true, obs)  # there is observation error
    assert read_truth(basin)["diagnostics"]["nse_truth_vs_obs"] == pytest.approx(nse_true, abs=1e-3)


def test_same_seed_same_bytes_other_seed_other_basin(basin, tmp_path):
    again = synthesize_basin(tmp_path / "b", **SMALL).parent
    assert _checksums(again) == _checksums(basin)
    other = synthesize_basin(tmp_path / "c", **{**SMALL, "seed": 12}).parent
    a, b = _checksums(basin), _checksums(other)
    for rel in ("basic/dem.asc", "obs/obs.csv", "truth.json", "params/wm.tif"):
        assert a[rel] != b[rel], rel


def test_rebuilding_replaces_a_basin_but_never_a_foreign_folder(tmp_path):
    kw = {**SMALL, "window_days": 2, "warmup_days": 1}
    p = synthesize_basin(tmp_path / "b", **kw)
    synthesize_basin(tmp_path / "b", **{**kw, "window_days": 1})  # an older basin is replaced
    assert len(list((p.parent / "precip").glob("*.tif"))) == 48
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me")
    with pytest.raises(ValueError, match="out_dir"):
        synthesize_basin(foreign, **kw)
    assert (foreign / "notes.txt").read_text() == "keep me"
    assert not list(tmp_path.glob(".*partial*"))


@pytest.mark.parametrize("change, word", [
    ({"area_km2": 0}, "area_km2"), ({"area_km2": -5.0}, "area_km2"), ({"area_km2": float("nan")}, "area_km2"),
    ({"window_days": 0}, "window_days"), ({"window_days": 1.5}, "window_days"), ({"warmup_days": -1}, "warmup_days"),
    ({"window_days": 500}, "window_days"), ({"seed": -1}, "seed"), ({"name": "two words"}, "name"),
    ({"name": ""}, "name"), ({"cellsize_deg": 0.5}, "cellsize_deg"), ({"cellsize_deg": 0.0}, "cellsize_deg"),
    ({"cellsize_deg": 0.0005, "area_km2": 5000.0}, "cellsize_deg"), ({"lat": 85.0}, "lat"),
    ({"lon": 200.0}, "lon"), ({"start": "June 1st"}, "start"), ({"start": "2021-06-01 12:30"}, "start"),
    ({"terrain": "moon"}, "terrain"), ({"climate": "tropical"}, "climate"),
])
def test_bad_arguments_raise_value_error_naming_the_argument(tmp_path, change, word):
    with pytest.raises(ValueError, match=word):
        synthesize_basin(tmp_path / "x", **{**SMALL, **change})
    assert not (tmp_path / "x").exists()


def test_settings_are_frozen_and_are_the_generator_record(basin):
    s = synthetic.SynthSettings.from_arguments(SMALL["name"], SMALL["area_km2"], SMALL["window_days"],
                                               SMALL["warmup_days"], SMALL["seed"], None, SMALL["start"], 35.0, -97.0,
                                               "hills", "humid", None, "")
    with pytest.raises(FrozenInstanceError):
        s.seed = 12
    assert s.as_dict() == json.loads((basin / "basin.json").read_text())["generator"]
    assert (s.begin, s.end) == (datetime(2021, 6, 29), datetime(2021, 7, 7))
    assert replace(s, seed=12).as_dict()["seed"] == 12 and s.as_dict()["seed"] == SMALL["seed"]


def test_read_truth_of_a_folder_that_is_not_a_basin(tmp_path):
    with pytest.raises(ValueError, match="not a synthetic basin"):
        read_truth(tmp_path)


def test_auto_cellsize_keeps_runs_near_a_second():
    for area, lat in ((329, 33.2), (2033, 40.5), (3209, 37.9), (40792, 44.8), (120, 35.0), (5, 35.0)):
        cs = auto_cellsize(area, lat)
        assert estimate_cells(area, cs, lat) <= synthetic.MAX_AUTO_CELLS
        assert estimate_cells(area, cs, lat) >= synthetic.MIN_CELLS
    assert auto_cellsize(329, 33.2) == 0.01 and auto_cellsize(40792, 44.8) == 0.04


@pytest.mark.parametrize("spec", DEMO_BASINS, ids=lambda s: s.name)
def test_demo_specs(spec):
    assert spec.name == f"syn_{spec.gauge_id}" and len(spec.gauge_id) == 8
    assert "NOT the real river" in spec.description and spec.gauge_id in spec.description
    # The demo keeps each basin near or below 1,500 cells so its 6,000-run campaign fits ~10 minutes.
    assert spec.cellsize_deg >= auto_cellsize(spec.area_km2, spec.lat)
    assert estimate_cells(spec.area_km2, spec.cellsize_deg, spec.lat) <= 1500
    assert spec.terrain in TERRAIN_STYLES


def test_demo_terrain_fits_the_cell_budget():
    """The terrain each demo basin gets (same seed stream as synthesize_basin) stays <= 4,000 cells."""
    for spec in DEMO_BASINS:
        rng = np.random.default_rng(spec.seed).spawn(6)[0]
        t = make_terrain(rng, area_km2=spec.area_km2, cellsize_deg=spec.cellsize_deg, lat=spec.lat, lon=spec.lon,
                         style=TERRAIN_STYLES[spec.terrain])
        assert t.cells <= 4000, spec.name
        assert abs(t.cells / t.target_cells - 1.0) < 0.15, spec.name
        assert t.fam[t.gauge] > DEFAULTS["th"] and np.sum(t.fam[t.basin] > DEFAULTS["th"]) >= 20
        top = t.yll + t.shape[0] * t.cellsize
        assert math.isclose(top - (t.gauge[0] + 0.5) * t.cellsize, spec.lat, abs_tol=t.cellsize)
        assert math.isclose(t.xll + (t.gauge[1] + 0.5) * t.cellsize, spec.lon, abs_tol=t.cellsize)


def test_build_demo_basins_skips_finished_basins(tmp_path, monkeypatch):
    small = replace(DEMO_BASINS[0], name="syn_small", area_km2=80.0, cellsize_deg=0.005)
    monkeypatch.setattr(synthetic, "DEMO_BASINS", (small,))
    paths = build_demo_basins(tmp_path, window_days=2, warmup_days=1)
    assert paths == [tmp_path / "syn_small" / "control.txt"]
    stamp = (tmp_path / "syn_small" / "basin.json").stat().st_mtime_ns
    build_demo_basins(tmp_path, window_days=2, warmup_days=1)
    assert (tmp_path / "syn_small" / "basin.json").stat().st_mtime_ns == stamp
    build_demo_basins(tmp_path, window_days=3, warmup_days=1)  # other settings: rebuilt
    assert json.loads((tmp_path / "syn_small" / "basin.json").read_text())["window_days"] == 3
    stamp = (tmp_path / "syn_small" / "basin.json").stat().st_mtime_ns
    build_demo_basins(tmp_path, window_days=3, warmup_days=1, force=True)
    assert (tmp_path / "syn_small" / "basin.json").stat().st_mtime_ns != stamp
    meta = json.loads((tmp_path / "syn_small" / "basin.json").read_text())
    assert meta["paper_gauge_id"] == "02338660" and "NOT the real river" in meta["description"]
