"""The simulator: an embedded EF5-compatible CREST/KW engine and the EF5 binary backend.

Choose the backend once, at the edge, with :func:`open_simulator`; both follow the
:class:`Simulator` protocol: ``base_params``, ``run(params) -> SimulationResult`` and
``run_batch([params, ...]) -> [SimulationResult, ...]``. The backends are the entries of
:data:`BACKENDS` (``embedded``, ``ef5``); the command line's ``--backend`` choices read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from hydroagent_hpc.registry import Registry
from hydroagent_hpc.types import SimulationResult

__all__ = ["Simulator", "SimulatorFactory", "open_simulator", "BACKENDS"]


@runtime_checkable
class Simulator(Protocol):
    """What the calibration environment needs of a simulator (both backends provide it).

    ``params`` are multiplier overrides by name (:data:`hydroagent_hpc.params.PARAM_NAMES`);
    names left out keep the control file's values, which ``base_params`` returns. A run that
    cannot produce valid output raises :class:`~hydroagent_hpc.sim.errors.SimulationError` (a
    :class:`~hydroagent_hpc.errors.HydroAgentError`); bad values raise an ``InputError``. A run validates
    ``params`` once, where they enter; a :class:`~hydroagent_hpc.params.ParamValues` (validated already,
    e.g. by the environment's tool call) is taken as it is.
    """

    @property
    def base_params(self) -> dict[str, float]: ...

    def run(self, params: Mapping[str, float] | None = None) -> SimulationResult: ...

    def run_batch(self, param_sets: Sequence[Mapping[str, float] | None]) -> list[SimulationResult]: ...


#: ``factory(control, task=..., **options)`` opens one backend on a control file's task.
SimulatorFactory = Callable[..., Simulator]

BACKENDS: Registry[SimulatorFactory] = Registry("simulator backend", where="hydroagent_hpc/sim/__init__.py")


@BACKENDS.register("embedded")
def _embedded(control: str | Path, task: str | None = None, **options: Any) -> Simulator:
    from hydroagent_hpc.sim.embedded import EmbeddedSimulator

    return EmbeddedSimulator(control, task=task, **options)


@BACKENDS.register("ef5")
def _ef5(control: str | Path, task: str | None = None, **options: Any) -> Simulator:
    from hydroagent_hpc.sim.ef5 import EF5Simulator

    return EF5Simulator(control, task=task, **options)


def open_simulator(control: str | Path, backend: str = "embedded", task: str | None = None,
                   **options: Any) -> Simulator:
    """Load a control file's task with the backend named in :data:`BACKENDS` (``embedded`` or ``ef5``).

    ``options`` go to the backend (``cache_dir`` for embedded; ``binary``, ``timeout_s``,
    ``workdir``, ``keep_runs`` for ef5). An unknown backend raises
    :class:`~hydroagent_hpc.registry.UnknownNameError` listing the valid ones.
    """
    return BACKENDS.lookup(backend)(control, task=task, **options)
