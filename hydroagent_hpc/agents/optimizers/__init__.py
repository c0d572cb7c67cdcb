"""Classic calibration algorithms as agents: DDS, SCE-UA, DREAM, Latin hypercube and random search.

Each algorithm is an ask/tell optimizer in the unit cube of the tunable multipliers
(:mod:`~hydroagent_hpc.agents.optimizers.space`); :class:`~hydroagent_hpc.agents.optimizers.policy.OptimizerPolicy`
drives any of them through the environment's direct tools.
"""

from hydroagent_hpc.agents.optimizers.policy import (
    OptimizerPolicy,
    make_optimizer,
    make_optimizer_policy,
    simulation_budget,
)

__all__ = ["OptimizerPolicy", "make_optimizer", "make_optimizer_policy", "simulation_budget"]
