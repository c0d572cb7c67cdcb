"""Fidelity table: our engine against EF5's golden outputs, unrounded values vs EF5's printed ones.

EF5 prints 2 decimals, so a perfect re-implementation differs by up to 0.005 plus rounding
effects; the tests assert 0.01 (``tests/test_golden.py``). This prints the actual largest
differences per case and gauge.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.outputs import read_ts_csv

__all__ = ["CASES", "fidelity_rows"]

CASES = (("tiny", "control_a.txt", "expected_a"), ("tiny", "control_b.txt", "expected_b"),
         ("dendritic", "control_a.txt", "expected_a"), ("dendritic", "control_b.txt", "expected_b"),
         ("dendritic", "control_c.txt", "expected_c"), ("tif", "control.txt", "expected"))


def fidelity_rows(reference: Path) -> list[dict[str, object]]:
    rows = []
    for case, control, expected in CASES:
        sim = EmbeddedSimulator(reference / case / control, cache_dir=False)
        res = sim.run()
        keep = ~res.warmup
        for gauge in sim.output_gauges():
            ef5 = read_ts_csv(reference / case / expected / f"ts.{gauge}.crest.csv")
            g = res.gauges[gauge]
            dq = np.abs(g.discharge[keep] - ef5["discharge"])
            rows.append({"case": f"{case}/{control}", "gauge": gauge, "rows": int(keep.sum()),
                         "max_dQ": float(dq.max()), "at_Q": float(ef5["discharge"][int(np.argmax(dq))]),
                         "max_dSM": float(np.abs(g.soil_moisture[keep] - ef5["sm"]).max()),
                         "max_dFast": float(np.abs(g.fast_flow[keep] * 1000 - ef5["fast_flow"]).max()),
                         "max_dSlow": float(np.abs(g.slow_flow[keep] * 1000 - ef5["slow_flow"]).max())})
    return rows
