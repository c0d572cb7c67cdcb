"""The calibration environment: what an agent sees, what it may do, and what it is paid.

- :mod:`~hydroagent_hpc.env.environment`: :class:`CalibrationEnv` (reset, step, the direct tools);
- :mod:`~hydroagent_hpc.env.toolcalls`: the tool schema, strict parsing and rendering of calls;
- :mod:`~hydroagent_hpc.env.prompts`: system and first user prompts from the basin;
- :mod:`~hydroagent_hpc.env.observations`: the simulation and evaluation views an agent reads;
- :mod:`~hydroagent_hpc.env.rewards`: the reward ledger (``paper`` and ``released`` presets);
- :mod:`~hydroagent_hpc.env.episode`: :func:`run_episode`, one policy through one episode.
"""

from hydroagent_hpc.env.environment import CalibrationEnv, StepResult
from hydroagent_hpc.env.episode import run_episode

__all__ = ["CalibrationEnv", "StepResult", "run_episode"]
