"""The agent protocols, re-exported for agent authors (defined in :mod:`hydroagent_hpc.env.policy`).

:class:`Policy` (text: ``act(messages)``) and :class:`DirectPolicy` (code: ``run(env)``) are what
:func:`hydroagent_hpc.env.episode.run_episode` drives; :class:`StopsWithReason` and
:class:`MetersUsage` and :class:`UsesParameters` are the optional extras an agent may offer.
"""

from hydroagent_hpc.env.policy import Agent, DirectPolicy, MetersUsage, Policy, StopsWithReason, UsesParameters

__all__ = ["Policy", "DirectPolicy", "Agent", "StopsWithReason", "MetersUsage", "UsesParameters"]
