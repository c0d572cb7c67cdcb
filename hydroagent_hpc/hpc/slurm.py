"""Slurm through submitit: site settings, executors, and what a job can learn about its allocation.

Generic: nothing here knows about campaigns. The backend is chosen once, by ``cluster``:
``"slurm"`` (a real Slurm; fails clearly when there is none), ``"local"`` (jobs as local
processes, for laptops), ``"debug"`` (in this process, for tests) or ``None``/``"auto"``
(Slurm when ``sbatch`` is on PATH, local otherwise), as :class:`submitit.AutoExecutor` does.

Site settings (:mod:`hydroagent_hpc.hpc.site`: partition, account, QOS, modules, time) come from
the command line or, without editing anything, from the same environment variables ``sbatch`` itself reads
(``SBATCH_PARTITION``, ``SBATCH_ACCOUNT``, ``SBATCH_QOS``) plus ``HYDROAGENT_MODULES`` (modules to
load, space-separated) and ``HYDROAGENT_SETUP`` (shell lines run before the job, ``;``-separated).
:meth:`SiteSettings.has` tells a value the user gave from a default, so a job that knows better
(a GPU training job's CPUs and memory, :mod:`hydroagent_hpc.train.submit`) replaces only defaults.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from hydroagent_hpc.hpc.site import SITE_OPTIONS, SiteSettings, SlurmFields

log = logging.getLogger(__name__)

__all__ = ["SlurmFields", "SiteSettings", "SITE_OPTIONS", "make_executor", "slurm_available", "array_id",
           "allocation_cpus", "CLUSTERS"]

CLUSTERS = ("auto", "slurm", "local", "debug")


def slurm_available() -> bool:
    """Whether a Slurm controller answers here (``sinfo`` exits 0 within a few seconds)."""
    if not shutil.which("sbatch") or not shutil.which("sinfo"):
        return False
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def make_executor(folder: str | Path, site: SiteSettings, cluster: str | None = None, name: str = "hydroagent",
                  dependency: str | None = None, srun_mpi: bool = True, max_num_timeout: int | None = None,
                  nodes: int = 1):
    """A :class:`submitit.AutoExecutor` with the site's settings; logs go to ``folder/%j``.

    ``nodes``: nodes per job (one task per node unless ``site.ntasks`` says more).
    ``max_num_timeout``: how many times a job that reaches its time limit is requeued (submitit's
    default, 3, when None).

    ``site.ntasks > 1`` starts that many tasks per job through ``srun --mpi=pmi2`` (PyPI's
    mpich), so the job can use the MPI simulation pool on its allocation.
    """
    import submitit

    if cluster in (None, "auto"):
        cluster = None
    elif cluster not in CLUSTERS:
        raise ValueError(f"cluster={cluster!r}: choose one of {', '.join(CLUSTERS)}")
    if cluster == "slurm" and not slurm_available():
        raise RuntimeError("cluster='slurm' but no Slurm controller answers here (sinfo failed); "
                           "run on a login node, or use --cluster local")
    if nodes < 1:
        raise ValueError(f"nodes={nodes}: must be at least 1")
    requeues: dict[str, Any] = {}
    if max_num_timeout is not None:
        if max_num_timeout < 0:
            raise ValueError(f"max_num_timeout={max_num_timeout}: must be 0 or more")
        requeues = {"slurm_max_num_timeout": max_num_timeout, "local_max_num_timeout": max_num_timeout}
    ex = submitit.AutoExecutor(folder=str(Path(folder) / "%j"), cluster=cluster, **requeues)
    params: dict[str, Any] = {"name": name, "timeout_min": site.time_min, "cpus_per_task": site.cpus_per_task,
                              "tasks_per_node": site.ntasks, "nodes": nodes}
    if site.mem_gb is not None:
        params["mem_gb"] = site.mem_gb
    if site.gpus_per_node:
        params["gpus_per_node"] = site.gpus_per_node
    if ex.cluster == "slurm":
        extra: dict[str, Any] = {"slurm_array_parallelism": site.array_parallelism}
        for key in ("partition", "account", "qos", "constraint"):
            if getattr(site, key):
                extra[f"slurm_{key}"] = getattr(site, key)
        if site.setup_lines():
            extra["slurm_setup"] = site.setup_lines()
        if dependency:
            extra["slurm_dependency"] = dependency
        if site.ntasks > 1 and srun_mpi:
            extra["slurm_srun_args"] = ["--mpi=pmi2"]
        params.update(extra)
    ex.update_parameters(**params)
    log.debug("executor %s in %s: %s", ex.cluster, folder, params)
    return ex


def array_id(job: Any) -> str:
    """The Slurm array id of a submitit job of an array (``"123_4"`` -> ``"123"``)."""
    return str(job.job_id).split("_")[0]


def allocation_cpus(default: int = 1) -> int:
    """CPUs this task may use: ``SLURM_CPUS_PER_TASK`` inside Slurm, else the CPUs this process may run on."""
    value = os.environ.get("SLURM_CPUS_PER_TASK", "")
    if value.isdigit() and int(value) > 0:
        return int(value)
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or default)
