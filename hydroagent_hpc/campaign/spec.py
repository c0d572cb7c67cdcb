"""Campaigns: agents x basins x seeds under one protocol, run into one HDF5 file, resumable.

A campaign file (YAML, read strictly by :func:`hydroagent_hpc.settings.from_mapping`: an unknown key, a
wrong type or a bad value is a :class:`~hydroagent_hpc.errors.ConfigError` naming FILE:LINE, the dotted
key, the value and the fix) names::

    name: demo
    basins: [../results/demo/basins/syn_02338660, ...]   # basin folders, relative to this file
    agents:
      - {name: heuristic, kind: heuristic}
      - {name: dds, kind: dds}
      - {name: gpt-5, kind: openai, model: gpt-5}
      - {name: sft, kind: hf_local, path: ../sft/final, greedy: true, seeds: [0]}
    seeds: [0, 1]
    env: {preset: paper, protocol: turns, max_simulations: 200, max_turns: null, patience: null}

An agent's own ``seeds`` replace the campaign's for that agent (a greedy policy plays the same
episode whatever the seed, so one seed is enough). An agent's other keys are its kind's options
(:func:`hydroagent_hpc.agents.factory.allowed_options`). ``env`` is a preset (``paper``, ``released``)
with :class:`~hydroagent_hpc.config.EnvConfig` keys on top.

``run_campaign`` expands it into episodes (ids ``name/basin/agent/seed``), keeps one shard of
them when asked (``shard=(i, n)``: every n-th episode from the i-th, for array jobs), skips those
already in the output file or in other stores (resume after an interruption), runs the rest
through a simulation pool (:mod:`hydroagent_hpc.hpc`: serial, local processes or MPI ranks), and
writes each episode as soon as it finishes with the single HDF5 writer in this process. A killed
run therefore loses only the episodes in flight.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.agents.factory import AGENT_KINDS, agent_options_problem
from hydroagent_hpc.config import PRESETS, EnvConfig, preset
from hydroagent_hpc.errors import ConfigError, HydroAgentError, UsageError
from hydroagent_hpc.settings import Settings, Where, from_mapping, invalid, setting
from hydroagent_hpc.sim import BACKENDS
from hydroagent_hpc.sim.manifest import verify_manifest
from hydroagent_hpc.yamlio import brief, load_strict

log = logging.getLogger(__name__)

__all__ = ["AgentSpec", "CampaignSpec", "CampaignNotReadyError", "Task", "load_campaign", "campaign_from_mapping",
           "expand", "shard_of", "check_requirements", "ensure_ready", "AGENT_KINDS", "SEED_RANGE",
           "check_agent_options"]

#: Seeds a campaign may use: numpy's generators refuse negative seeds and the store keeps seeds as int64
#: (a larger seed would run its episode and then fail in the writer).
SEED_RANGE = (0, 2**63 - 1)
_SEED_FIX = f"seeds are distinct whole numbers from {SEED_RANGE[0]} to {SEED_RANGE[1]} (2**63 - 1), each listed once"
_AGENT_KEYS = ("name", "kind", "seeds")  # an agent entry's keys that are not options


class CampaignNotReadyError(HydroAgentError, RuntimeError):
    """A valid campaign that cannot start on this machine: an API key, a basin folder or a basin file it
    needs is missing or changed (:func:`check_requirements`). Not a configuration error: the file is fine."""


def _word(value: Any) -> Any:
    """A name: a non-empty word without '/', '\\' or spaces (it becomes part of episode ids and paths)."""
    if not isinstance(value, str) or not value or any(c in value for c in "/\\") or any(c.isspace() for c in value):
        raise invalid((), f"{brief(value)} must be a non-empty word without '/', '\\' or spaces")
    return value


def _unknown_kind(at: tuple[str | int, ...], kind: Any) -> ConfigError:
    return invalid(at, f"unknown kind {brief(kind)}; use one of {', '.join(AGENT_KINDS.names())}",
                   "spell a registered agent kind (agents/factory.py)")


@dataclass(frozen=True)
class AgentSpec(Settings):
    """One agent entry: ``seeds`` (None: the campaign's) are the seeds this agent plays; a greedy
    policy, the same episode whatever the seed, needs one.

    Its options are checked against its kind where it is used (the campaign's check, and
    :func:`hydroagent_hpc.agents.factory.make_agent`), not when it is built."""

    name: str = setting(help="the agent's name in episode ids (default: its kind)", convert=_word)
    kind: str = setting(help="the agent kind (agents/factory.py AGENT_KINDS)")
    options: Mapping[str, Any] = setting(factory=dict, help="the kind's options: the entry's other keys")
    seeds: tuple[int, ...] | None = setting(None, ge=SEED_RANGE[0], le=SEED_RANGE[1], nonempty=True, unique=True,
                                            fix=_SEED_FIX, help="the seeds this agent plays (null: the campaign's)")

    def check(self) -> None:
        if self.kind not in AGENT_KINDS:
            raise _unknown_kind(("kind",), self.kind)


def _agents(value: Any) -> Any:
    """The file's agent entries (``{name, kind, seeds, OPTION: ...}``) as :class:`AgentSpec` objects."""
    if not isinstance(value, (list, tuple)):
        return value  # the type check refuses it
    out = []
    for i, entry in enumerate(value):
        if isinstance(entry, AgentSpec):
            out.append(entry)
            continue
        if not isinstance(entry, Mapping):
            raise invalid((i,), f"expected a mapping {{name, kind, ...}}, got {brief(entry)}")
        if "kind" not in entry:
            raise invalid((i,), "kind: missing", f"add kind: one of {', '.join(AGENT_KINDS.names())}")
        kind = entry["kind"]
        if "name" not in entry and not (isinstance(kind, str) and kind in AGENT_KINDS):
            raise _unknown_kind((i, "kind"), kind)  # before the name it would stand for
        options = {k: v for k, v in entry.items() if k not in _AGENT_KEYS}
        try:
            out.append(AgentSpec(**{"name": kind, **{k: entry[k] for k in _AGENT_KEYS if k in entry}},
                                 options=options))
        except ConfigError as exc:
            raise invalid((i, *exc.at), exc.problem or exc.message, exc.fix) from None
    return tuple(out)


@dataclass(frozen=True)
class CampaignSpec(Settings):
    """A campaign: every agent plays every basin with each seed under one environment."""

    name: str = setting(help="the campaign's name, the first part of every episode id", convert=_word)
    basins: tuple[str, ...] = setting(help="basin folders (relative to the campaign file)", nonempty=True, path=True)
    agents: tuple[AgentSpec, ...] = setting(help="the agents: {name, kind, seeds, OPTION: ...} each", nonempty=True,
                                            convert=_agents)
    seeds: tuple[int, ...] = setting((0,), ge=SEED_RANGE[0], le=SEED_RANGE[1], nonempty=True, unique=True,
                                     fix=_SEED_FIX, help="the seeds every agent plays (unless it lists its own)")
    env: EnvConfig = setting(factory=EnvConfig, help="the environment: preset (paper or released) and EnvConfig "
                                                     "keys on top")
    description: str = setting("", help="free text")
    requires: tuple[str, ...] = setting((), help="what must be set before the campaign starts: env:VARIABLE "
                                                 "(an API key), checked with the basins' files")
    source: str = field(default="", init=False, compare=False)  # the file it was read from

    def check(self) -> None:
        for i, b in enumerate(self.basins):
            base = Path(b).name
            if not b.strip() or "\0" in b or (base and not base.strip()):
                raise invalid(("basins", i), f"{brief(b)} is not a folder name", "name the basin's folder")
        seen: set[str] = set()
        for i, agent in enumerate(self.agents):
            if agent.name in seen:
                raise invalid(("agents", i, "name"), f"agent name {agent.name!r} is repeated",
                              "give each agent entry its own name")
            seen.add(agent.name)
            problem = _options_problem(agent.kind, agent.options)
            if problem is not None:  # a missing option: the entry's line
                raise invalid(("agents", i, problem[0]), problem[1], problem[2])
        if self.env.preset not in PRESETS:
            raise invalid(("env", "preset"), f"unknown preset {brief(self.env.preset)}",
                          f"choose one of: {', '.join(PRESETS.names())}")
        for i, r in enumerate(self.requires):
            if not r:
                raise invalid(("requires", i), "must not be empty", "write text such as env:OPENAI_API_KEY")


@dataclass(frozen=True)
class Task:
    episode_id: str
    basin_dir: str
    agent: AgentSpec
    seed: int
    env: EnvConfig


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and validate a campaign file (strict YAML: see :mod:`hydroagent_hpc.yamlio`); nothing runs here.

    Every error is a :class:`~hydroagent_hpc.errors.ConfigError` that starts with ``FILE:LINE`` of the
    offending key.
    """
    p = Path(path)
    doc = load_strict(p, what="campaign file")
    return campaign_from_mapping(doc.data, base_dir=p.resolve().parent, source=str(p), where=doc.where)


def _options_problem(kind: str, options: Mapping[str, Any]) -> tuple[str, str, str] | None:
    """The first problem with an agent's options as ``(option, problem, fix)``, or None: the
    simulator ``backend`` named, then :func:`~hydroagent_hpc.agents.factory.agent_options_problem`."""
    backend = options.get("backend")
    if "backend" in options and (not isinstance(backend, str) or backend not in BACKENDS):
        return "backend", f"{brief(backend)} is not a simulator backend; use one of {', '.join(BACKENDS.names())}", ""
    return agent_options_problem(kind, options)


def check_agent_options(kind: str, options: Mapping[str, Any], where: str = "") -> tuple[str, str] | None:
    """The first problem with an agent's options, as ``(option, message)``, or None.

    ``option`` is the option given but not taken, or (when it is not in ``options``) the one needed;
    ``where`` (``"agents[0]."``) starts the message. The options a kind takes (and which of them it
    needs) come from :func:`hydroagent_hpc.agents.factory.allowed_options`; ``backend`` (the
    simulator) is shared by all kinds.
    """
    problem = _options_problem(kind, options)
    if problem is None:
        return None
    name, text, fix = problem
    if name in options:
        return name, f"{where}{name}: {text}"
    return name, f"{where.rstrip('.') or 'agent'}: {text}; {fix}"


def campaign_from_mapping(data: Any, base_dir: Path | None = None, source: str = "", *,
                          where: Where | None = None) -> CampaignSpec:
    """Validate a campaign (the parsed file) completely.

    ``where(path)`` -> ``"FILE:LINE"`` places errors; without it an error's message starts with the
    dotted key and ``exc.at`` holds its key path (for a caller that places it, as pipeline files do).
    Relative basins (and ``./``, ``../`` checkpoints of hf_local agents) join ``base_dir``.
    """
    w: Where = where or (lambda path: source)
    if isinstance(data, Mapping):
        data = dict(data)
        env = {} if data.get("env", {}) is None else data.get("env", {})
        name = env.get("preset", "paper") if isinstance(env, Mapping) else None
        if isinstance(name, str) and name in PRESETS:  # the preset's values under the keys not given
            data["env"] = from_mapping(EnvConfig, env, at=("env",), where=w, base=preset(name))
        if base_dir is not None and isinstance(data.get("agents"), list):
            data["agents"] = [_checkpoint_path(a, base_dir) for a in data["agents"]]
        basins = data.get("basins")
        if isinstance(basins, list) and any(isinstance(b, str) and "\0" in b for b in basins):
            base_dir = None  # TODO(settings): joining a path with a NUL byte raises ValueError; check() refuses it
    spec = from_mapping(CampaignSpec, data, where=w, base_dir=base_dir)
    object.__setattr__(spec, "source", source)
    return spec


def _checkpoint_path(entry: Any, base_dir: Path) -> Any:
    """An hf_local checkpoint written as ./x or ../x is relative to the campaign file, as basins are; other
    values (absolute folders, hub ids such as Qwen/Qwen3-4B-Instruct-2507) are used as given."""
    path = entry.get("path") if isinstance(entry, Mapping) and entry.get("kind") == "hf_local" else None
    if not isinstance(path, str) or not path.startswith(("./", "../")) or "\0" in path:
        return entry
    return {**entry, "path": str((base_dir / path).resolve())}


def expand(spec: CampaignSpec) -> list[Task]:
    """Every (basin, agent, seed) episode of the campaign, in a stable order."""
    tasks = []
    for b in spec.basins:
        bname = Path(b).name
        for a in spec.agents:
            for s in a.seeds or spec.seeds:
                tasks.append(Task(f"{spec.name}/{bname}/{a.name}/{s}", b, a, s, spec.env))
    return tasks


def shard_of(tasks: list[Task], shard: tuple[int, int] | None) -> list[Task]:
    """Shard ``i`` of ``n``: tasks ``i, i+n, i+2n, ...`` of the expansion (agents and basins mixed)."""
    if shard is None:
        return list(tasks)
    index, count = shard
    if count < 1 or not 0 <= index < count:
        raise UsageError(f"shard {index}/{count}: need 0 <= index < count", "give --shard INDEX/COUNT with "
                                                                           "0 <= INDEX < COUNT")
    return list(tasks[index::count])


def check_requirements(spec: CampaignSpec) -> list[str]:
    """What a campaign needs but this machine lacks (API keys, data folders, intact basin files), as messages."""
    problems = []
    for b in spec.basins:
        if not (Path(b) / "control.txt").exists():
            problems.append(f"basin folder {b} has no control.txt (prepare the gauge's data first)")
        else:  # a prepared basin must still be what its manifest recorded (checksums)
            problems += verify_manifest(b)
    for r in spec.requires:
        if r.startswith("env:") and not os.environ.get(r[4:]):
            problems.append(f"environment variable {r[4:]} is not set (an API key the campaign needs)")
    return problems


def ensure_ready(spec: CampaignSpec) -> None:
    """Raise :class:`CampaignNotReadyError` listing everything :func:`check_requirements` finds missing."""
    problems = check_requirements(spec)
    if problems:
        raise CampaignNotReadyError(f"campaign {spec.name!r} cannot start:\n  - " + "\n  - ".join(problems))
