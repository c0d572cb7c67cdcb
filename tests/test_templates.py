"""The control-file template for the paper's data layout fills into a valid control file."""

from __future__ import annotations

import pytest

from hydroagent_hpc.params import DEFAULTS
from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.templates import TEMPLATE_DIR, fill_template, placeholders

PAPER = TEMPLATE_DIR / "hydroagent_paper.control.txt"


def _values(tmp_path):
    return {"data_root": str(tmp_path / "data"), "gauge_id": "02338660", "lat": 33.2357, "lon": -84.9876,
            "basin_area": 328.93, "time_begin": "201807010000", "time_warmend": "201807010000",
            "time_end": "201808312300", "output": str(tmp_path / "out"), **DEFAULTS}


def test_paper_template_fills_and_parses(tmp_path):
    text = fill_template(PAPER, _values(tmp_path))
    p = tmp_path / "control.txt"
    p.write_text(text)
    cf = parse_control(p)
    tk = cf.task()
    assert tk.timestep == "1h" and f"{tk.time_end:%Y%m%d%H%M}" == "201808312300"
    assert cf.gauges["02338660"].basinarea == 328.93
    assert cf.pet["pet"].unit == "mm/100d" and cf.precip["mrms"].type == "tif"
    assert set(cf.param_sets["crestparam"].grids) == {"wm", "im", "fc", "b"}
    assert set(cf.param_sets["kwparam"].grids) == {"leaki", "alpha", "beta", "alpha0"}
    assert cf.param_sets["kwparam"].values["02338660"]["alpha0"] == 0.0


def test_fill_is_strict(tmp_path):
    vals = _values(tmp_path)
    assert placeholders(PAPER.read_text()) == set(vals)
    for bad in ({"wm": float("nan")}, {"wm": "1.0\n[Task evil]"}, {"gauge_id": "0233 8660"},
                {"output": "out // comment"}, {"wm": True}):
        with pytest.raises(ValueError):
            fill_template(PAPER, {**vals, **bad})
    with pytest.raises(ValueError, match="needs values for: wm"):
        fill_template(PAPER, {k: v for k, v in vals.items() if k != "wm"})
    with pytest.raises(ValueError, match="no field"):
        fill_template(PAPER, {**vals, "colour": 1})
