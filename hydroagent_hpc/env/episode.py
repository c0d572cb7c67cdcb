"""``run_episode(policy, env) -> Episode``: the loop every agent, baseline and RL rollout uses."""

from __future__ import annotations

import logging

from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.policy import Agent, DirectPolicy, MetersUsage, Policy, StopsWithReason, UsesParameters
from hydroagent_hpc.env.toolcalls import render_tool_response
from hydroagent_hpc.errors import CannotHealError, one_line, tracebacks_wanted
from hydroagent_hpc.types import Episode

log = logging.getLogger(__name__)

__all__ = ["run_episode", "ROLE_TOOL"]

ROLE_TOOL = "tool"


def run_episode(policy: Agent, env: CalibrationEnv) -> Episode:
    """Alternate policy messages and environment steps until the episode ends.

    A text :class:`~hydroagent_hpc.env.policy.Policy` (``act(messages)``) gets the conversation:
    it holds the assistant messages and one ``tool`` message per observation, in the order the
    calls ran. A :class:`~hydroagent_hpc.env.policy.DirectPolicy` (``run(env)``, and no ``act``)
    drives the direct tools instead. A policy that returns ``None`` ends the episode (its
    ``stop_reason`` if it has one, else "policy_stopped"); one that raises ends it with
    "policy_error" and the error is logged (one line; with its traceback under ``hydroagent --debug``),
    except a :class:`~hydroagent_hpc.errors.CannotHealError` (a refused key, an unknown model, a model
    that does not load), which no later turn or episode can heal: it leaves ``run_episode`` so that the
    caller stops (a campaign stops at once) instead of recording it episode after episode. Anything
    else is a ``TypeError``. A policy with
    ``use_parameters`` (:class:`~hydroagent_hpc.env.policy.UsesParameters`) is first told the
    basin's parameter set.
    """
    if not isinstance(policy, (Policy, DirectPolicy)):
        raise TypeError(f"run_episode needs a Policy (name, act(messages)) or a DirectPolicy (name, run(env)); "
                        f"got {type(policy).__name__}")
    messages: list[dict[str, str]] = env.reset()
    if isinstance(policy, UsesParameters):
        policy.use_parameters(env.parameters)
    if isinstance(policy, Policy):
        _converse(policy, env, messages)
    else:
        try:
            policy.run(env)
        except CannotHealError:
            raise
        except Exception as exc:  # an agent's crash must not lose the episode record
            _log_failure(policy, env, exc)
            env.close(f"policy_error: {type(exc).__name__}")
        if not env.done:
            env.close(_stop_reason(policy))
    return _with_usage(env.episode(), policy)


def _converse(policy: Policy, env: CalibrationEnv, messages: list[dict[str, str]]) -> None:
    while not env.done:
        try:
            text = policy.act(messages)
        except CannotHealError:
            raise
        except Exception as exc:  # an agent's crash must not lose the episode record
            _log_failure(policy, env, exc)
            env.close(f"policy_error: {type(exc).__name__}")
            break
        if text is None:
            env.close(_stop_reason(policy))
            break
        result = env.step(text)
        messages.append({"role": "assistant", "content": text})
        for obs in result.observations:
            messages.append({"role": ROLE_TOOL, "content": render_tool_response(obs)})


def _log_failure(policy: Agent, env: CalibrationEnv, exc: Exception) -> None:
    """A policy's failure as one log line; its traceback too only under ``hydroagent --debug``."""
    log.error("policy %s failed on %s: %s: %s", policy.name, env.basin.basin_id, type(exc).__name__, one_line(exc),
              exc_info=exc if tracebacks_wanted() else None)


def _stop_reason(policy: Agent) -> str:
    """The policy's own reason for stopping, or "policy_stopped"."""
    reason = policy.stop_reason if isinstance(policy, StopsWithReason) else None
    return reason or "policy_stopped"


def _with_usage(episode: Episode, policy: Agent) -> Episode:
    """Copy the policy's token/cost accounting (LLM agents) into the episode."""
    if isinstance(policy, MetersUsage) and isinstance(policy.usage, dict) and policy.usage:
        episode.usage = {str(k): v for k, v in policy.usage.items()}
    return episode
