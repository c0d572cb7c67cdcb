"""The GRPO entry point that splits MPI ranks before torch is loaded.

``python -m hydroagent_hpc.train.grpo CONFIG --out RUN [--resume] [--pool threads|mpi] [--trainers T]``
(what ``slurm/grpo.sbatch`` runs on every rank) and ``hydroagent train grpo`` share :func:`build_parser`
and :func:`run`. Any key of the GRPO config that holds a value can be given as an option (``--lr``,
``--group-size``, ``--basins B --basins C``, ...): the options are made from the config's fields
(:mod:`hydroagent_hpc.settings`), with the file's help and limits, and replace the file's values.
Under ``torchrun``/``accelerate launch`` (``WORLD_SIZE`` > 1) every process trains a part of each
step (:mod:`hydroagent_hpc.train.grpo.trainer`); that needs ``generator: engine`` and ``--pool threads``.
With ``--pool mpi`` every rank enters the MPI pool first; only rank 0 then imports the trainer
(:mod:`hydroagent_hpc.train.grpo.trainer`, torch and transformers), while the simulation ranks serve
:func:`hydroagent_hpc.sim.task.simulate_task` without ever loading torch (about 300 MB and 2 s
less per rank). ``--pool mpi --trainers T`` (T > 1, ``generator: engine``): the first T ranks of
the MPI world are the training processes (their torch process group is set up from the MPI world,
as ``torchrun`` would: :func:`hydroagent_hpc.hpc.mpi.split_trainers`), rank 0 also being the pool's
root; ranks T.. simulate. This module imports nothing heavy.
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError, HydroAgentError, one_line
from hydroagent_hpc.settings import add_arguments, arguments_given, option_names
from hydroagent_hpc.train.grpo.config import GRPOConfig, load_grpo_config
from hydroagent_hpc.train.signals import early_usr1_ignored
from hydroagent_hpc.train.writes import stopped_by_io

log = logging.getLogger("hydroagent_hpc.train.grpo")

__all__ = ["build_parser", "run", "main", "CONFIG_OPTIONS"]

#: The GRPO config keys that are also command-line options (the nested ``env`` and ``engine``
#: sections stay in the file).
CONFIG_OPTIONS = option_names(GRPOConfig)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="hydroagent train grpo",
                                          description="GRPO with the simulator as the verifier (docs/grpo.md).")
    p.add_argument("config", type=Path, help="GRPO config (strict YAML; see hydroagent_hpc/train/grpo/config.py)")
    p.add_argument("--out", type=Path, required=True, help="run folder (checkpoints, metrics, rollouts.h5, final/)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its latest checkpoint")
    p.add_argument("--pool", choices=("threads", "mpi"), default="threads",
                   help="where simulations run: threads of this process (default), or the worker ranks of an MPI "
                        "launch (srun --mpi=pmi2 / mpiexec; rank 0 trains, the others simulate)")
    p.add_argument("--trainers", type=_positive, default=1, metavar="T",
                   help="with --pool mpi: the first T ranks train together (one process per GPU; T > 1 needs "
                        "generator: engine), the other ranks simulate (default 1)")
    p.add_argument("--sim-timeout", type=float, default=600.0,
                   help="seconds before a simulation on a worker rank is killed and recorded as failed (mpi)")
    keys = p.add_argument_group("config keys", "each replaces the CONFIG file's value (give the same ones again "
                                               "with --resume: a resumed run refuses another config)")
    add_arguments(keys, GRPOConfig, CONFIG_OPTIONS, defaults=dict.fromkeys(CONFIG_OPTIONS))
    return p


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"--trainers {text!r}: give a whole number of training processes, 1 or more")
    return value


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Run from parsed arguments: rank 0 (or the only process) trains and gets the summary; MPI
    simulation ranks serve until training is done and get ``{"worker": True, "stopped": None}``. An
    ``OSError`` of the run (its folder, a full disk) ends as one line
    (:func:`~hydroagent_hpc.train.writes.stopped_by_io`)."""
    try:
        return _run(args)
    except OSError as exc:
        raise stopped_by_io(exc, args.out) from None


def _run(args: argparse.Namespace) -> dict[str, Any]:

    world_size = int(os.environ.get("WORLD_SIZE", "1"))  # torchrun / accelerate launch set it
    pool_kind = getattr(args, "pool", "threads")
    trainers = int(getattr(args, "trainers", 1))
    if trainers > 1 and pool_kind != "mpi":
        raise ConfigError(f"--trainers {trainers} with --pool {pool_kind}: --trainers splits the ranks of an MPI "
                              f"launch into training and simulation ranks",
                              "add --pool mpi and start every rank with srun --mpi=pmi2 or mpiexec (slurm/grpo.sbatch "
                              "does), or start the training processes with torchrun/accelerate launch and --pool "
                              "threads, without --trainers")
    if world_size > 1 and pool_kind == "mpi":
        raise ConfigError(f"--pool mpi with {world_size} training processes started by a launcher "
                              f"(WORLD_SIZE={world_size}): the simulation ranks must share the trainers' MPI world",
                              "use --pool threads under torchrun/accelerate launch (rank 0 runs the simulations in "
                              "its threads), or start every rank with srun --mpi=pmi2/mpiexec and pass --pool mpi "
                              f"--trainers {world_size} (slurm/grpo.sbatch does)")
    config = load_grpo_config(args.config, world_size=trainers if pool_kind == "mpi" else world_size,
                              overrides=arguments_given(args, CONFIG_OPTIONS))
    if pool_kind != "mpi":
        from hydroagent_hpc.train.grpo.trainer import train_grpo

        return train_grpo(config, args.out, resume=args.resume)

    from hydroagent_hpc.hpc.mpi import mpi_pool, split_trainers  # lazy: tests/test_architecture.py LAZY_OWN_IMPORTS

    comm = None
    if trainers > 1:
        try:
            port = int(os.environ["MASTER_PORT"]) if os.environ.get("MASTER_PORT") else None
        except ValueError:
            raise ConfigError(f"MASTER_PORT={os.environ['MASTER_PORT']!r} is not a port number",
                                  "unset it (trainer rank 0 then finds a free port) or give a number") from None
        try:
            split = split_trainers(trainers, master_addr=os.environ.get("MASTER_ADDR") or None, master_port=port)
        except ValueError as exc:
            raise ConfigError(f"--trainers {trainers}: {exc}", "launch more ranks or lower --trainers") from None
        if split.trainer:
            os.environ.update(split.torch_env())
            log.info("trainer rank %d of %d (local rank %d of %d), process group at %s:%d", split.rank, trainers,
                     split.local_rank, split.local_trainers, split.master_addr, split.master_port)
        if split.pool_comm is None:  # trainer ranks 1..: train only; rank 0 drives the pool
            from hydroagent_hpc.train.grpo.trainer import train_grpo

            return train_grpo(config, args.out, resume=args.resume)
        comm = split.pool_comm
    with mpi_pool(max_in_flight=config.max_simulations_in_flight, timeout_s=args.sim_timeout, comm=comm) as pool:
        if pool is None:
            return {"worker": True, "stopped": None}
        from hydroagent_hpc.train.grpo.trainer import train_grpo

        return train_grpo(config, args.out, resume=args.resume, pool=pool)


def main(argv: Sequence[str] | None = None) -> int:
    """The result and errors go to the log (stderr). Exit status 0 when the run reached
    ``max_steps``, 143 when SIGTERM stopped it after its checkpoint (Slurm requeues it and
    ``--resume`` continues), the error's own status on an error."""

    args = build_parser().parse_args(argv)
    if not logging.getLogger().handlers:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    try:
        with early_usr1_ignored():
            summary = run(args)
    except HydroAgentError as exc:
        log.error("error: %s", one_line(exc))
        return exc.exit_code
    rank = int(os.environ.get("RANK", "0"))
    if not summary.get("worker") and rank == 0:
        log.info("result: %s", summary)
    elif not summary.get("worker"):
        log.info("trainer rank %d: done at step %s%s", rank, summary.get("steps"),
                 f" (stopped by {summary['stopped']})" if summary.get("stopped") else "")
    return 0 if summary["stopped"] is None else 143
