"""The policy protocol every agent follows.

A text policy reads the conversation (OpenAI-style message dicts: system, user, assistant, tool)
and returns the next assistant message, or ``None`` to stop. Language models, the heuristic
hydrologist and scripted replays all speak this protocol, so their episodes are alike.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

__all__ = ["Policy", "DirectPolicy"]


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

    def run(self, env) -> None:
        ...
