"""Control files: EF5 syntax accepted, bad input rejected with file:line, the key and the fix."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hydroagent_hpc.sim.controlfile import parse_control, render_control
from hydroagent_hpc.sim.errors import ControlFileError


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "control.txt"
    p.write_text(text)
    return p


@pytest.fixture
def tiny_text(reference_dir) -> str:
    return (reference_dir / "tiny" / "control_a.txt").read_text()


def _tiny_copy(tmp_path: Path, reference_dir: Path, text: str) -> Path:
    """Write a control file into the tiny case's folder layout via absolute paths."""
    base = reference_dir / "tiny"
    for key in ("basic/", "precip", "pet", "obs/"):
        text = text.replace(f"={key}", f"={base}/{key}")
    return _write(tmp_path, text)


def test_syntax_comments_case_and_shared_lines(tmp_path, reference_dir, tiny_text):
    text = tiny_text.replace("[Basic]", "/* block\ncomment */ [bAsIc]  // trailing")
    text = text.replace("PROJ=geographic", "proj=GEOGRAPHIC # comment")
    p = _tiny_copy(tmp_path, reference_dir, text)
    cf = parse_control(p)
    assert cf.basic.proj == "geographic" and cf.basic.esriddm is True and cf.basic.selffam is False
    assert cf.param_sets["syncrest"].values["outlet"] == {"wm": 100.0, "b": 0.5, "im": 5.0, "ke": 0.8, "fc": 5.0,
                                                          "iwu": 50.0}
    assert cf.task().time_begin.year == 2020 and cf.execute == ["synrun"]


@pytest.mark.parametrize("edit,line_of,words", [
    (("[Gauge Outlet]", "[Gauges Outlet]"), "[Gauges Outlet]", ["unknown section", "[Gauges]", "fix:"]),
    (("OUTPUTTS=TRUE", "OUTPUTTS=TRUE COLOUR=red"), "COLOUR=red", ["unknown key 'colour'", "[gauge]"]),
    (("TIME_END=202006040000", "TIME_END=202013040000"), "TIME_END=", ["time_end", "not a valid time", "YYYYMMDDHHUU"]),
    (("WM=100.0 ", "WM=abc "), "WM=abc", ["wm='abc'", "not a number"]),
    (("ESRIDDM=true", "ESRIDDM=maybe"), "ESRIDDM=maybe", ["esriddm", "boolean"]),
    (("TIMESTEP=1h", "TIMESTEP=1hour"), "TIMESTEP=", ["timestep", "duration"]),
])
def test_errors_name_file_line_key_and_fix(tmp_path, reference_dir, tiny_text, edit, line_of, words):
    text = tiny_text.replace(*edit)
    p = _tiny_copy(tmp_path, reference_dir, text)
    with pytest.raises(ControlFileError) as ei:
        parse_control(p)
    msg = str(ei.value)
    lineno = next(i for i, line in enumerate(p.read_text().splitlines(), 1) if line_of in line)
    assert f"{p}:{lineno}:" in msg, msg
    for w in words:
        assert w.lower() in msg.lower(), (w, msg)
    assert "fix:" in msg


@pytest.mark.parametrize("remove,key", [("TIMESTEP=1h\n", "timestep"), ("DEM=basic/dem.asc\n", "dem"),
                                        ("PRECIP=RAIN\n", "precip")])
def test_missing_required_key(tmp_path, reference_dir, tiny_text, remove, key):
    p = _tiny_copy(tmp_path, reference_dir, tiny_text.replace(remove, ""))
    with pytest.raises(ControlFileError, match=rf"missing the required key '{key}'"):
        parse_control(p)


def test_dangling_references(tmp_path, reference_dir, tiny_text):
    p = _tiny_copy(tmp_path, reference_dir, tiny_text.replace("PARAM_SET=SynCrest", "PARAM_SET=Nope"))
    with pytest.raises(ControlFileError, match="(?s)PARAM_SET=.nope. names no such section.*syncrest"):
        parse_control(p)
    p = _tiny_copy(tmp_path, reference_dir, tiny_text.replace("TASK=SynRun", "TASK=Other"))
    with pytest.raises(ControlFileError, match="runs task 'other'"):
        parse_control(p)


def test_missing_parameter_for_gauge(tmp_path, reference_dir, tiny_text):
    p = _tiny_copy(tmp_path, reference_dir, tiny_text.replace(" IWU=50.0", ""))
    with pytest.raises(ControlFileError, match="lacks iwu"):
        parse_control(p)


def test_ef5_only_features_point_to_backend(tmp_path, reference_dir, tiny_text):
    p = _tiny_copy(tmp_path, reference_dir, tiny_text + "\n[lrparamset X]\n")
    with pytest.raises(ControlFileError, match="--backend ef5"):
        parse_control(p)


def test_render_roundtrip_numbers_only(reference_dir, tmp_path):
    cf = parse_control(reference_dir / "dendritic" / "control_b.txt")
    text = render_control(cf, overrides={"wm": 2.5, "ALPHA0": 0.25}, output=tmp_path / "o")
    p = tmp_path / "rendered.txt"
    p.write_text(text)
    again = parse_control(p)
    assert again.param_sets["crestparams"].values["outlet"]["wm"] == 2.5
    assert again.param_sets["kwparams"].values["outlet"]["alpha0"] == 0.25
    assert again.param_sets["kwparams"].values["outlet"]["isu"] == 2e-05
    assert again.task().time_warmend == cf.task().time_warmend
    assert again.param_sets["crestparams"].grids == cf.param_sets["crestparams"].grids
    for bad in ("1; rm -rf /", float("nan"), float("inf"), "2.5"):
        with pytest.raises(ValueError):
            render_control(cf, overrides={"wm": bad})
    with pytest.raises(ValueError, match="unknown parameter"):
        render_control(cf, overrides={"wm_grid": 1.0})


def test_cli_reports_error_without_traceback(tmp_path, reference_dir, tiny_text):
    p = _tiny_copy(tmp_path, reference_dir, tiny_text.replace("[Gauge Outlet]", "[Gage Outlet]"))
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "simulate", str(p)], capture_output=True,
                          text=True)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert f"{p}:" in proc.stderr and "unknown section [Gage]" in proc.stderr and "fix:" in proc.stderr


def test_model_must_precede_param_set(tmp_path, reference_dir, tiny_text):
    text = tiny_text.replace("MODEL=CREST\n", "").replace("PARAM_SET=SynCrest\n", "PARAM_SET=SynCrest\nMODEL=CREST\n")
    p = _tiny_copy(tmp_path, reference_dir, text)
    with pytest.raises(ControlFileError, match="PARAM_SET comes before MODEL"):
        parse_control(p)
    text = tiny_text.replace("ROUTING=KW\n", "").replace("ROUTING_PARAM_SET=SynKW\n",
                                                         "ROUTING_PARAM_SET=SynKW\nROUTING=KW\n")
    with pytest.raises(ControlFileError, match="ROUTING_PARAM_SET comes before ROUTING"):
        parse_control(_tiny_copy(tmp_path, reference_dir, text))


def test_write_asc_accepts_numpy_scalars(tmp_path):
    import numpy as np

    from hydroagent_hpc.sim.grids import Grid, read_asc, write_asc

    g = Grid(np.ones((2, 3)), np.float64(-97.5), np.float32(35.0), np.float64(0.01))
    write_asc(tmp_path / "g.asc", g)
    back = read_asc(tmp_path / "g.asc")
    assert back.xll == -97.5 and back.yll == 35.0 and back.data.shape == (2, 3)
