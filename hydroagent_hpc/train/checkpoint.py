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

import hashlib
import json
import logging
import os
import random
import re
import shutil
import zipfile
from collections.abc import Mapping
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

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.train.live import LIVE_KEYS

log = logging.getLogger(__name__)

__all__ = ["TrainerState", "rng_state", "set_rng_state", "cuda_state_for", "rank_rng_state", "latest_checkpoint",
           "save_checkpoint", "load_checkpoint", "full_model_state", "FAULT_ENV", "fault", "CheckpointError",
           "MANIFEST", "CHECKPOINT_FILES", "checkpoint_problem", "resume_point", "has_checkpoints",
           "model_signature", "config_changes"]

_STEP = re.compile(r"^step-(\d+)$")
#: The files of one checkpoint, in the order they are written; the manifest comes after them.
CHECKPOINT_FILES = ("model.pt", "optim.pt", "trainer.pt")
MANIFEST = "manifest.json"
MANIFEST_FORMAT = "hydroagent-checkpoint/1"


class CheckpointError(HydroAgentError):
    """No checkpoint of a run can be resumed from (each is named with what is wrong), or one that
    passed its checks could not be loaded; the message says how to go on."""

    exit_code = 1

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


def _step_of(name: str) -> int | None:
    m = _STEP.match(name)
    return int(m.group(1)) if m else None


def _step_folders(ckpts: Path) -> list[tuple[int, Path]]:
    """``(step, folder)`` of every ``step-N`` folder, newest first."""
    if not ckpts.is_dir():
        return []
    found = [(n, p) for p in ckpts.iterdir() if (n := _step_of(p.name)) is not None and p.is_dir()]
    return sorted(found, reverse=True)


def has_checkpoints(run_dir: str | os.PathLike[str]) -> bool:
    """Whether ``RUN_DIR/checkpoints`` holds a ``latest`` pointer or any ``step-N`` folder (checked or not)."""
    ckpts = Path(run_dir) / "checkpoints"
    return (ckpts / "latest").exists() or bool(_step_folders(ckpts))


def _read_pointer(pointer: Path) -> tuple[str | None, str | None]:
    """(the folder name ``latest`` holds, or None; what is wrong with it, or None)."""
    try:
        raw = pointer.read_bytes()
    except IsADirectoryError:
        return None, "is a folder, not the one-line pointer file"
    except OSError as exc:
        return None, f"cannot be read ({exc.strerror or exc})"
    try:
        name = raw.decode("ascii").strip()
    except UnicodeDecodeError:
        return None, f"holds {len(raw)} bytes that are not a step-N name"
    if not name:
        return None, "is empty"
    if _step_of(name) is None:
        return None, f"names {name[:60]!r}, which is not a step-N checkpoint"
    if not (pointer.parent / name).is_dir():
        return None, f"names {name}, which does not exist"
    return name, None


def model_signature(state: Mapping[str, Any]) -> list[list[Any]]:
    """``[[name, [shape...]], ...]`` (sorted) of a model state dict: what a checkpoint must match to load."""
    return sorted([str(k), [int(d) for d in v.shape]] for k, v in state.items() if hasattr(v, "shape"))


def config_changes(saved: Mapping[str, Any], config: Mapping[str, Any],
                   defaults: Mapping[str, Any] | None = None) -> list[str]:
    """The keys whose values differ between a recorded config and ``config``, sorted. A key missing from
    the recorded one counts as unchanged while ``config`` holds its default (``defaults``): a run
    started before the key existed. The keys that only choose where metrics are shown
    (:data:`~hydroagent_hpc.train.live.LIVE_KEYS`) are not compared."""
    old = {k: v for k, v in saved.items() if k not in LIVE_KEYS}
    new = {k: v for k, v in config.items() if k not in LIVE_KEYS}
    for key, value in (defaults or {}).items():
        if key not in old and key in new:
            old[key] = value
    if old == new:
        return []
    return sorted({k for k in new if old.get(k) != new[k]} | {k for k in old if k not in new})


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _legacy_problem(path: Path) -> str | None:
    """What is wrong with a checkpoint written before manifests: a missing file or one that is not a
    complete archive (torch.save writes zip archives; their central directory is at the end)."""
    for name in CHECKPOINT_FILES:
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        try:
            with zipfile.ZipFile(f) as z:
                bad = z.testzip()
        except (zipfile.BadZipFile, OSError, EOFError, ValueError) as exc:
            return f"{name} is not a complete torch archive ({exc})"
        if bad is not None:
            return f"{name}: its entry {bad} fails its CRC"
    return None


def _written_with_manifest(path: Path) -> bool:
    """Whether ``trainer.pt`` says its checkpoint was written with a manifest (so a missing one is damage)."""
    try:
        extra = torch.load(path / "trainer.pt", map_location="cpu", weights_only=False)
    except Exception:  # unreadable: the manifest-less checks above judge the archive itself
        return False
    return isinstance(extra, dict) and extra.get("format") == MANIFEST_FORMAT


def _manifest(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(the manifest, None) or (None, what is wrong with it)."""
    try:
        data = json.loads((path / MANIFEST).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return None, f"{MANIFEST} cannot be read ({type(exc).__name__}: {str(exc)[:80]})"
    if not isinstance(data, dict) or data.get("format") != MANIFEST_FORMAT:
        return None, f"{MANIFEST}: format is not {MANIFEST_FORMAT!r}"
    files = data.get("files")
    if not isinstance(files, dict) or set(files) != set(CHECKPOINT_FILES):
        return None, f"{MANIFEST}: field 'files' does not list {', '.join(CHECKPOINT_FILES)}"
    for name, rec in files.items():
        if not (isinstance(rec, dict) and isinstance(rec.get("bytes"), int) and isinstance(rec.get("sha256"), str)):
            return None, f"{MANIFEST}: field 'files.{name}' is not {{bytes, sha256}}"
    if not isinstance(data.get("step"), int) or isinstance(data.get("step"), bool):
        return None, f"{MANIFEST}: field 'step' is not a whole number"
    return data, None


def checkpoint_problem(path: Path, *, config: Mapping[str, Any] | None = None,
                       defaults: Mapping[str, Any] | None = None,
                       signature: list[list[Any]] | None = None) -> str | None:
    """What is wrong with checkpoint folder ``path`` (None: it may be resumed from).

    Checked against its manifest: every file's size and SHA-256 (a truncated, zeroed or otherwise
    changed file), the step, and, when given, the model's tensor names and shapes (``signature``, of
    the model about to load it: a checkpoint of another model size) and the run's ``config`` (a
    checkpoint of a run with another config; ``defaults`` as for :func:`config_changes`).
    """
    if not path.is_dir():
        return "is not a folder"
    if not (path / MANIFEST).exists():
        problem = _legacy_problem(path)
        if problem is None and _written_with_manifest(path):
            return f"{MANIFEST} is missing (this checkpoint was written with one)"
        if problem is None:
            log.warning("%s: written before checkpoints had manifests; its files are complete archives, "
                        "but their contents cannot be checked", path)
        return problem
    manifest, problem = _manifest(path)
    if manifest is None:
        return problem
    if manifest["step"] != _step_of(path.name):
        return f"{MANIFEST} says step {manifest['step']}, the folder is {path.name}"
    for name in CHECKPOINT_FILES:
        want = manifest["files"][name]
        f = path / name
        if not f.is_file():
            return f"{name} is missing"
        size = f.stat().st_size
        if size != want["bytes"]:
            what = "truncated" if size < want["bytes"] else "longer than written"
            return f"{name} is {what}: {size} bytes, the manifest records {want['bytes']}"
        if _sha256(f) != want["sha256"]:
            return f"{name} does not match its SHA-256 in the manifest (its bytes changed since it was written)"
    saved_sig = manifest.get("model")
    if signature is not None and isinstance(saved_sig, list) and saved_sig != signature:
        mine = {str(n): s for n, s in signature}
        theirs = {str(n): s for n, s in saved_sig}
        diff = sorted(set(mine) ^ set(theirs)) or sorted(n for n in mine if mine[n] != theirs.get(n))
        first = diff[0] if diff else "?"
        return (f"holds another model: {len(theirs)} tensors, {_numel(theirs.values()):,} parameters, this model has "
                f"{len(mine)} and {_numel(mine.values()):,} (first difference: {first} "
                f"{theirs.get(first, 'absent')} in the checkpoint, {mine.get(first, 'absent')} here)")
    saved_config = manifest.get("config")
    if config is not None and isinstance(saved_config, dict):
        changed = config_changes(saved_config, config, defaults)
        if changed:
            return f"was written by a run with another config (differs in {', '.join(changed[:6])})"
    return None


def _numel(shapes: Any) -> int:
    total = 0
    for shape in shapes:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total


def resume_point(run_dir: str | os.PathLike[str], *, config: Mapping[str, Any] | None = None,
                 defaults: Mapping[str, Any] | None = None, model: torch.nn.Module | None = None) -> Path | None:
    """The checkpoint a resumed run continues from: the one ``latest`` names when it passes
    :func:`checkpoint_problem`, else the newest older one that does (each skipped one is named in a
    warning with what is wrong). None when the run has no checkpoint at all. Raises
    :class:`CheckpointError` when there are checkpoints but none passes.

    ``model`` (the model about to be loaded, unwrapped) gives the tensor shapes to match, ``config``
    the run's config to match (``defaults`` as for :func:`config_changes`).
    """
    ckpts = Path(run_dir) / "checkpoints"
    pointer = ckpts / "latest"
    folders = _step_folders(ckpts)
    if not pointer.exists() and not folders:
        return None
    skipped: list[str] = []
    if pointer.exists():
        name, problem = _read_pointer(pointer)
        if problem is not None:
            skipped.append(f"{pointer} {problem}")
        else:
            assert name is not None
            newest = _step_of(name)
            assert newest is not None
            folders = [(n, p) for n, p in folders if n <= newest]  # later ones: a kill before the pointer moved
    else:
        skipped.append(f"{pointer} is missing")
    signature = model_signature(model.state_dict()) if model is not None else None
    for _, path in folders:
        problem = checkpoint_problem(path, config=config, defaults=defaults, signature=signature)
        if problem is None:
            if skipped:
                log.warning("resuming from %s, not the newest checkpoint: %s", path, "; ".join(skipped))
            return path
        skipped.append(f"{path}: {problem}")
    raise CheckpointError(
        f"{ckpts}: no checkpoint to resume from is intact: {'; '.join(skipped) or 'none found'}",
        f"restore the damaged files from a copy, or move {ckpts} aside (mv {ckpts} {ckpts}.damaged) and run "
        f"again with --resume to start over from step 0 (metrics.csv is rewritten)")


def latest_checkpoint(run_dir: str | os.PathLike[str]) -> Path | None:
    """The checkpoint to resume ``RUN_DIR`` from (:func:`resume_point` without a model or config to match)."""
    return resume_point(run_dir)


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


class _HashingFile:
    """A write-only file object that hashes what passes through it (torch.save needs write and flush)."""

    def __init__(self, fh: Any) -> None:
        self.fh = fh
        self.sha = hashlib.sha256()
        self.bytes = 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.bytes += view.nbytes
        written: int = self.fh.write(view)
        return written

    def flush(self) -> None:
        self.fh.flush()


def _save_hashed(obj: Any, path: Path) -> dict[str, Any]:
    """``torch.save(obj)`` into ``path``, fsynced; its size and SHA-256 computed from the bytes written."""
    with open(path, "wb") as fh:
        sink = _HashingFile(fh)
        torch.save(obj, sink)  # type: ignore[arg-type]
        fh.flush()
        os.fsync(fh.fileno())
    return {"bytes": sink.bytes, "sha256": sink.sha.hexdigest()}


def _run_config(run_dir: Path) -> dict[str, Any] | None:
    """The config recorded in ``RUN_DIR/config.yaml`` (None when there is none)."""
    import yaml

    try:
        doc = yaml.safe_load((run_dir / "config.yaml").read_text())
    except (OSError, yaml.YAMLError):
        return None
    config = doc.get("config") if isinstance(doc, dict) else None
    return dict(config) if isinstance(config, dict) else None


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
        files = {"model.pt": _save_hashed(model_sd, tmp / "model.pt")}
        fault("kill_in_save", state.step)
        fault("term_in_save", state.step)
        files["optim.pt"] = _save_hashed(optim_sd, tmp / "optim.pt")
        files["trainer.pt"] = _save_hashed({"trainer": vars(state).copy(), "scheduler": scheduler.state_dict(),
                                            "rng": rank_rng[0], "rng_ranks": rank_rng, "format": MANIFEST_FORMAT},
                                           tmp / "trainer.pt")
        manifest = {"format": MANIFEST_FORMAT, "step": state.step, "files": files,
                    "model": model_signature(model_sd), "config": _run_config(Path(run_dir))}
        tmp_manifest = tmp / f"{MANIFEST}.tmp"
        tmp_manifest.write_text(json.dumps(manifest, sort_keys=True) + "\n")
        _fsync_file(tmp_manifest)
        os.replace(tmp_manifest, tmp / MANIFEST)
        _fsync_file(tmp)
        if final.exists():  # a re-save of the same step (e.g. SIGUSR1 then the periodic save)
            shutil.rmtree(final)
        os.replace(tmp, final)
        _fsync_file(ckpts)
        _write_pointer(ckpts, name)
        _prune(ckpts, keep, state.step)
        log.info("saved checkpoint %s", final)
    _barrier()
    return final


def _prune(ckpts: Path, keep: int, current: int) -> None:
    """Remove stray ``*.tmp`` folders and all but the ``keep`` newest checkpoints up to ``current``;
    later ones (left by a run that resumed from an earlier checkpoint) stay until it writes them again."""
    for stray in ckpts.glob("step-*.tmp"):
        shutil.rmtree(stray, ignore_errors=True)
    if keep <= 0:
        return
    upto = [(n, p) for n, p in _step_folders(ckpts) if n <= current]
    for n, p in upto[keep:]:
        if n != current:
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


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:160] if lines else type(exc).__name__


def _load(path: Path, name: str, weights_only: bool) -> Any:
    try:
        return torch.load(path / name, map_location="cpu", weights_only=weights_only)
    except Exception as exc:  # a file damaged after it was checked, or one no check could judge
        raise CheckpointError(f"{path / name}: cannot be loaded ({type(exc).__name__}: {_first_line(exc)})",
                              f"move {path} aside and run again with --resume: the run resumes from the "
                              f"checkpoint before it") from None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                    scheduler: Any) -> TrainerState:
    """Restore model, optimizer, scheduler and RNG states from ``path``; returns the trainer state.

    A file that does not load or does not fit the model is a :class:`CheckpointError` naming it."""
    rank0 = _rank() == 0
    distributed = _is_dist()
    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=distributed)
    model_sd = _load(path, "model.pt", True) if rank0 or not distributed else {}
    try:
        set_model_state_dict(model, model_sd, options=options)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path / 'model.pt'}: does not fit this model ({_first_line(exc)})",
                              "resume with the model and config the run started with, or start a new --out "
                              "folder") from None
    optim_sd = _load(path, "optim.pt", False) if rank0 or not distributed else {}
    try:
        set_optimizer_state_dict(model, optimizer, optim_sd, options=options)
    except (RuntimeError, KeyError, ValueError) as exc:
        raise CheckpointError(f"{path / 'optim.pt'}: does not fit this optimizer ({_first_line(exc)})",
                              "resume with the config the run started with, or start a new --out folder") from None
    extra = _load(path, "trainer.pt", False)
    try:
        scheduler.load_state_dict(extra["scheduler"])
        set_rng_state(rank_rng_state(extra, _rank()))
        state = TrainerState(**extra["trainer"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"{path / 'trainer.pt'}: not a trainer state ({type(exc).__name__}: {exc})",
                              f"move {path} aside and run again with --resume") from None
    log.info("resumed from %s (step %d)", path, state.step)
    return state
