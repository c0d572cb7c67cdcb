"""The simulator: an embedded EF5-compatible CREST/KW engine and the EF5 binary backend.

Choose the backend once, at the edge, with :func:`open_simulator`; both give the same API:
``run(params) -> SimulationResult``, ``run_batch([params, ...])``, ``base_params``.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["open_simulator", "BACKENDS"]

BACKENDS = ("embedded", "ef5")


def open_simulator(control: str | Path, backend: str = "embedded", task: str | None = None, **options):
    """Load a control file's task with the chosen backend (``embedded`` or ``ef5``)."""
    if backend == "embedded":
        from hydroagent_hpc.sim.embedded import EmbeddedSimulator

        return EmbeddedSimulator(control, task=task, **options)
    if backend == "ef5":
        from hydroagent_hpc.sim.ef5 import EF5Simulator

        return EF5Simulator(control, task=task, **options)
    raise ValueError(f"unknown backend {backend!r}; choose one of: {', '.join(BACKENDS)}")
