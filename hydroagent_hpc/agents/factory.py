"""Build an agent from a campaign's agent entry: ``make_agent(spec, seed, env_config)``.

Kinds: ``heuristic``; the optimizers ``dds``, ``sceua``, ``lhs``, ``random``, ``dream``;
``hybrid`` (a heuristic warm start handed to DDS); ``openai`` (any OpenAI-compatible endpoint
from the models file, option ``model``); ``hf_local`` (a local Hugging Face checkpoint, option
``path``); ``scripted`` (option ``script``, a JSON file). Options not listed for a kind are errors.
"""

from __future__ import annotations

from typing import Any, Mapping

from hydroagent_hpc.config import EnvConfig

__all__ = ["make_agent", "simulation_budget", "allowed_options"]


def simulation_budget(env: EnvConfig) -> int:
    """The number of simulations an optimizer may plan for under this environment (200 if unlimited)."""
    from hydroagent_hpc.agents.optimizers.policy import simulation_budget as limit

    return limit(env) or 200


def allowed_options(kind: str) -> Mapping[str, bool]:
    """The options agent kind ``kind`` takes, each mapped to whether it is required (``backend``, the
    simulator's option, is shared by every kind and not listed). Campaign files are checked against this
    before anything runs (:func:`hydroagent_hpc.campaign.spec.check_agent_options`)."""
    import inspect

    if kind == "heuristic":
        return dict.fromkeys(("step0", "min_step", "max_restarts"), False)
    if kind in ("dds", "sceua", "lhs", "random", "dream"):
        from hydroagent_hpc.agents.optimizers.policy import OPTIMIZERS

        params = inspect.signature(OPTIMIZERS[kind]).parameters  # its keyword options, plus the search scale
        return dict.fromkeys([n for n in params if n not in ("self", "seed", "budget", "space")] + ["scale"], False)
    if kind == "hybrid":
        return dict.fromkeys(("warm_start", "warm_simulations"), False)
    if kind == "openai":  # a models-file entry, then agent settings and any spec field it replaces
        import dataclasses

        from hydroagent_hpc.agents.llm.models_file import ModelSpec
        from hydroagent_hpc.agents.llm.openai_api import _AGENT_OPTIONS, _SECTIONS

        names = [f.name for f in dataclasses.fields(ModelSpec) if f.name not in ("name", "model", *_SECTIONS)]
        names += [f.name for cls in _SECTIONS.values() for f in dataclasses.fields(cls)] + list(_AGENT_OPTIONS)
        return {"model": True, **dict.fromkeys(names, False)}
    if kind == "hf_local":
        return {"path": True, **dict.fromkeys(("temperature", "top_p", "greedy", "max_new_tokens",
                                               "max_context_tokens", "device"), False)}
    if kind == "scripted":
        return {"script": True}
    raise ValueError(f"unknown agent kind {kind!r}")


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

        return HeuristicHydrologist(seed=seed, name=spec.name, **_take(opts, set(allowed_options(kind)), kind))
    if kind in ("dds", "sceua", "lhs", "random", "dream"):
        from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy

        policy = make_optimizer_policy(kind, seed=seed, budget=simulation_budget(env), **opts)
        policy.name = spec.name
        return policy
    if kind == "hybrid":
        from hydroagent_hpc.agents.hybrid import HybridPolicy

        return HybridPolicy(seed=seed, budget=simulation_budget(env), name=spec.name,
                            **_take(opts, set(allowed_options(kind)), kind))
    if kind == "openai":
        from hydroagent_hpc.agents.llm.openai_api import make_openai_agent

        return make_openai_agent(seed=seed, name=spec.name, **opts)
    if kind == "hf_local":
        from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

        o = _take(opts, set(allowed_options(kind)), kind)
        path = o.pop("path", None)
        if not path:
            raise ValueError("agent kind 'hf_local' needs option path: a local checkpoint folder")
        return HFLocalPolicy(path, seed=seed, **o)
    if kind == "scripted":
        from hydroagent_hpc.agents.scripted import ScriptedPolicy, load_script

        o = _take(opts, set(allowed_options(kind)), kind)
        if "script" not in o:
            raise ValueError("agent kind 'scripted' needs option script: a JSON file of messages or tool calls")
        return ScriptedPolicy(load_script(o["script"]), name=spec.name)
    raise ValueError(f"unknown agent kind {kind!r}")
