"""Simulator benchmarks: cold/warm load, one run, a batch of 8, the whole process, and EF5.

Runs use calibration-like parameters (:func:`typical_params`). Every figure is reported with the
baseline it is compared to, measured in the same run:
``batch8 / run`` (goal <= 2.5), ``EF5 process / our warm run`` (goal >= 4) and
``hydroagent process / EF5 process`` (goal <= 1; <= 2 on small basins) when ``$HYDROAGENT_EF5``
names a binary (run with ``OMP_NUM_THREADS=1``); the run with the process's kernel (C unless
``HYDROAGENT_KERNEL`` says otherwise) and, beside it, with numba;
without one, the EF5 columns say so and the published EF5 wall time of the reference case is
shown, labelled as published.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from hydroagent_hpc.bench.timing import median_seconds
from hydroagent_hpc.params import check_values
from hydroagent_hpc.sim import kernels
from hydroagent_hpc.sim.controlfile import render_control
from hydroagent_hpc.sim.ef5 import EF5Simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator

__all__ = ["CaseTiming", "bench_case"]

# EF5 1.2.3 wall time (median of 5) from ef5-reference/dendritic/README.md, for context only.
PUBLISHED_EF5_S = {"dendritic/control_a.txt": 0.031}


@dataclass
class CaseTiming:
    label: str
    cells: int
    steps: int
    load_cold_s: float
    load_warm_s: float
    run_s: float
    batch8_s: float
    process_s: float
    forcing_mb: float
    run_numba_s: float | None = None  # the same run with the numba kernel (run_s: the process's kernel)
    kernel: str = ""
    ef5_run_s: float | None = None
    ef5_process_s: float | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def cell_steps_per_s(self) -> float:
        return self.cells * self.steps / self.run_s

    @property
    def batch_ratio(self) -> float:
        return self.batch8_s / self.run_s


def _process_time(cmd: list[str], env: dict[str, str], repeats: int, cwd: str | None = None,
                  warm_up: bool = False) -> float:
    # bytecode caching on, as an installed package runs (some shells set PYTHONDONTWRITEBYTECODE)
    env = {k: v for k, v in env.items() if k != "PYTHONDONTWRITEBYTECODE"}

    def once():
        proc = subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"{cmd[0]} failed: {proc.stderr[-500:]}")
    return median_seconds(once, repeats, warm_up=warm_up)


def bench_case(control: Path, label: str, repeats: int = 5) -> CaseTiming:
    """Benchmark one control file with the embedded engine (and EF5 if configured)."""
    cache = tempfile.mkdtemp(prefix="hydroagent-bench-cache-")
    t0 = time.perf_counter()
    sim = EmbeddedSimulator(control, cache_dir=cache)
    cold = time.perf_counter() - t0
    warm = median_seconds(lambda: EmbeddedSimulator(control, cache_dir=cache), 3, warm_up=False)
    params = typical_params(Path(control))

    chosen = kernels.kernel().name
    sim.run(params)  # build, compile or load the compiled kernel
    run = median_seconds(lambda: sim.run(params), repeats, warm_up=False)
    run_numba = None
    if chosen != "numba":
        with kernels.using("numba"):
            sim.run(params)
            run_numba = median_seconds(lambda: sim.run(params), repeats, warm_up=False)
    rng = np.random.default_rng(0)
    sets = [{**params, "wm": float(rng.uniform(0.5, 2.0)), "alpha": float(rng.uniform(0.5, 2.0))} for _ in range(8)]
    sim.run_batch(sets)
    batch = median_seconds(lambda: sim.run_batch(sets), max(3, repeats // 2), warm_up=False)
    out = tempfile.mkdtemp(prefix="hydroagent-bench-out-")
    env = {**os.environ, "HYDROAGENT_CACHE": cache}
    # the same calibration-like multipliers in every process (EF5 below too): the control file's
    # defaults have alpha0 = 0, a shortcut that skips most of the routing work
    proc = _process_time([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "simulate", str(control), "--output", out,
                          *set_flags(params)], env, 3, warm_up=True)
    timing = CaseTiming(label, sim.net.n, len(sim.steps), cold, warm, run, batch, proc,
                        (sim.precip.nbytes + sim.pet.nbytes) / 2**20, run_numba, chosen)
    ef5 = os.environ.get("HYDROAGENT_EF5")
    if ef5:

        esim = EF5Simulator(control)
        esim.run(params)
        timing.ef5_run_s = median_seconds(lambda: esim.run(params), 3, warm_up=False)
        timing.ef5_process_s = ef5_process_time(control, params, 3)
    return timing


def set_flags(params: dict[str, float]) -> list[str]:
    """``hydroagent simulate`` flags that apply ``params`` (``--set NAME=VALUE`` each)."""
    return [a for k, v in params.items() for a in ("--set", f"{k}={v!r}")]


def ef5_process_time(control: Path, params: dict[str, float], repeats: int) -> float:
    """Median wall time of the EF5 binary as a whole process on ``control`` with ``params`` applied
    (``OMP_NUM_THREADS=1``; one untimed run first)."""

    esim = EF5Simulator(control)
    run_dir = Path(tempfile.mkdtemp(prefix="hydroagent-bench-ef5-"))
    (run_dir / "output").mkdir()
    over = check_values(params, "benchmark parameters", snow=bool(esim.task.snow))
    (run_dir / "control.txt").write_text(render_control(esim.control, esim.task.name, over, run_dir / "output"))
    return _process_time([str(esim.binary), "control.txt"], {**os.environ, "OMP_NUM_THREADS": "1"}, repeats,
                         cwd=str(run_dir), warm_up=True)


def typical_params(control: Path) -> dict[str, float]:
    """A calibration-like parameter set: a synthetic basin's hidden truth, else alpha0 = 0.5.

    The defaults (alpha0 = 0) take a pass-through shortcut in overland routing and run about
    twice as fast as the parameter sets a calibration actually visits, so they would flatter us.
    """
    truth = control.parent / "truth.json"
    if truth.exists():
        import json

        mult = json.loads(truth.read_text()).get("multipliers", {})
        return {k: float(v) for k, v in mult.items() if k not in ("th", "isu")}
    return {"alpha0": 0.5}


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
