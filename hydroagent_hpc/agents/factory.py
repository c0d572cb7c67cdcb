"""Build an agent from a campaign's agent entry: ``make_agent(spec, seed, env_config)``.

Kinds: ``heuristic``; the optimizers ``dds``, ``sceua``, ``lhs``, ``random``, ``dream``;
``hybrid`` (a heuristic warm start handed to DDS); ``openai`` (any OpenAI-compatible endpoint
from the models file, option ``model``); ``hf_local`` (a local Hugging Face checkpoint, option
``path``); ``scripted`` (option ``script``, a JSON file). Options not listed for a kind are errors.
"""

from __future__ import annotations

from typing import Any

from hydroagent_hpc.config import EnvConfig

__all__ = ["make_agent", "simulation_budget"]


def simulation_budget(env: EnvConfig) -> int:
    """The number of simulations an optimizer may plan for under this environment (200 if unlimited)."""
    from hydroagent_hpc.agents.optimizers.policy import simulation_budget as limit

    return limit(env) or 200


def _take(options: dict[str, Any], allowed: set[str], kind: str) -> dict[str, Any]:
    extra = sorted(set(options) - allowed - {"backend"})
    if extra:
        raise ValueError(f"agent kind {kind!r} takes no option {extra[0]!r}; options: {', '.join(sorted(allowed)) or 'none'}")
    return {k: v for k, v in options.items() if k in allowed}


def make_agent(spec, seed: int, env: EnvConfig):
    """The policy for one episode (a fresh object per episode: agents keep state)."""
    kind, opts = spec.kind, dict(spec.options)
    if kind == "heuristic":
        from hydroagent_hpc.agents.heuristic import HeuristicHydrologist

        return HeuristicHydrologist(seed=seed, name=spec.name, **_take(opts, {"step0", "min_step", "max_restarts"}, kind))
    if kind in ("dds", "sceua", "lhs", "random", "dream"):
        from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy

        policy = make_optimizer_policy(kind, seed=seed, budget=simulation_budget(env), **opts)
        policy.name = spec.name
        return policy
    if kind == "hybrid":
        from hydroagent_hpc.agents.hybrid import HybridPolicy

        return HybridPolicy(seed=seed, budget=simulation_budget(env), name=spec.name,
                            **_take(opts, {"warm_start", "warm_simulations"}, kind))
    if kind == "openai":
        from hydroagent_hpc.agents.llm.openai_api import make_openai_agent

        return make_openai_agent(seed=seed, name=spec.name, **opts)
    if kind == "hf_local":
        from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

        o = _take(opts, {"path", "temperature", "top_p", "greedy", "max_new_tokens", "max_context_tokens", "device"}, kind)
        path = o.pop("path", None)
        if not path:
            raise ValueError("agent kind 'hf_local' needs option path: a local checkpoint folder")
        return HFLocalPolicy(path, seed=seed, **o)
    if kind == "scripted":
        from hydroagent_hpc.agents.scripted import ScriptedPolicy, load_script

        o = _take(opts, {"script"}, kind)
        if "script" not in o:
            raise ValueError("agent kind 'scripted' needs option script: a JSON file of messages or tool calls")
        return ScriptedPolicy(load_script(o["script"]), name=spec.name)
    raise ValueError(f"unknown agent kind {kind!r}")
