"""``simulate_task((basin_dir, backend, params))``: one run, or one batch of runs, as a picklable pool task.

A worker (an MPI rank, a pool process) opens each basin's simulator once and keeps it, since
loading the forcing is the expensive part; the result travels back to the caller. ``params`` may be
a list of parameter sets: the batch of one basin that the GRPO rollout engine gathered
(:mod:`hydroagent_hpc.train.generation.coalesce`) then travels as one task and comes back as a list of results.
The module imports nothing heavy, so a worker that runs only simulations never loads torch.
"""

from __future__ import annotations

from pathlib import Path

from hydroagent_hpc.sim import Simulator, open_simulator
from hydroagent_hpc.sim.kernels import thread_cap
from hydroagent_hpc.types import SimulationResult

__all__ = ["simulate_task"]

_OPEN: dict[tuple[str, str], Simulator] = {}

Params = dict[str, float] | None


def simulate_task(item: tuple[str, str, Params | list[Params]]) -> SimulationResult | list[SimulationResult]:
    """Run ``params`` (multiplier overrides, or None) on the basin in ``basin_dir`` with ``backend``.

    A list of parameter sets runs as one batch and returns one result per set, in order. A task is
    one unit of the pool's parallelism, so the batch runs on one thread (``embedded``: one
    vectorised call over the shared forcing) or one EF5 process at a time (``ef5``). If any member
    fails the whole task fails; the caller reruns the members one by one.
    """
    basin_dir, backend, params = item
    key = (backend, basin_dir)
    sim = _OPEN.get(key)
    if sim is None:
        sim = _OPEN[key] = open_simulator(Path(basin_dir) / "control.txt", backend)
    if not isinstance(params, list):
        return sim.run(params)
    if backend != "embedded":  # EF5's run_batch starts a process per core: not one slot's worth
        return [sim.run(p) for p in params]
    with thread_cap(1):
        return sim.run_batch(params)
