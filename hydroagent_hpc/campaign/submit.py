"""Campaigns on a cluster: one shard per array task, a merge after them, requeue on preemption.

Two ways in, the same work:

* ``sbatch slurm/campaign.sbatch CAMPAIGN.yaml [RUN_DIR]`` — the array tasks call
  ``hydroagent campaign run --run-dir RUN --shard I/N`` (:func:`run_shard`) and the first task to
  start submits the dependent merge job (``hydroagent campaign merge``).
* ``hydroagent campaign submit CAMPAIGN.yaml --run-dir RUN --array N`` — :func:`submit_campaign`
  through submitit (Slurm when present, local processes otherwise): ``map_array`` over the shard
  indices with a :class:`ShardJob`, then a :class:`MergeJob` that depends on the whole array.

A shard task that reaches its time limit or is preempted is requeued by submitit (``ShardJob``
has the ``checkpoint`` method submitit looks for) and resumes from its shard file, losing at
most the episodes that were in flight. Layout of the run folder: :mod:`hydroagent_hpc.campaign.shards`.
"""

from __future__ import annotations

import logging
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from hydroagent_hpc.campaign import (
    CampaignSpec,
    ensure_ready,
    load_campaign,
    run_campaign,
    worker_init,
)
from hydroagent_hpc.campaign.shards import (
    MERGED,
    IncompleteMergeError,
    merge_run,
    shard_path,
    skip_stores,
    write_run_record,
)
from hydroagent_hpc.hpc.mpi import in_mpi_world, mpi_pool
from hydroagent_hpc.hpc.pool import BACKENDS as POOL_BACKENDS
from hydroagent_hpc.hpc.slurm import SiteSettings, allocation_cpus, array_id, make_executor
from hydroagent_hpc.settings import dump

log = logging.getLogger(__name__)

__all__ = ["choose_pool", "run_on_pool", "run_shard", "ShardJob", "MergeJob", "submit_campaign", "array_active",
           "defer_merge", "POOLS"]

POOLS = ("auto", *POOL_BACKENDS.names())  # "auto" picks one of the registered backends


def choose_pool(pool: str, workers: int | None, default_workers: int | None = None) -> tuple[str, int]:
    """The backend and worker count for ``pool`` ("auto", "serial", "processes", "mpi").

    Without ``workers``: ``default_workers``, or the CPUs this task may use (``SLURM_CPUS_PER_TASK``)
    when none is given or the pool is "processes". "auto" takes MPI under an MPI launcher, else
    processes when there is more than one worker, else serial.
    """

    if pool not in POOLS:
        raise ValueError(f"pool={pool!r}: choose one of {', '.join(POOLS)}")
    if workers is None:
        workers = default_workers if default_workers is not None and pool != "processes" else allocation_cpus()
    if pool == "mpi" and not in_mpi_world():
        raise ValueError("--pool mpi: this process was not started by an MPI launcher; run under "
                         "`mpiexec -n N hydroagent ...` or `srun --mpi=pmi2 -n N ...`")
    if pool == "auto":
        pool = "mpi" if in_mpi_world() else ("processes" if workers > 1 else "serial")
    return pool, workers


def run_on_pool(spec: CampaignSpec, out: str | Path, pool: str = "auto", workers: int | None = None,
                default_workers: int | None = None, max_in_flight: int = 32, timeout_s: float | None = None,
                progress: bool = True, **campaign: Any) -> dict[str, Any] | None:
    """:func:`run_campaign` on the pool chosen by :func:`choose_pool`; ``None`` on MPI worker ranks.

    ``campaign`` passes on ``shard``, ``skip_stores`` and ``limit``.
    """
    backend, n = choose_pool(pool, workers, default_workers)
    if backend == "mpi":

        with mpi_pool(max_in_flight=max_in_flight, timeout_s=timeout_s, initializer=worker_init) as p:
            if p is None:
                return None
            return run_campaign(spec, out, pool=p, progress=progress, **campaign)
    return run_campaign(spec, out, workers=n if backend == "processes" else 1, timeout_s=timeout_s,
                        progress=progress, **campaign)


def run_shard(campaign: str | Path, run_dir: str | Path, index: int, count: int, pool: str = "auto",
              workers: int | None = None, max_in_flight: int = 32, timeout_s: float | None = None,
              progress: bool | None = None) -> dict[str, Any] | None:
    """Run shard ``index`` of ``count`` of a campaign into ``RUN/shards/``; ``None`` on MPI worker ranks.

    ``pool="auto"`` takes the MPI pool when launched with several MPI ranks (``srun --mpi=pmi2``,
    ``mpiexec``), else local processes over the task's CPUs (``SLURM_CPUS_PER_TASK``).
    """
    return run_on_pool(load_campaign(campaign), shard_path(run_dir, index, count), pool, workers,
                       max_in_flight=max_in_flight, timeout_s=timeout_s,
                       progress=sys.stderr.isatty() if progress is None else progress,
                       shard=(index, count), skip_stores=skip_stores(run_dir, count))


class ShardJob:
    """A picklable callable for ``map_array``: ``job(index)`` runs that shard; requeued on timeout/preemption."""

    def __init__(self, campaign: str, run_dir: str, count: int, pool: str = "auto", workers: int | None = None,
                 max_in_flight: int = 32, timeout_s: float | None = None) -> None:
        self.campaign, self.run_dir, self.count = str(campaign), str(run_dir), int(count)
        self.pool, self.workers, self.max_in_flight, self.timeout_s = pool, workers, max_in_flight, timeout_s
        self.attempts = 0

    def __call__(self, index: int) -> dict[str, Any] | None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.attempts += 1
        log.info("shard %d of %d, attempt %d", index, self.count, self.attempts)
        return run_shard(self.campaign, self.run_dir, index, self.count, self.pool, self.workers,
                         self.max_in_flight, self.timeout_s, progress=False)

    def checkpoint(self, index: int) -> Any:
        """Called by submitit before a preemption or time-limit kill: requeue this shard as it is.

        Nothing needs saving: every finished episode is already committed to the shard file, and
        the requeued job skips those.
        """
        from submitit.helpers import DelayedSubmission

        log.warning("shard %d of %d: interrupted; requeueing (finished episodes are kept)", index, self.count)
        return DelayedSubmission(self, index)


def array_active(array: str) -> bool:
    """Whether a task of Slurm job (array) ``array`` is still pending or running.

    Slurm counts a requeued task as terminated for ``afterany``, so a merge can start while that
    task waits to run again; the merge asks this before it declares episodes missing.
    """
    try:
        p = subprocess.run(["squeue", "-h", "-j", str(array), "-o", "%T"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return p.returncode == 0 and bool(p.stdout.strip())


def defer_merge(array: str, argv: list[str], run_dir: str | Path) -> str:
    """Submit the same merge command again, after every task of ``array``; return the new job id."""
    cmd = [os.path.abspath(argv[0]) if os.path.exists(argv[0]) else argv[0], *argv[1:]]
    sb = ["sbatch", "--parsable", f"--dependency=afterany:{array}", "--ntasks=1", "--cpus-per-task=1",
          f"--time={os.environ.get('HYDROAGENT_MERGE_TIME', '00:30:00')}",
          f"--job-name={os.environ.get('SLURM_JOB_NAME', 'hydroagent-merge')}",
          f"--output={Path(run_dir) / 'logs' / 'merge-%j.out'}"]
    for var, flag in (("SLURM_JOB_PARTITION", "--partition"), ("SLURM_JOB_ACCOUNT", "--account")):
        if os.environ.get(var):
            sb.append(f"{flag}={os.environ[var]}")
    p = subprocess.run(sb + ["--wrap", shlex.join(cmd)], capture_output=True, text=True, timeout=60)
    if p.returncode != 0:
        raise RuntimeError(f"could not resubmit the merge after array {array}: {p.stderr.strip()}")
    return p.stdout.strip().split(";")[0]


class MergeJob:
    """A picklable callable: merge the run folder's shards, then write the report when ``report``.

    With ``array`` (a Slurm array id), a merge that finds episodes missing while a task of the
    array is still queued (a requeued task) submits itself again after the array and returns
    ``{"deferred_to": job_id}`` instead of failing.
    """

    def __init__(self, campaign: str, run_dir: str, report: bool = True, allow_missing: bool = False,
                 array: str | None = None, site: SiteSettings | None = None) -> None:
        self.campaign, self.run_dir = str(campaign), str(run_dir)
        self.report, self.allow_missing = report, allow_missing
        self.array, self.site = array, site

    def __call__(self) -> dict[str, Any]:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        spec = load_campaign(self.campaign)
        try:
            summary = merge_run(spec, self.run_dir, allow_missing=self.allow_missing)
        except IncompleteMergeError:
            if not (self.array and array_active(self.array)):
                raise
            ex = make_executor(Path(self.run_dir) / "logs", self.site or SiteSettings(), "slurm",
                               name=f"hydroagent-{spec.name}-merge", dependency=f"afterany:{self.array}")
            job = ex.submit(self)
            log.warning("array %s still has queued tasks (requeued); the merge runs again as job %s", self.array,
                        job.job_id)
            return {"deferred_to": job.job_id}
        if self.report:
            summary["report"] = write_run_report(self.run_dir)
        return summary


def write_run_report(run_dir: str | Path) -> str | None:
    """Write ``RUN/report/`` from ``RUN/campaign.h5``; returns its folder (None when reports are unavailable)."""
    try:
        from hydroagent_hpc.report import write_report
    except ImportError:  # the report package is optional for a merge
        log.warning("no report package in this installation; skipping the report")
        return None
    out = Path(run_dir) / "report"
    write_report(Path(run_dir) / MERGED, out)
    return str(out)


def submit_campaign(campaign: str | Path, run_dir: str | Path, array: int, site: SiteSettings,
                    cluster: str | None = None, wait: bool = False, pool: str = "auto", workers: int | None = None,
                    max_in_flight: int = 32, timeout_s: float | None = None, report: bool = True) -> dict[str, Any]:
    """Submit the shards of a campaign as one array and a merge job after it; return the job ids.

    On Slurm the merge waits for the array (``--dependency=afterany``) and this call returns at
    once unless ``wait``. On the local executor the shards run as local processes; this call
    waits for them and merges here.
    """
    campaign = Path(campaign).resolve()
    spec = load_campaign(campaign)
    ensure_ready(spec)
    if array < 1:
        raise ValueError(f"--array {array}: need at least 1 task")
    run_dir = Path(run_dir).resolve()
    logs = run_dir / "logs"
    ex = make_executor(logs, site, cluster, name=f"hydroagent-{spec.name}")
    shard_job = ShardJob(str(campaign), str(run_dir), array, pool, workers, max_in_flight, timeout_s)
    write_run_record(run_dir, {"command": "campaign submit", "campaign": str(campaign), "spec": dump(spec),
                               "array": array,
                               "cluster": ex.cluster, "site": site.as_dict(), "pool": pool, "workers": workers,
                               "max_in_flight": max_in_flight, "timeout_s": timeout_s})
    jobs = ex.map_array(shard_job, range(array))
    out: dict[str, Any] = {"run_dir": str(run_dir), "cluster": ex.cluster, "shard_jobs": [j.job_id for j in jobs],
                           "logs": str(logs)}
    merge_job = MergeJob(str(campaign), str(run_dir), report=report)
    if ex.cluster == "slurm":
        import submitit

        merge_site = site.with_(ntasks=1, cpus_per_task=1, time_min=max(10, min(site.time_min, 120)), gpus_per_node=0)
        merge_job.array, merge_job.site = array_id(jobs[0]), merge_site
        mex = make_executor(logs, merge_site, "slurm", name=f"hydroagent-{spec.name}-merge",
                            dependency=f"afterany:{array_id(jobs[0])}")
        mjob = mex.submit(merge_job)
        out["merge_job"] = mjob.job_id
        log.info("submitted %d shard tasks (array %s) and merge job %s; logs in %s", array, array_id(jobs[0]),
                 mjob.job_id, logs)
        if wait:
            result = mjob.result()
            while isinstance(result, dict) and "deferred_to" in result:  # a requeued shard deferred the merge
                out["merge_job"] = result["deferred_to"]
                result = submitit.SlurmJob(folder=logs / "%j", job_id=result["deferred_to"]).result()
            out["merge"] = result
        return out
    failures = []
    for j in jobs:
        try:
            j.result()
        except Exception as exc:  # a failed shard leaves its episodes missing; the merge says which
            failures.append(f"{j.job_id}: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
    out["shard_failures"] = failures
    out["merge"] = merge_job()
    return out
