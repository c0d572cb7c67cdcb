"""The MPI backend of the simulation pool: tasks fanned out over the ranks of an MPI world.

Every rank runs the same program and enters :func:`mpi_pool`; the root rank gets an
:class:`MPIPool`, every other rank serves tasks until the root leaves the ``with`` block and then
gets ``None``::

    with mpi_pool(max_in_flight=32, timeout_s=600) as pool:
        if pool is not None:          # the root rank only
            for r in pool.map(fn, items):
                ...

Launch it with ``mpiexec -n N python prog.py`` or, inside a Slurm allocation,
``srun --mpi=pmi2 -n N python prog.py`` (PyPI's mpich + mpi4py; ``-O`` when N exceeds the CPUs).
Rank 0 coordinates and N-1 ranks compute, so give it one rank more than the simulations you want
running at once; the coordinator sleeps between messages (mpi4py.futures' back-off), so it costs
little CPU.

Fault model. MPI ends the whole world when one rank dies, so a rank never runs a task itself: by
default (``isolate=True``) each rank keeps one child process (:class:`~hydroagent_hpc.hpc.pool.ProcessPool`)
and runs the task there. A task that raises, segfaults, is killed by the OOM killer or runs past
``timeout_s`` therefore becomes a failed :class:`~hydroagent_hpc.hpc.pool.TaskResult` while the rank
lives on. Only the loss of a rank itself (a node failure) ends the job, which a resumable caller
(the campaign) survives by rerunning. ``isolate=False`` runs tasks in the rank itself: less
overhead per task, no timeouts, and a crash takes the job down.

Several training processes beside the pool (:func:`split_trainers`): the first T ranks of the
world train together (a torch process group of their own), the others simulate; trainer rank 0 is
the pool's root, so the pool's communicator holds it and the simulation ranks only.

``mpi4py`` is imported only inside the functions here: a child process that imports this module
must never initialise MPI from the environment it inherited.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, wait
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from hydroagent_hpc.hpc.pool import ProcessPool, TaskResult, release

log = logging.getLogger(__name__)

__all__ = ["MPIPool", "mpi_pool", "world", "in_mpi_world", "TrainerSplit", "split_trainers"]

_RANK_POOL: dict[str, Any] = {}


def world() -> tuple[int, int]:
    """``(rank, size)`` of ``MPI.COMM_WORLD`` (initialises MPI on first use)."""
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def in_mpi_world() -> bool:
    """Whether this process was started by an MPI launcher with more than one rank.

    Reads the launchers' environment only (MPICH/Hydra ``PMI_SIZE``, Slurm's pmi2 plugin
    ``PMI_SIZE``, Open MPI ``OMPI_COMM_WORLD_SIZE``), so it never initialises MPI itself.
    """
    import os

    for var in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS"):
        value = os.environ.get(var, "")
        if value.isdigit() and int(value) > 1:
            return True
    return False


def _rank_call(fn: Callable[[Any], Any], item: Any, timeout_s: float | None,
               initializer: Callable[[], None] | None, isolate: bool) -> tuple[bool, Any, str, float]:
    """Run one task on a worker rank; never raises (a failure is returned)."""
    t0 = time.perf_counter()
    if isolate:
        key = repr((timeout_s, getattr(initializer, "__qualname__", None)))
        pool = _RANK_POOL.get(key)
        if pool is None:
            for old in _RANK_POOL.values():
                old.close()
            _RANK_POOL.clear()
            pool = _RANK_POOL[key] = ProcessPool(workers=1, max_in_flight=1, timeout_s=timeout_s,
                                                 initializer=initializer, log_failures=False)
        r = next(iter(pool.map(fn, [item])))
        return r.ok, r.value, r.error, r.seconds
    if initializer is not None and not _RANK_POOL.get("initialised"):
        initializer()
        _RANK_POOL["initialised"] = True
    try:
        return True, fn(item), "", time.perf_counter() - t0
    except Exception as exc:  # a task's failure is a result
        return False, None, f"{type(exc).__name__}: {exc}", time.perf_counter() - t0


class MPIPool:
    """The root rank's view of the pool: ``map`` over the worker ranks with an in-flight limit."""

    backend = "mpi"

    def __init__(self, executor: Any, workers: int, max_in_flight: int = 32, timeout_s: float | None = None,
                 initializer: Callable[[], None] | None = None, isolate: bool = True) -> None:
        if max_in_flight < 1:
            raise ValueError(f"max_in_flight={max_in_flight}: need at least 1")
        self._ex = executor
        self.workers = workers
        self.max_in_flight = max_in_flight
        self.timeout_s = timeout_s
        self.initializer = initializer
        self.isolate = isolate

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], ordered: bool = True) -> Iterator[TaskResult]:
        todo = list(enumerate(items))
        todo.reverse()
        pending: dict[Any, int] = {}
        done: dict[int, TaskResult] = {}
        next_out = 0
        total = len(todo)
        try:
            while next_out < total:
                while todo and len(pending) < self.max_in_flight:
                    index, item = todo.pop()
                    fut = self._ex.submit(_rank_call, fn, item, self.timeout_s, self.initializer, self.isolate)
                    pending[fut] = index
                finished, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in finished:
                    index = pending.pop(fut)
                    try:
                        ok, value, error, seconds = fut.result()
                    except Exception as exc:  # the task or its result could not travel
                        ok, value, error, seconds = False, None, f"{type(exc).__name__}: {exc}", 0.0
                    if not ok:
                        log.warning("task %d failed: %s", index, error.splitlines()[0] if error else "")
                    done[index] = TaskResult(index, ok, value, error, seconds)
                ready, next_out = release(done, next_out, ordered)
                yield from ready
        finally:
            for fut in pending:  # the consumer stopped early: drop what has not started
                fut.cancel()

    def submit(self, fn: Callable[[Any], Any], item: Any) -> Future[TaskResult]:
        """Run ``fn(item)`` on a worker rank; the future holds its :class:`TaskResult` (never raises).

        Safe to call from several threads at once (the GRPO rollout engine does); the caller keeps
        its own limit on tasks in flight (``map``'s ``max_in_flight`` does not apply here).
        """
        out: Future[TaskResult] = Future()
        inner = self._ex.submit(_rank_call, fn, item, self.timeout_s, self.initializer, self.isolate)

        def _done(f: Any) -> None:
            try:
                ok, value, error, seconds = f.result()
            except Exception as exc:  # the task or its result could not travel
                ok, value, error, seconds = False, None, f"{type(exc).__name__}: {exc}", 0.0
            out.set_result(TaskResult(0, ok, value, error, seconds))

        inner.add_done_callback(_done)
        return out

    def close(self) -> None:
        pass  # the executor is shut down by mpi_pool when the root leaves the block

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@contextmanager
def mpi_pool(max_in_flight: int = 32, timeout_s: float | None = None, initializer: Callable[[], None] | None = None,
             isolate: bool = True, comm: Any = None, root: int = 0) -> Iterator[MPIPool | None]:
    """Enter on every rank: the root gets an :class:`MPIPool`, the other ranks serve and get ``None``."""
    from mpi4py import MPI
    from mpi4py.futures import MPICommExecutor

    comm = MPI.COMM_WORLD if comm is None else comm
    size = comm.Get_size()
    if size < 2:
        raise ValueError("the mpi pool needs at least 2 ranks (1 coordinator + workers): launch with "
                         "`mpiexec -n N ...` or `srun --mpi=pmi2 -n N ...` (N >= 2), or choose the "
                         "processes pool")
    with MPICommExecutor(comm, root) as executor:
        if executor is None:  # a worker rank: it has served every task by now
            for pool in _RANK_POOL.values():
                if isinstance(pool, ProcessPool):
                    pool.close()
            _RANK_POOL.clear()
            yield None
            return
        log.info("mpi pool: %d worker ranks, at most %d tasks in flight, isolate=%s", size - 1, max_in_flight,
                 isolate)
        yield MPIPool(executor, size - 1, max_in_flight, timeout_s, initializer, isolate)


@dataclass(frozen=True)
class TrainerSplit:
    """This rank's place when the first ``trainers`` ranks of an MPI world train and the others simulate.

    ``rank``/``local_rank`` number the training processes (world rank = trainer rank; -1 on a
    simulation rank); ``master_addr``/``master_port`` are where trainer rank 0 sets up the torch
    process group (empty/0 on a simulation rank); ``pool_comm`` is the simulation pool's
    communicator (trainer rank 0 as its root, then the simulation ranks), None on trainer ranks 1..
    """

    trainer: bool
    rank: int
    trainers: int
    local_rank: int
    local_trainers: int
    master_addr: str
    master_port: int
    pool_comm: Any

    def torch_env(self) -> dict[str, str]:
        """The variables ``torchrun`` would set for this training process (``accelerate`` reads them)."""
        if not self.trainer:
            return {}
        return {"RANK": str(self.rank), "WORLD_SIZE": str(self.trainers), "LOCAL_RANK": str(self.local_rank),
                "LOCAL_WORLD_SIZE": str(self.local_trainers), "MASTER_ADDR": self.master_addr,
                "MASTER_PORT": str(self.master_port)}


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def split_trainers(trainers: int, comm: Any = None, master_addr: str | None = None,
                   master_port: int | None = None) -> TrainerSplit:
    """Split ``comm`` (default ``COMM_WORLD``): ranks ``0..trainers-1`` train, the rest simulate.

    A collective: every rank calls it with the same ``trainers``. The trainers' address is trainer
    rank 0's: ``master_addr`` when given, else 127.0.0.1 when every trainer shares rank 0's node,
    else rank 0's host name; the port is ``master_port`` or one rank 0 finds free. Local ranks count
    the trainers on each node (``MPI.COMM_TYPE_SHARED``), so trainer ``r`` uses ``cuda:local_rank``.
    """
    from mpi4py import MPI

    comm = MPI.COMM_WORLD if comm is None else comm
    rank, size = comm.Get_rank(), comm.Get_size()
    if trainers < 1:
        raise ValueError(f"trainers={trainers}: need at least 1 training process")
    if size <= trainers:
        raise ValueError(f"{trainers} training process(es) in an MPI world of {size} rank(s) leave no simulation "
                         f"rank: launch at least {trainers + 1} ranks (srun --mpi=pmi2 -n {trainers + 1} ..., "
                         f"mpiexec -n {trainers + 1} ...) or train with fewer processes")
    trainer = rank < trainers
    pool = comm.Split(0 if rank == 0 or not trainer else MPI.UNDEFINED, rank)
    group = comm.Split(0 if trainer else 1, rank)
    node = group.Split_type(MPI.COMM_TYPE_SHARED, key=rank)
    local_rank, local_size = node.Get_rank(), node.Get_size()
    node.Free()
    addr, port = "", 0
    if trainer:
        info = None
        if rank == 0:
            addr = master_addr or ("127.0.0.1" if local_size == trainers else socket.gethostname())
            info = (addr, master_port or _free_port())
        addr, port = group.bcast(info, root=0)
    group.Free()
    return TrainerSplit(trainer, rank if trainer else -1, trainers, local_rank if trainer else -1,
                        local_size if trainer else 0, addr, port, None if pool == MPI.COMM_NULL else pool)
