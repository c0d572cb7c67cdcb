"""How EF5 1.2.3 reads its inputs, where an earlier review suspected we differ (all three did).

* BASINAREA (``BasicGrids.cpp:678-812``): the search runs for CELLX/CELLY gauges too; the target uses
  the cell area at the gauge's own LAT (the cell's upper-left corner for CELLX/CELLY), float arithmetic;
  the candidates are the gauge's cell, then E, SE, S, SW, W, NW, N, NE at each distance; a tie keeps the
  earlier cell; a step west or north must stay at column/row > 0.
* ASCII grids (``AscGrid.cpp``, ``ReadFloatAscGrid``): every value and the NODATA_value are read with
  ``fscanf("%f")``, straight to float, not through double.
* PET (``PETReader.cpp:53-76``): only ``value > 0`` is tested, never nodata; precipitation
  (``PrecipReader.cpp:79-104``) tests ``value != noData && value > 0``.

Each case (``tests/helpers/tinycase.py``) is checked two ways: against the committed output of the real
EF5 (``tests/data/ef5-input-reading``, recorded by ``tests/scripts/record_ef5_input_reading.py``; no
binary needed) and, with ``HYDROAGENT_EF5``, against a fresh EF5 run.
"""

from __future__ import annotations

import logging
import os
import subprocess
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

from conftest import TEST_DATA, require
from helpers.tinycase import (
    CASES,
    asc_text,
    below_midpoint,
    check_against_fresh_ef5,
    gauge_cell,
    write_named_case,
    write_tiny_case,
)
from hydroagent_hpc.bench.differential import _COLUMNS, _excess
from hydroagent_hpc.sim.controlfile import parse_control, render_control
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import read_asc
from hydroagent_hpc.sim.outputs import read_ts_csv

RECORDED = TEST_DATA / "ef5-input-reading"


@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_recorded_ef5_output(tmp_path, name):
    """Our engine places the gauge where EF5 did and prints EF5's numbers (within print precision)."""
    control = write_named_case(name, tmp_path / name)
    sim = EmbeddedSimulator(control, cache_dir=False)
    assert gauge_cell(sim) == CASES[name][2]
    ef5 = read_ts_csv(require(RECORDED / f"{name}.csv"))
    ours = sim.run().gauges["outlet"]
    for col, (attr, factor, decimals) in _COLUMNS.items():
        ref = ef5[col]
        diff, excess = _excess(getattr(ours, attr) * factor, ref, decimals)
        assert not (excess > 0).any(), f"{name} {col}: max |dx| {diff.max():.4g} (EF5 {ref[int(np.argmax(excess))]})"


@pytest.mark.ef5
@pytest.mark.parametrize("name", list(CASES))
def test_case_matches_ef5(tmp_path, name):
    check_against_fresh_ef5(write_named_case(name, tmp_path / name), name, tmp_path)


# --------------------------------------------------------------------------- BASINAREA details
def test_basinarea_travels_to_ef5_for_cellxy_gauges(tmp_path):
    """The control file we hand EF5 keeps BASINAREA of a CELLX/CELLY gauge (it used to be dropped)."""
    control = write_named_case("basinarea-cellxy", tmp_path / "c")
    text = render_control(parse_control(control))
    assert "CELLX=2" in text and "BASINAREA=5.0062" in text


def test_latlon_wins_over_cellxy_as_in_ef5(tmp_path, caplog):
    """EF5 places a gauge by LAT/LON whenever LAT is set (``GaugeConfigSection::NeedsProjecting``)."""
    control = write_tiny_case(tmp_path / "c", ["LAT=35.025", "LON=-97.475", "CELLX=4", "CELLY=5"])
    with caplog.at_level(logging.WARNING):
        assert gauge_cell(EmbeddedSimulator(control, cache_dir=False)) == (3, 2)
    assert "the cell comes from LAT/LON" in caplog.text
    control = write_tiny_case(tmp_path / "d", ["LAT=35.025", "CELLX=4", "CELLY=5"])
    with pytest.raises(InputError, match="only one of LAT and LON"):
        EmbeddedSimulator(control, cache_dir=False)


# --------------------------------------------------------------------------- ASCII values as float
def test_asc_values_are_rounded_once_to_float(tmp_path):
    """``fscanf("%f")`` rounds the decimal once; through a double the midpoints round to even instead."""
    texts = [below_midpoint(n) for n in (2, 7, 11, 17)] + ["1.0000000596046448", "16777217.000000001", "0.1",
                                                           "16777217", "-9999", "nan"]
    for t in texts[:6]:  # each double is a float32 midpoint, the decimal is not
        assert Fraction(Decimal(t)) != Fraction(float(t))
    path = tmp_path / "g.asc"
    path.write_text(asc_text([texts], xll=0.0, yll=0.0, cellsize=1.0, nodata="-9999.0001"))
    g = read_asc(path)
    want = [1.9999998807907104, 6.999999523162842, 10.999999046325684, 16.999998092651367, 1.0000001192092896,
            16777218.0, 0.10000000149011612, 16777216.0, -9999.0]
    assert g.data[0, :9].tolist() == want and np.isnan(g.data[0, 9])
    assert g.nodata == -9999.0 and not g.valid()[0, 8]  # -9999.0001 is -9999 as a float


def test_dem_midpoints_truncate_as_ef5(tmp_path):
    """EF5 truncates the float DEM to whole metres: 17 - 2**-21 - tiny is 16 m, not 17 m."""
    sim = EmbeddedSimulator(write_named_case("asc-float-midpoints", tmp_path / "c"), cache_dir=False)
    node = {(int(r), int(c)): i for i, (r, c) in enumerate(zip(sim.net.rows, sim.net.cols))}
    dx = sim.net.dx[node[(0, 2)]]
    drops = [round(float(sim.net.slope[node[(r, 2)]] * sim.net.dx[node[(r, 2)]])) for r in range(5)]
    assert drops == [4, 2, 4, 2, 4] and dx > 0  # 20-16, 16-14, 14-10, 10-8, 8-4


# --------------------------------------------------------------------------- PET and precipitation nodata
def test_pet_has_no_nodata_test_but_precip_has(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        sim = EmbeddedSimulator(write_named_case("pet-positive-nodata", tmp_path / "p"), cache_dir=False)
    node = {(int(r), int(c)): i for i, (r, c) in enumerate(zip(sim.net.rows, sim.net.cols))}
    pet = np.asarray(sim.pet)
    assert pet[0, node[(1, 2)]] == pet[0, node[(2, 2)]] == np.float32(np.float32(9999.0) * np.float32(1 / 24))
    assert pet[0, node[(3, 2)]] == np.float32(np.float32(4.0) * np.float32(1 / 24))
    assert "positive NODATA_value 9999" in caplog.text
    sim = EmbeddedSimulator(write_named_case("asc-nodata-as-float", tmp_path / "r"), cache_dir=False)
    t = [s.hour for s in sim.steps].index(3)
    assert np.asarray(sim.precip)[t, node[(1, 2)]] == 0.0 and np.asarray(sim.precip)[t, node[(4, 2)]] == 3.0


def test_negative_and_nan_pet_read_zero(tmp_path):
    sim = EmbeddedSimulator(write_tiny_case(tmp_path / "c", ["CELLX=2", "CELLY=5"],
                                            pet=lambda r, c: ("-9999", "nan", "-3.5", "0", "4.0", "4.0")[r]),
                            cache_dir=False)
    node = {(int(r), int(c)): i for i, (r, c) in enumerate(zip(sim.net.rows, sim.net.cols))}
    assert [float(np.asarray(sim.pet)[0, node[(r, 2)]]) for r in range(4)] == [0.0] * 4


@pytest.mark.parametrize("kind", ["pet", "precip"])
def test_infinite_forcing_is_refused(tmp_path, kind):
    """A deliberate difference: EF5 would use +inf (a PET of inf dries the cell and prints PET inf)."""
    kw = ({"pet": lambda r, c: "inf" if r == 1 else "4.0"} if kind == "pet"
          else {"rain": lambda h, r, c: "inf" if (r, h) == (1, 2) else "1.0"})
    control = write_tiny_case(tmp_path / "c", ["CELLX=2", "CELLY=5"], **kw)
    with pytest.raises(InputError, match=rf"{kind} value at the basin cell \(col 2, row 1\) is infinite"):
        EmbeddedSimulator(control, cache_dir=False)


def test_a_gauge_on_a_negative_flow_accumulation_is_refused_as_ef5_does(tmp_path):
    """A gauge whose FAM cell is negative: EF5 sizes its node list from that FAM and aborts (its basin walk would
    call the cell no data); we refuse it with an error naming the cell and the grid (with HYDROAGENT_EF5, that
    EF5 gives no output is checked too)."""
    control = write_tiny_case(tmp_path / "case", ["CELLX=2", "CELLY=5"],
                              fam=lambda r, c: -3 if (r, c) == (5, 2) else r)
    with pytest.raises(InputError, match=r"col 2, row 5\): the flow accumulation there is negative \(-3 in .*fam"):
        EmbeddedSimulator(control, cache_dir=False)
    binary = os.environ.get("HYDROAGENT_EF5")
    if binary:
        proc = subprocess.run([binary, control.name], cwd=control.parent, capture_output=True, text=True,
                              env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
        assert proc.returncode != 0 and not (control.parent / "output" / "ts.outlet.crest.csv").exists()
