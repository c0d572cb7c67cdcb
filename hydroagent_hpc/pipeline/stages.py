"""The stages of the recipe: what each one reads, writes into ``RUN/<stage>/``, and how it does the work.

Every stage is three steps, the same on a laptop (:mod:`~hydroagent_hpc.pipeline.runner`) and in a
Slurm job (:mod:`~hydroagent_hpc.pipeline.submit`):

1. :func:`begin` computes the stage's input checksum (its section of the pipeline file and the
   checksums of the upstream outputs it reads) and compares it with ``RUN/<stage>/stage.json``:
   *skip* (done with these inputs and its outputs unchanged), *resume* (started with these inputs,
   not finished: the work continues from what is on disk) or *fresh* (never started, or its inputs
   changed: the stage's folder is cleared). It writes the tool configs (campaign file, SFT or
   GRPO config) and the record ``running``.
2. the work: :func:`work` (or, on Slurm, the campaign's shard jobs and the trainers' requeueable jobs).
   The tools resume by themselves: a campaign skips the episodes its stores hold, a trainer continues
   from its newest checkpoint, a synthetic basin already built with the same settings is kept.
3. :func:`finish` checksums the outputs and writes the record ``done``.

Folders: ``basins/<name>/``, ``base/model/`` (tiny), ``teacher/`` and ``evaluation/`` (campaign run
folders: ``campaign.yaml``, ``shards/``, ``campaign.h5``), ``sft-data/sft.h5``, ``sft/`` and ``grpo/``
(``sft.yaml`` / ``grpo.yaml`` and the trainer's ``run/`` with ``metrics.csv``, ``checkpoints/``,
``final/``), ``report/``.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hydroagent_hpc.agents.llm.models_file import default_models_file
from hydroagent_hpc.campaign import load_campaign
from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.pipeline.spec import STAGES, PipelineSpec
from hydroagent_hpc.pipeline.state import (
    PipelineStateError,
    input_digest,
    output_record,
    read_record,
    utc_now,
    verify_output,
    write_json_atomic,
    write_record,
)
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.sim.manifest import verify_manifest
from hydroagent_hpc.train.submit import grpo_argv, launcher_argv

log = logging.getLogger(__name__)

__all__ = ["StageError", "Plan", "UPSTREAM", "CAMPAIGN_STAGES", "TRAINER_STAGES", "begin", "work", "finish",
           "decide", "reads", "stage_dir", "campaign_file", "trainer_config", "trainer_argv", "upstream_outputs"]

#: What each stage reads: upstream stage -> the outputs of it (None = all of them).
UPSTREAM: dict[str, dict[str, tuple[str, ...] | None]] = {
    "basins": {},
    "base": {},
    "teacher": {"basins": ("@train",)},
    "sft-data": {"teacher": ("campaign",), "base": ("model",)},
    "sft": {"sft-data": ("data",), "base": ("model",)},
    "grpo": {"basins": ("@train", "@heldout"), "sft": ("final",), "base": ("model",)},
    "evaluation": {"basins": ("@heldout",), "base": ("model",), "sft": ("final",), "grpo": ("final",)},
    "report": {"evaluation": ("campaign",), "sft": ("metrics",), "grpo": ("metrics",)},
}
CAMPAIGN_STAGES = ("teacher", "evaluation")
TRAINER_STAGES = ("sft", "grpo")


class StageError(HydroAgentError):
    """A stage that cannot start or did not finish (names the stage, the cause and the fix)."""

    exit_code = 1


@dataclass(frozen=True)
class Plan:
    """What :func:`decide` found for one stage: ``action`` is skip, resume or fresh; ``why`` says why."""

    stage: str
    action: str
    why: str
    inputs: str
    parts: Mapping[str, Any]
    #: the records (size, time, checksum per file) of the files the stage reads besides upstream outputs and
    #: its section (agents' model folders, scripts, the models file), kept so that unchanged ones are not re-read
    input_files: Mapping[str, Any] = field(default_factory=dict)


def stage_dir(run_dir: Path, stage: str) -> Path:
    return run_dir / stage


def campaign_file(run_dir: Path, stage: str) -> Path:
    return stage_dir(run_dir, stage) / "campaign.yaml"


def trainer_config(run_dir: Path, stage: str) -> Path:
    return stage_dir(run_dir, stage) / f"{stage}.yaml"


def _done(run_dir: Path, stage: str) -> dict[str, Any]:
    rec = read_record(run_dir, stage)
    if rec is None or rec.get("status") != "done":
        raise StageError(f"stage {stage} has not finished in {run_dir}",
                         f"run the earlier stages first: `hydroagent pipeline run PIPELINE.yaml --run-dir {run_dir}`")
    return rec


def reads(spec: PipelineSpec, stage: str) -> dict[str, tuple[str, ...] | None]:
    """The upstream outputs ``stage`` reads under this spec (GRPO validates on held-out basins only when
    asked; it starts from the SFT or the base model; the evaluation reads only the policies it plays)."""
    want = dict(UPSTREAM[stage])
    if stage == "grpo":
        held = ("@heldout",) if int(spec.grpo.get("validate_every", 0)) > 0 else ()
        want["basins"] = ("@train", *held)
        if spec.grpo["init"] == "sft":
            del want["base"]
        else:
            del want["sft"]
    if stage == "evaluation":
        for policy in ("base", "sft", "grpo"):
            if policy not in spec.policies:
                del want[policy]
    return want


def upstream_outputs(spec: PipelineSpec, run_dir: Path, stage: str) -> dict[str, dict[str, Any]]:
    """``{upstream stage: {output name: output record}}`` of what ``stage`` reads; each upstream must be done.

    A basin's output is its ``manifest.json``, which holds the size and SHA-256 of every file of the
    basin; the folder is checked against it here, so a grid edited after the basins stage (the
    manifest left as it was) stops the stage instead of passing for the basin it was."""
    groups = {b.name: b.group for b in spec.basins}
    out: dict[str, dict[str, Any]] = {}
    for up, names in reads(spec, stage).items():
        outputs = _done(run_dir, up).get("outputs", {})
        picked = {}
        for key, rec in outputs.items():
            if names is None or key in names or (up == "basins" and f"@{groups.get(key)}" in names):
                picked[key] = rec
        out[up] = picked
    for name in out.get("basins", {}):
        problem = _basin_changed(spec, run_dir, name)
        if problem:
            raise StageError(f"stage {stage} reads basin {name}, changed since the basins stage: {problem}",
                             f"run the pipeline again: the basins stage comes first ({_basin_fix(spec, name)})")
    return out


def _basin_folder(spec: PipelineSpec, run_dir: Path, name: str) -> Path:
    b = next(b for b in spec.basins if b.name == name)
    return Path(b.settings["folder"]) if b.kind == "folder" else run_dir / "basins" / b.name


def _basin_changed(spec: PipelineSpec, run_dir: Path, name: str) -> str | None:
    """How basin ``name``'s files differ from its manifest (the first differences), or None."""
    if not any(b.name == name for b in spec.basins):
        return None
    problems = verify_manifest(_basin_folder(spec, run_dir, name), required=True)
    return "; ".join(problems[:3]) + (f" (and {len(problems) - 3} more)" if len(problems) > 3 else "") \
        if problems else None


def _basin_fix(spec: PipelineSpec, name: str) -> str:
    b = next(b for b in spec.basins if b.name == name)
    if b.kind == "folder":
        return (f"to keep the edit, record it first with `hydroagent data verify {b.settings['folder']} --write`, "
                "and every stage that reads the basin runs again; else restore the file")
    return "a synthetic basin is built again from its settings; edit them in the pipeline file instead"


def _files_read(spec: PipelineSpec, stage: str) -> list[Path]:
    """The files and folders a campaign stage's agents read besides the pipeline's own outputs: an
    ``hf_local`` agent's model folder, a ``scripted`` agent's script, the models file of ``openai`` agents."""
    if stage not in CAMPAIGN_STAGES:
        return []
    base = Path(spec.source).resolve().parent
    agents = spec.teacher.agents if stage == "teacher" else spec.evaluation.agents
    paths: list[Path] = []
    for agent in agents:
        for key in ("path", "script"):
            if isinstance(agent.get(key), str):
                p = Path(agent[key]).expanduser()
                paths.append(p if p.is_absolute() else base / p)
        if agent.get("kind") == "openai":
            paths.append(default_models_file())
    return sorted({p.resolve() for p in paths if p.exists()})


def _input_files(spec: PipelineSpec, run_dir: Path, stage: str, known: Any) -> dict[str, Any]:
    """``{path: record}`` of :func:`_files_read` (files whose size and time are those of ``known`` keep
    their checksum, so a model folder is hashed once)."""
    known = known if isinstance(known, dict) else {}
    return {str(p): output_record(run_dir, p, known.get(str(p)) if isinstance(known.get(str(p)), dict) else None)
            for p in _files_read(spec, stage)}


def decide(spec: PipelineSpec, run_dir: Path, stage: str) -> Plan:
    """Skip, resume or start ``stage`` afresh (see the module docstring); upstream stages must be done."""
    rec = read_record(run_dir, stage)
    ups = upstream_outputs(spec, run_dir, stage)
    files = _input_files(spec, run_dir, stage, (rec or {}).get("input_files"))
    parts: dict[str, Any] = {"section": spec.section(stage),
                             "upstream": {up: {k: r["sha256"] for k, r in recs.items()} for up, recs in ups.items()}}
    if files:  # only where there are any: the checksum of a stage that reads none stays what it was
        parts["files"] = {p: r["sha256"] for p, r in files.items()}
    digest = input_digest(parts)
    if rec is None:
        return Plan(stage, "fresh", "never run", digest, parts, files)
    if rec.get("inputs") != digest:
        old = rec.get("input_parts") or {}
        changed = [k for k in ("section",) if old.get("section") != parts["section"]]
        changed += [f"{up} outputs" for up in parts["upstream"] if (old.get("upstream") or {}).get(up) !=
                    parts["upstream"][up]]
        changed += [f"file {p}" for p, sha in (parts.get("files") or {}).items()
                    if (old.get("files") or {}).get(p) != sha]
        return Plan(stage, "fresh", f"inputs changed ({', '.join(changed) or 'checksum'})", digest, parts, files)
    if rec.get("status") != "done":
        return Plan(stage, "resume", f"interrupted ({rec.get('status')}, attempt {rec.get('attempts', 1)})", digest,
                    parts, files)
    for name, out in (rec.get("outputs") or {}).items():
        problem = verify_output(run_dir, out) or _damaged_store(run_dir, stage, out)
        if problem:
            return Plan(stage, "resume", f"output {name}: {problem}", digest, parts, files)
    if stage == "basins":
        for b in spec.basins:
            problem = _basin_changed(spec, run_dir, b.name)
            if problem:
                return Plan(stage, "resume", f"basin {b.name}: {problem}", digest, parts, files)
    return Plan(stage, "skip", "done, inputs unchanged", digest, parts, files)


def _damaged_store(run_dir: Path, stage: str, record: Mapping[str, Any]) -> str | None:
    """The damage of a campaign stage's episode store, or None: done means every checksum a later reader
    relies on holds, and a store's own checksums see damage that left its size and time alone (bit rot,
    ``cp -p``), which the record's file checksum is not re-read for. Resuming rebuilds it from the intact
    copies (``campaign.shards.merge_run``) or stops naming what is damaged."""
    if stage not in CAMPAIGN_STAGES:
        return None
    from hydroagent_hpc.store import StoreError, verify_store

    path = Path(record["path"])
    try:
        health = verify_store(path if path.is_absolute() else run_dir / path)
    except (StoreError, OSError) as exc:  # not a store any more
        return str(exc).splitlines()[0]
    return None if health.ok else health.summary()


# --------------------------------------------------------------------------- begin: configs and the record


def _basin_folders(spec: PipelineSpec, run_dir: Path, group: str) -> list[str]:
    return [b.settings["folder"] if b.kind == "folder" else str((run_dir / "basins" / b.name).resolve())
            for b in spec.group(group)]


def _base_model(spec: PipelineSpec, run_dir: Path) -> str:
    return str((run_dir / "base" / "model").resolve()) if spec.model == "tiny" else spec.model


def _final(run_dir: Path, stage: str) -> str:
    return str((stage_dir(run_dir, stage) / "run" / "final").resolve())


def _write_yaml(path: Path, header: str, data: Mapping[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(header + yaml.safe_dump(json.loads(json.dumps(dict(data), default=str)), sort_keys=False))
    os.replace(tmp, path)


def _campaign_mapping(spec: PipelineSpec, run_dir: Path, stage: str) -> dict[str, Any]:
    if stage == "teacher":
        section, basins = spec.teacher, _basin_folders(spec, run_dir, "train")
        agents = [dict(a) for a in section.agents]
    else:
        section, basins = spec.evaluation, _basin_folders(spec, run_dir, "heldout")
        paths = {"base": _base_model(spec, run_dir), "sft": _final(run_dir, "sft"), "grpo": _final(run_dir, "grpo")}
        # a greedy policy plays the same episode whatever the seed: one seed (the first) is enough
        once = {"seeds": list(section.seeds[:1])} if spec.policy_options.get("greedy") else {}
        agents = [{"name": p, "kind": "hf_local", "path": paths[p], **dict(spec.policy_options), **once}
                  for p in spec.policies]
        agents += [dict(a) for a in section.agents]
    return {"name": stage, "description": f"pipeline {spec.name}: {stage} campaign", "basins": basins,
            "agents": agents, "seeds": list(section.seeds), "env": dict(section.env)}


def _trainer_mapping(spec: PipelineSpec, run_dir: Path, stage: str) -> dict[str, Any]:
    if stage == "sft":
        return {"data": str((stage_dir(run_dir, "sft-data") / "sft.h5").resolve()),
                "model": _base_model(spec, run_dir), **dict(spec.sft)}
    grpo = {k: v for k, v in spec.grpo.items() if k != "init"}
    model = _final(run_dir, "sft") if spec.grpo["init"] == "sft" else _base_model(spec, run_dir)
    out = {"model": model, "basins": _basin_folders(spec, run_dir, "train"), **grpo}
    if int(grpo.get("validate_every", 0)) > 0:
        out["validation_basins"] = _basin_folders(spec, run_dir, "heldout")
    return out


def begin(spec: PipelineSpec, run_dir: Path, stage: str, *, job: str | None = None) -> Plan:
    """Decide, clear the stage's folder when its inputs changed, write its tool config and the record
    ``running``. Returns the plan; nothing is touched when the action is skip."""
    plan = decide(spec, run_dir, stage)
    if plan.action == "skip":
        return plan
    folder = stage_dir(run_dir, stage)
    old = read_record(run_dir, stage) or {}
    if plan.action == "fresh" and stage != "basins" and folder.exists():
        # outputs made from other inputs must not be resumed (a campaign would skip its stored
        # episodes, a trainer would continue another run); basins keep what matches (see _basins)
        stale = folder.with_name(f".{stage}.stale-{os.getpid()}")
        os.replace(folder, stale)
        shutil.rmtree(stale, ignore_errors=True)
        old = {}
    folder.mkdir(parents=True, exist_ok=True)
    header = (f"# Written by `hydroagent pipeline` for stage {stage} of {spec.source}; edit the pipeline file, "
              "not this one.\n")
    if stage in CAMPAIGN_STAGES:
        _write_yaml(campaign_file(run_dir, stage), header, _campaign_mapping(spec, run_dir, stage))
    elif stage in TRAINER_STAGES:
        _write_yaml(trainer_config(run_dir, stage), header, _trainer_mapping(spec, run_dir, stage))
    attempts = int(old.get("attempts", 0)) + 1 if plan.action == "resume" else 1
    before = (float(old.get("wall_s_before") or 0.0) + float(old.get("wall_s") or 0.0)
              if plan.action == "resume" else 0.0)
    write_record(run_dir, stage, {"stage": stage, "status": "running", "inputs": plan.inputs,
                                  "input_parts": plan.parts, "input_files": dict(plan.input_files),
                                  "action": plan.action, "why": plan.why,
                                  "attempts": attempts, "job": job, "started_utc": utc_now(),
                                  "first_started_utc": old.get("first_started_utc", utc_now()),
                                  "wall_s_before": before})
    log.info("stage %s: %s (%s)", stage, "resuming" if plan.action == "resume" else "starting", plan.why)
    return plan


# --------------------------------------------------------------------------- the work


def _basins(spec: PipelineSpec, run_dir: Path) -> dict[str, Any]:
    from hydroagent_hpc.sim.synth.basins import SynthSettings, synthesize_basin

    built, kept = [], []
    for b in spec.basins:
        if b.kind == "folder":
            problems = verify_manifest(b.settings["folder"], required=True)
            if problems:
                raise StageError(f"basin folder {b.settings['folder']}: {'; '.join(problems[:3])}",
                                 f"prepare it again (`hydroagent basin from-camels` or `basin synth`); "
                                 f"{_basin_fix(spec, b.name)}")
            kept.append(b.name)
            continue
        s = dict(b.settings)
        args = dict(name=b.name, area_km2=s["area_km2"], window_days=s.get("window_days", 60),
                    warmup_days=s.get("warmup_days", 30), seed=s.get("seed", 0), cellsize_deg=s.get("cellsize_deg"),
                    start=s.get("start", "2021-06-01"), lat=s.get("lat", 35.0), lon=s.get("lon", -97.0),
                    terrain=s.get("terrain", "hills"), climate=s.get("climate", "humid"),
                    paper_gauge_id=s.get("paper_gauge_id"),
                    description=(f"synthetic twin of USGS {s['paper_gauge_id']}" if s.get("paper_gauge_id") else ""))
        folder = run_dir / "basins" / b.name
        want = SynthSettings.from_arguments(*(args[k] for k in ("name", "area_km2", "window_days", "warmup_days",
                                                                "seed", "cellsize_deg", "start", "lat", "lon",
                                                                "terrain", "climate", "paper_gauge_id",
                                                                "description"))).as_dict()
        try:
            have = json.loads((folder / "basin.json").read_text()).get("generator")
        except (OSError, ValueError):
            have = None
        if have == want and not verify_manifest(folder, required=True):
            kept.append(b.name)
            continue
        synthesize_basin(folder, **args)
        built.append(b.name)
    listed = {b.name for b in spec.basins}
    for extra in sorted((run_dir / "basins").glob("syn_*")) if (run_dir / "basins").is_dir() else []:
        if extra.is_dir() and extra.name not in listed:
            shutil.rmtree(extra)
    return {"built": built, "kept": kept}


def _base(spec: PipelineSpec, run_dir: Path) -> dict[str, Any]:
    if spec.model != "tiny":
        if not (Path(spec.model) / "config.json").is_file():
            raise StageError(f"model: {spec.model} is not a model folder (no config.json)",
                             "download the base model first (e.g. `huggingface-cli download "
                             "Qwen/Qwen3-4B-Instruct-2507 --local-dir FOLDER`) and give that folder")
        return {"model": spec.model}
    from hydroagent_hpc.train.tiny import save_tiny

    out = run_dir / "base" / "model"
    if (out / "config.json").is_file():
        return {"model": str(out), "built": False}
    tmp = out.with_name(f".model.{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    save_tiny(tmp, seed=spec.model_seed)
    os.replace(tmp, out)
    return {"model": str(out), "built": True}


def run_campaign_stage(run_dir: Path, stage: str, workers: int, pool: str = "auto") -> dict[str, Any]:
    """Run the campaign of ``stage`` in this process (its episodes as one shard) and merge it."""
    from hydroagent_hpc.campaign.shards import merge_run
    from hydroagent_hpc.campaign.submit import run_shard

    path = campaign_file(run_dir, stage)
    summary = run_shard(path, stage_dir(run_dir, stage), 0, 1, pool=pool, workers=workers, progress=False)
    if summary is None:  # an MPI worker rank
        return {}
    if summary.get("failed"):
        raise StageError(f"stage {stage}: {len(summary['failed'])} episodes failed "
                         f"(e.g. {summary['failed'][0]})", "see the log above; run the pipeline again to retry them "
                                                            "(finished episodes are kept)")
    merged = merge_run(load_campaign(path), stage_dir(run_dir, stage))
    return {"run": {k: summary.get(k) for k in ("episodes", "already_stored", "ran", "wall_s") if k in summary},
            "merge": {k: merged[k] for k in ("episodes", "expected", "new")}}


def trainer_argv(run_dir: Path, stage: str, python: str | None = None) -> list[str]:
    """The trainer's command line for a CPU process (``--resume``: it continues from its newest checkpoint)."""

    config, out = str(trainer_config(run_dir, stage)), str(stage_dir(run_dir, stage) / "run")
    if stage == "sft":
        return launcher_argv(config, out, gpus=0, python=python)
    return grpo_argv(config, out, python=python)


def _train(run_dir: Path, stage: str) -> dict[str, Any]:
    argv = trainer_argv(run_dir, stage)
    log.info("stage %s: %s", stage, " ".join(argv))
    proc = subprocess.run(argv, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    if proc.returncode != 0:
        raise StageError(f"stage {stage}: the trainer exited with status {proc.returncode}"
                         + (" (stopped by SIGTERM after saving a checkpoint)" if proc.returncode == 143 else ""),
                         "run the pipeline again: the stage resumes from its newest checkpoint")
    return trainer_summary(run_dir, stage)


def trainer_summary(run_dir: Path, stage: str) -> dict[str, Any]:
    """The last metric row of a training stage's run (SFT: loss; GRPO: reward, best NSE, parse failures),
    for the stage record and for ``pipeline submit``'s job result."""
    import csv

    metrics = stage_dir(run_dir, stage) / "run" / "metrics.csv"
    with open(metrics, newline="") as fh:
        rows = list(csv.DictReader(fh))
    keys = ("loss",) if stage == "sft" else ("reward_mean", "best_nse_mean", "parse_failures_mean")
    return {"steps": len(rows), **{f"first_{k}": rows[0].get(k) for k in keys if rows},
            **{f"last_{k}": rows[-1].get(k) for k in keys if rows}}


def _sft_data(spec: PipelineSpec, run_dir: Path) -> dict[str, Any]:
    from hydroagent_hpc.train.sft.data import build_sft_data

    d = dict(spec.sft_data)
    report = build_sft_data([stage_dir(run_dir, "teacher") / "campaign.h5"], stage_dir(run_dir, "sft-data") / "sft.h5",
                            preset=d["preset"], tokenizer=_base_model(spec, run_dir), max_tokens=d["max_tokens"],
                            augment=d["augment"], render=d["render"], recovery=d.get("recovery", 0.0),
                            recovery_seed=d.get("recovery_seed", 0))
    return {"kept": report.kept, "examples": report.examples, "dropped": report.dropped,
            "recovery_turns": report.recovery_turns}


def work(spec: PipelineSpec, run_dir: Path, stage: str, *, workers: int = 1) -> dict[str, Any]:
    """Do ``stage``'s work in this process (trainers as a child process); returns its summary."""
    if stage == "basins":
        return _basins(spec, run_dir)
    if stage == "base":
        return _base(spec, run_dir)
    if stage in CAMPAIGN_STAGES:
        return run_campaign_stage(run_dir, stage, workers)
    if stage == "sft-data":
        return _sft_data(spec, run_dir)
    if stage in TRAINER_STAGES:
        return _train(run_dir, stage)
    if stage == "report":
        from hydroagent_hpc.pipeline.report import write_pipeline_report

        return write_pipeline_report(spec, run_dir)
    raise ValueError(f"unknown stage {stage!r}; the stages are {', '.join(STAGES)}")


# --------------------------------------------------------------------------- finish: outputs and the record


def output_paths(spec: PipelineSpec, run_dir: Path, stage: str) -> dict[str, Path]:
    """The outputs ``stage`` records (name -> file or folder)."""
    if stage == "basins":
        return {b.name: Path(b.settings["folder"] if b.kind == "folder" else run_dir / "basins" / b.name) /
                "manifest.json" for b in spec.basins}
    if stage == "base":
        return {"model": Path(_base_model(spec, run_dir))}
    if stage in CAMPAIGN_STAGES:
        return {"campaign": stage_dir(run_dir, stage) / "campaign.h5"}
    if stage == "sft-data":
        return {"data": stage_dir(run_dir, stage) / "sft.h5"}
    if stage in TRAINER_STAGES:
        return {"final": stage_dir(run_dir, stage) / "run" / "final",
                "metrics": stage_dir(run_dir, stage) / "run" / "metrics.csv"}
    return {"markdown": stage_dir(run_dir, stage) / "report.md", "html": stage_dir(run_dir, stage) / "report.html"}


def finish(spec: PipelineSpec, run_dir: Path, stage: str, summary: Mapping[str, Any]) -> dict[str, Any]:
    """Checksum the outputs and write the record ``done``; returns it."""
    rec = read_record(run_dir, stage) or {}
    missing = [str(p) for p in output_paths(spec, run_dir, stage).values() if not p.exists()]
    if missing:
        raise StageError(f"stage {stage} finished without its outputs: {', '.join(missing)}",
                         "see the stage's log; run the pipeline again")
    old = rec.get("outputs") or {}
    outputs = {name: output_record(run_dir, path, old.get(name))
               for name, path in output_paths(spec, run_dir, stage).items()}
    started = rec.get("started_utc")
    wall = None
    if started:
        from datetime import datetime

        wall = round((datetime.fromisoformat(utc_now()) - datetime.fromisoformat(started)).total_seconds(), 1)
    rec.update(status="done", outputs=outputs, finished_utc=utc_now(), wall_s=wall, summary=dict(summary))
    write_record(run_dir, stage, rec)
    return rec


def fail(run_dir: Path, stage: str, error: BaseException) -> None:
    """Record that ``stage`` stopped with ``error`` (the next run resumes it)."""
    try:
        rec = read_record(run_dir, stage)
    except PipelineStateError:  # the error being raised is the one to report; the damage is named next run
        return
    if rec is None:
        return
    rec.update(status="failed", error=f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}",
               failed_utc=utc_now())
    write_record(run_dir, stage, rec)


def elapsed(t0: float) -> float:
    return round(time.perf_counter() - t0, 1)


def write_pipeline_record(spec: PipelineSpec, run_dir: Path, extra: Mapping[str, Any]) -> None:
    """``RUN/pipeline.json``: the resolved spec's sections, the source file and provenance (git commit)."""

    write_json_atomic(run_dir / "pipeline.json", {"name": spec.name, "source": str(Path(spec.source).resolve()),
                                                  "sections": {s: spec.section(s) for s in STAGES},
                                                  "provenance": provenance(), "python": sys.executable, **extra})
