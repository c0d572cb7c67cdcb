"""``python -m hydroagent_hpc.bench.camels``: DDS on real CAMELS-US basins, calibration and validation NSE.

For each basin of ``shared/data/camels_us_nldas_sample`` (NLDAS forcing, Priestley-Taylor PET)
and the two basins of ``shared/data/camels_us_model_output`` (their PRCP and PET columns):

1. ``write_camels_basin`` writes a calibration basin scored on water years 1994-2003
   (1993-10-01..2003-09-30) after a 365-day warm-up, and a validation basin scored on
   2003-10-01..2013-09-30 (or the end of the record) whose warm-up is the calibration period
   plus the same 365 days: one long run from the same start, scored on the later period only,
   so the validation continues the calibrated model's states. Where the record starts after the
   warm-up (the NLDAS sample starts 1993-09-29) the missing days repeat the following year
   (``spinup="repeat"``, counted in basin.json).
2. DDS (:mod:`hydroagent_hpc.agents.optimizers.dds`) with 200 simulations through the calibration
   environment (``campaign.run_task``, paper preset with no target stop, no patience, no turn
   or wall-clock cap); calibration NSE = the episode's best.
3. The best multipliers run on the validation basin; validation NSE from
   :func:`hydroagent_hpc.metrics.evaluate` on the scored days.
4. For 01031500 and 13331500, the published SAC-SMA + Snow-17 simulation (``MOD_RUN`` of
   ``<id>_05_model_output.txt``) scored against ``OBS_RUN`` on the same days.

CREST has no snow routine; ``--raim`` adds rows for the two model-output basins forced with
``RAIM`` (rain + the benchmark's own Snow-17 melt) to show how much of the gap is snow.
Prints a Markdown table and writes ``results.json`` under ``--out``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
CAL = (date(1993, 10, 1), date(2003, 9, 30))
VAL = (date(2003, 10, 1), date(2013, 9, 30))


def _shared() -> Path:
    return Path(os.environ.get("HYDROAGENT_SHARED", ROOT.parent / "shared")) / "data"


def _nse(basin_dir: Path, params) -> tuple[float, int]:
    from hydroagent_hpc.metrics import evaluate
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    s = EmbeddedSimulator(basin_dir / "control.txt")
    r = s.run(params)
    m = evaluate(r.observed, r.discharge, r.times, mask=r.evaluation_mask())
    return float(m["NSE"]), int(m["n_points"])


def run_basin(case: dict, out: Path, simulations: int, seed: int, warmup: int) -> dict:
    """Write, calibrate and validate one case; returns its row."""
    from hydroagent_hpc.campaign import AgentSpec, Task, run_task
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.datasets import camels, model_output
    from hydroagent_hpc.datasets.camels_basin import write_camels_basin

    gid, label = case["gauge"], case["label"]
    t0 = time.perf_counter()
    common = dict(root=case["root"], gauge_id=gid, forcing=case["forcing"], attributes=case.get("attributes"),
                  spinup="repeat", precip_column=case.get("precip", "prcp"))
    flow = camels.read_streamflow(camels.find_streamflow_file(case["root"], gid))
    last = min(VAL[1], flow.dates[np.isfinite(flow.q_cfs)][-1].astype(date))
    if case["forcing"] == "model_output":
        mo = model_output.read_model_output(model_output.find_model_output_file(case["root"], gid))
        last = min(last, mo.dates[-1].astype(date))
    cal_dir, val_dir = out / "basins" / f"{label}_cal", out / "basins" / f"{label}_val"
    write_camels_basin(cal_dir, start=CAL[0], end=CAL[1], warmup_days=warmup, **common)
    write_camels_basin(val_dir, start=VAL[0], end=last, warmup_days=(VAL[0] - CAL[0]).days + warmup, **common)
    env = replace(preset("paper"), max_simulations=simulations, max_turns=None, patience=None, stop_at_target=False,
                  wall_clock_s=None)
    ep = run_task(Task(f"camels/{label}/dds/{seed}", str(cal_dir), AgentSpec("dds", "dds", {}), seed, env))
    best = dict(ep.best_params or {})
    val_nse, val_days = _nse(val_dir, best)
    default_val, _ = _nse(val_dir, None)
    meta = json.loads((cal_dir / "basin.json").read_text())
    row = {"label": label, "gauge": gid, "name": meta["gauge_name"], "forcing": case["forcing"] +
           (f" ({case['precip'].upper()})" if case.get("precip") else ""), "pet": meta["pet_method"],
           "area_km2": meta["area_km2"], "cells": meta["network"]["cells"], "spinup_days": meta["spinup_days"],
           "simulations": ep.counters.get("simulations"), "cal_nse": ep.best_nse, "val_nse": val_nse,
           "default_val_nse": default_val, "val_days": val_days, "val_period": f"{VAL[0]}..{last}",
           "best_params": best, "seconds": round(time.perf_counter() - t0, 1)}
    if case["forcing"] == "model_output":
        row["sacsma_val_nse"] = model_output.reference_nse(mo, VAL[0], last, flow)["nse"]
        row["sacsma_cal_nse"] = model_output.reference_nse(mo, CAL[0], CAL[1], flow)["nse"]
    return row


def cases(data: Path, raim: bool) -> list[dict]:
    sample = data / "camels_us_nldas_sample"
    out = []
    # the full CAMELS attribute tables (the sample's own subset lacks 01022500)
    attrs = data / "camels_us_nh_testdata" / "camels_attributes_v2.0"
    if sample.is_dir():
        for gid in (sample / "basins.txt").read_text().split():
            out.append({"label": gid, "gauge": gid, "root": str(sample), "forcing": "nldas",
                        "attributes": str(attrs) if attrs.is_dir() else None})
    mo = data / "camels_us_model_output"
    if mo.is_dir() and attrs.is_dir():
        for gid in ("01031500", "13331500"):
            out.append({"label": gid, "gauge": gid, "root": str(mo), "forcing": "model_output",
                        "attributes": str(attrs)})
            if raim:
                out.append({"label": f"{gid}_raim", "gauge": gid, "root": str(mo), "forcing": "model_output",
                            "attributes": str(attrs), "precip": "raim"})
    return out


def _f(x) -> str:
    return "n/a" if x is None or not np.isfinite(x) else f"{x:.3f}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.camels", description=__doc__.splitlines()[0])
    ap.add_argument("--data", default=str(_shared()), help="the shared data folder (default ../shared/data)")
    ap.add_argument("--out", default=str(ROOT / "results" / "camels_benchmark"))
    ap.add_argument("--simulations", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--warmup-days", type=int, default=365)
    ap.add_argument("--only", nargs="*", help="labels to run (default: all)")
    ap.add_argument("--raim", action="store_true", help="also force the two model-output basins with RAIM")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    data, out = Path(args.data), Path(args.out)
    todo = [c for c in cases(data, args.raim) if not args.only or c["label"] in args.only]
    if not todo:
        print(f"no CAMELS data under {data}: nothing to measure", file=sys.stderr)
        return 1
    rows = []
    w = sys.stdout.write
    w(f"## DDS ({args.simulations} simulations, seed {args.seed}) on CAMELS-US, daily; calibration WY1994-2003, "
      f"validation WY2004-2013\n\n| gauge | name | forcing | PET | km2 | spin-up d | cal NSE | val NSE | "
      "val NSE defaults | SAC-SMA val NSE | val days | s |\n|---|---|---|---|---|---|---|---|---|---|---|---|\n")
    for case in todo:
        r = run_basin(case, out, args.simulations, args.seed, args.warmup_days)
        rows.append(r)
        w(f"| {r['label']} | {r['name']} | {r['forcing']} | {r['pet']} | {r['area_km2']:.1f} | {r['spinup_days']} | "
          f"{_f(r['cal_nse'])} | {_f(r['val_nse'])} | {_f(r['default_val_nse'])} | {_f(r.get('sacsma_val_nse'))} | "
          f"{r['val_days']} | {r['seconds']} |\n")
        sys.stdout.flush()
    out.mkdir(parents=True, exist_ok=True)
    results = {"calibration": [str(d) for d in CAL], "validation": [str(d) for d in VAL],
               "simulations": args.simulations, "seed": args.seed, "rows": rows}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    w(f"\nresults: {out / 'results.json'}\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
