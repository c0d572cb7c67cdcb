"""Checkpoints that resume exactly: model, optimizer, scheduler, sampler position and RNG states.

Layout under ``RUN_DIR/checkpoints``::

    step-N/model.pt      full (gathered) model state dict, fp32
    step-N/optim.pt      full optimizer state dict (parameter names as keys)
    step-N/trainer.pt    step, sampler position (epoch, index), scheduler state, RNG states, counters
    latest               the text "step-N": the newest complete checkpoint

Atomicity: a checkpoint is written into ``step-N.tmp/`` (files fsynced), renamed to ``step-N``, and
only then ``latest`` is replaced (write ``latest.tmp``, fsync, ``os.replace``). A kill at any point
leaves ``latest`` naming a complete checkpoint (the previous one until the rename is done); stray
``*.tmp`` folders are removed by the next save. Only ``keep`` checkpoints are kept (0 = all).

The state dicts are gathered with ``torch.distributed.checkpoint.state_dict`` (full state dict,
offloaded to the CPU of rank 0), so the same files come from a single process, DDP or FSDP2 and
load into any of them; rank 0 reads the files and broadcasts (``broadcast_from_rank0``).
"""

from __future__ import annotations

import logging
import os
import random
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from hydroagent_hpc.errors import ConfigError

log = logging.getLogger(__name__)

__all__ = ["TrainerState", "rng_state", "set_rng_state", "cuda_state_for", "rank_rng_state", "latest_checkpoint",
           "save_checkpoint", "load_checkpoint", "full_model_state", "FAULT_ENV", "fault"]

_STEP = re.compile(r"^step-(\d+)$")

#: Test-only fault injection: a comma list of ``kill:K`` (SIGKILL itself after step K),
#: ``kill_in_save:K`` (SIGKILL in the middle of writing checkpoint K), ``kill_after_rollouts:K``
#: (GRPO: SIGKILL once step K's rollouts are stored, before its update), ``usr1:K`` / ``term:K``
#: (send itself SIGUSR1 / SIGTERM after step K, through the real handlers).
FAULT_ENV = "HYDROAGENT_SFT_FAULTS"


def fault(point: str, step: int) -> None:
    """Act on :data:`FAULT_ENV` at ``point`` (kill, kill_in_save, term_in_save, usr1, term) of ``step``."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    import signal

    signals = {"kill": signal.SIGKILL, "kill_in_save": signal.SIGKILL, "kill_after_rollouts": signal.SIGKILL,
               "usr1": signal.SIGUSR1, "term": signal.SIGTERM, "term_in_save": signal.SIGTERM}
    for item in spec.split(","):
        name, _, at = item.strip().partition(":")
        if name == point and at.strip() == str(step) and name in signals:
            log.warning("fault injection (%s): %s at step %d", FAULT_ENV, name, step)
            os.kill(os.getpid(), signals[name])


@dataclass
class TrainerState:
    """What besides model and optimizer a resumed run needs: where it was and what it had counted."""

    step: int = 0  # optimizer steps done
    epoch: int = 0  # sampler position: the next step runs micro-batches of this epoch ...
    index: int = 0  # ... from this step of the epoch's plan
    tokens: int = 0  # tokens (non-padding, all ranks) trained on so far
    micro_per_step: int = 0  # processes x grad_accum when saved (the sampler position depends on it)


def _is_dist() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _is_dist() else 0


def _barrier() -> None:
    if _is_dist():
        dist.barrier()


def rng_state() -> dict[str, Any]:
    """This process's Python, NumPy, torch CPU and (when present) CUDA RNG states.

    The CUDA state is that of this process's own device only (``torch.cuda.current_device()``): a
    rank uses one device, and the states of all visible devices would not restore where fewer are
    visible (``set_rng_state_all`` indexes them by position; gpu-audit F12).
    """
    state: dict[str, Any] = {"python": random.getstate(), "numpy": np.random.get_state(),
                             "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state(torch.cuda.current_device())
    return state


def cuda_state_for(saved: Any, device_index: int) -> torch.Tensor | None:
    """The saved CUDA RNG state to restore on device ``device_index``.

    ``saved`` is one device's state (a ByteTensor: what :func:`rng_state` writes) or, in checkpoints
    written before it, a list of every visible device's states: that list's entry for
    ``device_index`` when the writer saw that many devices, else its first (a run saved with 4
    visible GPUs resumed with 1). None when nothing was saved.
    """
    if saved is None:
        return None
    if isinstance(saved, torch.Tensor):
        return saved
    states: list[torch.Tensor] = list(saved)
    if not states:
        return None
    return states[device_index] if 0 <= device_index < len(states) else states[0]


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore :func:`rng_state`'s states; the CUDA state only on this process's own device."""
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if torch.cuda.is_available():
        device = torch.cuda.current_device()
        cuda = cuda_state_for(state.get("cuda"), device)
        if cuda is not None:
            torch.cuda.set_rng_state(cuda, device)


def _rank_rng_states() -> list[dict[str, Any]] | None:
    """Every rank's :func:`rng_state`, gathered on rank 0 (None on the others); a collective."""
    mine = rng_state()
    if not _is_dist():
        return [mine]
    gathered: list[Any] | None = [None] * dist.get_world_size() if _rank() == 0 else None
    dist.gather_object(mine, gathered, dst=0)
    return gathered


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint ``RUN_DIR/checkpoints/latest`` names, or None when there is none yet."""
    ckpts = Path(run_dir) / "checkpoints"
    pointer = ckpts / "latest"
    if not pointer.is_file():
        return None
    name = pointer.read_text().strip()
    path = ckpts / name
    if not _STEP.match(name) or not (path / "trainer.pt").is_file():
        raise ConfigError(f"{pointer}: names {name!r}, which is not a complete checkpoint",
                          "remove the pointer to start over, or point it at an existing step-N folder")
    return path


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _write_pointer(ckpts: Path, name: str) -> None:
    tmp = ckpts / "latest.tmp"
    tmp.write_text(name + "\n")
    _fsync_file(tmp)
    os.replace(tmp, ckpts / "latest")
    _fsync_file(ckpts)


_FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The whole model's state dict on rank 0's CPU (empty on other ranks under FSDP)."""
    state: dict[str, torch.Tensor] = get_model_state_dict(model, options=_FULL)  # type: ignore[assignment]
    return state


def save_checkpoint(run_dir: str | os.PathLike[str], model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any, state: TrainerState, *, keep: int = 2) -> Path:
    """Write checkpoint ``step-{state.step}`` atomically (collective: every rank calls it)."""
    ckpts = Path(run_dir) / "checkpoints"
    name = f"step-{state.step}"
    final = ckpts / name
    model_sd = get_model_state_dict(model, options=_FULL)
    optim_sd = get_optimizer_state_dict(model, optimizer, options=_FULL)
    rank_rng = _rank_rng_states()
    if _rank() == 0:
        assert rank_rng is not None
        ckpts.mkdir(parents=True, exist_ok=True)
        tmp = ckpts / f"{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        torch.save(model_sd, tmp / "model.pt")
        fault("kill_in_save", state.step)
        fault("term_in_save", state.step)
        torch.save(optim_sd, tmp / "optim.pt")
        torch.save({"trainer": vars(state).copy(), "scheduler": scheduler.state_dict(), "rng": rank_rng[0],
                    "rng_ranks": rank_rng}, tmp / "trainer.pt")
        for f in tmp.iterdir():
            _fsync_file(f)
        if final.exists():  # a re-save of the same step (e.g. SIGUSR1 then the periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_file(ckpts)
        _write_pointer(ckpts, name)
        _prune(ckpts, keep, name)
        log.info("saved checkpoint %s", final)
    _barrier()
    return final


def _prune(ckpts: Path, keep: int, current: str) -> None:
    for stray in ckpts.glob("step-*.tmp"):
        shutil.rmtree(stray, ignore_errors=True)
    if keep <= 0:
        return
    steps = sorted((int(m.group(1)), p) for p in ckpts.iterdir() if (m := _STEP.match(p.name)) and p.is_dir())
    for _, p in steps[:-keep]:
        if p.name != current:
            shutil.rmtree(p, ignore_errors=True)


def rank_rng_state(extra: dict[str, Any], rank: int) -> dict[str, Any]:
    """Rank ``rank``'s saved RNG states from a ``trainer.pt`` payload: its own where the checkpoint
    has one (``rng_ranks``, one entry per rank that saved), else rank 0's (a checkpoint from before
    per-rank states, or from a run with fewer ranks)."""
    ranks = extra.get("rng_ranks")
    if isinstance(ranks, list) and 0 <= rank < len(ranks):
        return dict(ranks[rank])
    if isinstance(ranks, list) and ranks:
        log.info("the checkpoint holds the RNG states of %d rank(s); rank %d takes rank 0's", len(ranks), rank)
    return dict(extra["rng"])


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states from ``path``; returns the trainer state."""
    rank0 = _rank() == 0
    distributed = _is_dist()
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
    model_sd = torch.load(path / "model.pt", map_location="cpu", weights_only=True) if rank0 or not distributed \
        else {}
    set_model_state_dict(model, model_sd, options=options)
    optim_sd = torch.load(path / "optim.pt", map_location="cpu", weights_only=False) if rank0 or not distributed \
        else {}
    set_optimizer_state_dict(model, optimizer, optim_sd, options=options)
    extra = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    scheduler.load_state_dict(extra["scheduler"])
    set_rng_state(rank_rng_state(extra, _rank()))
    log.info("resumed from %s (step %d)", path, extra["trainer"]["step"])
    return TrainerState(**extra["trainer"])
