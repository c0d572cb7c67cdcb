"""Queued simulations of one basin gathered into one batched call: :class:`RunCoalescer`.

The K rollouts of a GRPO group calibrate the same basin, so while every simulation slot is busy
several of them are often waiting to simulate that basin at the same moment. The embedded engine
runs K parameter sets of one basin in one call over the shared forcing
(:meth:`~hydroagent_hpc.sim.embedded.EmbeddedSimulator.run_batch`, bit-identical to K single runs),
so the coalescer lets those waiting requests share one slot and one call:

- A request for basin key ``key`` joins the open batch of that key if there is one with room
  (fewer than ``max_batch`` members); otherwise it opens a new batch and leads it.
- The leader waits for one slot of :class:`~hydroagent_hpc.train.generation.rollout.SimulationSlots`. When it
  gets it, it takes its share of the batch, runs those members with one ``run_batch`` call and
  hands each member its own result. A request that finds a slot free runs at once as a batch of
  one (with ``run_one``): nothing waits that would not have waited anyway.
- **The share** is ceil(requests waiting, all basins / slots), at most the batch: with one slot the
  whole batch, with 2 slots and 6 waiting 3 of them. The others stay waiting, led by the first of
  them, for the next slot that frees. Taking the whole queue into one slot would leave the other
  slots idle as they free (with 32 slots and 8 basins x 4 waiting runs, 8 slots would work
  through 4 runs each while 24 sit idle); a share keeps the slots busy. With the paper's
  setting (32 slots, 4 x 8 rollouts) no run ever waits for a slot, so nothing is batched.
- **Failure isolation.** One member's bad parameters (non-finite discharge, say) fail the whole
  batched call; the leader then reruns the members one by one in the same slot, so only the bad
  member fails, with its own error.
- **Accounting.** The slot counts every member as a run (``SimulationSlots.runs``), the batch as
  one slot hold (``batches``) and, when the batched call succeeded with two or more members, its
  members as ``batched_runs``.

The coalescer knows nothing of simulators: the caller passes ``run_batch`` and ``run_one`` for its
basin (:class:`~hydroagent_hpc.train.generation.rollout.RolloutSimulator` does, locally or on MPI ranks).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from hydroagent_hpc.types import SimulationResult

if TYPE_CHECKING:
    from hydroagent_hpc.train.generation.rollout import SimulationSlots

log = logging.getLogger(__name__)

__all__ = ["RunCoalescer", "Params", "RunOne", "RunBatch"]

#: One request's multiplier overrides (None: the base parameters).
Params = Mapping[str, float] | None
RunOne = Callable[[Params], SimulationResult]
RunBatch = Callable[[Sequence[Params]], Sequence[SimulationResult]]


class _Member:
    """One request: its parameters, and what its thread waits for (an outcome, or to lead)."""

    def __init__(self, params: Params) -> None:
        self.params = params
        self.outcome: SimulationResult | BaseException | None = None
        self.promoted: _Batch | None = None  # the rest of a batch this member now leads
        self._woken = threading.Event()

    def finish(self, outcome: SimulationResult | BaseException) -> None:
        self.outcome = outcome
        self._woken.set()

    def promote(self, batch: _Batch) -> None:
        self.promoted = batch
        self._woken.set()

    def wait(self) -> None:
        self._woken.wait()

    def result(self) -> SimulationResult:
        outcome = self.outcome
        if isinstance(outcome, BaseException):
            raise outcome
        if outcome is None:
            raise RuntimeError("a coalesced run finished without an outcome")
        return outcome


@dataclass
class _Batch:
    """Requests of one key gathered behind a leader (``members[0]``), who waits for a slot."""

    members: list[_Member] = field(default_factory=list)


class RunCoalescer:
    """Gathers the requests of one basin key that wait for a slot into batches (see the module doc).

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
        self._waiting = 0  # requests in batches whose leader waits for a slot (all keys)
        self.splits = 0  # batched calls that failed and were rerun member by member

    def run(self, key: Hashable, params: Params, run_batch: RunBatch, run_one: RunOne) -> SimulationResult:
        """Simulate ``params`` on the basin ``key`` names, in a batch with other waiting requests of
        that key; raises what this member's run raised."""
        member = _Member(params)
        batch = self._join(key, member)
        if batch is None:  # a member: woken with its outcome, or to lead the rest of its batch
            member.wait()
            batch = member.promoted
        if batch is not None:
            self._lead(key, batch, run_batch, run_one)
        return member.result()

    def waiting(self) -> int:
        """Requests waiting for a slot in a batch (their leader included)."""
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

    def _take(self, key: Hashable, batch: _Batch, everyone: bool = False) -> list[_Member]:
        """The members the leader runs now, leader first: its share of the waiting requests,
        ceil(waiting / slots), so a batch never holds runs that the other slots, as they free,
        would start sooner (with one slot: all of them). The rest stay waiting, led by the first."""
        with self._lock:
            share = len(batch.members) if everyone else -(-self._waiting // self.slots.limit)
            taken, rest = batch.members[:max(1, share)], batch.members[max(1, share):]
            self._waiting -= len(taken)
            batch.members = taken
            if rest:
                remainder = _Batch(rest)
                if self._open.get(key) is batch:
                    self._open[key] = remainder
                rest[0].promote(remainder)
            elif self._open.get(key) is batch:
                del self._open[key]
            return taken

    def _lead(self, key: Hashable, batch: _Batch, run_batch: RunBatch, run_one: RunOne) -> None:
        """Wait for a slot, take the members to run, run them, and hand every member its outcome."""
        members: list[_Member] | None = None
        try:
            with self.slots.slot() as use:
                members = self._take(key, batch)
                use.runs = len(members)
                outcomes, use.batched = self._execute([m.params for m in members], run_batch, run_one)
        except BaseException as exc:  # no slot (interrupted) or a broken runner: no member may wait forever
            for m in members if members is not None else self._take(key, batch, everyone=True):
                m.finish(exc)
            return
        for m, outcome in zip(members, outcomes):
            m.finish(outcome)

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
