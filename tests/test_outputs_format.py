"""The ts CSV writer prints every field exactly as EF5's format rules say, NaN and infinities included."""

from __future__ import annotations

import numpy as np
import pytest

from hydroagent_hpc.sim.outputs import HEADER, SNOW_HEADER, write_ts_csv
from hydroagent_hpc.types import GaugeSeries, SimulationResult


def _field2(x: float) -> str:
    """EF5's ``%.2f``, with any non-finite value printed ``nan`` (the rule, field by field)."""
    return "nan" if not np.isfinite(x) else f"{x:.2f}"


def _result(snow: bool, seed: int = 0) -> SimulationResult:
    rng = np.random.default_rng(seed)
    n = 40
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 0.005, 0.015, -0.004, 1e12, 2.675, 1e-300])

    def col(scale: float) -> np.ndarray:
        c = rng.normal(0, scale, n)
        c[: special.size] = rng.permutation(special)
        return c

    g = GaugeSeries(col(100.0), col(100.0), col(5.0), col(0.5), col(50.0), col(1e-3), col(1e-4),
                    temperature=col(10.0) if snow else None, swe=col(30.0) if snow else None)
    times = np.arange(np.datetime64("2020-01-01T01:00"), np.datetime64("2020-01-01T01:00") + n * 60,
                      60).astype("datetime64[m]")
    warm = np.zeros(n, dtype=bool)
    warm[:3] = True
    return SimulationResult(times, "g1", {"g1": g}, warm, {}, 0.0)


@pytest.mark.parametrize("snow", [False, True])
def test_rows_match_the_field_by_field_rule(tmp_path, snow):
    res = _result(snow)
    path = write_ts_csv(tmp_path / "ts.csv", res, "g1")
    g, keep = res.gauges["g1"], ~res.warmup
    want = [HEADER + (SNOW_HEADER if snow else "")]
    for i in np.flatnonzero(keep):
        t = str(res.times[i].astype("datetime64[m]")).replace("T", " ")
        row = [t] + [_field2(c[i]) for c in (g.discharge, g.observed, g.precip, g.pet, g.soil_moisture)]
        row += [f"{g.fast_flow[i] * 1000.0:.4f}", f"{g.slow_flow[i] * 1000.0:.4f}"]
        if snow:
            assert g.temperature is not None and g.swe is not None
            row += [_field2(g.temperature[i]), _field2(g.swe[i])]
        want.append(",".join(row))
    got = path.read_text()
    assert got == "\n".join(want) + "\n"
    printed = [line.split(",")[1:6] for line in got.splitlines()[1:]]
    assert not any(f.endswith("inf") for fields in printed for f in fields)  # %.2f columns never print inf
    assert any("nan" in fields for fields in printed)
    assert got.count("\n") == keep.sum() + 1
