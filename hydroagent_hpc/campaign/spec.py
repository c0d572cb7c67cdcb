"""Campaigns: agents x basins x seeds under one protocol, run into one HDF5 file, resumable.

A campaign file (YAML, strict: unknown keys fail with file:line) names::

    name: demo
    basins: [../results/demo/basins/syn_02338660, ...]   # basin folders, relative to this file
    agents:
      - {name: heuristic, kind: heuristic}
      - {name: dds, kind: dds}
      - {name: gpt-5, kind: openai, model: gpt-5}
    seeds: [0, 1]
    env: {preset: paper, protocol: turns, max_simulations: 200, max_turns: null, patience: null}

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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from hydroagent_hpc.agents.factory import AGENT_KINDS, check_agent_options
from hydroagent_hpc.config import EnvConfig, config_from_mapping, preset
from hydroagent_hpc.errors import HydroAgentError

log = logging.getLogger(__name__)

__all__ = ["AgentSpec", "CampaignSpec", "CampaignError", "Task", "load_campaign", "campaign_from_mapping", "expand",
           "shard_of", "check_requirements", "AGENT_KINDS"]


class CampaignError(HydroAgentError, ValueError):
    """A campaign file that cannot be run; the message names the file, line and key."""


@dataclass(frozen=True)
class AgentSpec:
    name: str
    kind: str
    options: Mapping[str, Any] = field(default_factory=dict)


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


def _line(node, key: str) -> int | None:
    from hydroagent_hpc.config import _line_of

    return _line_of(node, key)


def load_campaign(path: str | Path) -> CampaignSpec:
    """Read and validate a campaign file."""
    import yaml

    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise CampaignError(f"campaign file not found: {p}") from None
    try:
        node = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise CampaignError(f"{p}: not valid YAML: {exc}") from None
    try:
        return campaign_from_mapping(data, base_dir=p.resolve().parent, source=str(p))
    except (CampaignError, ValueError) as exc:
        msg = str(exc)
        key = msg.split(":")[0].split(".")[-1].split("[")[0].strip()
        line = _line(node, key) if key else None
        raise CampaignError(f"{p}{':' + str(line) if line else ''}: {msg}") from None


def campaign_from_mapping(data: Any, base_dir: Path | None = None, source: str = "") -> CampaignSpec:
    if not isinstance(data, Mapping):
        raise CampaignError("the campaign must be a mapping with name, basins, agents, seeds, env")
    known = {"name", "basins", "agents", "seeds", "env", "description", "requires"}
    unknown = sorted(set(data) - known)
    if unknown:
        raise CampaignError(f"{unknown[0]}: unknown key; valid keys: {', '.join(sorted(known))}")
    for key in ("name", "basins", "agents"):
        if key not in data:
            raise CampaignError(f"{key}: missing; a campaign needs name, basins and agents")
    name = data["name"]
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ "):
        raise CampaignError(f"name: {name!r} must be a non-empty word without '/', '\\' or spaces")
    basins = data["basins"]
    if not isinstance(basins, list) or not basins or not all(isinstance(b, str) for b in basins):
        raise CampaignError("basins: a non-empty list of basin folders")
    resolved = []
    for b in basins:
        bp = Path(b)
        if not bp.is_absolute() and base_dir is not None:
            bp = (base_dir / bp).resolve()
        resolved.append(str(bp))
    agents = []
    raw_agents = data["agents"]
    if not isinstance(raw_agents, list) or not raw_agents:
        raise CampaignError("agents: a non-empty list of {name, kind, ...}")
    seen = set()
    for i, a in enumerate(raw_agents):
        if not isinstance(a, Mapping) or "kind" not in a:
            raise CampaignError(f"agents[{i}]: each agent needs at least kind (one of {', '.join(AGENT_KINDS.names())})")
        kind = a["kind"]
        if kind not in AGENT_KINDS:
            raise CampaignError(f"kind: agents[{i}] has unknown kind {kind!r}; use one of {', '.join(AGENT_KINDS.names())}")
        aname = str(a.get("name", kind))
        if aname in seen or "/" in aname:
            raise CampaignError(f"name: agent name {aname!r} is repeated or contains '/'")
        seen.add(aname)
        options = {k: v for k, v in a.items() if k not in ("name", "kind")}
        check_agent_options(kind, options)  # unknown or missing options fail here, with the file's line
        agents.append(AgentSpec(aname, kind, options))
    seeds = data.get("seeds", [0])
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise CampaignError(f"seeds: a non-empty list of whole numbers, got {seeds!r}")
    env_data = dict(data.get("env") or {})
    base = preset(env_data.pop("preset", "paper"))
    env = config_from_mapping(EnvConfig, env_data, "env", base=base)
    requires = tuple(str(r) for r in data.get("requires", []) or [])
    return CampaignSpec(name, tuple(resolved), tuple(agents), tuple(seeds), env, source, requires)


def expand(spec: CampaignSpec) -> list[Task]:
    """Every (basin, agent, seed) episode of the campaign, in a stable order."""
    tasks = []
    for b in spec.basins:
        bname = Path(b).name
        for a in spec.agents:
            for s in spec.seeds:
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


