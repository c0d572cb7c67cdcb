"""The agent kinds a campaign (or ``hydroagent calibrate``) can name, in one table: :data:`AGENT_KINDS`.

Each entry is an :class:`AgentKind`: how to build the agent and the options it takes. The campaign
loader (:mod:`hydroagent_hpc.campaign.spec`), the ``--kind`` choices of the command line and
:func:`make_agent` all read this table, and :func:`check_agent_options` refuses unknown or missing
options in one place, so a typo fails when the campaign file is read (with its line), not in an
episode.

Kinds: ``heuristic``; the optimizers ``dds``, ``sceua``, ``lhs``, ``random``, ``dream``;
``hybrid`` (a heuristic warm start handed to DDS); ``openai`` (any OpenAI-compatible endpoint
from the models file, option ``model``); ``hf_local`` (a local Hugging Face checkpoint, option
``path``); ``scripted`` (option ``script``, a JSON file). Every kind also takes ``backend`` (the
simulator backend of its episodes, read by the campaign runner).

Adding a kind is one module with a builder and one ``AGENT_KINDS.register`` line below; see
``docs/adding-an-agent.md``.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from hydroagent_hpc.agents.base import Agent
from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.agents.llm.models_file import Limits, ModelSpec, Prices, Sampling
from hydroagent_hpc.agents.scripted import ScriptedPolicy, load_script
from hydroagent_hpc.config import EnvConfig
from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.registry import Registry

__all__ = ["AGENT_KINDS", "AgentKind", "AgentBuilder", "AgentOptionError", "COMMON_OPTIONS", "DEFAULT_BUDGET",
           "agent_options_problem", "allowed_options", "check_agent_options", "make_agent", "optimizer_budget"]

#: Options every kind accepts; the campaign runner reads them, the builder never sees them.
COMMON_OPTIONS = ("backend",)

#: Simulations an optimizer plans for when the environment sets no limit.
DEFAULT_BUDGET = 200

class AgentOptionError(HydroAgentError, ValueError):
    """An agent entry whose options the kind does not take (or lacks one it needs)."""


class AgentBuilder(Protocol):
    """Builds one episode's agent: ``build(options, name=..., seed=..., env=...)``.

    ``options`` are the entry's options without :data:`COMMON_OPTIONS`, already checked against
    the kind's declared ones. Return a fresh :class:`~hydroagent_hpc.agents.base.Policy` or
    :class:`~hydroagent_hpc.agents.base.DirectPolicy` (agents keep state between calls).
    """

    def __call__(self, options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent: ...


class _SpecLike(Protocol):
    """What :func:`make_agent` reads of a campaign's :class:`~hydroagent_hpc.campaign.spec.AgentSpec`."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str: ...

    @property
    def options(self) -> Mapping[str, Any]: ...


@dataclass(frozen=True)
class AgentKind:
    """One entry of :data:`AGENT_KINDS`.

    ``build``: an :class:`AgentBuilder`, or ``"package.module:function"`` naming one (imported on
    first use, so heavy dependencies load only for the kinds a campaign uses). ``options``: the
    option names the kind takes, or a function returning them (computed from a signature, say).
    ``required``: options that must be given, each with the phrase that explains it.
    """

    build: AgentBuilder | str
    options: Collection[str] | Callable[[], Collection[str]] = ()
    required: Mapping[str, str] = field(default_factory=dict)
    help: str = ""

    def allowed(self) -> frozenset[str]:
        """The option names this kind takes (its own and the required ones)."""
        names = self.options() if callable(self.options) else self.options
        return frozenset(names) | frozenset(self.required)

    def builder(self) -> AgentBuilder:
        if not isinstance(self.build, str):
            return self.build
        module, _, attr = self.build.partition(":")
        built: AgentBuilder = getattr(importlib.import_module(module), attr)
        return built


AGENT_KINDS: Registry[AgentKind] = Registry("agent kind", where="hydroagent_hpc/agents/factory.py")


def agent_options_problem(kind: str, options: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first problem with agent kind ``kind``'s ``options``, as ``(option, problem, fix)``, or None:
    an option the kind does not take (the first in sorted order), or one it needs that is missing or
    empty. The one check of an agent's options: campaign files, ``calibrate``'s flags, pipeline files
    and :func:`make_agent` all use it. Raises :class:`~hydroagent_hpc.registry.UnknownNameError` for
    an unknown kind. (The value of ``backend`` is checked where the simulator's registry is known,
    :mod:`hydroagent_hpc.campaign.spec`.)"""
    entry = AGENT_KINDS.lookup(kind)
    allowed = entry.allowed()
    extra = sorted(set(options) - allowed - set(COMMON_OPTIONS))
    if extra:
        return (extra[0], f"agent kind {kind!r} takes no option {extra[0]!r}; its options: "
                          f"{', '.join(sorted(allowed)) or 'none'} (and {', '.join(COMMON_OPTIONS)})",
                f"remove {extra[0]!r} or spell it as one of the options listed")
    for opt, what in entry.required.items():
        if options.get(opt) in (None, ""):
            return opt, f"agent kind {kind!r} needs option {opt} ({what})", f"add '{opt}: ...' to the agent's entry"
    return None


def check_agent_options(kind: str, options: Mapping[str, Any]) -> AgentKind:
    """The kind's entry, once ``options`` pass :func:`agent_options_problem`; else
    :class:`AgentOptionError` (message starting with the option's name)."""
    problem = agent_options_problem(kind, options)
    if problem is not None:
        name, text, fix = problem
        raise AgentOptionError(f"{name}: {text}", fix=fix)
    return AGENT_KINDS.lookup(kind)


def make_agent(spec: _SpecLike, seed: int, env: EnvConfig) -> Agent:
    """The policy for one episode (a fresh object per episode: agents keep state)."""
    entry = check_agent_options(spec.kind, spec.options)
    options = {k: v for k, v in spec.options.items() if k not in COMMON_OPTIONS}
    return entry.builder()(options, name=spec.name, seed=seed, env=env)


def optimizer_budget(env: EnvConfig) -> int:
    """The simulations an optimizer plans for: the environment's limit, or :data:`DEFAULT_BUDGET`.

    The limit itself is :func:`hydroagent_hpc.agents.optimizers.policy.simulation_budget`.
    """
    from hydroagent_hpc.agents.optimizers.policy import simulation_budget

    return simulation_budget(env) or DEFAULT_BUDGET


# --------------------------------------------------------------------------- the built-in kinds' builders


def _heuristic(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
    return HeuristicHydrologist(seed=seed, name=name, **options)


def _optimizer(kind: str) -> AgentBuilder:
    def build(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
        from hydroagent_hpc.agents.optimizers.policy import make_optimizer_policy

        policy = make_optimizer_policy(kind, seed=seed, budget=optimizer_budget(env), **options)
        policy.name = name
        return policy

    return build


def _optimizer_options(kind: str) -> Callable[[], frozenset[str]]:
    """``scale`` and the keyword options of the optimizer's constructor (read from its signature)."""

    def names() -> frozenset[str]:
        from hydroagent_hpc.agents.optimizers.policy import OPTIMIZERS

        params = inspect.signature(OPTIMIZERS[kind]).parameters.values()
        return frozenset({"scale"} | {p.name for p in params if p.kind is p.KEYWORD_ONLY and p.name != "space"})

    return names


def _hybrid(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
    from hydroagent_hpc.agents.hybrid import HybridPolicy

    return HybridPolicy(seed=seed, budget=optimizer_budget(env), name=name, **options)


def _openai(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
    from hydroagent_hpc.agents.llm.openai_api import make_openai_agent

    return make_openai_agent(seed=seed, name=name, **options)


def _openai_options() -> frozenset[str]:
    """``model``, the agent's own options and every model setting a campaign may override."""
    import dataclasses

    from hydroagent_hpc.agents.llm.openai_api import AGENT_OPTIONS

    fields = {f.name for cls in (ModelSpec, Sampling, Prices, Limits) for f in dataclasses.fields(cls)}
    return frozenset({"model", *AGENT_OPTIONS} | fields)


def _hf_local(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

    path = options.pop("path")
    return HFLocalPolicy(path, seed=seed, **options)


def _scripted(options: dict[str, Any], *, name: str, seed: int, env: EnvConfig) -> Agent:
    return ScriptedPolicy(load_script(options["script"]), name=name)


# --------------------------------------------------------------------------- the table (one line per kind)

AGENT_KINDS.register("heuristic", AgentKind(_heuristic, ("step0", "min_step", "max_restarts", "overshoot", "digits",
                                                              "partial", "explore", "quote",
                                                              "explore_start"),
                                            help="the rule-based hydrologist (text tools)"))
for _kind in ("dds", "sceua", "lhs", "random", "dream"):
    AGENT_KINDS.register(_kind, AgentKind(_optimizer(_kind), _optimizer_options(_kind),
                                          help=f"the {_kind} optimizer (direct tools)"))
AGENT_KINDS.register("hybrid", AgentKind(_hybrid, ("warm_start", "warm_simulations"),
                                         help="a heuristic warm start handed to DDS"))
AGENT_KINDS.register("openai", AgentKind(_openai, _openai_options, required={"model": "a name in the models file"},
                                         help="a chat model behind an OpenAI-compatible endpoint"))
AGENT_KINDS.register("hf_local", AgentKind(
    _hf_local, ("temperature", "top_p", "greedy", "max_new_tokens", "max_context_tokens", "device"),
    required={"path": "a local checkpoint folder"}, help="a local Hugging Face checkpoint"))
AGENT_KINDS.register("scripted", AgentKind(
    _scripted, (), required={"script": "a JSON file of messages or tool calls"}, help="a replay of a JSON script"))


def allowed_options(kind: str) -> dict[str, bool]:
    """The options agent kind ``kind`` takes, each mapped to whether it is required (``backend``, the
    simulator's option shared by every kind, is not listed). Read from :data:`AGENT_KINDS`."""
    entry = AGENT_KINDS.lookup(kind)
    return {name: name in entry.required for name in sorted(entry.allowed())}
