"""The paper's 14 gauges in data/paper_gauges.csv: strings, counts, windows, targets, and the loader's errors."""

from __future__ import annotations

import csv

import pytest

from conftest import CAMELS, require
from hydroagent_hpc.datasets.gauges import COLUMNS, DEFAULT_FILE, load_paper_gauges, paper_gauge
from hydroagent_hpc.sim.basin import CANONICAL_GAUGE, CANONICAL_TARGET, DEFAULT_TARGET
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.synth.basins import DEMO_BASINS


def test_fourteen_gauges_four_held_out_ids_as_strings():
    gauges = load_paper_gauges()
    assert len(gauges) == 14 and len({g.gauge_id for g in gauges}) == 14
    assert [g.gauge_id for g in gauges if g.held_out] == ["02338660", "01403060", "06279500", "07144100"]
    assert all(isinstance(g.gauge_id, str) and len(g.gauge_id) == 8 for g in gauges)
    assert all(g.name and g.source and g.area_km2 > 0 for g in gauges)
    assert DEFAULT_FILE.parent.name == "data" and not (DEFAULT_FILE.parent / "gauges" / "paper_gauges.csv").exists()


def test_windows_and_targets():
    for g in load_paper_gauges():
        assert g.window_start.hour == 0 and g.window_end.hour == 23
        assert g.days == (62 if g.gauge_id == CANONICAL_GAUGE else 60)
        assert g.target_nse == (CANONICAL_TARGET if g.gauge_id == CANONICAL_GAUGE else DEFAULT_TARGET)
        assert g.basin_dir == f"data/gauges/{g.gauge_id}"
    assert paper_gauge("07144100").area_km2 == 3209.0
    with pytest.raises(KeyError):
        paper_gauge("01013500")


def test_agrees_with_the_shared_metadata_and_the_demo_twins():
    for spec in DEMO_BASINS:
        g = paper_gauge(spec.gauge_id)
        assert (g.lat, g.lon, g.area_km2) == (spec.lat, spec.lon, spec.area_km2)
    meta = require(CAMELS / "paper_gauges_metadata" / "paper_gauges.csv")
    ours = {g.gauge_id: g for g in load_paper_gauges()}
    for row in csv.DictReader(meta.open()):
        g = ours[row["gauge_id"]]
        assert g.split == row["split"]
        assert g.area_km2 == pytest.approx(float(row["basin_area_km2"]), abs=0.53)  # whole km2 there
        assert f"{g.window_start:%Y-%m-%dT%H:%M}" == row["window_begin_utc"]
        assert f"{g.window_end:%Y-%m-%dT%H:%M}" == row["window_end_utc"]
        if row["lat"]:
            assert g.lat == pytest.approx(float(row["lat"])) and g.lon == pytest.approx(float(row["lon"]))


def _write(tmp_path, edit):
    lines = DEFAULT_FILE.read_text().splitlines()
    lines = edit(lines)
    p = tmp_path / "g.csv"
    p.write_text("\n".join(lines) + "\n")
    return p


@pytest.mark.parametrize("edit,where,what", [
    (lambda ls: [ls[0]] + [ls[1].replace("02338660", "2338660", 1)] + ls[2:], ":2:", "leading zeros"),
    (lambda ls: ls + [ls[5]], ":16:", "listed twice"),
    (lambda ls: [ls[0]] + [ls[1].replace(",test,", ",holdout,", 1)] + ls[2:], ":2:", "split='holdout'"),
    (lambda ls: [ls[0]] + [ls[1].replace("2018-08-31 23:00", "2018-08-31 22:00")] + ls[2:], ":2:", "whole days"),
    (lambda ls: [ls[0]] + [ls[1].replace("33.2357", "3.2357")] + ls[2:], ":2:", "lat=3.2357"),
    (lambda ls: [ls[0].replace("area_km2", "area")] + ls[1:], ":1:", "header"),
    (lambda ls: ls[:-1], "", "9 training"),
])
def test_errors_name_the_line_and_the_fix(tmp_path, edit, where, what):
    with pytest.raises(InputError) as err:
        load_paper_gauges(_write(tmp_path, edit))
    assert where in str(err.value) and what in str(err.value) and "fix:" in str(err.value)
    assert COLUMNS[0] == "gauge_id"
