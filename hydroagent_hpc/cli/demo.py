"""``make demo``: the embedded default end to end, no network, no GPU, no EF5 binary.

1. Builds the four synthetic twins of the paper's held-out gauges (``results/demo/basins``).
2. Simulates each with HydroAgent's default multipliers (the starting point of every
   calibration) and writes EF5's output files per basin (``results/demo/runs``).
3. Runs the demo campaign (``data/campaigns/demo.yaml``: heuristic, DDS, SCE-UA and random
   search, 2 seeds each, 200 simulations) into ``results/demo/campaign.h5``; an interrupted demo
   resumes where it stopped.
4. Prints the best NSE after 25, 50, 100 and 200 simulations (median over seeds) and the
   parameter recovery against the hidden truth, and writes ``summary.json`` with the provenance.
5. Writes the campaign's report (``results/demo/report/``: ``report.md``, a self-contained
   ``report.html``, figures and CSV tables; see ``hydroagent report``) and prints where it is.
"""

from __future__ import annotations

import json
import logging
import os
import time
from pathlib import Path

import numpy as np

from hydroagent_hpc.campaign import campaign_from_mapping, run_campaign
from hydroagent_hpc.metrics import evaluate
from hydroagent_hpc.params import TUNABLE
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.report.recovery import recovery_error
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.outputs import write_run
from hydroagent_hpc.sim.synth.basins import DEMO_BASINS, build_demo_basins, read_truth

log = logging.getLogger(__name__)

__all__ = ["run_demo", "default_rows", "campaign_rows", "format_table", "DEMO_CAMPAIGN"]

DEMO_CAMPAIGN = Path(__file__).resolve().parents[2] / "data" / "campaigns" / "demo.yaml"
CHECKPOINTS = (25, 50, 100, 200)


def default_rows(controls: list[Path], out: Path) -> list[dict[str, object]]:
    """Simulate each basin with the default multipliers; one row each."""
    specs = {spec.name: spec for spec in DEMO_BASINS}
    rows = []
    for control in controls:
        t0 = time.perf_counter()
        sim = EmbeddedSimulator(control)
        load = time.perf_counter() - t0
        sim.run()  # the first call loads the compiled kernel
        res = sim.run()
        write_run(sim, res, out / "runs" / control.parent.name, res.wall_time_s)
        m = evaluate(res.observed, res.discharge, res.times, mask=res.evaluation_mask())
        spec = specs.get(control.parent.name)
        basin = json.loads((control.parent / "basin.json").read_text())
        rows.append({"basin": control.parent.name, "twin_of": spec.gauge_id if spec else "",
                     "area_km2": basin.get("area_km2"), "cells": sim.net.n, "steps": len(sim.steps),
                     "load_s": round(load, 3), "run_s": round(res.wall_time_s, 4), "NSE": round(float(m["NSE"]), 3),
                     "KGE": round(float(m["KGE"]), 3), "PBIAS": round(float(m["PBIAS"]), 1)})
    return rows


def campaign_rows(store: Path, basin_dirs: dict[str, Path]) -> list[dict[str, object]]:
    """Best NSE after 25/50/100/200 simulations (median over seeds) and recovery, per agent and basin."""
    from hydroagent_hpc.store import read_episodes, read_sims

    eps = read_episodes(store)
    sims = read_sims(store)
    rows = []
    for (agent, basin), group in eps.groupby(["agent", "basin_id"], sort=True):
        curves, recov = [], []
        truth = read_truth(basin_dirs[basin])["multipliers"] if basin in basin_dirs else None
        for _, ep in group.iterrows():
            s = sims[sims["episode_id"] == ep["episode_id"]].sort_values("run_id")
            nse = np.where(np.isfinite(s["NSE"].to_numpy(float)), s["NSE"].to_numpy(float), -np.inf)
            run = np.maximum.accumulate(nse) if nse.size else np.array([-np.inf])
            curves.append([float(run[min(n, run.size) - 1]) for n in CHECKPOINTS])
            if truth is not None and nse.size and np.isfinite(nse.max()):
                best = s.iloc[int(np.argmax(nse))]
                recov.append(recovery_error({k: best[k] for k in TUNABLE}, truth))
        med = np.median(np.array(curves), axis=0)
        row = {"agent": agent, "basin": basin, "seeds": len(group)}
        row.update({f"NSE@{n}": round(float(v), 3) for n, v in zip(CHECKPOINTS, med)})
        row["sims"] = int(np.median(group["n_sims"]))
        row["recovery"] = round(float(np.median(recov)), 3) if recov else None
        rows.append(row)
    return rows


def format_table(rows: list[dict[str, object]]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(rows[0])
    widths = {c: max(len(c), *(len(f"{r.get(c)}") for r in rows)) for c in cols}
    lines = ["  ".join(c.ljust(widths[c]) for c in cols)]
    lines += ["  ".join(f"{r.get(c)}".ljust(widths[c]) for c in cols) for r in rows]
    return "\n".join(lines)


def run_demo(out: Path, workers: int | None = None, campaign: bool = True) -> int:
    out.mkdir(parents=True, exist_ok=True)
    controls = build_demo_basins(out / "basins")
    starts = default_rows(controls, out)
    print("Default multipliers (the uncalibrated starting point):")
    print(format_table(starts))
    summary: dict[str, object] = {"defaults": starts, "provenance": provenance()}
    if campaign:
        import yaml

        data = yaml.safe_load(DEMO_CAMPAIGN.read_text())
        data["basins"] = [str(c.parent) for c in controls]
        spec = campaign_from_mapping(data, source=str(DEMO_CAMPAIGN))
        workers = workers or max(1, min(2, os.cpu_count() or 1))
        print(f"\nCampaign {spec.name}: {len(spec.agents)} agents x {len(spec.basins)} basins x "
              f"{len(spec.seeds)} seeds, "
              f"{spec.env.max_simulations} simulations each, {workers} worker(s)")
        result = run_campaign(spec, out / "campaign.h5", workers=workers)
        rows = campaign_rows(out / "campaign.h5", {c.parent.name: c.parent for c in controls})
        print("\nBest NSE after N simulations (median over seeds); "
              "recovery = mean |log10(best/truth)| of the 11 multipliers:")
        print(format_table(rows))
        summary.update({"campaign": result, "results": rows})
    tmp = out / ".summary.json.part"
    tmp.write_text(json.dumps(summary, indent=2, default=str))
    tmp.replace(out / "summary.json")
    print(f"\nEF5-style outputs per basin: {out / 'runs'}")
    if campaign:
        print(f"episodes (HDF5): {out / 'campaign.h5'}  (schema: docs/store_schema.md)")
    print(f"summary: {out / 'summary.json'}")
    if campaign:
        from hydroagent_hpc.report import write_report

        report = write_report(out / "campaign.h5", out / "report")
        print(f"\nReport ({report.seconds:.1f} s): {report.markdown}  (one self-contained page: {report.html}; "
              f"figures and CSV tables beside them)")
    return 0
