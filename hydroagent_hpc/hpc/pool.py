"""A simulation pool: one interface over serial, local-process and MPI execution.

``open_pool(backend, workers, max_in_flight, timeout_s)`` returns a :class:`Pool` whose
``map(fn, items)`` yields one :class:`TaskResult` per item, in order (``ordered=False``: as each
finishes, so a consumer can store it at once). The backends are the entries of :data:`BACKENDS`
(``serial``, ``processes``, ``mpi``); the command line's ``--pool`` choices read it. Guarantees:

* at most ``max_in_flight`` tasks run at once (32 by default, as the paper's GRPO setup used);
* a task that runs longer than ``timeout_s`` is killed and becomes a failed result;
* a worker that dies (a segfault, ``os._exit``, the OOM killer) turns its task into a failed
  result and is replaced; the pool never hangs on it.

The pool is generic: it takes picklable callables and never imports the domain. The MPI backend
lives in :mod:`hydroagent_hpc.hpc.mpi` (it needs every rank to take part, so it is opened with
:func:`hydroagent_hpc.hpc.mpi.mpi_pool`, not here).
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import multiprocessing.connection
import time
import traceback
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.registry import Registry

log = logging.getLogger(__name__)

__all__ = ["TaskResult", "Pool", "PoolError", "PoolFactory", "SerialPool", "ProcessPool", "open_pool", "release",
           "BACKENDS"]


@dataclass(frozen=True)
class TaskResult:
    """The outcome of one task: ``ok`` with ``value``, or a failure with ``error``."""

    index: int
    ok: bool
    value: Any = None
    error: str = ""
    seconds: float = 0.0


class PoolError(HydroAgentError, ValueError):
    """A pool that cannot be opened as asked (a worker count below 1, MPI outside a launcher)."""


@runtime_checkable
class Pool(Protocol):
    """What a campaign needs of a pool (serial, local processes, MPI ranks).

    ``backend`` names it, ``workers`` is how many tasks can run at once; ``map(fn, items)`` yields
    one :class:`TaskResult` per item (in order, or as each finishes with ``ordered=False``) and
    never raises for a task's failure; ``close()`` releases the workers. Pools are context managers.
    """

    backend: str
    workers: int

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], ordered: bool = True) -> Iterator[TaskResult]: ...

    def close(self) -> None: ...

    def __enter__(self) -> Pool: ...

    def __exit__(self, *exc: object) -> None: ...


def release(done: dict[int, TaskResult], next_out: int, ordered: bool) -> tuple[list[TaskResult], int]:
    """Take the finished results a ``map`` may hand out now; return them and the new count handed out.

    Unordered: every finished result. Ordered: the unbroken run from index ``next_out`` on.
    """
    if ordered:
        ready = []
        while next_out in done:
            ready.append(done.pop(next_out))
            next_out += 1
        return ready, next_out
    ready = [done.pop(i) for i in sorted(done)]
    return ready, next_out + len(ready)


class SerialPool:
    """Runs tasks one after another in this process (exceptions become failed results).

    ``initializer`` is accepted for symmetry and not run: it prepares worker processes, and
    this process is the caller's own.
    """

    backend = "serial"

    def __init__(self, timeout_s: float | None = None, initializer: Callable[[], None] | None = None) -> None:
        self.timeout_s = timeout_s  # not enforceable in-process; recorded for symmetry
        self.workers = 1

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], ordered: bool = True) -> Iterator[TaskResult]:
        for i, item in enumerate(items):
            t0 = time.perf_counter()
            try:
                yield TaskResult(i, True, fn(item), seconds=time.perf_counter() - t0)
            except Exception as exc:  # a task's failure is a result, not a crash of the pool
                yield TaskResult(i, False, error=f"{type(exc).__name__}: {exc}", seconds=time.perf_counter() - t0)

    def close(self) -> None:
        pass

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _worker(conn, initializer: Callable[[], None] | None = None) -> None:
    """Worker loop: receive (index, fn, item), send back (index, ok, value or error)."""
    if initializer is not None:
        initializer()
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        index, fn, item = msg
        try:
            out = (index, True, fn(item))
        except Exception as exc:  # sent back as a failed result
            out = (index, False, f"{type(exc).__name__}: {exc}\n{traceback.format_exc(limit=3)}")
        try:
            conn.send(out)
        except Exception as exc:  # an unpicklable result
            conn.send((index, False, f"result could not be sent back: {type(exc).__name__}: {exc}"))


@dataclass
class _Slot:
    proc: Any
    conn: Any
    task: int | None = None
    started: float = 0.0


class ProcessPool:
    """Local worker processes with an in-flight limit, per-task timeouts and dead-worker recovery."""

    backend = "processes"

    def __init__(self, workers: int = 2, max_in_flight: int = 32, timeout_s: float | None = None,
                 context: str = "spawn", initializer: Callable[[], None] | None = None,
                 log_failures: bool = True) -> None:
        if workers < 1:
            raise PoolError(f"workers={workers}: need at least 1")
        if max_in_flight < 1:
            raise PoolError(f"max_in_flight={max_in_flight}: need at least 1")
        self.workers = min(workers, max_in_flight)
        self.timeout_s = timeout_s
        self.initializer = initializer
        self.log_failures = log_failures
        self._ctx: Any = mp.get_context(context)  # typeshed's BaseContext lacks Process
        self._slots: list[_Slot] = []

    def _spawn(self) -> _Slot:
        parent, child = self._ctx.Pipe()
        proc = self._ctx.Process(target=_worker, args=(child, self.initializer), daemon=True)
        proc.start()
        child.close()
        return _Slot(proc, parent)

    def _retire(self, slot: _Slot) -> None:
        if slot.proc.is_alive():
            slot.proc.kill()
        slot.proc.join(timeout=5)
        slot.conn.close()

    def map(self, fn: Callable[[Any], Any], items: Iterable[Any], ordered: bool = True) -> Iterator[TaskResult]:
        todo = list(enumerate(items))
        todo.reverse()
        results: dict[int, TaskResult] = {}
        next_out = 0
        total = len(todo)
        while len(self._slots) < min(self.workers, max(total, 1)):
            self._slots.append(self._spawn())
        try:
            while next_out < total:
                for slot in self._slots:
                    if slot.task is None and todo:
                        index, item = todo.pop()
                        slot.task, slot.started = index, time.perf_counter()
                        slot.conn.send((index, fn, item))
                signalled = mp.connection.wait([s.conn for s in self._slots if s.task is not None] +
                                               [s.proc.sentinel for s in self._slots if s.task is not None],
                                               timeout=0.05)
                now = time.perf_counter()
                for k, slot in enumerate(self._slots):
                    if slot.task is None:
                        continue
                    task = slot.task
                    failure = None
                    if slot.conn in signalled or slot.conn.poll():
                        try:
                            index, ok, payload = slot.conn.recv()
                            results[index] = TaskResult(index, ok, payload if ok else None, "" if ok else payload,
                                                        now - slot.started)
                            slot.task = None
                            continue
                        except (EOFError, OSError):
                            failure = "the worker died"
                    elif not slot.proc.is_alive():
                        failure = f"the worker died (exit code {slot.proc.exitcode})"
                    elif self.timeout_s is not None and now - slot.started > self.timeout_s:
                        failure = f"timed out after {self.timeout_s:g} s; the worker was killed"
                    if failure:
                        if self.log_failures:
                            log.warning("task %d failed: %s", task, failure)
                        results[task] = TaskResult(task, False, error=failure, seconds=now - slot.started)
                        self._retire(slot)
                        self._slots[k] = self._spawn()
                ready, next_out = release(results, next_out, ordered)
                yield from ready
        finally:
            for slot in self._slots:
                if slot.task is not None:  # abandoned mid-task (the consumer stopped): kill
                    self._retire(slot)
                    slot.task = None
            self._slots = [s for s in self._slots if s.proc.is_alive()]

    def close(self) -> None:
        for slot in self._slots:
            try:
                slot.conn.send(None)
            except (BrokenPipeError, OSError):
                pass
            slot.proc.join(timeout=2)
            self._retire(slot)
        self._slots = []

    def __enter__(self) -> Pool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


#: ``factory(workers, max_in_flight, timeout_s, initializer)`` opens one pool backend.
PoolFactory = Callable[[int, int, float | None, Callable[[], None] | None], Pool]

BACKENDS: Registry[PoolFactory] = Registry("pool backend", where="hydroagent_hpc/hpc/pool.py")


@BACKENDS.register("serial")
def _serial(workers: int, max_in_flight: int, timeout_s: float | None,
            initializer: Callable[[], None] | None) -> Pool:
    return SerialPool(timeout_s, initializer)


@BACKENDS.register("processes")
def _processes(workers: int, max_in_flight: int, timeout_s: float | None,
               initializer: Callable[[], None] | None) -> Pool:
    return ProcessPool(workers, max_in_flight, timeout_s, initializer=initializer)


@BACKENDS.register("mpi")
def _mpi(workers: int, max_in_flight: int, timeout_s: float | None, initializer: Callable[[], None] | None) -> Pool:
    raise PoolError("the mpi pool needs every rank to take part: open it with "
                    "hydroagent_hpc.hpc.mpi.mpi_pool() under mpiexec or srun --mpi=pmi2")


def open_pool(backend: str = "serial", workers: int = 2, max_in_flight: int = 32, timeout_s: float | None = None,
              initializer: Callable[[], None] | None = None) -> Pool:
    """The pool for ``backend``, an entry of :data:`BACKENDS` ("serial" or "processes"; "mpi" is
    opened with ``hpc.mpi.mpi_pool`` on every rank). An unknown name raises
    :class:`~hydroagent_hpc.registry.UnknownNameError` listing the valid ones."""
    return BACKENDS.lookup(backend)(workers, max_in_flight, timeout_s, initializer)
