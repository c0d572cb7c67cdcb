"""``simulate_task((basin_dir, backend, params))``: one run as a picklable pool task.

A worker (an MPI rank, a pool process) opens each basin's simulator once and keeps it, since
loading the forcing is the expensive part; the result travels back to the caller. The module
imports nothing heavy, so a worker that runs only simulations never loads torch.
"""

from __future__ import annotations

from pathlib import Path

from hydroagent_hpc.sim import Simulator, open_simulator
from hydroagent_hpc.types import SimulationResult

__all__ = ["simulate_task"]

_OPEN: dict[tuple[str, str], Simulator] = {}


def simulate_task(item: tuple[str, str, dict[str, float] | None]) -> SimulationResult:
    """Run ``params`` (multiplier overrides, or None) on the basin in ``basin_dir`` with ``backend``."""
    basin_dir, backend, params = item
    key = (backend, basin_dir)
    sim = _OPEN.get(key)
    if sim is None:
        sim = _OPEN[key] = open_simulator(Path(basin_dir) / "control.txt", backend)
    return sim.run(params)
