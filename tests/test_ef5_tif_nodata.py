"""GeoTIFF nodata as EF5 1.2.3 reads it (``TifGrid.cpp:134-139``), where an earlier review suspected we differ.

* No ``GDAL_NODATA`` tag: nodata is a quiet NaN, which no cell equals (every test is ``cell == noData`` or
  ``cell != noData``): a -9999 cell is data. We used -9999.
* The tag's text goes through ``atof`` into a ``float noData``; cells are floats, so ``cell == noData`` is a
  float comparison. We compared the double of the text with the cell ("-9999.1" never matched), and a tag
  that is not a number gave -9999 (EF5: atof gives 0).
* Deliberate difference: a -9999 cell of a tag-less grid that EF5 would use as a value (DEM, FAM, DDM,
  parameter) is refused with the file, cell and fix; EF5 runs on with it (or refuses, for the DDM).

Checked against committed EF5 outputs (``tests/data/ef5-input-reading``, recorded by
``tests/scripts/record_ef5_input_reading.py``) and, with ``HYDROAGENT_EF5``, against a fresh EF5 run.
"""

from __future__ import annotations

import logging
import os
import subprocess

import numpy as np
import pytest

from conftest import TEST_DATA, require
from helpers.tinycase import TIF_CASES, TIF_REFUSED, check_against_fresh_ef5, gauge_cell, write_case_tif, write_tif_case
from hydroagent_hpc.bench.differential import _COLUMNS, _excess
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import Grid, read_tif, write_tif
from hydroagent_hpc.sim.outputs import read_ts_csv

RECORDED = TEST_DATA / "ef5-input-reading"


@pytest.mark.parametrize("name", list(TIF_CASES))
def test_tif_case_matches_recorded_ef5_output(tmp_path, name):
    sim = EmbeddedSimulator(write_tif_case(name, tmp_path / name), cache_dir=False)
    assert gauge_cell(sim) == TIF_CASES[name][2]
    ef5 = read_ts_csv(require(RECORDED / f"{name}.csv"))
    ours = sim.run().gauges["outlet"]
    for col, (attr, factor, decimals) in _COLUMNS.items():
        diff, excess = _excess(getattr(ours, attr) * factor, ef5[col], decimals)
        assert not (excess > 0).any(), f"{name} {col}: max |dx| {diff.max():.4g}"


@pytest.mark.parametrize("name", list(TIF_REFUSED))
def test_tif_case_refused_where_ef5_uses_or_refuses_the_cell(tmp_path, name):
    _, _, ours, ef5 = TIF_REFUSED[name]
    if ef5 == "ran":  # EF5 ran to the end on the -9999 value (the recorded output is its proof)
        assert len(read_ts_csv(require(RECORDED / f"{name}.csv"))["discharge"]) > 0
    else:
        assert ef5 in require(RECORDED / f"{name}.log").read_text()
    with pytest.raises(InputError, match=ours) as err:
        EmbeddedSimulator(write_tif_case(name, tmp_path / name), cache_dir=False)
    if "holds -9999" in ours:
        assert "add a GDAL_NODATA tag" in (err.value.fix or "")


@pytest.mark.ef5
@pytest.mark.parametrize("name", list(TIF_CASES))
def test_tif_case_matches_ef5(tmp_path, name):
    check_against_fresh_ef5(write_tif_case(name, tmp_path / name), name, tmp_path)


@pytest.mark.ef5
@pytest.mark.parametrize("name", list(TIF_REFUSED))
def test_tif_refused_case_as_ef5_does_it(tmp_path, name):
    binary = os.environ.get("HYDROAGENT_EF5")
    if not binary:
        pytest.skip("HYDROAGENT_EF5 is not set: no real EF5 binary (build one with ../shared/scripts/build-ef5.sh)")
    control = write_tif_case(name, tmp_path / name)
    proc = subprocess.run([binary, control.name], cwd=control.parent, capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "1"}, timeout=120)
    csv = control.parent / "output" / "ts.outlet.crest.csv"
    if TIF_REFUSED[name][3] == "ran":
        assert proc.returncode == 0 and csv.exists()
    else:
        assert TIF_REFUSED[name][3] in proc.stdout + proc.stderr and not csv.exists()


# --------------------------------------------------------------------------- the reader itself
def _tif(tmp_path, values, tag):
    path = tmp_path / "g.tif"
    write_case_tif(path, [values], xll=0.0, yll=0.0, cellsize=1.0, nodata_tag=tag)
    return read_tif(path)


def test_no_tag_means_no_nodata(tmp_path):
    g = _tif(tmp_path, [-9999, 1.5, "nan"], None)
    assert np.isnan(g.nodata) and not g.has_nodata
    assert g.valid()[0].tolist() == [True, True, False]  # -9999 is data (a NaN cell stays out, as before)
    assert g.untagged_sentinels()[0].tolist() == [True, False, False]


@pytest.mark.parametrize(("tag", "nodata", "warned"), [
    ("-9999", -9999.0, False), (" -9999.1", float(np.float32(-9999.1)), False), ("1e39", float("inf"), False),
    ("0x10", 16.0, False), ("-9999abc", -9999.0, True), ("none", 0.0, True), ("", 0.0, True)])
def test_tag_is_atof_into_float(tmp_path, caplog, tag, nodata, warned):
    with caplog.at_level(logging.WARNING):
        g = _tif(tmp_path, [np.float32(nodata), 2.0], tag)
    assert g.nodata == nodata and ("is not a number" in caplog.text) == warned
    assert g.valid()[0].tolist() == [False, True]


def test_nan_tag_is_no_nodata(tmp_path):
    assert not _tif(tmp_path, [-9999, 2.0], "nan").has_nodata


def test_float_nodata_compared_as_float(tmp_path):
    """Tag "-9999.1" and a cell float32(-9999.1): equal as EF5's floats, not as doubles (the old reader)."""
    g = _tif(tmp_path, ["-9999.1", "-9999.0999", 3.0], "-9999.1")
    assert g.valid()[0].tolist() == [False, False, True]  # -9999.0999 is the same float32


def test_write_tif_tag_reads_back_the_cells_nodata(tmp_path):
    """The tag holds the float32 nodata exactly (%g lost -3.4028235e38, GDAL's float minimum)."""
    lowest = float(np.finfo(np.float32).min)
    write_tif(tmp_path / "w.tif", Grid(np.array([[lowest, 1.0]]), 0.0, 0.0, 1.0, lowest))
    g = read_tif(tmp_path / "w.tif")
    assert g.nodata == lowest and g.valid()[0].tolist() == [False, True]
    write_tif(tmp_path / "n.tif", Grid(np.array([[-9999.0, 1.0]]), 0.0, 0.0, 1.0, -9999.0))
    assert read_tif(tmp_path / "n.tif").nodata == -9999.0
