"""``hydroagent pipeline run`` and ``pipeline status``: the stages in order, in this process.

:func:`run_pipeline` copies the pipeline file into ``RUN/pipeline.yaml`` (with ``RUN/pipeline.json``:
the resolved sections and the git commit), then for each stage in :data:`~hydroagent_hpc.pipeline.spec.STAGES`
skips it, resumes it or starts it afresh (:func:`hydroagent_hpc.pipeline.stages.decide`). A stage
that was started afresh changes its outputs' checksums, so every stage after it that reads them
runs again; a stage whose inputs are unchanged is skipped even after an upstream rerun that
reproduced the same bytes.

:func:`pipeline_status` reads a run folder (nothing runs): per stage its record and what
``pipeline run`` would do now.
"""

from __future__ import annotations

import fcntl
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import one_line
from hydroagent_hpc.hpc.jobs import slurm_active_jobs
from hydroagent_hpc.pipeline import stages as st
from hydroagent_hpc.pipeline.spec import STAGES, PipelineSpec, load_pipeline, pipeline_from_mapping
from hydroagent_hpc.pipeline.state import PipelineError, PipelineStateError, read_record, read_submit_record
from hydroagent_hpc.yamlio import load_strict

log = logging.getLogger(__name__)

__all__ = ["run_pipeline", "pipeline_status", "format_status", "adopt_spec", "RUN_SPEC", "PipelineError"]

#: The pipeline file as the run folder keeps it.
RUN_SPEC = "pipeline.yaml"


def adopt_spec(path: str | Path, run_dir: Path) -> PipelineSpec:
    """Read ``path`` strictly and keep a copy as ``RUN/pipeline.yaml``; return the spec read from the copy.

    Relative paths in the file are resolved against the original file's folder, and the copy is
    loaded with the same folder, so both give the same spec.
    """
    spec = load_pipeline(path)
    run_dir.mkdir(parents=True, exist_ok=True)
    copy = run_dir / RUN_SPEC
    tmp = run_dir / f".{RUN_SPEC}.{os.getpid()}.tmp"
    shutil.copyfile(path, tmp)
    os.replace(tmp, copy)
    (run_dir / ".pipeline-base").write_text(str(Path(path).resolve().parent) + "\n")
    st.write_pipeline_record(spec, run_dir, {"pipeline_file": str(Path(path).resolve())})
    return spec


def load_run_spec(run_dir: Path) -> PipelineSpec:
    """The spec a run folder was started with (``RUN/pipeline.yaml``, paths as in the original file)."""

    copy = run_dir / RUN_SPEC
    if not copy.is_file():
        raise PipelineError(f"{run_dir}: no {RUN_SPEC}; not a pipeline run folder",
                            "give the folder passed as --run-dir to `hydroagent pipeline run`")
    base = Path((run_dir / ".pipeline-base").read_text().strip()) if (run_dir / ".pipeline-base").is_file() \
        else run_dir
    doc = load_strict(copy, what="pipeline file")
    return pipeline_from_mapping(doc.data, base_dir=base, source=str(copy),
                                 where=lambda at: doc.where([p for p in at if p is not None]))


def run_pipeline(path: str | Path, run_dir: str | Path, *, workers: int = 1, until: str | None = None,
                 only: str | None = None) -> dict[str, Any]:
    """Run every stage that is not up to date; returns ``{"run_dir", "stages": [{stage, action, why, wall_s}]}``.

    ``until``: stop after this stage; ``only``: run just this one (its upstream must be done).
    A stage that fails is recorded ``failed`` and the error is raised; the next run resumes it.
    """
    run = Path(run_dir).resolve()
    load_pipeline(path)  # a bad file fails before anything is created
    run.mkdir(parents=True, exist_ok=True)
    lock = open(run / ".pipeline.lock", "w")  # one `pipeline run` per folder at a time
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise PipelineError(f"{run}: another `hydroagent pipeline run` is working in this folder",
                            "wait for it (`hydroagent pipeline status RUN`), or use another --run-dir") from None
    try:
        return _run_locked(path, run, workers, until, only)
    finally:
        lock.close()


def _slurm_jobs_active(run: Path) -> list[str]:
    """Jobs of a `pipeline submit` of this folder that Slurm still has queued or running."""
    submitted = read_submit_record(run)
    if submitted.get("cluster") != "slurm":  # local jobs are processes of a finished `submit --cluster local`
        return []
    jobs = submitted.get("jobs") or {}
    return slurm_active_jobs([j for ids in jobs.values() for j in ids])


def _run_locked(path: str | Path, run: Path, workers: int, until: str | None, only: str | None) -> dict[str, Any]:
    active = _slurm_jobs_active(run)
    if active:
        raise PipelineError(f"{run}: Slurm jobs {', '.join(active[:5])} of `pipeline submit` still work on this folder",
                            "wait for them (`hydroagent pipeline status RUN`, squeue), or scancel them first")
    spec = adopt_spec(path, run)
    for name in (until, only):
        if name is not None and name not in STAGES:
            raise PipelineError(f"stage {name!r}: unknown; the stages are {', '.join(STAGES)}")
    done: list[dict[str, Any]] = []
    for stage in STAGES:
        if only is not None and stage != only:
            continue
        t0 = time.perf_counter()
        plan = st.begin(spec, run, stage)
        if plan.action == "skip":
            log.info("stage %s: skipped (%s)", stage, plan.why)
            done.append({"stage": stage, "action": "skip", "why": plan.why, "wall_s": 0.0})
        else:
            try:
                summary = st.work(spec, run, stage, workers=workers)
            except BaseException as exc:
                st.fail(run, stage, exc)
                raise
            rec = st.finish(spec, run, stage, summary)
            done.append({"stage": stage, "action": plan.action, "why": plan.why, "wall_s": st.elapsed(t0),
                         "summary": rec.get("summary")})
            log.info("stage %s: done in %.1f s", stage, done[-1]["wall_s"])
        if stage == until:
            break
    return {"run_dir": str(run), "stages": done}


def pipeline_status(run_dir: str | Path) -> dict[str, Any]:
    """Where a run stands: per stage its recorded status and what ``pipeline run`` would do now."""
    run = Path(run_dir).resolve()
    spec = load_run_spec(run)
    busy = _locked(run)
    rows: list[dict[str, Any]] = []
    pending: dict[str, str] = {}  # stage -> what a rerun would do, for the stages that would run
    for stage in STAGES:
        try:
            rec = read_record(run, stage) or {}
        except PipelineStateError as exc:  # named in its row; `pipeline run` stops on it
            pending[stage] = "-"
            rows.append({"stage": stage, "status": "damaged", "next": "-", "why": one_line(exc), "attempts": None,
                         "wall_s": None, "finished_utc": None, "job": None, "error": None, "summary": None})
            continue
        after = [up for up in st.reads(spec, stage) if up in pending]
        if after:  # its inputs will change (or appear) when these run
            next_action, why = "wait", f"runs after {', '.join(after)}"
        else:
            try:
                plan = st.decide(spec, run, stage)
                next_action, why = plan.action, plan.why
            except st.StageError:
                next_action, why = "wait", "an upstream stage is not done"
        if next_action != "skip":
            pending[stage] = next_action
        if busy and rec.get("status") == "running":
            next_action, why = "-", "running now (a `pipeline run` holds this folder)"
        rows.append({"stage": stage, "status": rec.get("status", "not started"), "next": next_action, "why": why,
                     "attempts": rec.get("attempts"),
                     "wall_s": None if rec.get("wall_s") is None else  # every attempt of the stage
                     round(float(rec["wall_s"]) + float(rec.get("wall_s_before") or 0.0), 1),
                     "finished_utc": rec.get("finished_utc"), "job": rec.get("job"),
                     "error": rec.get("error"), "summary": rec.get("summary")})
    return {"run_dir": str(run), "pipeline": spec.name, "stages": rows}


def _locked(run: Path) -> bool:
    """Whether a `pipeline run` holds ``RUN/.pipeline.lock`` now."""
    path = run / ".pipeline.lock"
    if not path.exists():
        return False
    with open(path) as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
    return False


def format_status(status: dict[str, Any]) -> str:
    lines = [f"pipeline {status['pipeline']} in {status['run_dir']}"]
    lines.append(f"  {'stage':<11} {'status':<12} {'next run':<9} {'wall s':>8}  why / error")
    for r in status["stages"]:
        wall = "" if r["wall_s"] is None else f"{r['wall_s']:.1f}"
        note = r["error"] or r["why"]
        if r["job"]:
            note += f" [job {r['job']}]"
        if (r["attempts"] or 0) > 1:
            note += f" [{r['attempts']} attempts]"
        lines.append(f"  {r['stage']:<11} {r['status']:<12} {r['next']:<9} {wall:>8}  {note}")
    return "\n".join(lines)
