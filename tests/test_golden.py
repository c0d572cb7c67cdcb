"""Fidelity: the embedded engine reproduces EF5 1.2.3's outputs on every golden case.

Tolerances from ef5-reference/README.md: discharge within 0.01 m3/s, SM within 0.01 %,
Precip/PET within 0.01 mm/h, Fast/Slow Flow within 1e-4, identical Time column, equal missingQPE;
state grids cell-wise to a relative 1e-5 (float32) where EF5 wrote them.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from conftest import GOLDEN_CASES
from hydroagent_hpc.sim.grids import read_tif
from hydroagent_hpc.sim.outputs import read_ts_csv

TOL = {"discharge": 0.01, "sm": 0.01, "precip": 0.01, "pet": 0.01, "fast_flow": 1e-4, "slow_flow": 1e-4}
EPS = 1e-9  # decimal print units are not exact in binary: 12.35 - 12.34 > 0.01


@pytest.mark.parametrize("case,control,expected", GOLDEN_CASES, ids=[f"{c}-{f}" for c, f, _ in GOLDEN_CASES])
def test_cli_matches_ef5(reference_dir, tmp_path, case, control, expected):
    """`hydroagent simulate` as a real subprocess writes EF5's files with EF5's numbers."""
    case_dir = reference_dir / case
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(case_dir / control),
                           "--output", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    exp_dir = case_dir / expected
    csvs = sorted(p.name for p in exp_dir.glob("ts.*.csv"))
    assert csvs and sorted(p.name for p in out.glob("ts.*.csv")) == csvs
    for name in csvs:
        ours, ef5 = read_ts_csv(out / name), read_ts_csv(exp_dir / name)
        assert np.array_equal(ours["times"], ef5["times"])
        for col, tol in TOL.items():
            diff = np.abs(ours[col] - ef5[col])
            assert np.nanmax(diff) <= tol + EPS, f"{name} {col}: max diff {np.nanmax(diff)}"
        # Observed: same values, same gaps (nan), -999 printed as a value.
        assert np.array_equal(np.isnan(ours["observed"]), np.isnan(ef5["observed"]))
        assert np.nanmax(np.abs(ours["observed"] - ef5["observed"]), initial=0.0) <= 0.01 + EPS
    assert json.loads((out / "results.json").read_text())["missingQPE"] == \
        json.loads((exp_dir / "results.json").read_text())["missingQPE"]
    for state in exp_dir.glob("*.tif"):
        ours_g, ef5_g = read_tif(out / state.name), read_tif(state)
        basin = ef5_g.data != -9999
        assert np.array_equal(basin, ours_g.data != -9999), state.name
        np.testing.assert_allclose(ours_g.data[basin], ef5_g.data[basin], rtol=1e-5, atol=1e-7, err_msg=state.name)


def test_ascii_and_tif_inputs_agree(reference_dir):
    """The all-GeoTIFF case gives the same series as its ASCII twin (EF5: byte-identical)."""
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    a = EmbeddedSimulator(reference_dir / "dendritic" / "control_a.txt", cache_dir=False).run()
    t = EmbeddedSimulator(reference_dir / "tif" / "control.txt", cache_dir=False).run()
    for g in ("outlet", "inner"):  # tolerances: float32 TIF vs decimal ASCII
        np.testing.assert_allclose(a.gauges[g].discharge, t.gauges[g].discharge, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(a.gauges[g].soil_moisture, t.gauges[g].soil_moisture, rtol=1e-6, atol=1e-6)
