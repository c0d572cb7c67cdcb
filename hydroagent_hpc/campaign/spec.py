"""Campaigns: agents x basins x seeds under one protocol, run into one HDF5 file, resumable.

A campaign file (YAML, strict: unknown keys fail with file:line) names::

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
episode whatever the seed, so one seed is enough).

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

from hydroagent_hpc.agents.factory import AGENT_KINDS
from hydroagent_hpc.config import PRESETS, EnvConfig, preset
from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.settings import from_mapping
from hydroagent_hpc.yamlio import brief, load_strict, path_of

log = logging.getLogger(__name__)

__all__ = ["AgentSpec", "CampaignSpec", "CampaignError", "Task", "load_campaign", "campaign_from_mapping", "expand",
           "shard_of", "check_requirements", "AGENT_KINDS", "SEED_RANGE", "check_agent_options"]

#: Seeds a campaign may use: numpy's generators refuse negative seeds and the store keeps seeds as int64
#: (a larger seed would run its episode and then fail in the writer).
SEED_RANGE = (0, 2**63 - 1)


class CampaignError(HydroAgentError, ValueError):
    """A campaign file that cannot be run; the message names the file, line and key."""


@dataclass(frozen=True)
class AgentSpec:
    """One agent entry: ``seeds`` (empty: the campaign's) are the seeds this agent plays; a greedy
    policy, the same episode whatever the seed, needs one."""

    name: str
    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()


@dataclass(frozen=True)
class CampaignSpec:
    name: str
    basins: tuple[str, ...]
    agents: tuple[AgentSpec, ...]
    seeds: tuple[int, ...]
    env: EnvConfig
    source: str = ""
    requires: tuple[str, ...] = ()  # environment variables or paths the campaign needs (checked before start)


@dataclass(frozen=True)
class Task:
    episode_id: str
    basin_dir: str
    agent: AgentSpec
    seed: int
    env: EnvConfig


def _at(path: tuple, message: str, fix: str = "") -> CampaignError:
    """A CampaignError that knows the key path it is about (``load_campaign`` turns it into file:line)."""
    exc = CampaignError(message, fix)
    exc.at = path  # type: ignore[attr-defined]
    return exc


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and validate a campaign file (strict YAML: see :mod:`hydroagent_hpc.yamlio`); nothing runs here.

    Every error is a :class:`CampaignError` that starts with ``FILE:LINE`` of the offending key.
    """
    p = Path(path)
    doc = load_strict(p, error=CampaignError, what="campaign file")
    try:
        return campaign_from_mapping(doc.data, base_dir=p.resolve().parent, source=str(p))
    except HydroAgentError as exc:
        at = getattr(exc, "at", None) or path_of(exc.message)
        raise CampaignError(f"{doc.where(at)}: {exc.message}", exc.fix) from None
    except ValueError as exc:
        raise CampaignError(f"{doc.where(path_of(str(exc)))}: {exc}") from None


def _word(value: Any, path: tuple, what: str) -> str:
    if not isinstance(value, str) or not value or any(c in value for c in "/\\") or any(c.isspace() for c in value):
        raise _at(path, f"{what}: {brief(value)} must be a non-empty word without '/', '\\' or spaces")
    return value


def check_agent_options(kind: str, options: Mapping[str, Any], where: str = "") -> tuple[str, str] | None:
    """The first problem with an agent's options, as ``(option, message)``, or None.

    ``option`` is the option given but not taken, or (when it is not in ``options``) the one needed.

    The options a kind takes (and which of them it needs) come from
    :func:`hydroagent_hpc.agents.factory.allowed_options`; ``backend`` (the simulator) is shared by all kinds.
    """
    from hydroagent_hpc.agents.factory import allowed_options
    from hydroagent_hpc.sim import BACKENDS

    allowed = allowed_options(kind)
    for name in options:
        if name == "backend":
            if not isinstance(options[name], str) or options[name] not in BACKENDS:
                return name, (f"{where}backend: {brief(options[name])} is not a simulator backend; use one of "
                              f"{', '.join(BACKENDS.names())}")
        elif name not in allowed:
            return name, (f"{where}{name}: agent kind {kind!r} takes no option {name!r}; its options: "
                          f"{', '.join(sorted(allowed)) or 'none'} (and backend)")
    for name, required in allowed.items():
        if required and name not in options:
            return name, (f"{where.rstrip('.') or 'agent'}: agent kind {kind!r} needs option {name!r}; add "
                          f"'{name}: ...' to the agent's entry")
    return None


def campaign_from_mapping(data: Any, base_dir: Path | None = None, source: str = "") -> CampaignSpec:
    """Validate a campaign (the parsed file) completely; errors name the key path (``_at``)."""
    if not isinstance(data, Mapping):
        raise _at((), f"the campaign must be a mapping with name, basins, agents, seeds, env; got "
                      f"{type(data).__name__ if data is not None else 'an empty file'}")
    known = {"name", "basins", "agents", "seeds", "env", "description", "requires"}
    unknown = sorted((k for k in data if k not in known), key=str)
    if unknown:
        raise _at((unknown[0],), f"{unknown[0]}: unknown key; valid keys: {', '.join(sorted(known))}")
    for key in ("name", "basins", "agents"):
        if key not in data:
            raise _at((), f"{key}: missing; a campaign needs name, basins and agents")
    name = _word(data["name"], ("name",), "name")
    if data.get("description") is not None and not isinstance(data["description"], str):
        raise _at(("description",), f"description: expected text, got {brief(data['description'])}")
    basins = data["basins"]
    if not isinstance(basins, list) or not basins:
        raise _at(("basins",), f"basins: a non-empty list of basin folders, got {brief(basins)}")
    resolved = []
    for i, b in enumerate(basins):
        if not isinstance(b, str) or not b.strip() or "\0" in b:
            raise _at(("basins", i), f"basins[{i}]: {brief(b)} is not a folder name")
        bp = Path(b)
        if not bp.is_absolute() and base_dir is not None:
            bp = (base_dir / bp).resolve()
        resolved.append(str(bp))
    agents = []
    raw_agents = data["agents"]
    if not isinstance(raw_agents, list) or not raw_agents:
        raise _at(("agents",), f"agents: a non-empty list of {{name, kind, ...}}, got {brief(raw_agents)}")
    seen: set[str] = set()
    for i, a in enumerate(raw_agents):
        if not isinstance(a, Mapping) or "kind" not in a:
            raise _at(("agents", i),
                      f"agents[{i}]: each agent needs at least kind (one of {', '.join(AGENT_KINDS.names())})")
        kind = a["kind"]
        if not isinstance(kind, str) or kind not in AGENT_KINDS:
            raise _at(("agents", i, "kind"),
                      f"kind: agents[{i}] has unknown kind {brief(kind)}; use one of {', '.join(AGENT_KINDS.names())}")
        aname = _word(a["name"], ("agents", i, "name"), f"agents[{i}].name") if "name" in a else kind
        if aname in seen:
            raise _at(("agents", i, "name"), f"name: agent name {aname!r} is repeated",
                      "give each agent entry its own name")
        seen.add(aname)
        options = {k: v for k, v in a.items() if k not in ("name", "kind", "seeds")}
        agent_seeds = _seeds(a["seeds"], ("agents", i, "seeds"), f"agents[{i}].seeds") if "seeds" in a else ()
        # A checkpoint written as ./x or ../x is relative to the campaign file, as basins are; other
        # values (absolute folders, hub ids such as Qwen/Qwen3-4B-Instruct-2507) are used as given.
        path_opt = options.get("path")
        if (kind == "hf_local" and isinstance(path_opt, str) and base_dir is not None
                and path_opt.startswith(("./", "../"))):
            options["path"] = str((base_dir / path_opt).resolve())
        problem = check_agent_options(kind, options, f"agents[{i}].")
        if problem:
            fix = (f"remove {problem[0]!r} or spell it as one of the options listed" if problem[0] in options
                   else "")
            raise _at(("agents", i, problem[0]), problem[1], fix)  # a missing option: the entry's line
        agents.append(AgentSpec(aname, kind, options, agent_seeds))
    seeds = _seeds(data.get("seeds", [0]), ("seeds",), "seeds")
    env_data = data.get("env")
    if env_data is None:
        env_data = {}
    if not isinstance(env_data, Mapping):
        raise _at(("env",), f"env: expected a mapping of environment settings, got {brief(env_data)}")
    env_data = dict(env_data)
    preset_name = env_data.pop("preset", "paper")
    if not isinstance(preset_name, str) or preset_name not in PRESETS:
        raise _at(("env", "preset"), f"env.preset: unknown preset {brief(preset_name)}; choose one of: "
                                     f"{', '.join(PRESETS.names())}")
    env = from_mapping(EnvConfig, env_data, at=("env",), base=preset(preset_name))
    requires = data.get("requires") or []
    if not isinstance(requires, list):
        raise _at(("requires",), f"requires: a list such as [env:OPENAI_API_KEY], got {brief(requires)}")
    for i, r in enumerate(requires):
        if not isinstance(r, str) or not r:
            raise _at(("requires", i), f"requires[{i}]: {brief(r)} is not text such as env:OPENAI_API_KEY")
    return CampaignSpec(name, tuple(resolved), tuple(agents), seeds, env, source, tuple(requires))


def _seeds(seeds: Any, path: tuple[Any, ...], label: str) -> tuple[int, ...]:
    """A non-empty list of distinct seeds in :data:`SEED_RANGE` (errors name ``label`` and its line)."""
    if not isinstance(seeds, list) or not seeds:
        raise _at(path, f"{label}: a non-empty list of whole numbers, got {brief(seeds)}")
    lo, hi = SEED_RANGE
    taken: set[int] = set()
    for i, s in enumerate(seeds):
        if isinstance(s, bool) or not isinstance(s, int) or not lo <= s <= hi:
            raise _at((*path, i), f"{label}[{i}]: {brief(s)} is not a seed; seeds are whole numbers from {lo} to "
                                  f"{hi} (2**63 - 1)")
        if s in taken:
            raise _at((*path, i), f"{label}[{i}]: seed {s} is repeated", "list each seed once")
        taken.add(s)
    return tuple(seeds)


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
        raise CampaignError(f"shard {index}/{count}: need 0 <= index < count", )
    return list(tasks[index::count])


def check_requirements(spec: CampaignSpec) -> list[str]:
    """What a campaign needs but this machine lacks (API keys, data folders, intact basin files), as messages."""
    from hydroagent_hpc.sim.manifest import verify_manifest

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


