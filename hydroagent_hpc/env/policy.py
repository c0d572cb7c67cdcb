"""The protocols every agent follows: :class:`Policy` (text) and :class:`DirectPolicy` (code).

They live in ``env/`` because the episode loop (:mod:`hydroagent_hpc.env.episode`) is what drives
them; :mod:`hydroagent_hpc.agents.base` re-exports them for agent authors.

A text policy reads the conversation (OpenAI-style message dicts: system, user, assistant, tool)
and returns the next assistant message, or ``None`` to stop. Language models, the heuristic
hydrologist and scripted replays all speak this protocol, so their episodes are alike. A direct
policy (an optimizer) drives the environment's direct tools itself.

The protocols are runtime-checkable: :func:`hydroagent_hpc.env.episode.run_episode` dispatches on
``isinstance(policy, Policy)`` / ``isinstance(policy, DirectPolicy)``. :class:`StopsWithReason`,
:class:`MetersUsage` and :class:`UsesParameters` are the optional extras an agent may offer (why it
stopped; its token and cost accounting; told the basin's parameter set before the episode). The
simulator and pool seams are :class:`hydroagent_hpc.sim.Simulator` and
:class:`hydroagent_hpc.hpc.pool.Pool`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.params import ParameterSet

__all__ = ["Policy", "DirectPolicy", "Agent", "StopsWithReason", "MetersUsage", "UsesParameters"]


@runtime_checkable
class Policy(Protocol):
    name: str

    def act(self, messages: list[dict[str, str]]) -> str | None:
        """The next assistant message given the conversation so far; ``None`` ends the episode."""
        ...


@runtime_checkable
class DirectPolicy(Protocol):
    """A code-driven agent (an optimizer): drives the environment's direct tools itself.

    ``run(env)`` calls ``env.set_parameters(**values)``, ``env.run_simulation()`` and
    ``env.evaluate()`` (reading scores only from the observations the environment returns)
    until ``env.done``; the environment enforces the budget and the stop rules.
    """

    name: str

    def run(self, env: CalibrationEnv) -> None:
        ...


#: Either kind of agent; what :func:`hydroagent_hpc.agents.factory.make_agent` returns.
Agent = Policy | DirectPolicy


@runtime_checkable
class StopsWithReason(Protocol):
    """An agent that says why it stopped (``stop_reason``; empty or ``None`` while it has not)."""

    stop_reason: str | None


@runtime_checkable
class MetersUsage(Protocol):
    """An agent that accounts for its tokens and cost (LLM agents); copied into the episode record."""

    usage: Mapping[str, Any]


@runtime_checkable
class UsesParameters(Protocol):
    """An agent told the basin's parameter set (``env.parameters``) before each episode starts.

    :func:`~hydroagent_hpc.env.episode.run_episode` calls ``use_parameters`` right after
    ``env.reset()``; e.g. an LLM agent with native function calling puts the Snow-17 parameters
    into its tool schema on a basin with snow.
    """

    def use_parameters(self, parameters: ParameterSet) -> None:
        ...
