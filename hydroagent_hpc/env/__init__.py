"""The calibration environment: what an agent sees, what it may do, and what it is paid.

- :mod:`~hydroagent_hpc.env.environment`: :class:`CalibrationEnv` (reset, step, the direct tools);
- :mod:`~hydroagent_hpc.env.toolcalls`: the tool schema, strict parsing and rendering of calls;
- :mod:`~hydroagent_hpc.env.prompts`: system and first user prompts from the basin;
- :mod:`~hydroagent_hpc.env.observations`: the simulation and evaluation views an agent reads;
- :mod:`~hydroagent_hpc.env.rewards`: the reward ledger (``paper`` and ``released`` presets);
- :mod:`~hydroagent_hpc.env.episode`: :func:`run_episode`, one policy through one episode.

The package exports are loaded on first use (PEP 562), so importing a light submodule such as
:mod:`~hydroagent_hpc.env.policy` or :mod:`~hydroagent_hpc.env.toolcalls` does not pull in the
environment, the metrics and scipy: ``hydroagent simulate`` starts without them.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from hydroagent_hpc.env.environment import CalibrationEnv, StepResult
    from hydroagent_hpc.env.episode import run_episode

__all__ = ["CalibrationEnv", "StepResult", "run_episode"]

_WHERE = {"CalibrationEnv": "environment", "StepResult": "environment", "run_episode": "episode"}


def __getattr__(name: str) -> Any:
    if name in _WHERE:
        return getattr(importlib.import_module(f"hydroagent_hpc.env.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'hydroagent_hpc.env' has no attribute {name!r}")
