"""``hydroagent submit sft|grpo``: a training run as a submitit job that survives requeues.

:class:`SFTJob` is a :class:`hydroagent_hpc.hpc.jobs.CheckpointedCommand` whose command is the
trainer's entry point, ``python -m hydroagent_hpc.train.sft CONFIG --out RUN --resume``:

* ``gpus == 0``: that command in one CPU process (tiny models; the local executor on a laptop);
* one node with G GPUs: ``accelerate launch --num_processes G [--multi_gpu] -m hydroagent_hpc.train.sft ...``;
* N nodes: submitit starts one task per node; each task builds its own launcher at run time with
  ``--num_machines N --machine_rank NODE --main_process_ip HOST0 --main_process_port PORT`` from
  submitit's job environment (HOST0 is the first of the job's hostnames).

On a time limit or preemption, submitit calls :meth:`SFTJob.checkpoint` in the first task: SIGUSR1
goes to the trainer ranks on that node (the trainer saves a checkpoint into RUN/checkpoints/), then
SIGTERM (the trainer saves and exits 143), and the job is requeued, at most ``max_requeues`` times
for time limits. Every attempt passes ``--resume``, so it continues from the newest checkpoint.
Ranks on other nodes stop on Slurm's SIGTERM at the requeue; the trainer's own signal handling
keeps the ranks of one save together. ``slurm/sft.sbatch`` is the same protocol for ``sbatch``.

Before submitting, the config is read with the trainer's strict loader
(:func:`hydroagent_hpc.train.config.load_sft_config`), so a typo fails here, not in the queue; the
trainer itself (torch) is never imported by this module.

:class:`GRPOJob` (``hydroagent submit grpo CONFIG --out RUN``) is the same protocol for the GRPO
trainer, ``python -m hydroagent_hpc.train.grpo_launch CONFIG --out RUN --resume --pool threads``: one
process that trains (on its GPU, or on CPU with ``gpus == 0``) and runs the simulations in its own
threads, so the job has one task and SIGUSR1/SIGTERM go to that process. The trainer acts on them
at the end of its current step (a GRPO step is long: the default wait is 540 s and Slurm's warning
comes 600 s before the limit). With ``sim_ranks = R > 0`` (``--sim-ranks R``) the simulations run
on R MPI ranks beside the trainer instead of its threads: the job's one task gets ``R + 1`` CPUs and
runs ``mpiexec -launcher fork -n R+1 python -m hydroagent_hpc.train.grpo_launch ... --pool mpi``
(the environment's own MPICH Hydra, all ranks on the job's node: rank 0 trains and generates, the
others simulate), and SIGUSR1/SIGTERM go to rank 0 only (the workers have nothing to save; they stop
when the trainer closes the pool).

Several training processes (``trainers = T > 1``, ``--trainers T``; by default one per GPU of
``--gpus G``; ``generator: engine``, as every multi-process GRPO run): without simulation ranks,
``torchrun --standalone --nproc_per_node T`` starts them (rank 0 simulates in its threads) and the
signals go to every trainer (torchrun itself would end its workers on SIGUSR1); with R simulation
ranks, ``mpiexec -n T+R ... --pool mpi --trainers T`` (ranks 0..T-1 train, their process group set
up from the MPI world: :func:`hydroagent_hpc.hpc.mpi.split_trainers`) and the signals go to rank 0,
whose trainers agree on them at the end of the step and save together. Across several nodes,
``sbatch --ntasks=N slurm/grpo.sbatch`` is the path (``srun --mpi=pmi2``). The config is read with
:func:`hydroagent_hpc.train.grpo_config.load_grpo_config` (for T processes) before anything is queued.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.hpc.jobs import CheckpointedCommand
from hydroagent_hpc.hpc.slurm import SiteSettings, make_executor

log = logging.getLogger(__name__)

__all__ = ["TRAINER_MODULE", "GRPO_MODULE", "SFTJob", "GRPOJob", "SubmitError", "launcher_argv", "grpo_argv",
           "submit_sft", "submit_sft_job", "submit_grpo", "submit_grpo_job"]

#: The trainer's entry point (``python -m``).
TRAINER_MODULE = "hydroagent_hpc.train.sft"
#: The GRPO trainer's entry point (``python -m``).
GRPO_MODULE = "hydroagent_hpc.train.grpo_launch"


class SubmitError(HydroAgentError):
    """A training submission that cannot start (missing config, bad sizes, no trainer installed)."""


def launcher_argv(config: str, run_dir: str, *, gpus: int, nodes: int = 1, node_rank: int = 0,
                  master_addr: str | None = None, master_port: int = 29500, module: str = TRAINER_MODULE,
                  python: str | None = None) -> list[str]:
    """The command line one node runs: a plain CPU process (``gpus == 0``) or ``accelerate launch``.

    ``accelerate`` is the script beside ``python`` (the job's environment), so no PATH lookup decides it.
    """
    if gpus < 0 or nodes < 1 or not 0 <= node_rank < nodes:
        raise ValueError(f"gpus={gpus}, nodes={nodes}, node_rank={node_rank}: need gpus >= 0, nodes >= 1 and "
                         f"0 <= node_rank < nodes")
    py = python or sys.executable
    trainer = ["-m", module, str(config), "--out", str(run_dir), "--resume"]
    if gpus == 0:
        if nodes > 1:
            raise ValueError(f"gpus=0 with nodes={nodes}: the CPU path is one process on one node")
        return [py, *trainer]
    total = gpus * nodes
    argv = [str(Path(py).parent / "accelerate"), "launch", "--num_processes", str(total),
            "--num_machines", str(nodes), "--machine_rank", str(node_rank), "--dynamo_backend", "no",
            "--mixed_precision", "no"]  # the trainer's config sets its dtype and FSDP itself
    if total > 1:
        argv.append("--multi_gpu")
    if nodes > 1:
        if not master_addr:
            raise ValueError("nodes > 1 needs master_addr (the first host of the job)")
        argv += ["--main_process_ip", master_addr, "--main_process_port", str(master_port),
                 "--rdzv_backend", "static", "--same_network"]
    return argv + trainer


class SFTJob(CheckpointedCommand):
    """The trainer as a requeueable submitit job (see the module docstring)."""

    def __init__(self, config: str | Path, run_dir: str | Path, *, gpus: int = 0, nodes: int = 1,
                 master_port: int = 29500, save_wait_s: float = 240.0, module: str = TRAINER_MODULE,
                 env: dict[str, str] | None = None) -> None:
        self.config, self.run_dir = str(config), str(run_dir)
        self.gpus, self.nodes, self.master_port, self.module = int(gpus), int(nodes), int(master_port), module
        argv = launcher_argv(self.config, self.run_dir, gpus=self.gpus, nodes=self.nodes,
                             master_addr="localhost", master_port=self.master_port, module=module)
        super().__init__(argv, Path(self.run_dir) / "checkpoints", env=env,
                         ranks_match=None if self.gpus == 0 else module, save_wait_s=save_wait_s, name="sft")

    def __call__(self) -> dict[str, Any]:
        if self.nodes > 1:  # each node's task builds its launcher from the job it runs in
            import submitit

            job = submitit.JobEnvironment()
            self.argv = launcher_argv(self.config, self.run_dir, gpus=self.gpus, nodes=self.nodes,
                                      node_rank=job.node, master_addr=job.hostnames[0],
                                      master_port=self.master_port, module=self.module)
        out = super().__call__()
        out.update(run_dir=self.run_dir, final=str(Path(self.run_dir) / "final"))
        return out


def _validate(config: Path, module: str, trainer: str, world_size: int = 1) -> None:
    """Check that the ``trainer`` ("SFT" or "GRPO") ``module`` is installed and, for ours, read the
    config with its strict loader (no torch needed), so a bad config fails with file:line before
    anything is queued."""
    import importlib.util

    if importlib.util.find_spec(module) is None:
        raise SubmitError(f"{config}: this installation has no {module} (the {trainer} trainer)",
                          "install the checkout that has it ('make venv'), or run from it")
    if module == TRAINER_MODULE:
        from hydroagent_hpc.train.config import load_sft_config

        load_sft_config(config)
    elif module == GRPO_MODULE:
        from hydroagent_hpc.train.grpo_config import load_grpo_config

        load_grpo_config(config, world_size=world_size)


def submit_sft(config: str | Path, run_dir: str | Path, site: SiteSettings, *, gpus: int = 0, nodes: int = 1,
               cluster: str | None = None, wait: bool = False, max_requeues: int = 3, save_wait_s: float = 240.0,
               module: str = TRAINER_MODULE, validate: bool = True) -> dict[str, Any]:
    """Submit one SFT run; return its job id, cluster and folders (and the trainer's result when ``wait``).

    The arguments are those of :func:`submit_sft_job`, which also returns the submitit job.
    """
    job, out = submit_sft_job(config, run_dir, site, gpus=gpus, nodes=nodes, cluster=cluster,
                              max_requeues=max_requeues, save_wait_s=save_wait_s, module=module, validate=validate)
    if wait:
        out["result"] = job.result()
    return out


def submit_sft_job(config: str | Path, run_dir: str | Path, site: SiteSettings, *, gpus: int = 0, nodes: int = 1,
                   cluster: str | None = None, max_requeues: int = 3, save_wait_s: float = 240.0,
                   module: str = TRAINER_MODULE, validate: bool = True) -> tuple[Any, dict[str, Any]]:
    """Submit one SFT run; return ``(submitit job, summary)``.

    ``gpus`` per node (0: one CPU process); ``max_requeues`` time-limit requeues; on Slurm the
    warning signal comes ``save_wait_s + 60`` seconds before the limit, so the checkpoint and the
    final save both fit. Logs go to ``RUN/logs/<job id>/``; ``RUN/submit.json`` records the submission.
    """
    cfg = Path(config).resolve()
    if not cfg.is_file():
        raise SubmitError(f"{config}: no such SFT config file",
                          "give the path of a YAML such as data/train/sft-tiny.yaml")
    if gpus < 0 or nodes < 1:
        raise SubmitError(f"--gpus {gpus} --nodes {nodes}: need gpus >= 0 and nodes >= 1")
    if gpus == 0 and nodes > 1:
        raise SubmitError(f"--gpus 0 --nodes {nodes}: the CPU path is one process; use --nodes 1 or give GPUs")
    if max_requeues < 0:
        raise SubmitError(f"--max-requeues {max_requeues}: must be 0 or more")
    if validate:
        _validate(cfg, module, "SFT")
    run = Path(run_dir).resolve()
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ex = make_executor(logs, site.with_(gpus_per_node=gpus, ntasks=1), cluster, name=f"hydroagent-sft-{cfg.stem}",
                       max_num_timeout=max_requeues, nodes=nodes)
    if ex.cluster == "slurm":
        ex.update_parameters(slurm_signal_delay_s=int(save_wait_s) + 60)
    port = 29500 + os.getpid() % 1000
    job = ex.submit(SFTJob(cfg, run, gpus=gpus, nodes=nodes, master_port=port, save_wait_s=save_wait_s,
                           module=module))
    record = {"command": "submit sft", "config": str(cfg), "run_dir": str(run), "job_id": str(job.job_id),
              "cluster": ex.cluster, "gpus_per_node": gpus, "nodes": nodes, "max_requeues": max_requeues,
              "site": site.as_dict(), "submitted_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write_record(run, record)
    log.info("submitted SFT job %s (%s); logs in %s", job.job_id, ex.cluster, logs)
    out: dict[str, Any] = {"job_id": str(job.job_id), "cluster": ex.cluster, "run_dir": str(run),
                           "logs": str(logs), "final": str(run / "final")}
    return job, out


def _write_record(run: Path, record: dict[str, Any]) -> None:
    """``RUN/submit.json``, replaced atomically (a resubmission overwrites the previous record)."""
    tmp = run / ".submit.json.tmp"
    tmp.write_text(json.dumps(record, indent=2, default=str) + "\n")
    tmp.replace(run / "submit.json")


# --------------------------------------------------------------------------- GRPO


def _script_beside(python: str, name: str, need: str, fix: str) -> str:
    """The console script ``name`` beside ``python`` (the job's environment), else on PATH; ``need`` and
    ``fix`` make the error when there is none."""
    beside = Path(python).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    found = shutil.which(name)
    if found is None:
        raise SubmitError(f"{need} need {name}, and there is none beside the Python interpreter or on PATH", fix)
    return found


def mpiexec_path(python: str | None = None) -> str:
    """The ``mpiexec`` beside ``python`` (the mpich wheel installs one into the environment), else on PATH."""
    return _script_beside(python or sys.executable, "mpiexec", "simulation ranks",
                          "install the mpi extra (pip install mpi4py mpich), or give --sim-ranks 0 (simulations in "
                          "the trainer's threads)")


def grpo_argv(config: str, run_dir: str, *, module: str = GRPO_MODULE, python: str | None = None,
              sim_ranks: int = 0, trainers: int = 1) -> list[str]:
    """The GRPO job's command line (see the module docstring): one process with the simulations in its
    threads (``--pool threads``); with ``sim_ranks`` R > 0, ``mpiexec -launcher fork -n T+R`` of it with
    ``--pool mpi`` (and ``--trainers T`` when T > 1); with T > 1 trainers and no simulation ranks,
    ``torchrun --standalone --nproc_per_node T`` of it."""
    py = python or sys.executable
    if sim_ranks < 0:
        raise SubmitError(f"--sim-ranks {sim_ranks}: must be 0 (threads) or more")
    if trainers < 1:
        raise SubmitError(f"--trainers {trainers}: give 1 or more training processes")
    tail = [str(config), "--out", str(run_dir), "--resume", "--pool", "mpi" if sim_ranks else "threads"]
    if sim_ranks:
        if trainers > 1:
            tail += ["--trainers", str(trainers)]
        return [mpiexec_path(py), "-launcher", "fork", "-n", str(sim_ranks + trainers), py, "-m", module, *tail]
    if trainers > 1:
        torchrun = _script_beside(py, "torchrun", "several GRPO trainers",
                                  "install torch into the job's environment ('make venv'), or give --trainers 1")
        return [torchrun, "--standalone", "--nproc_per_node", str(trainers), "-m", module,
                *tail]
    return [py, "-m", module, *tail]


class GRPOJob(CheckpointedCommand):
    """The GRPO trainer as a requeueable submitit job (see the module docstring)."""

    def __init__(self, config: str | Path, run_dir: str | Path, *, save_wait_s: float = 540.0,
                 module: str = GRPO_MODULE, env: dict[str, str] | None = None, sim_ranks: int = 0,
                 trainers: int = 1) -> None:
        self.config, self.run_dir, self.module, self.sim_ranks = str(config), str(run_dir), module, int(sim_ranks)
        self.trainers = int(trainers)
        launched = bool(self.sim_ranks) or self.trainers > 1  # mpiexec or torchrun: signal the ranks themselves
        super().__init__(grpo_argv(self.config, self.run_dir, module=module, sim_ranks=self.sim_ranks,
                                   trainers=self.trainers),
                         Path(self.run_dir) / "checkpoints", env=env,
                         ranks_match=module if launched else None, rank0_only=bool(self.sim_ranks),
                         save_wait_s=save_wait_s, name="grpo")

    def __call__(self) -> dict[str, Any]:
        out = super().__call__()
        out.update(run_dir=self.run_dir, final=str(Path(self.run_dir) / "final"))
        return out


def submit_grpo(config: str | Path, run_dir: str | Path, site: SiteSettings, *, gpus: int = 0,
                cluster: str | None = None, wait: bool = False, max_requeues: int = 3, save_wait_s: float = 540.0,
                module: str = GRPO_MODULE, validate: bool = True, sim_ranks: int = 0,
                trainers: int | None = None) -> dict[str, Any]:
    """Submit one GRPO run; return its job id, cluster and folders (and the trainer's result when ``wait``).

    The arguments are those of :func:`submit_grpo_job`, which also returns the submitit job.
    """
    job, out = submit_grpo_job(config, run_dir, site, gpus=gpus, cluster=cluster, max_requeues=max_requeues,
                               save_wait_s=save_wait_s, module=module, validate=validate, sim_ranks=sim_ranks,
                               trainers=trainers)
    if wait:
        out["result"] = job.result()
    return out


def submit_grpo_job(config: str | Path, run_dir: str | Path, site: SiteSettings, *, gpus: int = 0,
                    cluster: str | None = None, max_requeues: int = 3, save_wait_s: float = 540.0,
                    module: str = GRPO_MODULE, validate: bool = True, sim_ranks: int = 0,
                    trainers: int | None = None) -> tuple[Any, dict[str, Any]]:
    """Submit one GRPO run as one task; return ``(submitit job, summary)``.

    ``gpus``: the GPUs of the task, 0 to train on CPU (tiny models); ``trainers``: training processes,
    by default one per GPU (1 on CPU), at most ``gpus`` when there are GPUs (the rest can serve an
    engine). The task's ``site.cpus_per_task`` CPUs run the trainers and their simulation threads, or,
    with ``sim_ranks`` R > 0, the trainers and R MPI simulation ranks (the task gets at least T + R
    CPUs). ``max_requeues``
    time-limit requeues; on Slurm the warning signal comes ``save_wait_s + 60`` seconds before the
    limit. Logs go to ``RUN/logs/<job id>/``; ``RUN/submit.json`` records the submission.
    """
    cfg = Path(config).resolve()
    if not cfg.is_file():
        raise SubmitError(f"{config}: no such GRPO config file",
                          "give the path of a GRPO YAML (basins, group_size, ...; see hydroagent_hpc/train/"
                          "grpo_config.py)")
    if gpus < 0:
        raise SubmitError(f"--gpus {gpus}: give the GPUs of the job, or 0 to train on CPU (tiny models)")
    n_trainers = (gpus or 1) if trainers is None else int(trainers)
    if n_trainers < 1:
        raise SubmitError(f"--trainers {n_trainers}: give 1 or more training processes")
    if gpus and n_trainers > gpus:
        raise SubmitError(f"--trainers {n_trainers} with --gpus {gpus}: one trainer process per GPU",
                          f"give --gpus {n_trainers}, or fewer trainers")
    if max_requeues < 0:
        raise SubmitError(f"--max-requeues {max_requeues}: must be 0 or more")
    if save_wait_s <= 0:
        raise SubmitError(f"--save-wait {save_wait_s}: must be positive")
    if validate:
        _validate(cfg, module, "GRPO", world_size=n_trainers)
    job_cmd = GRPOJob(cfg, Path(run_dir).resolve(), save_wait_s=save_wait_s, module=module, sim_ranks=sim_ranks,
                      trainers=n_trainers)  # before any folder exists: a missing launcher is refused here
    run = Path(run_dir).resolve()
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    cpus = max(site.cpus_per_task or 1, sim_ranks + n_trainers) if sim_ranks else site.cpus_per_task
    ex = make_executor(logs, site.with_(gpus_per_node=gpus, ntasks=1, cpus_per_task=cpus), cluster,
                       name=f"hydroagent-grpo-{cfg.stem}", max_num_timeout=max_requeues)
    if ex.cluster == "slurm":
        ex.update_parameters(slurm_signal_delay_s=int(save_wait_s) + 60)
    job = ex.submit(job_cmd)
    record = {"command": "submit grpo", "config": str(cfg), "run_dir": str(run), "job_id": str(job.job_id),
              "cluster": ex.cluster, "gpus_per_node": gpus, "pool": "mpi" if sim_ranks else "threads",
              "sim_ranks": sim_ranks, "trainers": n_trainers, "max_requeues": max_requeues,
              "site": site.as_dict(), "submitted_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write_record(run, record)
    log.info("submitted GRPO job %s (%s); logs in %s", job.job_id, ex.cluster, logs)
    out: dict[str, Any] = {"job_id": str(job.job_id), "cluster": ex.cluster, "run_dir": str(run),
                           "logs": str(logs), "final": str(run / "final")}
    return job, out
