"""``hydroagent pipeline submit``: the stages as Slurm jobs chained with ``afterok``, through submitit.

The jobs of one submission, each waiting for the one before it (``--dependency=afterok:ID``; for an
array, every task of it)::

    basins -> base -> teacher: begin -> shards (array of N) -> merge -> sft-data -> sft -> grpo
           -> evaluation: begin -> shards (array of N) -> merge -> report

Every job runs the same stage code as ``pipeline run`` (:mod:`~hydroagent_hpc.pipeline.stages`):
it begins the stage (skip / resume / fresh by the input checksums), does its part and records it.
Campaign shard jobs are :class:`hydroagent_hpc.campaign.submit.ShardJob` (requeued on preemption,
resuming from their shard files); SFT and GRPO are one job each that runs the trainer command under
:class:`hydroagent_hpc.hpc.jobs.CheckpointedCommand` (checkpoint on SIGUSR1, requeue, ``--resume``),
on the site's GPU partition with its GPUs, or on CPU when the site file says ``gpus: 0``.

Stages already done with unchanged inputs get no job. A failed job leaves the jobs after it
pending with an unsatisfiable dependency; ``pipeline submit`` with the same arguments cancels those
(they belong to this run folder and never started), and submits again from the first stage that is
not done, so finished work is never redone.

Without Slurm (``--cluster local``) the same jobs run one after the other as local processes.
"""

from __future__ import annotations

import logging
import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign import load_campaign
from hydroagent_hpc.campaign.submit import ShardJob
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.hpc.jobs import CheckpointedCommand
from hydroagent_hpc.hpc.jobs import slurm_active_jobs as _active
from hydroagent_hpc.hpc.slurm import SiteSettings, SlurmFields, array_id, make_executor
from hydroagent_hpc.pipeline import stages as st
from hydroagent_hpc.pipeline.runner import RUN_SPEC, adopt_spec, load_run_spec
from hydroagent_hpc.pipeline.spec import STAGES, load_pipeline
from hydroagent_hpc.pipeline.state import read_record, read_submit_record, utc_now, write_json_atomic
from hydroagent_hpc.settings import dump, from_mapping, invalid, setting
from hydroagent_hpc.train.submit import GRPOJob, SFTJob
from hydroagent_hpc.yamlio import brief, load_strict

log = logging.getLogger(__name__)

__all__ = ["Site", "load_site", "StageJob", "StageShardJob", "TrainStageJob", "submit_pipeline",
           "SUBMIT_RECORD"]

SUBMIT_RECORD = "submit.json"


def _stage_minutes(value: Any) -> dict[str, int]:
    """``time_min`` of a site file: minutes for every stage, or a mapping of stage (or ``default``) to minutes."""
    if isinstance(value, int) and not isinstance(value, bool):
        value = {"default": value}
    if not isinstance(value, Mapping):
        raise invalid((), f"minutes, or a mapping of stage (or default) to minutes, got {brief(value)}",
                      f"stages: {', '.join(STAGES)}")
    for k, v in value.items():  # the entry itself is named (its own line in the file)
        if k not in (*STAGES, "default"):
            raise invalid((str(k),), "not a stage", f"stages: {', '.join(STAGES)}, or default")
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise invalid((str(k),), f"expected whole minutes, 1 or more, got {brief(v)}", "e.g. grpo: 240")
    return {"default": 60, **value}


@dataclass(frozen=True)
class Site(SlurmFields):
    """Where the jobs run: ``partition`` for CPU stages, ``gpu_partition`` and ``gpus`` for SFT and GRPO
    (``gpus: 0`` trains on CPU), ``time_min`` per stage (``default`` for the rest). The Slurm fields
    every job shares (partition, account, qos, constraint, cpus_per_task, mem_gb, array_parallelism,
    modules, setup) are :class:`~hydroagent_hpc.hpc.slurm.SlurmFields`, as on the command line."""

    gpu_partition: str | None = setting(None, nonempty=True, help="partition of the SFT, GRPO and policy-evaluation "
                                                                  "jobs (null: partition)")
    gpus: int = setting(0, ge=0, le=1, help="GPUs of the SFT and GRPO jobs (0 trains on CPU)",
                        fix="give 1 (or 0 to train on CPU); multi-GPU SFT: `hydroagent train submit sft --gpus N`")
    grpo_sim_ranks: int = setting(0, ge=0, help="MPI simulation ranks beside the GRPO trainer (0: its threads)")
    train_cpus_per_task: int | None = setting(None, ge=1, help="CPUs of the training jobs (null: cpus_per_task)")
    time_min: dict[str, int] = setting(factory=lambda: {"default": 60}, convert=_stage_minutes,
                                       help="minutes per job: a number, or a mapping of stage (or default) to minutes")
    source: str = setting("<defaults>", help="(internal) the site file")

    def settings(self, stage: str, shards: bool = False) -> SiteSettings:
        """The SLURM settings of ``stage``'s jobs: SFT, GRPO and the evaluation's shards (LLM policies)
        on the GPU partition with ``gpus`` GPUs, the rest on ``partition``."""
        train = stage in st.TRAINER_STAGES or (stage == "evaluation" and shards)
        base = SiteSettings.from_env(partition=(self.gpu_partition or self.partition) if train else self.partition,
                                     account=self.account, qos=self.qos, constraint=self.constraint,
                                     mem_gb=self.mem_gb, modules=self.modules or None, setup=self.setup or None)
        cpus = (self.train_cpus_per_task or self.cpus_per_task) if train else self.cpus_per_task
        if stage == "grpo" and self.grpo_sim_ranks:
            cpus = max(cpus, self.grpo_sim_ranks + 1)  # the trainer and its simulation ranks share the task
        return base.with_(time_min=int(self.time_min.get(stage, self.time_min.get("default", 60))),
                          cpus_per_task=cpus,
                          gpus_per_node=self.gpus if train else 0, array_parallelism=self.array_parallelism, ntasks=1)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dump(self)
        return out


def load_site(path: str | Path | None) -> Site:
    """Read a site file strictly (None: the defaults, with $SBATCH_PARTITION etc. from the environment)."""
    if path is None:
        return Site()
    doc = load_strict(path, what="site file")
    data = {} if doc.data is None else doc.data
    if isinstance(data, Mapping) and "source" in data:
        raise ConfigError(f"{doc.where(('source',))}: source: unknown key", "remove it")
    return from_mapping(Site, {**data, "source": doc.source} if isinstance(data, Mapping) else data,
                        where=doc.where)


# --------------------------------------------------------------------------- the jobs


def _job_id() -> str | None:
    return os.environ.get("SLURM_ARRAY_JOB_ID") and f"{os.environ['SLURM_ARRAY_JOB_ID']}_" \
        f"{os.environ.get('SLURM_ARRAY_TASK_ID')}" or os.environ.get("SLURM_JOB_ID")


def _logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")


class StageJob:
    """A picklable submitit callable: one stage (``part`` "all"), or a campaign stage's "begin" or "merge"."""

    def __init__(self, run_dir: str, stage: str, part: str = "all") -> None:
        if part not in ("all", "begin", "merge"):
            raise ValueError(f"part={part!r}: all, begin or merge")
        self.run_dir, self.stage, self.part = str(run_dir), stage, part

    def __call__(self) -> dict[str, Any]:
        _logging()
        run = Path(self.run_dir)
        spec = load_run_spec(run)
        if self.part == "merge":
            rec = read_record(run, self.stage) or {}
            if rec.get("status") == "done":
                return {"stage": self.stage, "action": "skip"}
            from hydroagent_hpc.campaign.shards import merge_run

            try:
                merged = merge_run(load_campaign(st.campaign_file(run, self.stage)), st.stage_dir(run, self.stage))
                summary = {"merge": {k: merged[k] for k in ("episodes", "expected", "new")}}
                st.finish(spec, run, self.stage, summary)
            except BaseException as exc:
                st.fail(run, self.stage, exc)
                raise
            return {"stage": self.stage, "action": "merge", **summary}
        plan = st.begin(spec, run, self.stage, job=_job_id())
        if plan.action == "skip" or self.part == "begin":
            return {"stage": self.stage, "action": plan.action, "why": plan.why}
        try:
            summary = st.work(spec, run, self.stage, workers=max(1, int(os.environ.get("SLURM_CPUS_PER_TASK", "1"))))
            st.finish(spec, run, self.stage, summary)
        except BaseException as exc:
            st.fail(run, self.stage, exc)
            raise
        return {"stage": self.stage, "action": plan.action, "why": plan.why}


class StageShardJob(ShardJob):
    """A campaign stage's shard (``job(index)``); nothing to do when the begin job found the stage done."""

    def __init__(self, run_dir: str, stage: str, count: int) -> None:
        super().__init__(str(st.campaign_file(Path(run_dir), stage)), str(st.stage_dir(Path(run_dir), stage)), count)
        self.pipeline_run, self.stage = str(run_dir), stage

    def __call__(self, index: int) -> dict[str, Any] | None:
        rec = read_record(Path(self.pipeline_run), self.stage) or {}
        if rec.get("status") == "done":
            return {"stage": self.stage, "action": "skip"}
        return super().__call__(index)


class TrainStageJob:
    """SFT or GRPO as one requeueable job: begin, the trainer under CheckpointedCommand, finish."""

    def __init__(self, run_dir: str, stage: str, gpus: int = 0, save_wait_s: float | None = None,
                 sim_ranks: int = 0) -> None:
        self.run_dir, self.stage, self.gpus, self.sim_ranks = str(run_dir), stage, int(gpus), int(sim_ranks)
        self.save_wait_s = save_wait_s or (240.0 if stage == "sft" else 540.0)
        self.command: CheckpointedCommand | None = None

    def _command(self) -> CheckpointedCommand:

        run = Path(self.run_dir)
        config, out = st.trainer_config(run, self.stage), st.stage_dir(run, self.stage) / "run"
        if self.stage == "sft":
            return SFTJob(config, out, gpus=self.gpus, save_wait_s=self.save_wait_s)
        return GRPOJob(config, out, save_wait_s=self.save_wait_s, sim_ranks=self.sim_ranks)

    def __call__(self) -> dict[str, Any]:
        _logging()
        run = Path(self.run_dir)
        spec = load_run_spec(run)
        plan = st.begin(spec, run, self.stage, job=_job_id())
        if plan.action == "skip":
            return {"stage": self.stage, "action": "skip", "why": plan.why}
        if self.command is None:
            self.command = self._command()
        try:
            self.command()
            summary = st.trainer_summary(run, self.stage)
            st.finish(spec, run, self.stage, summary)
        except BaseException as exc:
            st.fail(run, self.stage, exc)
            raise
        return {"stage": self.stage, "action": plan.action, "why": plan.why, **summary}

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Before a time limit or preemption: the trainer saves and stops; the job is requeued and resumes."""
        from submitit.helpers import DelayedSubmission

        if self.command is not None:
            self.command.stop_for_requeue()
        log.warning("stage %s: requeueing; the next attempt resumes from its newest checkpoint", self.stage)
        return DelayedSubmission(self, *args, **kwargs)


# --------------------------------------------------------------------------- submitting


def _pending_on_dependency(job_ids: list[str]) -> tuple[list[str], list[str]]:
    """Split active jobs into (waiting on a dependency that can no longer be met or pending, running)."""
    waiting: list[str] = []
    running: list[str] = []
    for jid in job_ids:
        p = subprocess.run(["squeue", "-h", "-o", "%T %r", "-j", jid.split("_")[0]], capture_output=True, text=True,
                           timeout=60)
        states = p.stdout.split()
        if not states or states[0] == "COMPLETING":
            continue
        (running if states[0] in ("RUNNING", "CONFIGURING") else waiting).append(jid)
    return waiting, running


def submit_pipeline(path: str | Path, run_dir: str | Path, site: Site, *, cluster: str | None = None,
                    wait: bool = False) -> dict[str, Any]:
    """Submit every stage that is not done; return the job ids per stage (and the outcome when ``wait``)."""
    run = Path(run_dir).resolve()
    record_path = run / SUBMIT_RECORD
    previous = read_submit_record(run)
    old_ids = [j for ids in (previous.get("jobs") or {}).values() for j in ids]
    spec = load_pipeline(path)  # checked before anything is cancelled or written
    logs = run / "logs"
    first_ex = make_executor(logs, site.settings("basins"), cluster, name=f"pipeline-{spec.name}")
    slurm = first_ex.cluster == "slurm"
    cancelled: list[str] = []
    if slurm:
        active = _active(old_ids) if previous.get("cluster") == "slurm" else []
        waiting, running = _pending_on_dependency(active)
        # a job whose stage is recorded done is only exiting (submitit returns its result before Slurm ends it)
        stage_of = {j.split("_")[0]: stage for stage, ids in (previous.get("jobs") or {}).items() for j in ids}
        running = [j for j in running if (read_record(run, stage_of.get(j.split("_")[0], "")) or {}).get("status")
                   != "done"]
        if running:
            raise st.StageError(f"{run}: jobs {', '.join(running)} of the previous submission are still running",
                                "wait for them (`hydroagent pipeline status RUN`, squeue) or scancel them, then submit "
                                "again")
        if waiting:
            subprocess.run(["scancel", *sorted({j.split("_")[0] for j in waiting})], timeout=60, check=False)
            cancelled = waiting
            log.info("cancelled %d pending jobs of the previous submission: %s", len(waiting), ", ".join(waiting))
    spec = adopt_spec(path, run)  # the jobs read RUN/pipeline.yaml: replaced only once none of the old ones runs
    jobs: dict[str, list[str]] = {}
    handles: list[tuple[str, Any]] = []
    last: str | None = None  # the job (or array) the next one waits for
    skipped: list[str] = []

    def executor(stage: str, name: str, shards: bool = False) -> Any:
        return make_executor(logs, site.settings(stage, shards), cluster, name=f"pipeline-{spec.name}-{name}",
                             dependency=f"afterok:{last}" if (slurm and last) else None,
                             max_num_timeout=3)

    def settle(job: Any) -> None:
        if not slurm:  # local processes have no dependencies: run the chain one job at a time
            job.result() if not isinstance(job, list) else [j.result() for j in job]

    for stage in STAGES:
        if last is None:  # everything before is done: this stage can be decided now
            try:
                if st.decide(spec, run, stage).action == "skip":
                    skipped.append(stage)
                    continue
            except st.StageError:
                pass
        if stage in st.CAMPAIGN_STAGES:
            section = spec.teacher if stage == "teacher" else spec.evaluation
            begin = executor(stage, f"{stage}-begin").submit(StageJob(str(run), stage, "begin"))
            settle(begin)
            last = str(begin.job_id)
            shards = executor(stage, f"{stage}-shards", shards=True).map_array(
                StageShardJob(str(run), stage, section.array), range(section.array))
            settle(shards)
            last = array_id(shards[0])
            merge = executor(stage, f"{stage}-merge").submit(StageJob(str(run), stage, "merge"))
            settle(merge)
            last = str(merge.job_id)
            jobs[stage] = [str(begin.job_id), *(str(j.job_id) for j in shards), str(merge.job_id)]
            handles.append((stage, merge))
        elif stage in st.TRAINER_STAGES:
            ex = executor(stage, stage)
            if slurm:
                ex.update_parameters(slurm_signal_delay_s=int(240 if stage == "sft" else 540) + 60)
            job = ex.submit(TrainStageJob(str(run), stage, gpus=site.gpus,
                                          sim_ranks=site.grpo_sim_ranks if stage == "grpo" else 0))
            settle(job)
            last = str(job.job_id)
            jobs[stage] = [last]
            handles.append((stage, job))
        else:
            job = executor(stage, stage).submit(StageJob(str(run), stage))
            settle(job)
            last = str(job.job_id)
            jobs[stage] = [last]
            handles.append((stage, job))
    record = {"pipeline": str(Path(path).resolve()), "run_dir": str(run), "cluster": first_ex.cluster,
              "submitted_utc": utc_now(), "jobs": jobs, "skipped": skipped, "cancelled": cancelled,
              "site": site.as_dict(), "previous": previous.get("submitted_utc")}
    write_json_atomic(record_path, record)
    log.info("submitted %d stages (%s); skipped %s", len(jobs), ", ".join(jobs) or "none", ", ".join(skipped) or "none")
    out: dict[str, Any] = {"run_dir": str(run), "cluster": first_ex.cluster, "jobs": jobs, "skipped": skipped,
                           "cancelled": cancelled, "spec": str(run / RUN_SPEC)}
    if wait and handles:
        t0 = time.perf_counter()
        failed = []
        for stage, job in handles:
            try:
                job.result()
            except Exception as exc:  # the first failure leaves the rest pending forever: stop waiting
                failed.append(f"{stage}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
                break
        if slurm:
            # submitit sees a job's result (or its failure) a moment before Slurm lets the job go (its
            # batch script is still exiting): wait for that too, so that after --wait none of the
            # submission's jobs is running (the dependants of a failed stage stay pending, unstartable)
            ids = [j for stage_ids in jobs.values() for j in stage_ids]
            deadline = time.monotonic() + 300.0
            while _pending_on_dependency(_active(ids))[1] and time.monotonic() < deadline:
                time.sleep(1.0)
        out["failed"] = failed
        out["waited_s"] = round(time.perf_counter() - t0, 1)
    return out
