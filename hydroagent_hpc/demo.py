"""``make demo``: the embedded default end to end, no network, no GPU, no EF5 binary.

Builds the four synthetic twins of the paper's held-out gauges, simulates each with HydroAgent's
default multipliers (the starting point of every calibration), writes EF5's output files per
basin, scores them against the synthetic observations, and writes ``summary.json`` with the
provenance. Later issues extend it into a full campaign and report.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from hydroagent_hpc.metrics import evaluate
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.outputs import write_run
from hydroagent_hpc.sim.synthetic import DEMO_BASINS, build_demo_basins

log = logging.getLogger(__name__)

__all__ = ["run_demo", "demo_rows", "format_table"]


def demo_rows(out: Path) -> list[dict[str, object]]:
    """Build (or reuse) the demo basins, simulate each with the defaults, return one row each."""
    controls = build_demo_basins(out / "basins")
    specs = {spec.name: spec for spec in DEMO_BASINS}
    rows = []
    for control in controls:
        t0 = time.perf_counter()
        sim = EmbeddedSimulator(control)
        load = time.perf_counter() - t0
        sim.run()  # the first call loads the compiled kernel
        res = sim.run()
        run_dir = out / "runs" / control.parent.name
        write_run(sim, res, run_dir, res.wall_time_s)
        m = evaluate(res.observed, res.discharge, res.times, mask=res.evaluation_mask())
        spec = specs.get(control.parent.name)
        basin = json.loads((control.parent / "basin.json").read_text())
        rows.append({
            "basin": control.parent.name, "twin_of": spec.gauge_id if spec else "", "area_km2": basin.get("area_km2"),
            "cells": sim.net.n, "steps": len(sim.steps), "load_s": round(load, 3), "run_s": round(res.wall_time_s, 4),
            "NSE": round(float(m["NSE"]), 3), "KGE": round(float(m["KGE"]), 3), "PBIAS": round(float(m["PBIAS"]), 1),
            "peak_lag_h": m["peak_lag_h"], "nse_band": m["nse_band"], "output": str(run_dir),
        })
        log.info("%s: NSE %.3f with default multipliers", control.parent.name, m["NSE"])
    return rows


def format_table(rows: list[dict[str, object]]) -> str:
    cols = ("basin", "twin_of", "area_km2", "cells", "steps", "load_s", "run_s", "NSE", "KGE", "PBIAS", "peak_lag_h")
    widths = {c: max(len(c), *(len(f"{r[c]}") for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(f"{r[c]}".ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def run_demo(out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    rows = demo_rows(out)
    summary = {"what": "default multipliers on the synthetic demo basins", "rows": rows, "provenance": provenance()}
    tmp = out / ".summary.json.part"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(out / "summary.json")
    print(format_table(rows))
    print(f"\nEF5-style outputs per basin: {out / 'runs'}\nsummary: {out / 'summary.json'}\n"
          "These are the uncalibrated starting points; calibration agents and campaigns arrive with the next issues.")
    return 0
