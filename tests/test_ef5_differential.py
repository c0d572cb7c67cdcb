"""Differential tests: generated EF5 cases through the real EF5 and our engine, compared at print precision.

The cases (``hydroagent_hpc.sim.synth.cases``) vary basin size, latitude and cell size, ASCII or
GeoTIFF grids and forcing, hourly or daily steps, warm-up, missing precipitation files, one or
two gauges placed by cell or by LAT/LON, initial state grids and states written mid-run, and all
13 multipliers across their bounds. The seeded set below runs in ``make test`` whenever
``HYDROAGENT_EF5`` names a binary (``.ci/run`` builds one); ``python -m
hydroagent_hpc.bench.differential`` runs a longer sweep. The rest of this file needs no binary.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest

from hydroagent_hpc.bench.differential import compare_case
from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.ef5 import EF5Simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.forcing import render_name
from hydroagent_hpc.sim.synth.cases import draw_case, write_case

SEEDS = range(40)  # the set make test runs against the real binary (about 40 s here)
# Seeds from longer sweeps that once failed, each for its own cause:
# 7106: lengths and areas a float ulp off EF5's (GeographicProjection's roundings); 0.02 off at one row.
REGRESSION_SEEDS = (7106,)


def _needs_ef5() -> None:
    if not os.environ.get("HYDROAGENT_EF5"):
        pytest.skip("HYDROAGENT_EF5 is not set: no real EF5 binary (build one with ../shared/scripts/build-ef5.sh)")


@pytest.mark.ef5
@pytest.mark.parametrize("seed", [*SEEDS, *REGRESSION_SEEDS])
def test_engine_matches_ef5_on_generated_case(tmp_path, seed):
    """The seeds of ``make test``, then cases that once failed (REGRESSION_SEEDS)."""
    _needs_ef5()
    result = compare_case(draw_case(seed), tmp_path)
    assert result.ok, f"{result.label}: " + "; ".join(result.failures)


# --------------------------------------------------------------------------- without a binary
def test_lengths_and_areas_are_ef5s_floats():
    """EF5's own values (its GridNode horLen and area, dumped from a 0.05-degree case): the old
    rounding (``lat/180`` in double, the area a float product, the diagonal from the rounded east-west
    length) was one float ulp off in about a third of the cells, enough to flip a Newton stopping test."""
    from hydroagent_hpc.sim.network import _area, _lengths

    lat = np.array([52.650001525878906, 52.70000076293945, 52.599998474121094], dtype=np.float32)
    east, northeast = np.ones(3, np.int64), np.full(3, 2, np.int64)
    assert _lengths(lat[:2], 0.05, east[:2]).tolist() == [3354.16455078125, 3350.328369140625]
    assert _lengths(lat[[0, 2]], 0.05, northeast[:2]).tolist() == [6466.6025390625, 6468.59228515625]
    assert _area(lat, 0.05).tolist() == [18.544170379638672, 18.522960662841797, 18.565370559692383]


def test_cases_cover_the_inputs_and_the_whole_bounds():
    specs = [draw_case(s) for s in range(200)]
    assert {s.grid_format for s in specs} == {"asc", "tif"}
    assert {s.timestep for s in specs} == {"1h", "1d"}
    assert {s.gauge_by for s in specs} == {"cell", "latlon"}
    for flag in ("inner_gauge", "initial_states", "save_states"):
        assert {getattr(s, flag) for s in specs} == {True, False}, flag
    assert any(s.warmup_days == 0 for s in specs) and any(s.warmup_days > 0 for s in specs)
    assert any(s.missing_precip > 0 for s in specs) and any(s.missing_precip == 0 for s in specs)
    assert min(s.lat for s in specs) < -30 and max(s.lat for s in specs) > 45
    for name in TUNABLE:  # every multiplier reaches both of its bounds, and stays within them
        values = [s.params[name] for s in specs]
        assert min(values) == PARAMS[name].lower and max(values) == PARAMS[name].upper, name
    assert {s.params["th"] for s in specs} > {10.0} and max(s.params["isu"] for s in specs) > 0.0
    assert draw_case(7) == draw_case(7) and draw_case(7) != draw_case(8)


def test_a_written_case_runs_and_is_reproducible(tmp_path):
    spec = dataclasses.replace(draw_case(3), timestep="1d", days=40, grid_format="asc", warmup_days=5,
                               missing_precip=0.2, inner_gauge=True, gauge_by="latlon")
    control = write_case(spec, tmp_path / "a")
    write_case(spec, tmp_path / "b")
    for f in sorted(p for p in (tmp_path / "a").rglob("*") if p.is_file()):
        assert f.read_bytes() == (tmp_path / "b" / f.relative_to(tmp_path / "a")).read_bytes(), f
    # daily precipitation keeps EF5's literal HH; some files are missing, never all
    names = sorted(p.name for p in (tmp_path / "a" / "precip").iterdir())
    assert names and all(n.endswith("HH.asc") for n in names) and len(names) < 45
    res = EmbeddedSimulator(control, cache_dir=False).run()
    assert set(res.gauges) <= {"outlet", "inner"} and res.missing_precip == 45 - len(names)
    assert np.isfinite(res.discharge).all() and int((~res.warmup).sum()) == 41  # from TIME_WARMEND on
    with pytest.raises(ValueError, match="not empty"):
        write_case(spec, tmp_path / "a")


def test_names_are_filled_as_ef5_fills_them():
    t = datetime(2020, 5, 20, 13, 45, 10)
    assert render_name("rain.YYYYMMDDHH.tif", t) == "rain.2020052013.tif"
    assert render_name("rain.YYYYMMDDHH.tif", t, finest=2) == "rain.20200520HH.tif"  # FREQ=1d precipitation
    assert render_name("a_DD_DD_YYYY", t) == "a_20_DD_2020"  # each field at its first place only
    assert render_name("q.YYYYMMDD_HHUUSS", t, finest=4) == "q.20200520_1345SS"


def test_ef5_backend_starts_from_the_initial_state_grids(tmp_path):
    """The run folder replaces STATES; the initial grids used to be left behind, so EF5 started dry."""
    spec = dataclasses.replace(draw_case(4), timestep="1h", days=3, warmup_days=0, initial_states=True,
                               save_states=False, missing_precip=0.0, grid_format="tif")
    control = write_case(spec, tmp_path / "case")
    standin = tmp_path / "ef5-standin"  # a real executable with EF5's command line: our engine
    standin.write_text(f'#!/bin/sh\nexec {sys.executable} -m hydroagent_hpc.cli -q simulate "$1" --no-cache\n')
    standin.chmod(0o755)
    via_backend = EF5Simulator(control, binary=standin, workdir=tmp_path).run()
    direct = EmbeddedSimulator(control, cache_dir=False).run()
    assert direct.discharge[0] > 0.05  # the start states carry flow at the first step
    np.testing.assert_allclose(via_backend.discharge, direct.discharge, atol=0.005 + 1e-9)
    assert parse_control(control).task(None).states == Path(tmp_path / "case" / "states")
