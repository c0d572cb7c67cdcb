"""Queued simulations of one basin gathered into one batched call: :class:`RunCoalescer`.

The K rollouts of a GRPO group calibrate the same basin, so while every simulation slot is busy
several of them are often waiting to simulate that basin at the same moment. The embedded engine
runs K parameter sets of one basin in one call over the shared forcing
(:meth:`~hydroagent_hpc.sim.embedded.EmbeddedSimulator.run_batch`, bit-identical to K single runs),
so the coalescer lets those waiting requests share one slot and one call:

- A request for basin key ``key`` joins the open batch of that key if there is one with room
  (fewer than ``max_batch`` members); otherwise it opens a new batch and leads it.
- The leader waits for one slot of :class:`~hydroagent_hpc.train.rollout.SimulationSlots`. When it
  gets it, it closes the batch (later requests open the next one), runs all members with one
  ``run_batch`` call and hands each member its own result. A request that finds a slot free runs
  at once as a batch of one (with ``run_one``): nothing waits that would not have waited anyway.
- **Failure isolation.** One member's bad parameters (non-finite discharge, say) fail the whole
  batched call; the leader then reruns the members one by one in the same slot, so only the bad
  member fails, with its own error.
- **Accounting.** The slot counts every member as a run (``SimulationSlots.runs``), the batch as
  one slot hold (``batches``) and, when the batched call succeeded with two or more members, its
  members as ``batched_runs``.

The coalescer knows nothing of simulators: the caller passes ``run_batch`` and ``run_one`` for its
basin (:class:`~hydroagent_hpc.train.rollout.RolloutSimulator` does, locally or on MPI ranks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hydroagent_hpc.types import SimulationResult

if TYPE_CHECKING:
    from hydroagent_hpc.train.rollout import SimulationSlots

log = logging.getLogger(__name__)

__all__ = ["RunCoalescer", "Params", "RunOne", "RunBatch"]

#: One request's multiplier overrides (None: the base parameters).
Params = Mapping[str, float] | None
RunOne = Callable[[Params], SimulationResult]
RunBatch = Callable[[Sequence[Params]], Sequence[SimulationResult]]


@dataclass
class _Member:
    """One request in a batch and the future its thread waits on."""

    params: Params
    future: Future[SimulationResult] = field(default_factory=Future)


@dataclass
class _Batch:
    """The requests gathered behind one leader; ``closed`` once the leader took them to run."""

    members: list[_Member]
    closed: bool = False


class RunCoalescer:
    """Gathers the requests of one basin key that wait for a slot into one batch (see the module doc).

    ``slots`` is the rollouts' shared cap on simulations in flight; ``max_batch`` the most members a
    batch takes (1: every request runs alone, as without a coalescer). Thread-safe.
    """

    def __init__(self, slots: SimulationSlots, max_batch: int = 8) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch={max_batch}: a batch needs room for at least 1 run")
        self.slots = slots
        self.max_batch = int(max_batch)
        self._lock = threading.Lock()
        self._open: dict[Hashable, _Batch] = {}  # the batch of each key that still takes members
        self._waiting = 0  # members of batches not yet closed
        self.splits = 0  # batched calls that failed and were rerun member by member

    def run(self, key: Hashable, params: Params, run_batch: RunBatch, run_one: RunOne) -> SimulationResult:
        """Simulate ``params`` on the basin ``key`` names, in a batch with other waiting requests of
        that key; raises what this member's run raised."""
        member = _Member(params)
        batch = self._join(key, member)
        if batch is not None:
            self._lead(key, batch, run_batch, run_one)
        return member.future.result()

    def waiting(self) -> int:
        """Requests in batches not yet closed (their leader still waits for a slot)."""
        with self._lock:
            return self._waiting

    def _join(self, key: Hashable, member: _Member) -> _Batch | None:
        """Add ``member`` to the open batch of ``key`` (None), or open a new batch it leads (the batch)."""
        with self._lock:
            self._waiting += 1
            batch = self._open.get(key)
            if batch is not None and len(batch.members) < self.max_batch:
                batch.members.append(member)
                return None
            batch = self._open[key] = _Batch([member])  # a full batch stays with its leader; the next one opens
            return batch

    def _close(self, key: Hashable, batch: _Batch) -> list[_Member]:
        """Stop ``batch`` taking members; its members, in the order they came."""
        with self._lock:
            if self._open.get(key) is batch:
                del self._open[key]
            if not batch.closed:
                batch.closed = True
                self._waiting -= len(batch.members)
            return list(batch.members)

    def _lead(self, key: Hashable, batch: _Batch, run_batch: RunBatch, run_one: RunOne) -> None:
        """Wait for a slot, close the batch, run it, and hand every member its outcome."""
        try:
            with self.slots.slot() as use:
                members = self._close(key, batch)
                use.runs = len(members)
                outcomes, use.batched = self._execute([m.params for m in members], run_batch, run_one)
        except BaseException as exc:  # no slot (interrupted) or a broken runner: no member may wait forever
            for m in self._close(key, batch):
                if not m.future.done():
                    m.future.set_exception(exc)
            return
        for m, outcome in zip(members, outcomes):
            if isinstance(outcome, BaseException):
                m.future.set_exception(outcome)
            else:
                m.future.set_result(outcome)

    def _execute(self, params: list[Params], run_batch: RunBatch,
                 run_one: RunOne) -> tuple[list[SimulationResult | Exception], bool]:
        """The members' outcomes, in order, and whether they ran as one batched call."""
        if len(params) == 1:
            return [_attempt(run_one, params[0])], False
        try:
            results = list(run_batch(params))
            if len(results) != len(params):
                raise RuntimeError(f"run_batch returned {len(results)} results for {len(params)} parameter sets")
        except Exception as exc:
            with self._lock:
                self.splits += 1
            log.info("a batch of %d runs failed as a whole (%s: %s); running its members one by one",
                     len(params), type(exc).__name__, str(exc).splitlines()[0] if str(exc) else "")
            return [_attempt(run_one, p) for p in params], False
        return list(results), True


def _attempt(run_one: RunOne, params: Params) -> SimulationResult | Exception:
    """``run_one(params)``, or the exception it raised (delivered to that member only)."""
    try:
        return run_one(params)
    except Exception as exc:
        return exc
