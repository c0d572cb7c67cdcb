"""A submitit job that runs a checkpointing command and requeues it when time runs out.

Generic (nothing here knows about training): :class:`CheckpointedCommand` runs one command line
(a training launcher such as ``python -m hydroagent_hpc.train.sft CONFIG --out RUN --resume``) as a
child process of the submitit job and waits for it. Before a time-limit or preemption kill,
submitit signals the job (SIGUSR1) and calls :meth:`CheckpointedCommand.checkpoint`, which

1. forwards SIGUSR1 to the command's ranks (the command itself, or its direct children whose
   command line contains ``ranks_match`` when the command is a launcher such as
   ``accelerate launch``, which would die of SIGUSR1 itself; with ``rank0_only``, the one
   descendant at any depth whose command line contains ``ranks_match`` and whose environment says
   MPI rank 0, for an ``mpiexec`` whose other ranks are simulation workers that have nothing to
   save), so they write a checkpoint;
2. waits until an entry newer than the signal appears in ``checkpoints`` (at most ``save_wait_s``);
3. sends SIGTERM the same way and waits (at most ``save_wait_s`` again) for the command to exit,
   which a trainer does after saving once more (exit 143);
4. returns a :class:`submitit.helpers.DelayedSubmission` of itself: submitit requeues the job, at
   most the executor's ``max_num_timeout`` times for time limits, and the next attempt runs the same
   command, which resumes from the newest checkpoint.

The same protocol as ``slurm/sft.sbatch``, for jobs submitted from Python.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["CheckpointedCommand", "CommandFailed", "child_pids", "descendant_pids", "mpi_rank", "slurm_active_jobs"]

#: Environment variables in which MPI launchers give a process its rank (MPICH/Hydra and Slurm's pmi2,
#: PMIx, Open MPI).
RANK_VARIABLES = ("PMI_RANK", "PMIX_RANK", "OMPI_COMM_WORLD_RANK")


class CommandFailed(RuntimeError):
    """The command of a :class:`CheckpointedCommand` exited with a non-zero status (not a requeue)."""


def child_pids(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of the direct children of ``pid``, read from ``/proc`` (Linux)."""
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # after "pid (comm) state": the parent
            if ppid != pid:
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace").strip()
        except (OSError, ValueError, IndexError):  # the process ended while we looked
            continue
        out.append((int(entry.name), cmdline))
    return sorted(out)


def descendant_pids(pid: int) -> list[tuple[int, str]]:
    """``(pid, command line)`` of every descendant of ``pid`` (children, their children, ...)."""
    out: list[tuple[int, str]] = []
    todo = [pid]
    while todo:
        for child in child_pids(todo.pop()):
            out.append(child)
            todo.append(child[0])
    return sorted(out)


def mpi_rank(pid: int) -> int | None:
    """The MPI rank a launcher gave process ``pid`` (from its environment), or None."""
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in env:
        key, _, value = item.partition(b"=")
        if key.decode(errors="replace") in RANK_VARIABLES:
            try:
                return int(value)
            except ValueError:
                return None
    return None


def slurm_active_jobs(job_ids: list[str]) -> list[str]:
    """The ids among ``job_ids`` that Slurm still has pending or running (``squeue``); none when
    ``squeue`` is missing or does not answer within a minute. An array task id ``123_4`` asks for its array."""
    if not job_ids:
        return []
    try:
        # COMPLETING is left out: its work is over (a job just finished stays in squeue for a moment)
        p = subprocess.run(["squeue", "-h", "-o", "%i %T", "-t", "PENDING,CONFIGURING,RUNNING,REQUEUED,REQUEUE_HOLD,"
                            "SUSPENDED", "-j", ",".join(sorted({j.split("_")[0] for j in job_ids}))],
                           capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.split()[0] for line in p.stdout.splitlines() if line.strip()]


def _newest_mtime(folder: Path) -> float:
    try:
        return max((p.stat().st_mtime for p in folder.iterdir()), default=0.0)
    except OSError:
        return 0.0


def _poll_until_exit(proc: subprocess.Popen[bytes], timeout_s: float) -> bool:
    """Whether ``proc`` exited within ``timeout_s`` (polling: safe inside a signal handler)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)
    return True


# The running command of this job process (one per process; not pickled with the job).
_RUNNING: dict[int, subprocess.Popen[bytes]] = {}


class CheckpointedCommand:
    """A picklable submitit callable: ``job()`` runs ``argv`` to completion; requeued on time limit.

    ``checkpoints`` is the folder the command writes its checkpoints into (entries are compared by
    modification time); ``env`` is added to the job's environment; ``ranks_match`` picks the
    children that get the signals and ``rank0_only`` narrows them to MPI rank 0 (see the module
    docstring); ``save_wait_s`` bounds each wait.
    """

    def __init__(self, argv: list[str], checkpoints: str | Path, *, env: dict[str, str] | None = None,
                 ranks_match: str | None = None, save_wait_s: float = 240.0, name: str = "command",
                 rank0_only: bool = False) -> None:
        if rank0_only and not ranks_match:
            raise ValueError("rank0_only needs ranks_match (the rank processes' command line)")
        if not argv:
            raise ValueError("argv: an empty command line; give the program and its arguments")
        if save_wait_s <= 0:
            raise ValueError(f"save_wait_s={save_wait_s}: must be positive")
        self.argv = [str(a) for a in argv]
        self.checkpoints = str(checkpoints)
        self.env = dict(env or {})
        self.ranks_match = ranks_match
        self.rank0_only = bool(rank0_only)
        self.save_wait_s = float(save_wait_s)
        self.name = name
        self.attempts = 0

    def __call__(self) -> dict[str, Any]:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
        self.attempts += 1
        log.info("%s: attempt %d: %s", self.name, self.attempts, " ".join(self.argv))
        proc = subprocess.Popen(self.argv, env={**os.environ, **self.env})
        _RUNNING[id(self)] = proc
        try:
            # Poll rather than block in wait(): submitit's signal handler runs checkpoint() on this
            # thread, and a wait() it interrupted would hold the Popen lock that checkpoint needs.
            while (rc := proc.poll()) is None:
                time.sleep(0.2)
        finally:
            _RUNNING.pop(id(self), None)
        if rc != 0:
            raise CommandFailed(f"{self.name}: {' '.join(self.argv)} exited with status {rc} (attempt "
                                f"{self.attempts}); see the job's stderr log above for the cause")
        return {"name": self.name, "returncode": rc, "attempts": self.attempts, "checkpoints": self.checkpoints}

    def _signal(self, proc: subprocess.Popen[bytes], sig: signal.Signals) -> list[int]:
        """Send ``sig`` to the ranks (matching children) or, without ``ranks_match``, to the command."""
        if self.ranks_match is None:
            targets = [proc.pid]
        else:
            procs = descendant_pids(proc.pid) if self.rank0_only else child_pids(proc.pid)
            targets = [pid for pid, cmd in procs if self.ranks_match in cmd
                       and (not self.rank0_only or mpi_rank(pid) == 0)]
            if not targets and sig == signal.SIGTERM:  # no rank yet: the launcher stops itself
                targets = [proc.pid]
        for pid in targets:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        return targets

    def stop_for_requeue(self) -> bool:
        """Steps 1-3 of the module docstring for the command this process runs; whether a new checkpoint appeared."""
        proc = _RUNNING.get(id(self))
        if proc is None or proc.poll() is not None:
            return False
        folder = Path(self.checkpoints)
        before = _newest_mtime(folder)
        if not self._signal(proc, signal.SIGUSR1):
            log.warning("%s: no rank matching %r to signal yet", self.name, self.ranks_match)
        deadline = time.monotonic() + self.save_wait_s
        saved = False
        while time.monotonic() < deadline and proc.poll() is None:
            if _newest_mtime(folder) > before:
                saved = True
                break
            time.sleep(0.2)
        log.warning("%s: %s; stopping the command for the requeue", self.name,
                    "checkpoint written" if saved else f"no new checkpoint in {folder} after SIGUSR1")
        self._signal(proc, signal.SIGTERM)
        if not _poll_until_exit(proc, self.save_wait_s):
            log.error("%s: still running %.0f s after SIGTERM; killing it (the previous checkpoint stays usable)",
                      self.name, self.save_wait_s)
            proc.kill()
            _poll_until_exit(proc, 10.0)
        return saved

    def checkpoint(self, *args: Any, **kwargs: Any) -> Any:
        """Called by submitit before a time-limit or preemption kill: save, stop, requeue this job."""
        from submitit.helpers import DelayedSubmission

        self.stop_for_requeue()
        log.warning("%s: requeueing (attempt %d); the next attempt resumes from %s", self.name, self.attempts,
                    self.checkpoints)
        return DelayedSubmission(self, *args, **kwargs)
