"""A run folder that cannot be written (read-only, a file in its place, a full disk, a quota or file-size
limit) is one clear error, never a half-written checkpoint or ``final/``.

- :func:`check_run_dir`, before anything loads: ``--out`` (or the nearest folder above it that exists)
  must be a folder this process can write in, on a file system that is not mounted read-only.
- :func:`save_checkpoint_or_stop`: :func:`~hydroagent_hpc.train.checkpoint.save_checkpoint`, and when
  writing fails (an ``OSError``, or the ``RuntimeError`` torch's archive writer turns one into) the
  checkpoint's temporary folder is removed and :class:`RunWriteError` names the folder, the cause and
  the checkpoint ``latest`` still names (untouched: it moves only once a checkpoint is complete).
- :func:`write_folder`: ``final/`` written into ``final.tmp/`` and renamed into place; a failure
  removes the temporary folder and leaves any earlier ``final/`` as it was.
- :func:`stopped_by_io`: what the entry points (``hydroagent train sft|grpo`` and the modules Slurm runs)
  make of any other ``OSError`` of a run (``config.yaml``, ``metrics.csv``, the rollout store): one line
  naming the run folder, the cause and the checkpoint a resume starts from.
"""

from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError, HydroAgentError, one_line

__all__ = ["RunWriteError", "check_run_dir", "save_checkpoint_or_stop", "write_folder", "write_fix", "stopped_by_io",
           "describe_last"]

_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
_PERMISSION = {errno.EROFS, errno.EACCES, errno.EPERM}


class RunWriteError(HydroAgentError):
    """A run that stopped because its folder could not be written (the message names what and where, and
    that nothing half-written was left)."""

    exit_code = 1


def write_fix(exc: BaseException, folder: Path) -> str:
    """What to do about a failed write into ``folder``, from the error's errno."""
    code = getattr(exc, "errno", None)
    if code in _SPACE or code is None:
        return (f"free space on the file system of {folder} (or raise the quota or file-size limit; "
                f"keep_checkpoints: 1 keeps fewer), then rerun with --resume")
    if code in _PERMISSION:
        return f"make {folder} writable, or give another --out, then rerun with --resume"
    return f"check the file system of {folder}, then rerun with --resume"


def _cause(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"[Errno {exc.errno}] {exc.strerror}"
    return f"{type(exc).__name__}: {one_line(exc)[:200]}"


def check_run_dir(run_dir: str | os.PathLike[str]) -> None:
    """Refuse, before anything loads, a run folder that cannot be written: the folder (or the nearest one
    above it that exists) is a file, or a nameless temporary file cannot be made in it (no permission, a
    read-only file system; judged as the run itself would be, root and access lists included). The
    ``hydroagent`` command checks its ``--out`` so too (:mod:`hydroagent_hpc.cli.paths`); this covers
    the module entries Slurm jobs run and :func:`train_sft` / :func:`train_grpo` called directly."""
    import tempfile

    run_dir = Path(run_dir)
    probe = run_dir
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise ConfigError(f"--out {run_dir}: {probe} is a file, not a folder",
                          "give --out a folder (a new one is created), not a file or a path under one")
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as exc:
        raise ConfigError(f"--out {run_dir}: nothing can be written in {probe} ({_cause(exc)})",
                          "give --out a folder you can write in") from None


def save_checkpoint_or_stop(run_dir: Path, *args: Any, **kwargs: Any) -> Path:
    """:func:`~hydroagent_hpc.train.checkpoint.save_checkpoint` (same arguments after ``run_dir``); a write
    that fails removes the checkpoint's temporary folder and raises :class:`RunWriteError`."""
    from hydroagent_hpc.train.checkpoint import save_checkpoint
    state = args[3] if len(args) > 3 else kwargs["state"]
    ckpts = run_dir / "checkpoints"
    tmp = ckpts / f"step-{state.step}.tmp"
    try:
        return save_checkpoint(run_dir, *args, **kwargs)
    except (OSError, RuntimeError) as exc:
        pointer_tmp = ckpts / "latest.tmp"
        if isinstance(exc, RuntimeError) and not tmp.exists() and not pointer_tmp.exists():
            raise  # not a write: the state dicts or a collective failed
        shutil.rmtree(tmp, ignore_errors=True)
        pointer_tmp.unlink(missing_ok=True)
        raise RunWriteError(f"cannot write checkpoint step-{state.step} into {ckpts} ({_cause(exc)}); nothing of "
                            f"it was kept, and {describe_last(run_dir)}", write_fix(exc, ckpts)) from None


def write_folder(final: Path, write: Callable[[Path], None], what: str = "the final model") -> None:
    """Write a folder through ``write(tmp)`` into ``final.tmp`` and rename it to ``final``; on any failure
    the temporary folder is removed, an earlier ``final`` is left as it was, and :class:`RunWriteError`
    says so."""
    tmp = final.with_name(final.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        write(tmp)
    except Exception as exc:  # any failure of the writers (OSError, safetensors' own error) leaves nothing
        shutil.rmtree(tmp, ignore_errors=True)
        kept = f"the earlier {final} is unchanged" if final.exists() else f"no {final.name}/ was written"
        raise RunWriteError(f"cannot write {what} into {final} ({_cause(exc)}); {kept}",
                            write_fix(exc, final.parent)) from None
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)


def stopped_by_io(exc: OSError, run_dir: str | os.PathLike[str]) -> RunWriteError:
    """A run stopped by ``exc`` outside a checkpoint or ``final/`` write, as one clear error."""
    where = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    return RunWriteError(f"--out {run_dir}: the run stopped on an I/O error{where}: {_cause(exc)}; "
                         f"{describe_last(run_dir)}", write_fix(exc, Path(run_dir)))


def describe_last(run_dir: Any) -> str:
    """``"the last checkpoint, step-N, is intact"`` or ``"no checkpoint was written yet"`` (for the messages)."""
    pointer = Path(run_dir) / "checkpoints" / "latest"
    try:
        name = pointer.read_text().strip()
    except OSError:
        return "no checkpoint was written yet"
    return f"the last checkpoint, {pointer.parent / name}, is intact" if name else "no checkpoint was written yet"
