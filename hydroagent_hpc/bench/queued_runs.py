"""Rollout-style queued runs: ``python -m hydroagent_hpc.bench.queued_runs [--runs N]``.

What the GRPO rollout engine's :class:`~hydroagent_hpc.train.generation.coalesce.RunCoalescer` gains: 8
threads (the K = 8 members of a GRPO group) each simulate ``N`` distinct calibration-like parameter
sets on one demo basin, one after another, through
:class:`~hydroagent_hpc.train.generation.rollout.RolloutSimulator` with 1 and 2 simulation slots; once with
the runs that wait for a slot gathered into batches of up to 8 (``sim_batch: 8``) and once each
run alone (``sim_batch: 1``, the baseline), alternating, in the same process. Reported: runs per
second (the best of the repeats: other processes on the machine only ever slow a repeat down), the
ratio gathered / alone, the median ratio of each alternating pair, and the mean members per slot
hold.
No model and no environment: only the simulations' schedule is measured.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.simulator import typical_params
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.train.generation.coalesce import RunCoalescer

__all__ = ["measure", "markdown", "main"]

log = logging.getLogger(__name__)
ROOT = Path(__file__).resolve().parents[2]


def _param_sets(control: Path, members: int, runs: int) -> list[list[dict[str, float]]]:
    """``runs`` distinct calibration-like parameter sets for each of ``members`` threads."""
    base = typical_params(control)
    rng = np.random.default_rng(0)
    return [[{**base, "wm": float(rng.uniform(0.5, 2.0)), "alpha": float(rng.uniform(0.5, 2.0))}
             for _ in range(runs)] for _ in range(members)]


def _once(sim: Any, sets: list[list[dict[str, float]]], slots_limit: int, sim_batch: int) -> tuple[float, float]:
    """Every thread runs its sets through one RolloutSimulator; (wall seconds, runs per slot hold)."""
    from hydroagent_hpc.train.generation.rollout import RolloutSimulator, SimulationSlots

    slots = SimulationSlots(slots_limit)
    coalescer = RunCoalescer(slots, sim_batch) if sim_batch > 1 else None
    wrapped = RolloutSimulator(sim, slots, None, "bench", coalescer=coalescer)
    start = threading.Barrier(len(sets) + 1)

    def member(own: list[dict[str, float]]) -> None:
        start.wait()
        for p in own:
            wrapped.run(p)

    threads = [threading.Thread(target=member, args=(own,)) for own in sets]
    for t in threads:
        t.start()
    start.wait()
    t0 = time.perf_counter()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    return wall, slots.runs / max(1, slots.batches)


def measure(control: Path, members: int = 8, runs: int = 6, slot_limits: tuple[int, ...] = (1, 2),
            repeats: int = 5, sim_batch: int = 8) -> list[dict[str, Any]]:
    """One row per slot limit: runs/s gathered and alone (best of ``repeats``, alternating)."""

    sim = EmbeddedSimulator(control)
    sets = _param_sets(control, members, runs)
    sim.run_batch(sets[0])  # load the kernel and warm the caches outside the timings
    total = members * runs
    rows = []
    for limit in slot_limits:
        walls: dict[int, list[float]] = {sim_batch: [], 1: []}
        per_hold: list[float] = []
        for _ in range(repeats):
            for batch in (sim_batch, 1):
                wall, mean_batch = _once(sim, sets, limit, batch)
                walls[batch].append(wall)
                if batch > 1:
                    per_hold.append(mean_batch)
        gathered, alone = (total / min(walls[b]) for b in (sim_batch, 1))
        pairs = [a / g for g, a in zip(walls[sim_batch], walls[1])]
        rows.append({"basin": control.parent.name, "cells": sim.net.n, "steps": len(sim.steps), "slots": limit,
                     "threads": members, "runs": total, "gathered_runs_s": gathered, "alone_runs_s": alone,
                     "ratio": gathered / alone, "pair_ratio": statistics.median(pairs),
                     "pair_range": (min(pairs), max(pairs)), "mean_batch": statistics.median(per_hold)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    lines = ["| basin | cells | steps | slots | threads x runs | gathered runs/s (mean per slot hold) | alone runs/s "
             "| gathered / alone, best | per pair: median (range) |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lo, hi = r["pair_range"]
        lines.append(f"| {r['basin']} | {r['cells']} | {r['steps']} | {r['slots']} | {r['threads']} x "
                     f"{r['runs'] // r['threads']} | {r['gathered_runs_s']:.1f} ({r['mean_batch']:.1f}) | "
                     f"{r['alone_runs_s']:.1f} | **{r['ratio']:.2f}x** | {r['pair_ratio']:.2f}x "
                     f"({lo:.2f}-{hi:.2f}) |")
    lines += ["", "Gathered: runs of the basin that wait for a slot share one batched call in one slot on one "
              "thread (`sim_batch: 8`); alone: one run per slot (`sim_batch: 1`). Same parameter sets, "
              "alternating; runs/s from the best repeat of each, and the ratio of each alternating pair."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.queued_runs",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--basins", default=str(ROOT / "results" / "demo" / "basins"),
                    help="where the demo basins are (built if missing)")
    ap.add_argument("--basin", default="syn_02338660", help="which demo basin (default: the smallest, 327 cells)")
    ap.add_argument("--runs", type=int, default=6, help="runs per thread (default 6; 8 threads)")
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    from hydroagent_hpc.sim.synth.basins import build_demo_basins

    controls = {c.parent.name: c for c in build_demo_basins(args.basins)}
    if args.basin not in controls:
        ap.error(f"--basin {args.basin}: not a demo basin (one of {', '.join(sorted(controls))})")
    sys.stdout.write(markdown(measure(controls[args.basin], runs=args.runs, repeats=args.repeats)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
