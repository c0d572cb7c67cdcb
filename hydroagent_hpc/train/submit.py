"""``hydroagent train submit sft|grpo``: a training run as a submitit job that survives requeues.

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
(:func:`hydroagent_hpc.train.sft.config.load_sft_config`), so a typo fails here, not in the queue; the
trainer itself (torch) is never imported by this module.

:class:`GRPOJob` (``hydroagent train submit grpo CONFIG --out RUN``) is the same protocol for the GRPO
trainer, ``python -m hydroagent_hpc.train.grpo CONFIG --out RUN --resume --pool threads``: one
process that trains (on its GPU, or on CPU with ``gpus == 0``) and runs the simulations in its own
threads, so the job has one task and SIGUSR1/SIGTERM go to that process. The trainer acts on them
at the end of its current step (a GRPO step is long: the default wait is 540 s and Slurm's warning
comes 600 s before the limit). With ``sim_ranks = R > 0`` (``--sim-ranks R``) the simulations run
on R MPI ranks beside the trainer instead of its threads: the job's one task gets ``R + 1`` CPUs and
runs ``mpiexec -launcher fork -n R+1 python -m hydroagent_hpc.train.grpo ... --pool mpi``
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
:func:`hydroagent_hpc.train.grpo.config.load_grpo_config` (for T processes) before anything is queued.
When the config launches its own inference engine (``generator: engine`` with ``engine.launch``), the
default is T = G - 1 trainers: the engine, started by trainer rank 0, takes the GPUs after the first T
(:func:`grpo_trainers`; one GPU, or T >= G, is refused), as ``slurm/grpo.sbatch`` does.

Host CPUs and memory (audit F10). On GPUs every training process loads the whole fp32 model on the host
before it is sharded, rank 0 gathers the full weights and optimizer state at each checkpoint, and GRPO's
rank 0 also plays the rollouts; one CPU and the site's default memory starve them. So, unless the
command line (or the environment) gives ``--cpus-per-task`` / ``--mem-gb``, a GPU job asks for
:func:`sft_host_request` (8 CPUs per GPU process; memory from the model's size, or 64 GB per GPU when
the model folder is not there yet) or :func:`grpo_host_request` (8 CPUs per trainer process and for a
launched engine, one per simulation slot; 4 GB per CPU, as ``slurm/grpo.sbatch``), and logs the request
and how it was reached. CPU jobs (tiny models) keep the site's values.
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import sys
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.hpc.jobs import CheckpointedCommand
from hydroagent_hpc.hpc.slurm import SiteSettings, make_executor
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.train.sft.config import load_sft_config

log = logging.getLogger(__name__)

__all__ = ["TRAINER_MODULE", "GRPO_MODULE", "SFTJob", "GRPOJob", "SubmitError", "launcher_argv", "grpo_argv",
           "submit_sft", "submit_sft_job", "submit_grpo", "submit_grpo_job", "HostRequest", "count_parameters",
           "model_parameters", "sft_host_memory_gb", "sft_host_request", "grpo_host_request", "grpo_trainers",
           "grpo_launches_engine"]

#: The trainer's entry point (``python -m``).
TRAINER_MODULE = "hydroagent_hpc.train.sft"
#: The GRPO trainer's entry point (``python -m``).
GRPO_MODULE = "hydroagent_hpc.train.grpo"


class SubmitError(HydroAgentError):
    """A training submission that cannot start (missing config, bad sizes, no trainer installed)."""


# --------------------------------------------------------------------------- host CPUs and memory (F10)

#: CPUs per training process (and for a launched engine) when the site does not say: slurm/sft.sbatch
#: asks 32 for 4 GPUs, slurm/grpo.sbatch 8 per trainer rank.
CPUS_PER_RANK = 8
#: Host memory per GPU process when the model's size is unknown: slurm/sft.sbatch asks 256 GB for 4 GPUs.
MEM_GB_PER_GPU = 64.0
#: Host memory of one training process besides the model (CUDA context, torch, transformers, tokenizer, data).
RANK_OVERHEAD_GB = 4.0
#: Headroom on the computed memory.
MEM_MARGIN = 1.1
#: Host memory per CPU of a GRPO job, slurm/grpo.sbatch's --mem-per-cpu=4G (a simulation rank's basin forcing).
GRPO_MEM_GB_PER_CPU = 4.0


@dataclass(frozen=True)
class HostRequest:
    """The CPUs and memory a training job asks for, and how they were reached (logged and recorded)."""

    cpus_per_task: int
    mem_gb: float | None
    why: str


def count_parameters(cfg: dict[str, Any]) -> int:
    """Parameters of a decoder-only transformer from its ``config.json`` (Llama/Qwen layout).

    With hidden size ``H``, MLP size ``I``, ``L`` layers, ``n_q`` query and ``n_kv`` key/value heads
    of size ``d`` (``head_dim``, default ``H / n_q``) and vocabulary ``V``:
    ``P = V*H*(1 if tied else 2) + H + L*(H*d*(2*n_q + 2*n_kv) + 3*H*I + 2*H + 2*d)``
    (embedding and untied head; final norm; per layer the q, k, v, o projections, the gated MLP's three
    matrices, two RMS norms and Qwen3's q/k norms; attention biases, where ``attention_bias``, add
    ``d*(n_q + 2*n_kv)`` per layer). Qwen3-4B: 4.02e9.
    """
    h, i, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    n_q = int(cfg["num_attention_heads"])
    n_kv = int(cfg.get("num_key_value_heads") or n_q)
    d = int(cfg.get("head_dim") or h // n_q)
    vocab = int(cfg["vocab_size"])
    tied = bool(cfg.get("tie_word_embeddings", False))
    per_layer = h * d * (2 * n_q + 2 * n_kv) + 3 * h * i + 2 * h + 2 * d
    if cfg.get("attention_bias"):
        per_layer += d * (n_q + 2 * n_kv)
    return vocab * h * (1 if tied else 2) + h + layers * per_layer


def model_parameters(model: str | Path) -> int | None:
    """:func:`count_parameters` of a ``save_pretrained`` folder's ``config.json``; None when there is none
    yet (``tiny``, a folder a later stage writes) or it is not a decoder config this formula knows."""
    try:
        cfg = json.loads((Path(model) / "config.json").read_text())
        return count_parameters(cfg.get("text_config", cfg))
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError, AttributeError):
        return None


def sft_host_memory_gb(ranks: int, n_params: int) -> float:
    """Host memory (GB) for ``ranks`` processes of SFT of a model with ``n_params`` parameters:
    ``1.1 * (4 B * P * (ranks + 3) + ranks * 4 GB)``: every process loads the whole fp32 model
    (``4 P`` bytes each) before it is sharded, rank 0 gathers the fp32 weights and both AdamW moments
    (``12 P``) at a checkpoint, and each process carries its own runtime (``RANK_OVERHEAD_GB``); 10 %
    headroom. Qwen3-4B (4.02e9): 142 GB on 4 GPUs, 230 GB on 8, 76 GB on 1."""
    if ranks < 1 or n_params < 1:
        raise ValueError(f"ranks={ranks}, n_params={n_params}: both must be positive")
    return MEM_MARGIN * (4 * n_params * (ranks + 3) / 1e9 + ranks * RANK_OVERHEAD_GB)


def sft_host_request(gpus: int, n_params: int | None) -> HostRequest:
    """What one node of an SFT job on ``gpus`` GPUs asks for: ``CPUS_PER_RANK`` CPUs per GPU process and
    :func:`sft_host_memory_gb` rounded up (``MEM_GB_PER_GPU`` per GPU when the model's size is unknown)."""
    if gpus < 1:
        raise ValueError(f"gpus={gpus}: the host request is for GPU jobs")
    cpus = CPUS_PER_RANK * gpus
    if n_params:
        mem = math.ceil(sft_host_memory_gb(gpus, n_params))
        why = (f"{gpus} process(es) x {CPUS_PER_RANK} CPUs; memory 1.1 x (4 B x {n_params / 1e9:.2f}e9 parameters x "
               f"({gpus} + 3) + {gpus} x {RANK_OVERHEAD_GB:g} GB)")
    else:
        mem = math.ceil(MEM_GB_PER_GPU * gpus)
        why = (f"{gpus} process(es) x {CPUS_PER_RANK} CPUs; memory {MEM_GB_PER_GPU:g} GB per GPU (the model's size "
               f"is unknown: no config.json in its folder yet)")
    return HostRequest(cpus, float(mem), why)


def grpo_host_request(trainers: int, engine: bool, sim_slots: int) -> HostRequest:
    """What a GRPO GPU job asks for: ``cpus = trainers * 8 + (8 if engine) + sim_slots`` (the CPUs of
    slurm/grpo.sbatch's layout: trainer rank 0 also runs the rollout threads, the generation server or
    HTTP clients and the HDF5 writes; each simulation, on an MPI rank or a thread, one CPU) and
    ``GRPO_MEM_GB_PER_CPU`` GB per CPU."""
    if trainers < 1 or sim_slots < 0:
        raise ValueError(f"trainers={trainers}, sim_slots={sim_slots}: need trainers >= 1, sim_slots >= 0")
    engine_cpus = CPUS_PER_RANK if engine else 0
    cpus = trainers * CPUS_PER_RANK + engine_cpus + sim_slots
    why = (f"{trainers} trainer(s) x {CPUS_PER_RANK} CPUs + {engine_cpus} for the engine + {sim_slots} simulation "
           f"slot(s); {GRPO_MEM_GB_PER_CPU:g} GB per CPU")
    return HostRequest(cpus, cpus * GRPO_MEM_GB_PER_CPU, why)


def _with_host_request(site: SiteSettings, request: HostRequest, what: str) -> SiteSettings:
    """``site`` with ``request``'s CPUs and memory where the user gave none (logged either way)."""
    cpus = site.cpus_per_task if site.has("cpus_per_task") else request.cpus_per_task
    mem = site.mem_gb if site.has("mem_gb") else request.mem_gb
    log.info("%s job asks for %d CPUs and %s per node (computed: %d CPUs, %s GB: %s)%s", what, cpus,
             "the site's default memory" if mem is None else f"{mem:g} GB", request.cpus_per_task,
             "-" if request.mem_gb is None else f"{request.mem_gb:g}", request.why,
             "; --cpus-per-task/--mem-gb as given" if site.has("cpus_per_task") or site.has("mem_gb") else "")
    return site.with_(cpus_per_task=cpus, mem_gb=mem)


def _raw_yaml(config: str | Path) -> dict[str, Any]:
    """The config's top-level mapping, read leniently (layout questions only; the trainers' strict
    loaders report every error); ``{}`` when the file does not parse as a mapping."""
    import yaml

    try:
        data = yaml.safe_load(Path(config).read_text())
    except (OSError, yaml.YAMLError):
        return {}
    return data if isinstance(data, dict) else {}


def grpo_launches_engine(config: str | Path) -> bool:
    """Whether the GRPO config starts its own inference engine (``generator: engine`` with a non-empty
    ``engine.launch`` list): it then needs GPUs no trainer uses. slurm/grpo.sbatch asks this too."""
    data = _raw_yaml(config)
    engine = data.get("engine")
    return (data.get("generator") == "engine" and isinstance(engine, dict)
            and isinstance(engine.get("launch"), list) and bool(engine["launch"]))


def grpo_trainers(gpus: int, launches_engine: bool, trainers: int | None = None) -> int:
    """The number of training processes T: ``trainers`` when given, else ``gpus - 1`` when the config
    launches an engine (it takes the GPUs after the first T), else one per GPU (1 on CPU). Refuses
    layouts that leave no GPU for a trainer or for the engine, and more trainers than GPUs."""
    if trainers is None:
        trainers = gpus - 1 if gpus and launches_engine else (gpus or 1)
        if trainers < 1:
            raise SubmitError(f"--gpus {gpus}: the config launches an inference engine (generator: engine with "
                              f"engine.launch), which needs a GPU of its own, so no GPU is left for a trainer",
                              "give --gpus 2 or more (GPUs - 1 trainers, the engine on the rest), or start the "
                              "engine elsewhere and give engine.url without engine.launch")
    if trainers < 1:
        raise SubmitError(f"--trainers {trainers}: give 1 or more training processes")
    if gpus and trainers > gpus:
        raise SubmitError(f"--trainers {trainers} with --gpus {gpus}: one trainer process per GPU",
                          f"give --gpus {trainers}, or fewer trainers")
    if gpus and launches_engine and trainers >= gpus:
        raise SubmitError(f"--trainers {trainers} with --gpus {gpus} leave no GPU for the engine the config launches "
                          f"(engine.launch)", f"give --trainers {gpus - 1} (or leave it out), or --gpus {trainers + 1}")
    return trainers


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

        load_sft_config(config)
    elif module == GRPO_MODULE:

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
    request = None
    if gpus:  # every process loads the whole fp32 model on the host: CPUs and memory for them (F10)
        request = sft_host_request(gpus, model_parameters(_sft_model_dir(cfg)))
        site = _with_host_request(site, request, "SFT")
    run = Path(run_dir).resolve()
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    ex = make_executor(logs, site.with_(gpus_per_node=gpus, ntasks=1), cluster, name=f"hydroagent-sft-{cfg.stem}",
                       max_num_timeout=max_requeues, nodes=nodes)
    if ex.cluster == "slurm":
        ex.update_parameters(slurm_signal_delay_s=int(save_wait_s) + 60)
    port = 29500 + os.getpid() % 1000
    # accelerate launch gives each process OMP_NUM_THREADS=1 unless told: its share of the task's CPUs
    threads = {"OMP_NUM_THREADS": str(max(1, site.cpus_per_task // gpus))} if gpus else None
    job = ex.submit(SFTJob(cfg, run, gpus=gpus, nodes=nodes, master_port=port, save_wait_s=save_wait_s,
                           module=module, env=threads))
    record = {"command": "train submit sft", "config": str(cfg), "run_dir": str(run), "job_id": str(job.job_id),
              "cluster": ex.cluster, "gpus_per_node": gpus, "nodes": nodes, "max_requeues": max_requeues,
              "site": site.as_dict(), "host_request": None if request is None else request.__dict__,
              "submitted_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write_record(run, record)
    log.info("submitted SFT job %s (%s); logs in %s", job.job_id, ex.cluster, logs)
    out: dict[str, Any] = {"job_id": str(job.job_id), "cluster": ex.cluster, "run_dir": str(run),
                           "logs": str(logs), "final": str(run / "final")}
    return job, out


def _sft_model_dir(config: Path) -> Path:
    """The SFT config's ``model`` folder, relative to the config's folder as the trainer resolves it
    (``tiny`` names no folder: the result has no config.json)."""
    model = str(_raw_yaml(config).get("model", "tiny"))
    return (config.parent / model).resolve()


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
                          "grpo/config.py)")
    if gpus < 0:
        raise SubmitError(f"--gpus {gpus}: give the GPUs of the job, or 0 to train on CPU (tiny models)")
    engine = grpo_launches_engine(cfg)
    n_trainers = grpo_trainers(gpus, engine, None if trainers is None else int(trainers))
    if max_requeues < 0:
        raise SubmitError(f"--max-requeues {max_requeues}: must be 0 or more")
    if save_wait_s <= 0:
        raise SubmitError(f"--save-wait {save_wait_s}: must be positive")
    if validate:
        _validate(cfg, module, "GRPO", world_size=n_trainers)
    # torchrun gives each trainer OMP_NUM_THREADS=1 unless told; on GPUs a trainer has CPUS_PER_RANK CPUs
    threads = {"OMP_NUM_THREADS": str(CPUS_PER_RANK)} if gpus else None
    job_cmd = GRPOJob(cfg, Path(run_dir).resolve(), save_wait_s=save_wait_s, module=module, sim_ranks=sim_ranks,
                      trainers=n_trainers, env=threads)  # before any folder exists: a missing launcher is refused
    run = Path(run_dir).resolve()
    logs = run / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    request = None
    if gpus:  # trainer rank 0 plays the rollouts: CPUs of its own, beside the engine's and the simulations' (F10)
        slots = sim_ranks or int(_raw_yaml(cfg).get("max_simulations_in_flight", 32))
        request = grpo_host_request(n_trainers, engine, slots)
        site = _with_host_request(site, request, "GRPO")
        cpus = site.cpus_per_task
    else:
        cpus = max(site.cpus_per_task or 1, sim_ranks + n_trainers) if sim_ranks else site.cpus_per_task
    ex = make_executor(logs, site.with_(gpus_per_node=gpus, ntasks=1, cpus_per_task=cpus), cluster,
                       name=f"hydroagent-grpo-{cfg.stem}", max_num_timeout=max_requeues)
    if ex.cluster == "slurm":
        ex.update_parameters(slurm_signal_delay_s=int(save_wait_s) + 60)
    job = ex.submit(job_cmd)
    record = {"command": "train submit grpo", "config": str(cfg), "run_dir": str(run), "job_id": str(job.job_id),
              "cluster": ex.cluster, "gpus_per_node": gpus, "pool": "mpi" if sim_ranks else "threads",
              "sim_ranks": sim_ranks, "trainers": n_trainers, "max_requeues": max_requeues,
              "site": site.as_dict(), "host_request": None if request is None else request.__dict__,
              "submitted_utc": datetime.now(timezone.utc).isoformat(timespec="seconds")}
    _write_record(run, record)
    log.info("submitted GRPO job %s (%s); logs in %s", job.job_id, ex.cluster, logs)
    out: dict[str, Any] = {"job_id": str(job.job_id), "cluster": ex.cluster, "run_dir": str(run),
                           "logs": str(logs), "final": str(run / "final")}
    return job, out
