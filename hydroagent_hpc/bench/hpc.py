"""HPC benchmarks: pool overhead per task, parallel efficiency on real simulations, Slurm latency.

``python -m hydroagent_hpc.bench.hpc`` (also part of ``make bench``). Three measurements, each
against a baseline measured in the same run:

* overhead per trivial task on the serial, local-process and MPI pools (``mpiexec -n 3``: one
  coordinator, two workers; with and without the per-rank child process that isolates crashes),
  baseline: the serial pool;
* parallel efficiency on CPU-bound simulations of a demo basin, ``T_serial / (workers * T_pool)``,
  baseline: the same simulations run serially (warm simulators on both sides);
* submit-to-result latency of a trivial submitit job on Slurm, baseline: the same job on
  submitit's local executor, plus ``sbatch --wait`` of a one-line job.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.bench.timing import median_seconds
from hydroagent_hpc.hpc.mpi import mpi_pool
from hydroagent_hpc.hpc.pool import ProcessPool, SerialPool
from hydroagent_hpc.hpc.slurm import SiteSettings, make_executor, slurm_available
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.kernels import set_threads

ROOT = Path(__file__).resolve().parents[2]
_SIM: dict[str, Any] = {}


def _submit_trivial(executor: Any) -> Any:
    """Submit :func:`trivial` and wait for its result (one latency sample)."""
    return executor.submit(trivial, 0).result()


def trivial(x: int) -> int:
    return x


def simulate(item: tuple[str, int]) -> float:
    """One simulation of ``control`` with multipliers drawn from ``seed``; returns the discharge sum."""
    control, seed = item
    sim = _SIM.get(control)
    if sim is None:

        sim = _SIM[control] = EmbeddedSimulator(control)
    rng = np.random.default_rng(seed)
    params = {k: float(v) * float(rng.uniform(0.7, 1.3)) for k, v in sim.base_params.items()
              if k in ("wm", "b", "im", "ke", "fc", "iwu", "under", "leaki", "alpha", "beta", "alpha0")}
    return float(np.nansum(sim.run(params).discharge))


def _one_thread() -> None:
    set_threads(1)


def _time_map(pool: Any, fn: Any, items: list) -> float:
    t0 = time.perf_counter()
    out = list(pool.map(fn, items))
    dt = time.perf_counter() - t0
    bad = [r.error for r in out if not r.ok]
    if bad:
        raise RuntimeError(f"benchmark task failed: {bad[0]}")
    return dt


def _mpi_probe(kind: str, n: int, control: str, isolate: bool) -> None:
    """Run under mpiexec: print one JSON line (root) with the timed map's seconds."""

    with mpi_pool(max_in_flight=32, initializer=_one_thread, isolate=isolate) as pool:
        if pool is None:
            return
        if kind == "trivial":
            _time_map(pool, trivial, list(range(64)))  # warm: start the per-rank children
            dt = _time_map(pool, trivial, list(range(n)))
        else:
            _time_map(pool, simulate, [(control, 10_000 + i) for i in range(2 * pool.workers)])  # warm simulators
            dt = _time_map(pool, simulate, [(control, i) for i in range(n)])
        sys.stdout.write(json.dumps({"seconds": dt, "workers": pool.workers}) + "\n")


def _mpi(kind: str, n: int, control: str = "", isolate: bool = True, ranks: int = 3) -> dict | None:
    exe = Path(sys.executable).parent
    mpiexec = shutil.which("mpiexec", path=str(exe)) or shutil.which("mpiexec")
    if mpiexec is None:
        return None
    env = dict(os.environ, PATH=f"{exe}:{os.environ.get('PATH', '')}")
    cmd = [mpiexec, "-n", str(ranks), sys.executable, "-m", "hydroagent_hpc.bench.hpc", "--mpi-probe", kind,
           "--n", str(n), "--control", control] + ([] if isolate else ["--no-isolate"])
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900, stdin=subprocess.DEVNULL)
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    if p.returncode != 0 or not lines:
        raise RuntimeError(f"mpiexec benchmark failed: {p.stderr[-500:]}")
    return json.loads(lines[0])


def pool_overhead(n: int = 2000) -> list[dict[str, Any]]:
    """Milliseconds per trivial task on each backend."""

    rows: list[dict[str, Any]] = []
    serial = _time_map(SerialPool(), trivial, list(range(n)))
    rows.append({"backend": "serial", "workers": 1, "ms_per_task": 1e3 * serial / n})
    with ProcessPool(workers=2) as pool:
        _time_map(pool, trivial, list(range(64)))
        dt = _time_map(pool, trivial, list(range(n)))
    rows.append({"backend": "processes", "workers": 2, "ms_per_task": 1e3 * dt / n})
    for isolate in (True, False):
        m = _mpi("trivial", n, isolate=isolate)
        if m is not None:
            rows.append({"backend": f"mpi ({'isolated' if isolate else 'in-rank'})", "workers": m["workers"],
                         "ms_per_task": 1e3 * m["seconds"] / n})
    base = rows[0]["ms_per_task"]
    for r in rows:
        r["ratio_vs_serial"] = r["ms_per_task"] / base
    return rows


def efficiency(control: str, n: int = 48, workers: int = 2) -> list[dict[str, Any]]:
    """Parallel efficiency of simulations: T_serial / (workers * T_pool)."""

    _one_thread()
    serial_pool = SerialPool()
    _time_map(serial_pool, simulate, [(control, 10_000)])
    t1 = _time_map(serial_pool, simulate, [(control, i) for i in range(n)])
    rows = [{"backend": "serial (baseline)", "workers": 1, "seconds": t1, "sim_s": t1 / n, "efficiency": 1.0}]
    with ProcessPool(workers=workers, initializer=_one_thread) as pool:
        _time_map(pool, simulate, [(control, 10_000 + i) for i in range(2 * workers)])
        tp = _time_map(pool, simulate, [(control, i) for i in range(n)])
    rows.append({"backend": "processes", "workers": workers, "seconds": tp, "sim_s": tp / n,
                 "efficiency": t1 / (workers * tp)})
    m = _mpi("simulate", n, control, ranks=workers + 1)
    if m is not None:
        rows.append({"backend": "mpi (isolated)", "workers": m["workers"], "seconds": m["seconds"],
                     "sim_s": m["seconds"] / n, "efficiency": t1 / (m["workers"] * m["seconds"])})
    return rows


def slurm_latency(repeats: int = 3) -> list[dict[str, Any]] | None:
    """Seconds from submit to result of a trivial job: submitit on Slurm vs submitit local, and sbatch --wait."""

    if not slurm_available():
        return None
    rows: list[dict[str, Any]] = []
    site = SiteSettings(time_min=5)
    with tempfile.TemporaryDirectory(prefix="hydroagent-bench-") as tmp:
        for cluster in ("local", "slurm"):
            ex = make_executor(Path(tmp) / cluster, site, cluster, name="bench-latency")
            seconds = median_seconds(partial(_submit_trivial, ex), repeats, warm_up=False)
            rows.append({"path": f"submitit {cluster}", "median_s": seconds})
        sbatch = ["sbatch", "--wait", "--quiet", "-o", "/dev/null", "--wrap", "true"]
        seconds = median_seconds(lambda: subprocess.run(sbatch, check=True, timeout=300, cwd=tmp), repeats,
                                 warm_up=False)
        rows.append({"path": "sbatch --wait --wrap true", "median_s": seconds})
    base = rows[0]["median_s"]
    for r in rows:
        r["ratio_vs_submitit_local"] = r["median_s"] / base
    return rows


def markdown(control: str, n_trivial: int = 2000, n_sims: int = 48) -> str:
    lines = ["| pool | workers | ms per trivial task | ratio vs serial |", "|---|---|---|---|"]
    for r in pool_overhead(n_trivial):
        lines.append(f"| {r['backend']} | {r['workers']} | {r['ms_per_task']:.3f} | {r['ratio_vs_serial']:.0f} |")
    lines += ["", f"Simulations of {Path(control).parent.name} ({n_sims} runs, warm simulators, "
              f"{os.cpu_count()} CPUs):", "",
              "| pool | workers | total s | s per simulation | parallel efficiency |", "|---|---|---|---|---|"]
    for r in efficiency(control, n_sims):
        lines.append(f"| {r['backend']} | {r['workers']} | {r['seconds']:.2f} | {r['sim_s']:.4f} | "
                     f"{100 * r['efficiency']:.0f}% |")
    lat = slurm_latency()
    lines.append("")
    if lat is None:
        lines.append("Slurm latency: no Slurm controller answers here (start one with "
                     "../shared/scripts/start-local-slurm.sh).")
    else:
        lines += ["| submit to result | median s | ratio vs submitit local |", "|---|---|---|"]
        for r in lat:
            lines.append(f"| {r['path']} | {r['median_s']:.2f} | {r['ratio_vs_submitit_local']:.1f} |")
    return "\n".join(lines) + "\n"


def default_control() -> str:
    demo = ROOT / "results" / "demo" / "basins" / "syn_01403060" / "control.txt"
    if demo.exists():
        return str(demo)
    from hydroagent_hpc.sim.synth.basins import build_demo_basins

    return str(next(c for c in build_demo_basins(ROOT / "results" / "demo" / "basins")
                    if c.parent.name == "syn_01403060"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.hpc", description=__doc__.splitlines()[0])
    ap.add_argument("--mpi-probe", choices=("trivial", "simulate"), help=argparse.SUPPRESS)
    ap.add_argument("--n", type=int, default=2000, help=argparse.SUPPRESS)
    ap.add_argument("--control", default="", help="control file for the simulation benchmark (default: a demo basin)")
    ap.add_argument("--no-isolate", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.mpi_probe:
        _mpi_probe(args.mpi_probe, args.n, args.control, not args.no_isolate)
        return 0
    sys.stdout.write("## HPC pools and Slurm\n\n" + markdown(args.control or default_control()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
