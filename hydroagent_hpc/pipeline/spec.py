"""The pipeline file: one strict YAML -> a frozen :class:`PipelineSpec` (nothing runs here).

Every section is checked when the file is read, with the checker of the tool that will use it
(campaign files, the SFT and GRPO configs, the environment presets), so a typo in the GRPO section
fails at ``pipeline run`` / ``pipeline submit`` time with ``FILE:LINE``, not an hour later in the
queue. Layout (``data/pipelines/demo.yaml`` is a complete example)::

    name: demo
    model: tiny                  # the base policy: tiny (built from model_seed) or a local folder
    model_seed: 0
    basins:
      train:                     # teacher campaign and GRPO prompts
        - {name: syn_a, area_km2: 80, seed: 7, window_days: 10, warmup_days: 3, start: "2021-07-01"}
        - {gauge: "11383500", window_days: 60, warmup_days: 30}   # synthetic twin of a paper gauge
        - {folder: ../data/gauges/11383500}                        # a prepared basin folder, verified
      heldout: [...]             # evaluation (never trained on)
    teacher:    {agents: [...], seeds: [...], env: {...}, array: 4}
    sft_data:   {preset: released, augment: none, render: none, max_tokens: 32768, recovery: 0.0, recovery_seed: 0}
    sft:        {lr: 3.0e-3, max_steps: 150, ...}        # the SFT config's keys but data and model
    grpo:       {init: sft, group_size: 4, ...}          # the GRPO config's keys but basins and model
    evaluation: {references: [...], policies: [base, sft, grpo], policy: {greedy: true}, seeds: [0],
                 env: {...}, array: 4}
    report:     {compare: [base, grpo]}

Relative paths are resolved against the file's folder. Errors are :class:`ConfigError` naming
``FILE:LINE``, the key and the fix.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign.spec import SEED_RANGE, campaign_from_mapping, check_agent_options
from hydroagent_hpc.datasets.gauges import paper_gauge
from hydroagent_hpc.errors import ConfigError, HydroAgentError
from hydroagent_hpc.settings import Settings, from_mapping, setting
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping
from hydroagent_hpc.train.sft.config import config_from_mapping as sft_from_mapping
from hydroagent_hpc.yamlio import YamlDocument, brief, load_strict, path_of

__all__ = ["PipelineSpec", "SFTDataSection", "BasinEntry", "CampaignSection", "load_pipeline", "pipeline_from_mapping",
           "POLICIES", "STAGES"]

#: The stages in the order they run; each depends only on stages before it.
STAGES = ("basins", "base", "teacher", "sft-data", "sft", "grpo", "evaluation", "report")
#: The trained policies the evaluation campaign can put beside its references.
POLICIES = ("base", "sft", "grpo")

_TOP = ("name", "description", "model", "model_seed", "basins", "teacher", "sft_data", "sft", "grpo", "evaluation",
        "report")
_SYNTH_KEYS = ("name", "area_km2", "seed", "window_days", "warmup_days", "start", "lat", "lon", "terrain", "climate",
               "cellsize_deg")
_GAUGE_KEYS = ("gauge", "window_days", "warmup_days", "cellsize_deg")
_PLACEHOLDER = "/nonexistent/pipeline-placeholder"

#: A key path in the file (``("grpo", "lr")``, ``("basins", "train", 0)``) and its FILE:LINE finder.
Path_ = tuple[str | int | None, ...]
Where = Callable[[Path_], str]


@dataclass(frozen=True)
class SFTDataSection(Settings):
    """The ``sft_data`` section: how the teacher's episodes become SFT data (``hydroagent train sft-data``)."""

    preset: str = setting("paper", choices=("paper", "released"), source="paper, released",
                          help="which episodes and weights: paper (final NSE > 0.6, percentile weights) or released")
    augment: str = setting("none", choices=("none", "stopping_points"), help="extra examples cut at stopping points")
    render: str = setting("none", choices=("none", "calls"), help="re-render the tool calls (calls) or keep them")
    max_tokens: int = setting(16384, ge=1, help="context budget per sequence")
    recovery: float = setting(0.0, ge=0, le=1, fix="give a number from 0 to 1 (0 turns error-recovery turns off)",
                              help="share of examples that get an error-recovery turn")
    recovery_seed: int = setting(0, ge=SEED_RANGE[0], le=SEED_RANGE[1], help="seed of the error-recovery turns")


@dataclass(frozen=True)
class BasinEntry:
    """One basin: ``kind`` synth (built from ``settings``), gauge (a synthetic twin of a paper gauge,
    settings resolved from data/paper_gauges.csv) or folder (``settings["folder"]``, verified)."""

    name: str
    group: str  # "train" or "heldout"
    kind: str
    settings: Mapping[str, Any]


@dataclass(frozen=True)
class CampaignSection:
    agents: tuple[Mapping[str, Any], ...]
    seeds: tuple[int, ...]
    env: Mapping[str, Any]
    array: int = 1


@dataclass(frozen=True)
class PipelineSpec:
    name: str
    source: str
    model: str  # "tiny" or an absolute folder
    model_seed: int
    basins: tuple[BasinEntry, ...]
    teacher: CampaignSection
    sft_data: Mapping[str, Any]
    sft: Mapping[str, Any]
    grpo: Mapping[str, Any]  # GRPO config keys plus "init" (sft | base)
    evaluation: CampaignSection  # agents = the references
    policies: tuple[str, ...]
    policy_options: Mapping[str, Any]
    report: Mapping[str, Any] = field(default_factory=dict)
    description: str = ""

    def group(self, group: str) -> tuple[BasinEntry, ...]:
        return tuple(b for b in self.basins if b.group == group)

    def section(self, stage: str) -> dict[str, Any]:
        """The part of the file that decides ``stage`` (JSON-ready; it goes into the stage's input checksum)."""
        sections: dict[str, Any] = {
            "basins": {"basins": [{"name": b.name, "group": b.group, "kind": b.kind, **dict(b.settings)}
                                  for b in self.basins]},
            "base": {"model": self.model, "model_seed": self.model_seed},
            "teacher": _campaign_dict(self.teacher),
            "sft-data": dict(self.sft_data),
            "sft": dict(self.sft),
            "grpo": dict(self.grpo),
            "evaluation": {**_campaign_dict(self.evaluation), "policies": list(self.policies),
                           "policy": dict(self.policy_options)},
            "report": dict(self.report),
        }
        out: dict[str, Any] = json.loads(json.dumps(sections[stage], sort_keys=True, default=str))
        return out


def _campaign_dict(c: CampaignSection) -> dict[str, Any]:
    return {"agents": [dict(a) for a in c.agents], "seeds": list(c.seeds), "env": dict(c.env), "array": c.array}


def _fail(where: Where, path: Path_, message: str, fix: str = "") -> ConfigError:
    return ConfigError(f"{where(path)}: {'.'.join(str(p) for p in path if isinstance(p, str))}: {message}", fix)


def _mapping(where: Where, data: Any, path: Path_, allowed: tuple[str, ...] | None,
             required: tuple[str, ...] = ()) -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise _fail(where, path, f"expected a mapping, got {brief(data)}")
    if allowed is not None:
        for key in data:
            if key not in allowed:
                raise _fail(where, (*path, key), "unknown key", f"use one of {', '.join(allowed)}")
    for key in required:
        if key not in data:
            raise _fail(where, path, f"{key}: missing", f"add '{key}:' to this section")
    return dict(data)


def _int(where: Where, value: Any, path: Path_, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _fail(where, path, f"expected a whole number >= {least}, got {brief(value)}")
    return value


def _basins(where: Where, data: Any, base_dir: Path) -> tuple[BasinEntry, ...]:
    from hydroagent_hpc.sim.synth.basins import DEMO_BASINS, SynthSettings

    groups = _mapping(where, data, ("basins",), ("train", "heldout"), ("train", "heldout"))
    out: list[BasinEntry] = []
    for group in ("train", "heldout"):
        items = groups[group]
        if not isinstance(items, list) or not items:
            raise _fail(where, ("basins", group), f"expected a non-empty list of basins, got {brief(items)}")
        for i, item in enumerate(items):
            at = ("basins", group, i)
            entry = _mapping(where, item, at, None)
            if "folder" in entry:
                _mapping(where, entry, at, ("folder",))
                folder = Path(str(entry["folder"]))
                folder = folder if folder.is_absolute() else (base_dir / folder).resolve()
                out.append(BasinEntry(folder.name, group, "folder", {"folder": str(folder)}))
            elif "gauge" in entry:
                _mapping(where, entry, at, _GAUGE_KEYS)
                gid = entry["gauge"]
                if not isinstance(gid, str):
                    raise _fail(where, (*at, "gauge"), f"{brief(gid)} is not a quoted 8-digit gauge id",
                                'quote the id: gauge: "02338660" (YAML reads 02338660 unquoted as a number)')
                try:
                    g = paper_gauge(gid)
                except HydroAgentError as exc:
                    raise _fail(where, (*at, "gauge"), exc.message, exc.fix) from None
                # the window is the paper's (60 days; 62 for 02338660); a held-out gauge's twin is the
                # `make demo` basin (DEMO_BASINS: its terrain, climate and cell size)
                demo = next((d for d in DEMO_BASINS if d.gauge_id == g.gauge_id), None)
                settings = {"area_km2": g.area_km2, "seed": int(g.gauge_id),
                            "window_days": entry.get("window_days", g.days),
                            "warmup_days": entry.get("warmup_days", 30), "start": f"{g.window_start:%Y-%m-%d}",
                            "lat": g.lat, "lon": g.lon, "terrain": demo.terrain if demo else "hills",
                            "climate": demo.climate if demo else "humid",
                            "cellsize_deg": entry.get("cellsize_deg", demo.cellsize_deg if demo else None),
                            "paper_gauge_id": g.gauge_id}
                _check_synth(where, at, f"syn_{g.gauge_id}", settings, SynthSettings)
                out.append(BasinEntry(f"syn_{g.gauge_id}", group, "gauge", settings))
            else:
                _mapping(where, entry, at, _SYNTH_KEYS, ("name", "area_km2"))
                settings = {k: v for k, v in entry.items() if k != "name"}
                settings.setdefault("seed", 0)
                _check_synth(where, at, entry["name"], settings, SynthSettings)
                out.append(BasinEntry(str(entry["name"]), group, "synth", settings))
    names = [b.name for b in out]
    for i, name in enumerate(names):
        if name in names[:i]:
            b = out[i]
            raise _fail(where, ("basins", b.group), f"basin {name!r} is listed twice",
                        "give each basin its own name; a held-out basin must not be a training basin")
    return tuple(out)


def _check_synth(where: Where, at: Path_, name: Any, settings: dict[str, Any], cls: Any) -> None:
    s = dict(settings)
    try:
        cls.from_arguments(name, s.get("area_km2"), s.get("window_days", 60), s.get("warmup_days", 30),
                           s.get("seed", 0), s.get("cellsize_deg"), s.get("start", "2021-06-01"), s.get("lat", 35.0),
                           s.get("lon", -97.0), s.get("terrain", "hills"), s.get("climate", "humid"),
                           s.get("paper_gauge_id"), "")
    except ValueError as exc:
        key = str(exc).split("=", 1)[0] if "=" in str(exc).split(" ", 1)[0] else None
        raise _fail(where, (*at, key) if key in settings else at, str(exc)) from None


def _campaign(where: Where, data: Any, key: str, agents_key: str,
              extra: tuple[str, ...] = ()) -> tuple[CampaignSection, dict[str, Any]]:

    section = _mapping(where, data, (key,), (agents_key, "seeds", "env", "array", *extra), (agents_key,))
    array = _int(where, section.get("array", 1), (key, "array"), 1)
    mapping = {"name": key, "basins": [_PLACEHOLDER], "agents": copy.deepcopy(section[agents_key]),
               "seeds": section.get("seeds", [0]), "env": copy.deepcopy(section.get("env") or {})}
    try:
        spec = campaign_from_mapping(mapping)
    except HydroAgentError as exc:
        at = getattr(exc, "at", None) or path_of(exc.message)
        at = (agents_key, *at[1:]) if at and at[0] == "agents" else at
        raise ConfigError(f"{where((key, *at))}: {key}.{exc.message}", exc.fix) from None
    names = [a.name for a in spec.agents]
    if set(names) & set(POLICIES):
        raise _fail(where, (key, agents_key), f"agent names {sorted(set(names) & set(POLICIES))} are kept for the "
                                              "trained policies", "name the references otherwise (heuristic, dds)")
    return CampaignSection(tuple(dict(a) for a in section[agents_key]), tuple(spec.seeds),
                           dict(section.get("env") or {}), array), section


def pipeline_from_mapping(data: Any, *, base_dir: Path, source: str = "<pipeline>",
                          where: Where | None = None) -> PipelineSpec:
    """A :class:`PipelineSpec` from a parsed mapping; ``where(path)`` -> ``"file:line"``."""

    w: Where = where or (lambda path: source)
    top = _mapping(w, data, (), _TOP, ("name", "basins", "teacher", "sft", "grpo", "evaluation"))
    name = top["name"]
    if not isinstance(name, str) or not name or any(c in name for c in "/\\ "):
        raise _fail(w, ("name",), f"{brief(name)} must be a word without '/', '\\' or spaces")
    model = top.get("model", "tiny")
    if not isinstance(model, str) or not model:
        raise _fail(w, ("model",), f"expected tiny or a model folder, got {brief(model)}")
    if model != "tiny":
        folder = Path(model) if Path(model).is_absolute() else (base_dir / model).resolve()
        model = str(folder)
    model_seed = _int(w, top.get("model_seed", 0), ("model_seed",), 0)
    basins = _basins(w, top["basins"], base_dir)
    teacher, _ = _campaign(w, top["teacher"], "teacher", "agents")

    raw = top.get("sft_data") or {}
    section = from_mapping(SFTDataSection, raw, at=("sft_data",), where=lambda path: w(path))
    # keys not given stay out of the stage checksum, as before (a default added later changes nothing)
    sft_data = {"preset": "paper", "augment": None, "render": "none", "max_tokens": 16384,
                **{k: getattr(section, k) for k in raw}}

    sft = _mapping(w, top["sft"], ("sft",), None)
    for key in ("data", "model"):
        if key in sft:
            raise _fail(w, ("sft", key), "is set by the pipeline (the sft-data output and the base model)",
                        "remove it; choose the base model with the top-level 'model:'")
    try:
        sft_from_mapping({**sft, "data": _PLACEHOLDER}, at=("sft",), where=w)
    except ConfigError as exc:
        raise ConfigError(exc.message, exc.fix) from None

    grpo = _mapping(w, top["grpo"], ("grpo",), None)
    init = grpo.pop("init", "sft")
    if init not in ("sft", "base"):
        raise _fail(w, ("grpo", "init"), f"{brief(init)} is not sft or base",
                    "sft: start GRPO from the SFT checkpoint (paper); base: from the base model (released code)")
    for key in ("basins", "validation_basins", "model"):
        if key in grpo:
            raise _fail(w, ("grpo", key), "is set by the pipeline (the training basins, the held-out basins when "
                                          "validate_every > 0, and the init policy)", "remove it")
    try:
        held = grpo.get("validate_every")  # the pipeline gives the held-out basins when validate_every > 0
        held_out = [_PLACEHOLDER + "-heldout"] if isinstance(held, int) and not isinstance(held, bool) and held else []
        grpo_config_from_mapping({**grpo, "basins": [_PLACEHOLDER], "validation_basins": held_out}, at=("grpo",),
                                 where=w)
    except ConfigError as exc:
        raise ConfigError(exc.message, exc.fix) from None
    grpo = {"init": init, **grpo}

    evaluation, raw_eval = _campaign(w, top["evaluation"], "evaluation", "references", ("policies", "policy"))
    policies = raw_eval.get("policies", list(POLICIES))
    if (not isinstance(policies, list) or any(p not in POLICIES for p in policies)
            or len(set(policies)) != len(policies)):
        raise _fail(w, ("evaluation", "policies"), f"{brief(policies)}: a list of distinct names from "
                                                    f"{', '.join(POLICIES)}")
    policy = _mapping(w, raw_eval.get("policy") or {}, ("evaluation", "policy"), None)

    problem = check_agent_options("hf_local", {"path": _PLACEHOLDER, **policy}, "evaluation.policy.")
    if problem:
        raise _fail(w, ("evaluation", "policy", problem[0]), problem[1])

    report = _mapping(w, top.get("report") or {}, ("report",), ("compare",))
    if "compare" in report:
        cmp_ = report["compare"]
        agents = [*POLICIES, *(a.get("name", a.get("kind")) for a in evaluation.agents)]
        if not isinstance(cmp_, list) or len(cmp_) != 2 or any(c not in agents for c in cmp_) or cmp_[0] == cmp_[1]:
            raise _fail(w, ("report", "compare"), f"{brief(cmp_)}: two different agents of the evaluation "
                                                   f"({', '.join(agents)})")
    description = top.get("description", "")
    if not isinstance(description, str):
        raise _fail(w, ("description",), f"expected text, got {brief(description)}")
    return PipelineSpec(name=name, source=source, model=model, model_seed=model_seed, basins=basins, teacher=teacher,
                        sft_data=sft_data, sft=sft, grpo=grpo, evaluation=evaluation, policies=tuple(policies),
                        policy_options=policy, report=report, description=description)


def load_pipeline(path: str | Path) -> PipelineSpec:
    """Read a pipeline file strictly; every problem is a :class:`ConfigError` naming FILE:LINE and the fix."""
    p = Path(path)
    doc: YamlDocument = load_strict(p, error=ConfigError, what="pipeline file")
    return pipeline_from_mapping(doc.data, base_dir=p.resolve().parent, source=str(p),
                                 where=lambda at: doc.where([p for p in at if p is not None]))
