"""The GRPO step timeline: what each trainer process, simulation slot and rollout did in a step, and when.

The trainer (:mod:`hydroagent_hpc.train.grpo.trainer`) records it into ``RUN/timeline.jsonl``, one line
per step; ``hydroagent train timeline RUN [--out PNG] [--steps A:B]`` draws it and prints how busy each
lane was (:func:`read_timeline`, :func:`utilisation`, :func:`format_utilisation`, :func:`draw`). It is
what to read when a step is slow: which GPU generated while the others waited, how long the weights
took to reach the engine, which rollouts waited for a batch or a simulation slot.

**Lanes and phases** (a span is ``[lane, phase, start, end, depth]``, seconds from the step's start on
rank 0):

* ``rank R``, one per training process (its device in the lane's record). Depth 0, one at a time:
  ``generate`` (rank 0 plays the step's rollouts), ``wait`` (for another rank: the training batch that
  rank 0 broadcasts, so on the other ranks it covers rank 0's rollouts), ``train`` (the loss and one
  optimizer step), ``sync`` (the new weights to the generator: gather and push), ``validate`` (greedy
  validation episodes), and ``sleep`` / ``wake`` for a generator that releases its memory. Depth 1,
  inside those: ``decode`` (one batch of the in-process sampler, inside ``generate`` or ``validate``),
  ``forward``, ``backward`` and ``optimizer`` (inside ``train``). The step's time in no depth-0 span is
  the trainer's own bookkeeping (advantages, the episode store, the metrics row): ``idle`` in the
  utilisation table. On a CUDA device every rank span ends with a device synchronisation, so that it
  holds the GPU work it launched (the loop synchronises there anyway: a loss is read as a float).
* ``sim slot I``, one per simulation slot that was used
  (:class:`~hydroagent_hpc.train.generation.rollout.SimulationSlots`): ``simulate`` while the slot is
  held (one run, or one basin's runs batched into one call).
* ``grpo gG-kK`` (``grpo-val gG-k0`` for validation episodes), one per rollout: ``gpu_wait`` (its turn
  queued while the in-process sampler decoded other batches), ``decode`` (its turn's batch being
  decoded), ``engine`` (a turn sent to an inference engine: queueing and decoding there, not told
  apart), ``sim_wait`` (a simulation waiting for a slot) and ``simulate`` (its simulation running, or
  the batched or shared run of the same parameters that it waits on). A run batched with another
  rollout's holds that rollout's slot: the waiting member's ``sim_wait`` ends when that slot was taken
  (the latest slot hold that ended during its call), so for batched and shared runs the split is
  inferred, not observed. The rest of a rollout's time is its own work (the environment, the chat
  template) and, after its last turn, waiting for the step's slowest rollout.

**The file.** Rank 0 appends a step's line (one ``write``, flushed and fsynced) after the step's
metrics row and before its checkpoint; the other ranks send theirs to rank 0 first
(``gather_object``, a collective of every rank at the same point). A resumed run first drops the
lines of steps after its checkpoint and a line cut short by a kill (written to a temporary file and
renamed over), so every step is in the file once, from the run that the checkpoints continue. Each line::

    {"v": 1, "step": N, "start": <epoch seconds of the step's start on rank 0>, "wall_s": <rank 0's step>,
     "lanes": [{"name": "rank 0", "kind": "rank", "device": "cuda:0", "start": 0.0, "end": 12.3},
               {"name": "sim slot 0", "kind": "slot"}, {"name": "grpo g0-k0", "kind": "rollout"}, ...],
     "spans": [[lane index, phase, start s, end s, depth], ...]}

The checkpoint written after a step and the validation before the first step are in no step's line.

**Recording API** (the trainer's few calls): :func:`recording` around the step loop, :func:`begin_step`
and :func:`end_step` around each step, ``with span("train"):`` around a phase (nested spans get depth
1), and in the rollout phase :func:`timed_sampler`, :func:`timed_slots`, :func:`rollout_server` and
:func:`rollout_simulator`, which return their argument unchanged when nothing records. Importing this
module loads neither torch nor matplotlib.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import re
import threading
import time
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar, cast

from hydroagent_hpc.errors import HydroAgentError

if TYPE_CHECKING:
    from hydroagent_hpc.train.generation.rollout import RolloutSpec, SimulationSlots
    from hydroagent_hpc.train.generation.sampler import GenerationServer, RolloutSampler
    from hydroagent_hpc.types import SimulationResult

log = logging.getLogger(__name__)

__all__ = ["FILE_NAME", "VERSION", "RANK_PHASES", "INNER_PHASES", "ROLLOUT_PHASES", "TimelineError",
           "TimelineRecorder", "recording", "active", "span", "begin_step", "end_step", "timed_sampler",
           "timed_slots", "rollout_server", "rollout_simulator", "trim", "read_timeline", "parse_steps",
           "utilisation", "format_utilisation", "draw"]

FILE_NAME = "timeline.jsonl"
VERSION = 1
#: Depth-0 phases of a rank lane, in drawing order.
RANK_PHASES = ("generate", "wake", "sync", "wait", "train", "sleep", "validate")
#: Depth-1 phases of a rank lane (inside generate/validate, inside train).
INNER_PHASES = ("decode", "forward", "backward", "optimizer")
#: Phases of a rollout lane.
ROLLOUT_PHASES = ("gpu_wait", "decode", "engine", "sim_wait", "simulate")
SLOT_PHASES = ("simulate",)
_KIND_ORDER = {"rank": 0, "slot": 1, "rollout": 2}

T = TypeVar("T")


class TimelineError(HydroAgentError):
    """A timeline that cannot be read or drawn (missing, empty, no step in the range asked for)."""


@dataclass(frozen=True)
class _Hold:
    """One hold of a simulation slot: asked for at ``asked``, taken at ``taken``, given back at ``end``."""

    asked: float
    taken: float
    end: float
    thread: int


class TimelineRecorder:
    """The spans of the current step of one training process (thread-safe; see the module doc).

    ``path``: the file rank 0 appends to (None on the other ranks, which send their spans to rank 0).
    ``sync_device``: synchronise a CUDA device at the end of every rank span.
    """

    def __init__(self, path: Path | None, *, rank: int = 0, world: int = 1, device: str = "cpu",
                 sync_device: bool = True) -> None:
        self.path = path
        self.rank = int(rank)
        self.world = int(world)
        self.device = str(device)
        self.lane = f"rank {self.rank}"
        self.sync_device = bool(sync_device) and self.device.startswith("cuda")
        self._lock = threading.Lock()
        self._local = threading.local()
        self._perf0 = time.perf_counter()
        self._wall0 = time.time()
        self._step: int | None = None
        self._start = 0.0
        self._spans: list[tuple[str, str, str, float, float, int]] = []  # lane, kind, phase, t0, t1, depth
        self._holds: list[_Hold] = []
        #: the time each keyed request's batch began decoding (set by the timed sampler, read by the rollout)
        self.batch_start: dict[Hashable, float] = {}

    def now(self) -> float:
        """Seconds since the epoch, from the monotonic clock (so spans never run backwards)."""
        return self._wall0 + (time.perf_counter() - self._perf0)

    @property
    def step(self) -> int | None:
        return self._step

    def begin_step(self, step: int) -> None:
        with self._lock:
            self._step = int(step)
            self._start = self.now()
            self._spans = []
            self._holds = []
            self.batch_start = {}

    def add(self, lane: str, kind: str, phase: str, t0: float, t1: float, depth: int = 0) -> None:
        """Record a span (ignored outside a step, or when it is empty)."""
        if t1 <= t0:
            return
        with self._lock:
            if self._step is not None:
                self._spans.append((lane, kind, phase, t0, t1, int(depth)))

    def _synchronize(self) -> None:
        if self.sync_device:
            import torch

            torch.cuda.synchronize()

    @contextlib.contextmanager
    def span(self, phase: str) -> Iterator[None]:
        """This rank's lane is in ``phase`` for the block (depth: how many spans of this thread enclose it)."""
        stack: list[str] = self._local.__dict__.setdefault("stack", [])
        depth = len(stack)
        stack.append(phase)
        t0 = self.now()
        try:
            yield
        finally:
            self._synchronize()
            stack.pop()
            self.add(self.lane, "rank", phase, t0, self.now(), depth)

    # -- simulation slots

    def hold(self, asked: float, taken: float, end: float) -> None:
        with self._lock:
            if self._step is not None:
                self._holds.append(_Hold(asked, taken, end, threading.get_ident()))

    def simulation_call(self, lane: str, t0: float, t1: float) -> None:
        """A rollout's simulator call ran from ``t0`` to ``t1`` on this thread: its ``sim_wait`` and
        ``simulate`` spans, from the slot holds this thread took during the call, or else (a run
        batched with another rollout's, or shared with it) from the latest hold that ended in the call."""
        me = threading.get_ident()
        with self._lock:
            own = sorted((h for h in self._holds if h.thread == me and t0 <= h.asked and h.end <= t1),
                         key=lambda h: h.taken)
            other = [h for h in self._holds if t0 <= h.end <= t1]
        if own:
            cursor = t0
            for h in own:
                self.add(lane, "rollout", "sim_wait", cursor, h.taken)
                self.add(lane, "rollout", "simulate", max(cursor, h.taken), h.end)
                cursor = max(cursor, h.end)
            return
        if other:
            taken = max(other, key=lambda h: h.end).taken
            self.add(lane, "rollout", "sim_wait", t0, taken)
            self.add(lane, "rollout", "simulate", max(t0, taken), t1)
            return
        self.add(lane, "rollout", "simulate", t0, t1)

    # -- the step's line

    def end_step(self) -> dict[str, Any] | None:
        """Close the step: gather every rank's spans on rank 0, which appends the step's line; returns
        the line's record on rank 0 (None elsewhere, or outside a step)."""
        with self._lock:
            step, start, spans = self._step, self._start, list(self._spans)
            self._step = None
        if step is None:
            return None
        payload = {"rank": self.rank, "device": self.device, "start": start, "end": self.now(),
                   "spans": spans}
        payloads: list[dict[str, Any]] = [payload]
        if self.world > 1:
            payloads = _gather(payload, self.rank, self.world)
        if self.path is None:
            return None
        record = _compose(step, payloads)
        append_line(self.path, record)
        return record


def _gather(payload: dict[str, Any], rank: int, world: int) -> list[dict[str, Any]]:
    """Every rank's payload on rank 0 (``gather_object``: every rank calls it); [] on the other ranks."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return [payload]
    out: list[Any] | None = [None] * world if rank == 0 else None
    dist.gather_object(payload, out, dst=0)
    return [p for p in out if p is not None] if out is not None else []


def _natural(name: str) -> tuple[Any, ...]:
    """Sort key: numbers inside a name compare as numbers (``grpo g2-k10`` after ``grpo g2-k9``)."""
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _lane_key(kind: str, name: str) -> tuple[Any, ...]:
    return (_KIND_ORDER.get(kind, 9), _natural(name))


def _compose(step: int, payloads: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The step's line from the ranks' payloads (times relative to rank 0's start)."""
    lead = next((p for p in payloads if p["rank"] == 0), payloads[0])
    t0 = float(lead["start"])
    lanes: dict[str, dict[str, Any]] = {}
    for p in payloads:
        lanes[f"rank {p['rank']}"] = {"name": f"rank {p['rank']}", "kind": "rank", "device": p["device"],
                                      "start": round(float(p["start"]) - t0, 6), "end": round(float(p["end"]) - t0, 6)}
        for lane, kind, _, _, _, _ in p["spans"]:
            lanes.setdefault(lane, {"name": lane, "kind": kind})
    order = sorted(lanes.values(), key=lambda x: _lane_key(x["kind"], x["name"]))
    index = {lane["name"]: i for i, lane in enumerate(order)}
    spans = sorted(([index[lane], phase, round(a - t0, 6), round(b - t0, 6), depth]
                    for p in payloads for lane, _, phase, a, b, depth in p["spans"]),
                   key=lambda s: (s[0], s[2], s[4]))
    return {"v": VERSION, "step": int(step), "start": round(t0, 6), "wall_s": round(float(lead["end"]) - t0, 6),
            "lanes": order, "spans": spans}


def append_line(path: Path, record: Mapping[str, Any]) -> None:
    """Append ``record`` as one JSON line: one write, flushed and fsynced."""
    data = (json.dumps(record, separators=(",", ":")) + "\n").encode("utf-8")
    with open(path, "ab", buffering=0) as fh:  # unbuffered: the line goes in one write call (O_APPEND)
        view = memoryview(data)
        while view:  # a raw write may take less than it is given
            view = view[fh.write(view) or 0:]
        os.fsync(fh.fileno())


def _parse_line(line: bytes) -> dict[str, Any] | None:
    """A step's record, or None for a line that is not one (cut short, damaged)."""
    try:
        record = json.loads(line)
    except (ValueError, UnicodeDecodeError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step"), int) \
            or not isinstance(record.get("spans"), list) or not isinstance(record.get("lanes"), list):
        return None
    return record


def trim(path: Path, last_step: int) -> int:
    """Keep the whole lines of steps up to ``last_step`` (a resumed run's checkpoint; 0 for a start from
    scratch): the lines of later steps and any line cut short go (the file rewritten to a temporary name
    and renamed over it). Returns how many lines were dropped."""
    if not path.is_file():
        return 0
    raw = path.read_bytes()
    lines = raw.split(b"\n")
    whole, tail = lines[:-1], lines[-1]  # the text after the last newline is a cut-off line (or empty)
    kept = [ln for ln in whole if (r := _parse_line(ln)) is not None and r["step"] <= last_step]
    dropped = len(whole) - len(kept) + (1 if tail else 0)
    if dropped == 0:
        return 0
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as fh:
        fh.write(b"".join(ln + b"\n" for ln in kept))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)
    log.info("%s: dropped %d line(s) after step %d (the run resumes from there)", path, dropped, last_step)
    return dropped


# ---------------------------------------------------------------------------------------------
# The recorder the trainer's calls reach (one per process, while a run records)

_active: TimelineRecorder | None = None


def active() -> TimelineRecorder | None:
    """The recorder of the run in progress in this process, or None."""
    return _active


@contextlib.contextmanager
def recording(run_dir: str | os.PathLike[str], *, resumed_step: int, rank: int = 0, world: int = 1,
              device: Any = "cpu", sync_device: bool = True) -> Iterator[TimelineRecorder]:
    """Record the steps of the block into ``run_dir``/timeline.jsonl (rank 0 writes it, after dropping the
    lines after ``resumed_step``: the checkpoint's step, 0 for a fresh start)."""
    global _active
    path = Path(run_dir) / FILE_NAME if rank == 0 else None
    if path is not None:
        trim(path, int(resumed_step))
    recorder = TimelineRecorder(path, rank=rank, world=world, device=str(device), sync_device=sync_device)
    previous, _active = _active, recorder
    try:
        yield recorder
    finally:
        _active = previous


def span(phase: str) -> contextlib.AbstractContextManager[None]:
    """``with span("train"):`` on this process's lane (nothing when no run records)."""
    recorder = _active
    if recorder is None or recorder.step is None:
        return contextlib.nullcontext()
    return recorder.span(phase)


def begin_step(step: int) -> None:
    if _active is not None:
        _active.begin_step(step)


def end_step() -> dict[str, Any] | None:
    """Close the step (a collective when several processes train: every rank calls it at the same point)."""
    return _active.end_step() if _active is not None else None


# ---------------------------------------------------------------------------------------------
# The rollout phase: the sampler's batches, the slots, each rollout's turns and simulations


class _TimedSampler:
    """The in-process sampler, each batch a ``decode`` span (depth 1) on this rank's lane, and each row's
    batch start noted for the rollout that asked (by its key)."""

    def __init__(self, inner: RolloutSampler, recorder: TimelineRecorder) -> None:
        self.inner = inner
        self.recorder = recorder
        self.max_batch = inner.max_batch
        self.stats = inner.stats

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None] | None = None,
               forced: Sequence[Sequence[int] | None] | None = None) -> list[Any]:
        rec = self.recorder
        t0 = rec.now()
        for key in keys or ():
            if key is not None:
                rec.batch_start[key] = t0
        try:
            return self.inner.sample(prompts, seeds, keys, forced)
        finally:
            rec.add(rec.lane, "rank", "decode", t0, rec.now(), depth=1)

    def forget(self) -> None:
        self.inner.forget()


def timed_sampler(sampler: RolloutSampler) -> RolloutSampler:
    """``sampler`` with its batches recorded, when a run records and it is the in-process
    :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler` (an engine's sampler is returned as it is)."""
    from hydroagent_hpc.train.generation.sampler import BatchedSampler

    if _active is None or not isinstance(sampler, BatchedSampler):
        return sampler
    return cast("RolloutSampler", _TimedSampler(sampler, _active))


@functools.lru_cache(maxsize=1)
def _slots_class() -> type[SimulationSlots]:
    """:class:`SimulationSlots` whose holds are recorded (built on first use: the rollout module loads torch)."""
    from hydroagent_hpc.train.generation.rollout import SimulationSlots, SlotUse

    class TimedSlots(SimulationSlots):
        recorder: TimelineRecorder

        def __init__(self, limit: int, recorder: TimelineRecorder) -> None:
            super().__init__(limit)
            self.recorder = recorder
            self._free = list(range(self.limit))
            self._index_lock = threading.Lock()

        @contextlib.contextmanager
        def slot(self) -> Iterator[SlotUse]:
            rec = self.recorder
            asked = rec.now()
            with super().slot() as use:
                taken = rec.now()
                with self._index_lock:
                    index = self._free.pop(0)  # the lowest free slot: a slot's lane shows its own holds
                try:
                    yield use
                finally:
                    end = rec.now()
                    with self._index_lock:
                        self._free.append(index)
                        self._free.sort()
                    rec.add(f"sim slot {index}", "slot", "simulate", taken, end)
                    rec.hold(asked, taken, end)

    return TimedSlots


def timed_slots(limit: int) -> SimulationSlots:
    """The rollouts' simulation slots (``limit`` of them), their holds recorded when a run records."""
    if _active is None:
        from hydroagent_hpc.train.generation.rollout import SimulationSlots

        return SimulationSlots(limit)
    return _slots_class()(limit, _active)  # type: ignore[call-arg]


def rollout_lane(spec: RolloutSpec, agent: str) -> str:
    """The lane of a rollout: ``<agent> g<group>-k<member>``."""
    return f"{agent} g{spec.group}-k{spec.member}"


class _TimedServer:
    """A rollout's view of the generation server: each turn a ``gpu_wait`` + ``decode`` pair (the
    in-process sampler told when the batch began) or one ``engine`` span."""

    def __init__(self, server: GenerationServer, recorder: TimelineRecorder, lane: str) -> None:
        self._server = server
        self._recorder = recorder
        self._lane = lane

    def generate(self, ids: Sequence[int], seed: int | None, key: Hashable | None = None,
                 forced: Sequence[int] | None = None) -> Any:
        rec = self._recorder
        t0 = rec.now()
        try:
            if forced is None:  # as the rollout policy asks (a server need not know forced ids)
                return self._server.generate(ids, seed, key=key)
            return self._server.generate(ids, seed, key=key, forced=forced)
        finally:
            t1 = rec.now()
            began = rec.batch_start.pop(key, None) if key is not None else None
            if began is None:
                rec.add(self._lane, "rollout", "engine", t0, t1)
            else:
                began = min(max(began, t0), t1)
                rec.add(self._lane, "rollout", "gpu_wait", t0, began)
                rec.add(self._lane, "rollout", "decode", began, t1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._server, name)


def rollout_server(spec: RolloutSpec, server: GenerationServer, agent: str) -> GenerationServer:
    """``server`` as the rollout ``spec`` uses it, its turns recorded on the rollout's lane (when a run records)."""
    if _active is None:
        return server
    return cast("GenerationServer", _TimedServer(server, _active, rollout_lane(spec, agent)))


class _TimedSimulator:
    """A rollout's simulator, each call split into ``sim_wait`` and ``simulate`` on the rollout's lane."""

    def __init__(self, inner: Any, recorder: TimelineRecorder, lane: str) -> None:
        self.inner = inner
        self._recorder = recorder
        self._lane = lane

    @property
    def base_params(self) -> dict[str, float]:
        return dict(self.inner.base_params)

    def _timed(self, call: Callable[[], T]) -> T:
        t0 = self._recorder.now()
        try:
            return call()
        finally:
            self._recorder.simulation_call(self._lane, t0, self._recorder.now())

    def run(self, params: Mapping[str, float] | None = None) -> SimulationResult:
        result: SimulationResult = self._timed(lambda: self.inner.run(params))
        return result

    def run_batch(self, param_sets: Sequence[Mapping[str, float] | None]) -> list[SimulationResult]:
        return self._timed(lambda: list(self.inner.run_batch(param_sets)))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def rollout_simulator(spec: RolloutSpec, simulator: T, agent: str) -> T:
    """``simulator`` as the rollout ``spec``'s environment uses it, its calls recorded (when a run records)."""
    if _active is None:
        return simulator
    return cast(T, _TimedSimulator(simulator, _active, rollout_lane(spec, agent)))


# ---------------------------------------------------------------------------------------------
# Reading, the utilisation table, the figure


def parse_steps(text: str) -> tuple[int | None, int | None]:
    """``A:B`` (steps A to B, both included), ``A:``, ``:B`` or ``N`` (one step)."""
    match = re.fullmatch(r"\s*(\d*)\s*(:?)\s*(\d*)\s*", text)
    if match is None or not (match.group(1) or match.group(3)) or (match.group(3) and not match.group(2)):
        raise ValueError(f"{text!r} is not a step range such as 3:8, 3:, :8 or 5")
    first = int(match.group(1)) if match.group(1) else None
    last = int(match.group(3)) if match.group(3) else (first if not match.group(2) else None)
    if first is not None and last is not None and last < first:
        raise ValueError(f"{text!r}: the last step is before the first")
    return first, last


def read_timeline(run: str | os.PathLike[str], steps: tuple[int | None, int | None] = (None, None)
                  ) -> list[dict[str, Any]]:
    """The step records of a run folder's ``timeline.jsonl`` (or of that file), in the range ``steps``.
    Lines that are not a step's record (cut short by a kill) are skipped with a warning; a step that
    occurs twice (a file not trimmed by a resume) keeps its last line."""
    path = Path(run)
    if path.is_dir():
        path = path / FILE_NAME
    if not path.is_file():
        raise TimelineError(f"{path}: no step timeline here",
                            "name a GRPO run folder whose trainer recorded one (RUN/timeline.jsonl, written "
                            "every step)")
    by_step: dict[int, dict[str, Any]] = {}
    bad = []
    for n, line in enumerate(path.read_bytes().split(b"\n"), start=1):
        if not line.strip():
            continue
        record = _parse_line(line)
        if record is None:
            bad.append(n)
            continue
        by_step[int(record["step"])] = record
    if bad:
        log.warning("%s: line(s) %s are not step records (skipped)", path, ", ".join(map(str, bad[:5])))
    first, last = steps
    chosen = [r for s, r in sorted(by_step.items())
              if (first is None or s >= first) and (last is None or s <= last)]
    if not chosen:
        have = f"steps {min(by_step)}-{max(by_step)}" if by_step else "no step"
        raise TimelineError(f"{path}: no step in {first or ''}:{last or ''} ({have} recorded)",
                            "give --steps within the recorded range, or leave it out")
    return chosen


def _union(intervals: Sequence[tuple[float, float]]) -> float:
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def utilisation(records: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Seconds per lane and phase over ``records`` and the steps' wall time: ``{"steps": [...],
    "wall_s": ..., "lanes": {name: {"kind", "device", "seconds": {phase: s}}}}``. Rank lanes get
    ``idle`` (the step's time in no depth-0 span), slot lanes ``idle``, rollout lanes ``other`` (their
    own work between their first and last span) and ``done`` (the rest of the step: before their first
    span and after their last one, waiting for the slowest rollout)."""
    lanes: dict[str, dict[str, Any]] = {}
    wall = 0.0
    for r in records:
        step_wall = float(r["wall_s"])
        wall += step_wall
        names = [lane["name"] for lane in r["lanes"]]
        spans_of: dict[str, list[list[Any]]] = {name: [] for name in names}
        for s in r["spans"]:
            spans_of[names[s[0]]].append(s)
        for lane in r["lanes"]:
            entry = lanes.setdefault(lane["name"], {"kind": lane["kind"], "device": lane.get("device", ""),
                                                    "seconds": {}})
            sec = entry["seconds"]
            mine = spans_of[lane["name"]]
            for _, phase, a, b, _depth in mine:
                sec[phase] = sec.get(phase, 0.0) + (b - a)
            top = [(a, b) for _, _, a, b, d in mine if d == 0]
            busy = _union(top)
            if lane["kind"] in ("rank", "slot"):
                sec["idle"] = sec.get("idle", 0.0) + max(0.0, step_wall - busy)
            else:
                first = min((a for a, _ in top), default=0.0)
                last = max((b for _, b in top), default=0.0)
                sec["other"] = sec.get("other", 0.0) + max(0.0, (last - first) - busy)
                sec["done"] = sec.get("done", 0.0) + max(0.0, step_wall - (last - first))
    ordered = dict(sorted(lanes.items(), key=lambda kv: _lane_key(kv[1]["kind"], kv[0])))
    return {"steps": [int(r["step"]) for r in records], "wall_s": wall, "lanes": ordered}


_COLUMNS = {"rank": ("generate", "decode", "wake", "sync", "wait", "train", "forward", "backward", "optimizer", "sleep",
                     "validate", "idle"),
            "slot": SLOT_PHASES + ("idle",), "rollout": ROLLOUT_PHASES + ("other", "done")}
_TITLES = {"rank": "training processes", "slot": "simulation slots", "rollout": "rollouts"}


def format_utilisation(table: Mapping[str, Any]) -> str:
    """The utilisation as text: per lane kind, one row per lane, each phase as a percentage of the steps'
    wall time (depth-1 phases are parts of their depth-0 phase's share; a phase under 0.05 % in every lane
    of a kind is left out)."""
    steps, wall = table["steps"], float(table["wall_s"])
    out = [f"steps {steps[0]}-{steps[-1]} ({len(steps)} step(s), {wall:.2f} s): % of the wall time per lane and phase"]
    for kind in ("rank", "slot", "rollout"):
        rows = {name: lane for name, lane in table["lanes"].items() if lane["kind"] == kind}
        if not rows:
            continue
        shown = {p for lane in rows.values() for p, sec in lane["seconds"].items() if sec > 5e-4 * wall}
        cols = [c for c in _COLUMNS[kind] if c in shown] + sorted(shown - set(_COLUMNS[kind]))
        width = max(len(n) for n in rows) + (10 if kind == "rank" else 0)
        out += ["", f"{_TITLES[kind]}:",
                f"{'lane':<{width}}" + "".join(f"{c:>10}" for c in cols)]
        for name, lane in rows.items():
            label = f"{name} ({lane['device']})" if kind == "rank" and lane["device"] else name
            sec = lane["seconds"]
            out.append(f"{label:<{width}}" + "".join(f"{100 * sec.get(c, 0.0) / wall if wall else 0.0:>10.1f}"
                                                     for c in cols))
    return "\n".join(out) + "\n"


_COLOURS = {"generate": "#4C72B0", "decode": "#1b3d7a", "engine": "#4C72B0", "gpu_wait": "#c7c7c7",
            "wake": "#937860", "sleep": "#8C8C8C", "sync": "#DD8452", "wait": "#e5e5e5", "train": "#55A868",
            "forward": "#2d6e3e", "backward": "#8fd19e", "optimizer": "#C44E52", "validate": "#8172B3",
            "sim_wait": "#f2c75c", "simulate": "#DA8BC3"}


def draw(records: Sequence[Mapping[str, Any]], path: str | os.PathLike[str]) -> Path:
    """A PNG of ``records``: one lane per training process, simulation slot and rollout, each span coloured
    by its phase (depth-1 spans drawn thinner over their depth-0 span), a line at each step's start."""
    import matplotlib
    import matplotlib.style
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    origin = float(records[0]["start"])
    lanes: dict[str, str] = {}
    for r in records:
        for lane in r["lanes"]:
            lanes.setdefault(lane["name"], lane["kind"])
    order = sorted(lanes, key=lambda n: _lane_key(lanes[n], n))
    row = {name: i for i, name in enumerate(order)}
    bars: dict[tuple[int, str, int], list[tuple[float, float]]] = {}
    for r in records:
        shift = float(r["start"]) - origin
        names = [lane["name"] for lane in r["lanes"]]
        for lane_i, phase, a, b, depth in r["spans"]:
            bars.setdefault((row[names[lane_i]], phase, min(int(depth), 1)), []).append((shift + a, b - a))
    # matplotlib's default style (a user's matplotlibrc changes nothing), the Agg canvas (no pyplot, no display)
    with matplotlib.style.context("default"), matplotlib.rc_context({"font.size": 8, "axes.grid": True,
                                                                      "grid.alpha": 0.3}):
        fig = Figure(figsize=(12.0, 1.4 + 0.22 * len(order)), dpi=100, layout="constrained")
        FigureCanvasAgg(fig)
        ax = fig.add_subplot()
        seen: dict[str, Any] = {}
        for (y, phase, depth), xs in sorted(bars.items(), key=lambda kv: kv[0][2]):
            height = 0.8 if depth == 0 else 0.4
            colour = _COLOURS.get(phase, "#999999")
            artist = ax.broken_barh(xs, (y - height / 2, height), facecolors=colour, edgecolor="none",
                                    label=phase)
            seen.setdefault(phase, artist)
        for r in records:
            x = float(r["start"]) - origin
            ax.axvline(x, color="0.2", lw=0.8, ls="--")
            ax.text(x, -0.9, f" step {r['step']}", fontsize=7, va="bottom", ha="left")
        ax.set_yticks(range(len(order)), order, fontsize=7)
        ax.set_ylim(len(order) - 0.4, -1.0)
        ax.set_xlabel("seconds since the start of the first step shown")
        steps = [int(r["step"]) for r in records]
        ax.set_title(f"GRPO step timeline, step{'s' if len(steps) > 1 else ''} {steps[0]}"
                     + (f"-{steps[-1]}" if len(steps) > 1 else ""))
        ax.grid(axis="y", visible=False)
        fig.legend(list(seen.values()), list(seen), loc="outside lower center", fontsize=7,
                   ncols=min(len(seen), 8), frameon=False)
        out = Path(path)
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.with_name(out.name + ".tmp")
        fig.savefig(tmp, format="png", dpi=100, metadata={"Software": None})
        os.replace(tmp, out)  # a reader never sees half a PNG
    return out
