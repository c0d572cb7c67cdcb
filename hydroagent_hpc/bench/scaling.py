"""``python -m hydroagent_hpc.bench.scaling``: simulator cost against basin size and length, beside EF5.

For synthetic basins of 300 to 50,000 cells (0.01 degree cells, ``--days`` of hourly forcing, no
warm-up) and, on the 1,000-cell basin, for several window lengths, it measures in one run:

- our warm run in-process with the C kernel and with the numba kernel (median of ``--repeats``;
  calibration-like multipliers: the basin's hidden truth), and cell-steps per second;
- a batch of 8 parameter sets on one thread, as a multiple of one run;
- the memory a run allocates (``tracemalloc`` peak: numpy arrays, which is what grows with the
  basin; the C kernel's own per-node scratch, a few arrays of n floats, is not traced), and the
  forcing the simulator holds once for all runs;
- the whole ``hydroagent simulate`` process (``--no-cache``: it reads every forcing file, as EF5
  does), and the EF5 binary's whole process on the same control file (``$HYDROAGENT_EF5``,
  ``OMP_NUM_THREADS=1``), when one is configured, both with the same multipliers as our runs;
- runs per second per core in a pool of persistent worker processes (:mod:`hydroagent_hpc.bench.hpc`).

Prints Markdown tables and writes ``OUT/scaling.json`` and ``OUT/scaling.png`` (time per run
against cells, log-log, with EF5 when measured). Basins are built once under ``OUT/basins``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.hpc import efficiency
from hydroagent_hpc.bench.simulator import ef5_process_time, set_flags, typical_params
from hydroagent_hpc.bench.timing import median_seconds
from hydroagent_hpc.sim import kernels
from hydroagent_hpc.sim.embedded import EmbeddedSimulator

ROOT = Path(__file__).resolve().parents[2]
SIZES = (300, 1000, 3000, 10000, 30000, 50000)
LENGTHS = (5, 20, 60)  # days, on the 1,000-cell basin

__all__ = ["SIZES", "LENGTHS", "basin", "measure", "main"]


def basin(out: Path, area_km2: int, days: int) -> Path:
    """A synthetic basin of about ``area_km2`` cells (0.01 degree), built once."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    folder = out / "basins" / f"a{area_km2}_d{days}"
    control = folder / "control.txt"
    if not control.exists():
        synthesize_basin(folder, name=f"scale{area_km2}", area_km2=float(area_km2), window_days=days, warmup_days=0,
                         seed=1, cellsize_deg=0.01)
    return control


def _process(cmd: list[str], repeats: int, cwd: str | None = None, env: dict[str, str] | None = None) -> float:
    # bytecode caching on, as an installed package runs (some shells set PYTHONDONTWRITEBYTECODE)
    env = {k: v for k, v in (env or os.environ).items() if k != "PYTHONDONTWRITEBYTECODE"}

    def once() -> None:
        proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {proc.stderr[-400:]}")
    return median_seconds(once, repeats, warm_up=True)


def _ef5_process(control: Path, params: dict[str, float], repeats: int) -> float | None:
    if not os.environ.get("HYDROAGENT_EF5"):
        return None

    return ef5_process_time(control, params, repeats)


def measure(control: Path, repeats: int = 3, process: bool = True) -> dict[str, Any]:
    """One basin: runs with each kernel, a batch of 8, memory, and whole processes."""

    sim = EmbeddedSimulator(control, cache_dir=False)
    params = typical_params(control)
    row: dict[str, Any] = {"cells": sim.net.n, "steps": len(sim.steps),
                           "forcing_mb": (sim.precip.nbytes + sim.pet.nbytes) / 2**20}
    rng = np.random.default_rng(0)
    sets = [{**params, "wm": float(rng.uniform(0.5, 2.0)), "alpha": float(rng.uniform(0.5, 2.0))} for _ in range(8)]
    kernels.set_threads(1)
    for name in ("c", "numba"):
        try:
            with kernels.using(name):
                sim.run(params)  # build / compile / load
                row[f"run_{name}_s"] = median_seconds(lambda: sim.run(params), repeats, warm_up=False)
                sim.run_batch(sets)
                row[f"batch8_{name}_s"] = median_seconds(lambda: sim.run_batch(sets), max(1, repeats // 2),
                                                         warm_up=False)
        except Exception as exc:  # a kernel that cannot run here is reported, not fatal
            row[f"run_{name}_s"] = None
            row[f"{name}_error"] = str(exc)[:200]
    with kernels.using(row.get("run_c_s") and "c" or "numba"):
        tracemalloc.start()
        sim.run(params)
        row["run_peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    if process:
        out = tempfile.mkdtemp(prefix="hydroagent-scaling-out-")
        # --no-cache: the process reads every forcing file, as EF5 does
        row["process_s"] = _process([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(control),
                                     "--output", out, "--no-cache", *set_flags(params)], repeats)
        row["ef5_process_s"] = _ef5_process(control, params, repeats)
    return row


def _fmt(x: float | None, spec: str = ".3f") -> str:
    return "n/a" if x is None else format(x, spec)


def table(rows: list[dict[str, Any]]) -> str:
    head = ("| cells | steps | run C s | run numba s | numba / C | Mcell-steps/s (C) | batch8 / run (C, 1 thread) "
            "| run peak MB | forcing MB | process s | EF5 process s | EF5 process / our run (C) "
            "| process / EF5 process |\n" + "|---" * 13 + "|\n")
    lines = []
    for r in rows:
        c, nb, ef5 = r.get("run_c_s"), r.get("run_numba_s"), r.get("ef5_process_s")
        lines.append(
            f"| {r['cells']} | {r['steps']} | {_fmt(c, '.4f')} | {_fmt(nb, '.4f')} | "
            f"{_fmt(nb / c if c and nb else None, '.2f')} | "
            f"{_fmt(r['cells'] * r['steps'] / c / 1e6 if c else None, '.1f')} | "
            f"{_fmt(r['batch8_c_s'] / c if c and r.get('batch8_c_s') else None, '.2f')} | "
            f"{r['run_peak_mb']:.1f} | {r['forcing_mb']:.1f} | {_fmt(r.get('process_s'))} | {_fmt(ef5)} | "
            f"{_fmt(ef5 / c if ef5 and c else None, '.1f')} | "
            f"{_fmt(r['process_s'] / ef5 if ef5 and r.get('process_s') else None, '.2f')} |")
    return head + "\n".join(lines) + "\n"


def figure(rows: list[dict[str, Any]], path: Path) -> Path | None:
    """Time per run against cells (log-log): C, numba, and EF5's whole process when measured."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:  # pragma: no cover - matplotlib is a dependency of the reports
        return None
    fig, ax = plt.subplots(figsize=(6.0, 4.2))
    cells = [r["cells"] for r in rows]
    for key, label, style in (("run_c_s", "ours, C kernel (in-process)", "o-"),
                              ("run_numba_s", "ours, numba kernel (in-process)", "s--"),
                              ("process_s", "ours, `hydroagent simulate` process", "^:"),
                              ("ef5_process_s", "EF5 1.2.3 process", "k*-")):
        pts = [(c, r[key]) for c, r in zip(cells, rows) if r.get(key)]
        if pts:
            ax.plot(*zip(*pts), style, label=label)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("cells")
    ax.set_ylabel(f"seconds per run ({rows[0]['steps']} hourly steps)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def pool_rate(control: Path, workers: int = 2, n: int = 24) -> dict[str, Any]:
    """Runs per second per core in a pool of persistent worker processes (bench.hpc's efficiency)."""

    rows = efficiency(str(control), n=n, workers=workers)
    pool = next(r for r in rows if r["backend"] == "processes")
    return {"workers": workers, "runs_per_s_per_core": 1.0 / (pool["sim_s"] * workers),
            "serial_runs_per_s": 1.0 / rows[0]["sim_s"], "efficiency": pool["efficiency"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.scaling", description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=ROOT / "results" / "bench-scaling")
    ap.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    ap.add_argument("--days", type=int, default=10, help="hourly days per run in the size sweep")
    ap.add_argument("--lengths", type=int, nargs="*", default=list(LENGTHS), help="days, on the 1,000-cell basin")
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    out = sys.stdout.write
    args.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    size_rows = [measure(basin(args.out, a, args.days), args.repeats) for a in args.sizes]
    out(f"## Simulator scaling with basin size ({args.days} days hourly, C and numba kernels, EF5 "
        f"{'measured in the same run' if os.environ.get('HYDROAGENT_EF5') else 'not configured'})\n\n")
    out(table(size_rows) + "\n")
    length_rows = [measure(basin(args.out, 1000, d), args.repeats, process=False) for d in args.lengths]
    if length_rows:
        out("## Simulator scaling with run length (1,000-cell basin)\n\n")
        out(table(length_rows) + "\n")
    rate = pool_rate(basin(args.out, 1000, args.days))
    out(f"Pool of {rate['workers']} persistent worker processes on the 1,000-cell basin: "
        f"{rate['runs_per_s_per_core']:.1f} runs/s per core (serial: {rate['serial_runs_per_s']:.1f} runs/s; "
        f"parallel efficiency {rate['efficiency']:.2f}).\n\n")
    fig = figure(size_rows, args.out / "scaling.png")
    (args.out / "scaling.json").write_text(json.dumps({"sizes": size_rows, "lengths": length_rows, "pool": rate,
                                                       "seconds": round(time.perf_counter() - t0, 1)}, indent=2))
    out(f"Figure: {fig}; data: {args.out / 'scaling.json'} ({time.perf_counter() - t0:.0f} s)\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
