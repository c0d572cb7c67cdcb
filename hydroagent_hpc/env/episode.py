"""``run_episode(policy, env) -> Episode``: the loop every agent, baseline and RL rollout uses."""

from __future__ import annotations

import logging
from typing import Any

from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.toolcalls import render_tool_response
from hydroagent_hpc.types import Episode

log = logging.getLogger(__name__)

__all__ = ["run_episode", "ROLE_TOOL"]

ROLE_TOOL = "tool"


def run_episode(policy: Any, env: CalibrationEnv) -> Episode:
    """Alternate policy messages and environment steps until the episode ends.

    A :class:`~hydroagent_hpc.agents.base.DirectPolicy` (``run(env)``) drives the direct tools
    instead. The conversation holds the assistant messages and one ``tool`` message per observation, in
    the order the calls ran. A policy that returns ``None`` ends the episode
    ("policy_stopped"); one that raises ends it with "policy_error" and the error is logged.
    """
    messages: list[dict[str, str]] = env.reset()
    if hasattr(policy, "run") and not hasattr(policy, "act"):
        try:
            policy.run(env)
        except Exception as exc:  # an agent's crash must not lose the episode record
            log.exception("policy %s failed on %s", getattr(policy, "name", policy), env.basin.basin_id)
            env.close(f"policy_error: {type(exc).__name__}")
        if not env.done:
            env.close(getattr(policy, "stop_reason", None) or "policy_stopped")
        return _with_usage(env.episode(), policy)
    while not env.done:
        try:
            text = policy.act(messages)
        except Exception as exc:  # an agent's crash must not lose the episode record
            log.exception("policy %s failed on %s", getattr(policy, "name", policy), env.basin.basin_id)
            env.close(f"policy_error: {type(exc).__name__}")
            break
        if text is None:
            env.close(getattr(policy, "stop_reason", None) or "policy_stopped")
            break
        result = env.step(text)
        messages.append({"role": "assistant", "content": text})
        for obs in result.observations:
            messages.append({"role": ROLE_TOOL, "content": render_tool_response(obs)})
    return _with_usage(env.episode(), policy)


def _with_usage(episode: Episode, policy: Any) -> Episode:
    """Copy the policy's token/cost accounting (LLM agents) into the episode."""
    usage = getattr(policy, "usage", None)
    if isinstance(usage, dict) and usage:
        episode.usage = {str(k): v for k, v in usage.items()}
    return episode
