"""The GRPO rollout engine: one task per episode, no lockstep, one global cap on simulations.

``run_rollouts(specs, ...)`` plays every :class:`RolloutSpec` (a basin, a group, a member of the
group, a seed) as a full calibration episode through the same
:func:`~hydroagent_hpc.env.episode.run_episode` contract as every other agent:

- **One thread per episode.** Each rollout alternates model turns and tool calls at its own
  pace; nothing waits for the slowest rollout of the batch or of its turn (TRL's lock-step
  rollouts do). The embedded simulator's kernel releases the GIL, so the simulations of
  different rollouts run on different cores.
- **Model turns** go to a :class:`~hydroagent_hpc.train.generation.sampler.GenerationServer`: the rollouts
  waiting for a turn at the same moment are sampled in one batch. The policy is
  :class:`RolloutPolicy`, :class:`~hydroagent_hpc.agents.llm.hf_local.HFLocalPolicy` with its
  sampling handed to the server, so the held id sequence is built exactly as in evaluation (the
  token-exact trajectory builder; sampled ids never re-tokenised) and the trainer gets those ids.
- **Simulations** pass through :class:`RolloutSimulator`: a global cap on simulations in flight
  (:class:`SimulationSlots`, 32 by default as in the paper), shared by all rollouts, and
  :class:`SharedRuns`, so one parameter set on one basin is simulated once per batch (the K
  members of a group usually start from the same defaults) and the result is shared. Each
  rollout's environment still records, credits and counts that run as its own. Runs of one basin
  that wait for a slot at the same moment (the K members of a group, typically) are gathered by a
  :class:`~hydroagent_hpc.train.generation.coalesce.RunCoalescer` into one batched call that holds one slot
  and one thread (``sim_batch`` members at most; 1 turns it off); a run that finds a slot free
  runs at once.
- **Rewards come from the environment's ledger only**: the per-turn payments of the turns an
  assistant message caused (:attr:`Rollout.turn_rewards`) and the terminal payment. The text the
  model wrote never scores itself.

Faults stay on the rollout they hit; the batch and the run go on:

- a simulator that fails in any way (not only with :class:`~hydroagent_hpc.sim.errors.SimulationError`:
  an ``OSError`` of a basin file deleted under an EF5 run, a ``MemoryError``, a kernel's ``RuntimeError``)
  is a failed simulation of that rollout, recorded in its episode like any other
  (:class:`RolloutSimulator`);
- a policy that writes garbage is recorded by the environment as parse failures, one that raises as
  ``policy_error`` (:func:`~hydroagent_hpc.env.episode.run_episode`);
- anything else that escapes the episode (the environment itself failing on what it was given) ends
  that episode with the stop reason ``rollout_error: <type>: <message>``; the episode so far is
  returned and stored with ``error`` set, so it is not trained on. Only a rollout whose environment or
  policy could not even be built comes back without an episode (``error`` says why).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.errors import HydroAgentError, one_line
from hydroagent_hpc.sim import Simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import SimulationError
from hydroagent_hpc.sim.kernels import thread_cap
from hydroagent_hpc.sim.task import simulate_task
from hydroagent_hpc.train.generation.coalesce import Params, RunCoalescer
from hydroagent_hpc.train.generation.sampler import GenerationServer, Sampling
from hydroagent_hpc.types import Episode, SimulationResult

log = logging.getLogger(__name__)

__all__ = ["RolloutSpec", "Rollout", "SimulationSlots", "SlotUse", "SharedRuns", "RolloutSimulator",
           "RolloutPolicy", "RemoteRunner", "TurnGate", "run_rollouts", "assistant_spans", "message_rewards"]


@dataclass(frozen=True)
class RolloutSpec:
    """One episode to play: ``group`` indexes the prompt (basin) of a GRPO group, ``member`` 0..K-1."""

    group: int
    member: int
    basin_dir: str
    seed: int
    episode_id: str


@dataclass
class Rollout:
    """A played episode and the token sequence the trainer uses.

    ``ids``/``mask``: the whole episode as one id sequence, mask 1 exactly on sampled ids.
    ``spans[j]`` = ``(start, end)`` of assistant turn ``j``'s sampled ids in ``ids``;
    ``turn_rewards[j]`` is what the environment paid for the calls of message ``j``;
    ``terminal`` the terminal payment. ``sample_logprobs`` are the generator's log-probs of the
    mask-1 ids, in order. ``trainable`` is False when the sequence cannot be trained on (a thread
    error, a re-rendered history); ``error`` says why.
    """

    spec: RolloutSpec
    episode: Episode | None
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    spans: list[tuple[int, int]] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    terminal: float = 0.0
    sample_logprobs: list[float] = field(default_factory=list)
    error: str | None = None
    wall_s: float = 0.0
    generation_wait_s: float = 0.0

    @property
    def trainable(self) -> bool:
        return self.error is None and bool(self.spans)


@dataclass
class SlotUse:
    """What one hold of a slot ran: ``runs`` member runs (1 unless a batch), ``batched`` when they
    ran as one batched call (set by :class:`~hydroagent_hpc.train.generation.coalesce.RunCoalescer`)."""

    runs: int = 1
    batched: bool = False


class SimulationSlots:
    """At most ``limit`` simulations in flight across all rollouts (a batch of runs holds one);
    records the peak, the busy time, the member ``runs``, the slot holds (``batches``: a lone run
    is a batch of one) and the ``batched_runs`` that ran inside a batch of two or more."""

    def __init__(self, limit: int = 32) -> None:
        if limit < 1:
            raise ValueError(f"max_simulations_in_flight={limit}: must be at least 1")
        self.limit = int(limit)
        self._sem = threading.BoundedSemaphore(self.limit)
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.runs = 0
        self.batches = 0
        self.batched_runs = 0
        self.busy_s = 0.0  # summed over slots

    @contextlib.contextmanager
    def slot(self) -> Iterator[SlotUse]:
        """Hold one slot for the block; the holder says in the yielded :class:`SlotUse` what it ran."""
        with self._sem:
            with self._lock:
                self.in_flight += 1
                self.peak = max(self.peak, self.in_flight)
            t0 = time.perf_counter()
            use = SlotUse()
            try:
                yield use
            finally:
                with self._lock:
                    self.in_flight -= 1
                    self.runs += use.runs
                    self.batches += 1
                    if use.batched and use.runs >= 2:
                        self.batched_runs += use.runs
                    self.busy_s += time.perf_counter() - t0

    def stats(self) -> dict[str, float]:
        """The counters as one mapping (for logs and the GRPO metrics)."""
        with self._lock:
            return {"peak": self.peak, "runs": self.runs, "batches": self.batches,
                    "batched_runs": self.batched_runs, "busy_s": self.busy_s}


class SharedRuns:
    """Results of parameter sets already simulated on a basin in this batch (``key -> Future``)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: dict[tuple[Any, ...], Future[SimulationResult]] = {}
        self.hits = 0
        self.misses = 0

    def get_or_run(self, key: tuple[Any, ...], run: Callable[[], SimulationResult]) -> SimulationResult:
        with self._lock:
            fut = self._runs.get(key)
            owner = fut is None
            if fut is None:
                fut = self._runs[key] = Future()
                self.misses += 1
            else:
                self.hits += 1
        if owner:
            try:
                fut.set_result(run())
            except BaseException as exc:
                fut.set_exception(exc)
        return fut.result()


class RemoteRunner:
    """Runs a rollout's simulations on a pool's workers (MPI ranks): ``runner(basin_dir, params)``.

    ``pool`` needs ``submit(fn, item) -> Future[TaskResult]`` (:meth:`hydroagent_hpc.hpc.mpi.MPIPool.submit`).
    A failed task (the simulator raised, the worker's child crashed or timed out) raises
    :class:`~hydroagent_hpc.sim.errors.SimulationError` with the worker's message, which the
    environment records as a failed simulation, as for a local run.
    """

    def __init__(self, pool: Any, backend: str = "embedded") -> None:
        self.pool = pool
        self.backend = backend

    def __call__(self, basin_dir: str, params: Mapping[str, float] | None) -> SimulationResult:
        value: SimulationResult = self._submit(basin_dir, _plain(params))
        return value

    def run_batch(self, basin_dir: str, param_sets: Sequence[Mapping[str, float] | None]) -> list[SimulationResult]:
        """Run ``param_sets`` on one worker as one task (a batch on one thread there); if any member
        fails, the whole task fails with :class:`~hydroagent_hpc.sim.errors.SimulationError`."""
        values: list[SimulationResult] = self._submit(basin_dir, [_plain(p) for p in param_sets])
        return list(values)

    def _submit(self, basin_dir: str, params: Any) -> Any:
        result = self.pool.submit(simulate_task, (basin_dir, self.backend, params)).result()
        if not result.ok:  # the worker's reason: its last line that is not the error's "fix:" line
            lines = [ln for ln in (result.error or "").strip().splitlines() if not ln.strip().startswith("fix:")]
            last = lines[-1].strip() if lines else "failed"
            raise SimulationError(f"{basin_dir}: simulation failed on a worker: {last}",
                                  fix="see the worker's log; the rollout records it as a failed simulation")
        return result.value


def _plain(params: Mapping[str, float] | None) -> dict[str, float] | None:
    """``params`` as a plain picklable dict of floats (None stays None)."""
    return None if params is None else {str(k): float(v) for k, v in params.items()}


class RolloutSimulator:
    """A :class:`~hydroagent_hpc.sim.Simulator` for one rollout: the basin's simulator behind the
    global slots and the batch's shared runs (see the module doc). With ``runner`` (a
    :class:`RemoteRunner`) the runs execute on the pool's workers, ``inner`` giving only the base
    parameters. With ``coalescer`` the runs that wait for a slot join the other waiting runs of the
    basin in one batch, where a batch is one vectorised call on one thread: the embedded engine
    here, or a :class:`RemoteRunner` of the embedded engine. Other simulators (EF5, whose
    ``run_batch`` starts a process per core) keep one run per slot."""

    def __init__(self, inner: Simulator, slots: SimulationSlots, shared: SharedRuns | None, basin_key: str,
                 runner: Callable[[str, Mapping[str, float] | None], SimulationResult] | None = None,
                 coalescer: RunCoalescer | None = None) -> None:
        self.inner = inner
        self.slots = slots
        self.shared = shared
        self.basin_key = basin_key
        self.runner = runner
        self.coalescer = coalescer if coalescer is not None and self._batches_in_one_call() else None

    @property
    def base_params(self) -> dict[str, float]:
        return dict(self.inner.base_params)

    def _batches_in_one_call(self) -> bool:
        """Whether a batch of this basin's runs is one call on one thread (so it may hold one slot)."""
        if self.runner is not None:
            return isinstance(self.runner, RemoteRunner) and self.runner.backend == "embedded"

        return isinstance(self.inner, EmbeddedSimulator)

    def _run_now(self, params: Mapping[str, float] | None) -> SimulationResult:
        if self.coalescer is not None:
            # the simulator's identity is part of the key: only runs of one simulator share a call
            key = (self.basin_key, id(self.inner), id(self.runner))
            return self.coalescer.run(key, params, self._run_many, self._run_one)
        with self.slots.slot():
            return self._run_one(params)

    def _run_one(self, params: Params) -> SimulationResult:
        with self._failures_recorded():
            if self.runner is not None:
                return self._usable(self.runner(self.basin_key, params))
            return self._usable(self.inner.run(params))

    def _run_many(self, param_sets: Sequence[Params]) -> list[SimulationResult]:
        """One batched call: on a worker (one task), or here on this thread only (the batch holds one slot)."""
        with self._failures_recorded():
            if isinstance(self.runner, RemoteRunner):
                results = self.runner.run_batch(self.basin_key, param_sets)
            else:
                with thread_cap(1):
                    results = self.inner.run_batch(param_sets)
            if len(results) != len(param_sets):
                raise SimulationError(f"{self.basin_key}: the simulator returned {len(results)} results for "
                                      f"{len(param_sets)} runs", fix="see the trainer's log")
            return [self._usable(r) for r in results]

    def _usable(self, result: Any) -> SimulationResult:
        """``result`` when it is a run's output: one finite discharge per step after the warm-up (an EF5
        run checks its own output so; this holds any backend to it)."""
        try:
            q = np.asarray(result.discharge, dtype=np.float64)
            keep = ~np.asarray(result.warmup, dtype=bool)
            whole = q.shape == keep.shape == (len(result.times),)
        except Exception as exc:
            raise SimulationError(f"{self.basin_key}: the simulator returned no run output "
                                  f"({type(result).__name__}: {type(exc).__name__})", fix="see the trainer's log") \
                from None
        if not whole:
            raise SimulationError(f"{self.basin_key}: the simulator returned {q.shape} discharge values for "
                                  f"{len(result.times)} steps", fix="see the trainer's log")
        if not np.isfinite(q[keep]).all():
            raise SimulationError(f"{self.basin_key}: the simulator returned non-finite discharge at "
                                  f"{int((~np.isfinite(q[keep])).sum())} steps", fix="see the trainer's log")
        return result  # type: ignore[no-any-return]

    @contextlib.contextmanager
    def _failures_recorded(self) -> Iterator[None]:
        """Any failure of the simulator as a :class:`SimulationError` naming the basin: the environment
        records it as that rollout's failed simulation and the episode goes on."""
        try:
            yield
        except HydroAgentError:
            raise
        except Exception as exc:
            log.warning("%s: the simulator failed: %s: %s", self.basin_key, type(exc).__name__, one_line(exc))
            raise SimulationError(f"{self.basin_key}: the simulator failed: {type(exc).__name__}: {one_line(exc)}",
                                  fix="see the trainer's log; the rollout records it as a failed simulation") \
                from exc

    def run(self, params: Mapping[str, float] | None = None) -> SimulationResult:
        if self.shared is None:
            return self._run_now(params)
        full = {**self.inner.base_params, **{str(k): float(v) for k, v in (params or {}).items()}}
        key = (self.basin_key, tuple(sorted(full.items())))
        return self.shared.get_or_run(key, lambda: self._run_now(params))

    def run_batch(self, param_sets: Sequence[Mapping[str, float] | None]) -> list[SimulationResult]:
        return [self.run(p) for p in param_sets]


class TurnGate:
    """The lock-step schedule, for comparison only: no rollout starts turn ``t + 1`` before every
    live rollout has finished turn ``t`` (its generation and its tool calls), as trainers that step
    all rollouts together do. Rollouts that end leave the gate."""

    def __init__(self, parties: int) -> None:
        self._cond = threading.Condition()
        self._parties = int(parties)
        self._arrived = 0
        self._phase = 0

    def arrive_and_wait(self) -> None:
        with self._cond:
            phase = self._phase
            self._arrived += 1
            if self._arrived >= self._parties:
                self._advance()
            else:
                while self._phase == phase:
                    self._cond.wait()

    def leave(self) -> None:
        with self._cond:
            self._parties -= 1
            if self._parties > 0 and self._arrived >= self._parties:
                self._advance()

    def _advance(self) -> None:
        self._arrived = 0
        self._phase += 1
        self._cond.notify_all()


class RolloutPolicy(HFLocalPolicy):
    """:class:`HFLocalPolicy` whose turns are sampled by a shared :class:`GenerationServer`.

    ``gate`` (a :class:`TurnGate`) makes the rollouts wait for each other before every turn after
    the first: the lock-step baseline of the benchmark, never the default.
    """

    gate: TurnGate | None = None

    def __init__(self, model: Any, tokenizer: Any, server: GenerationServer, sampling: Sampling, *,
                 seed: int, max_context_tokens: int, name: str = "grpo", tools: Sequence[dict[str, Any]] | None = None,
                 chat_template: str | None = None) -> None:
        super().__init__(model, tokenizer, name=name, temperature=sampling.temperature, top_p=sampling.top_p,
                         top_k=sampling.top_k, greedy=sampling.greedy, max_new_tokens=sampling.max_new_tokens,
                         max_context_tokens=max_context_tokens, seed=seed, tools=tools, chat_template=chat_template)
        self.server = server
        self.sample_logprobs: list[float] = []
        self.generation_wait_s = 0.0

    def act(self, messages: list[dict[str, Any]]) -> str | None:
        if self.gate is not None and any(m.get("role") == "assistant" for m in messages):
            self.gate.arrive_and_wait()
        return super().act(messages)

    def _generate(self, ids: list[int], seed: int | None) -> list[int]:
        t0 = time.perf_counter()
        sample = self.server.generate(ids, seed, key=id(self))
        self.generation_wait_s += time.perf_counter() - t0
        self.sample_logprobs += sample.logprobs
        return list(sample.ids)


def assistant_spans(mask: Sequence[int]) -> list[tuple[int, int]]:
    """``(start, end)`` of each maximal run of 1s in ``mask``: one per assistant turn (turns are
    always separated by tool responses or template glue, which are 0)."""
    spans, start = [], None
    for i, m in enumerate(mask):
        if m and start is None:
            start = i
        elif not m and start is not None:
            spans.append((start, i))
            start = None
    if start is not None:
        spans.append((start, len(mask)))
    return spans


def message_rewards(episode: Episode, n_messages: int) -> list[float]:
    """The environment's per-turn payments summed per assistant message (``message_index``)."""
    out = [0.0] * n_messages
    for t in episode.turns:
        if 0 <= t.message_index < n_messages:
            out[t.message_index] += float(t.reward)
    return out


def _failed(spec: RolloutSpec, env: CalibrationEnv | None, exc: Exception, wall_s: float) -> Rollout:
    """A rollout that an error ended: its episode so far, closed with ``rollout_error: <type>: <message>``
    (None when no episode began or the environment cannot give one), and ``error`` set (not trained on)."""
    reason = f"{type(exc).__name__}: {one_line(exc)}"[:300]
    log.error("rollout %s (group %d member %d) failed: %s", spec.episode_id, spec.group, spec.member, reason)
    log.debug("rollout %s: the traceback", spec.episode_id, exc_info=exc)
    episode = None
    if env is not None:
        try:
            env.close(f"rollout_error: {reason}")
            episode = env.episode()
        except Exception as again:  # an environment that cannot even say what it did
            log.error("rollout %s: no episode record (%s: %s)", spec.episode_id, type(again).__name__,
                      one_line(again))
    if episode is None:
        return Rollout(spec, None, error=reason, wall_s=wall_s)
    messages = 1 + max((t.message_index for t in episode.turns), default=-1)
    return Rollout(spec, episode, turn_rewards=message_rewards(episode, messages),
                   terminal=float(episode.terminal_reward or 0.0), error=reason, wall_s=wall_s)


def run_rollouts(specs: Sequence[RolloutSpec], *, env_factory: Callable[[RolloutSpec, Simulator], CalibrationEnv],
                 simulators: Mapping[str, Simulator], policy_factory: Callable[[RolloutSpec], RolloutPolicy],
                 slots: SimulationSlots, shared: SharedRuns | None = None, max_workers: int | None = None,
                 runner: Callable[[str, Mapping[str, float] | None], SimulationResult] | None = None,
                 lockstep: bool = False, sim_batch: int = 8) -> list[Rollout]:
    """Play ``specs`` concurrently (see the module doc); results in the order of ``specs``.

    ``simulators`` maps a basin folder to its (thread-safe) simulator; ``env_factory(spec, sim)``
    builds the episode's environment on the wrapped simulator; ``policy_factory(spec)`` its
    policy (sharing the batch's generation server). ``shared``: a :class:`SharedRuns` to simulate
    identical parameter sets on a basin once (None: every request runs). ``runner``: run the
    simulations elsewhere (:class:`RemoteRunner` over MPI ranks) instead of in the rollout's thread.
    ``lockstep=True`` puts every rollout behind one :class:`TurnGate` (the baseline schedule the
    benchmark compares against; it needs ``max_workers`` >= the number of rollouts). ``sim_batch``:
    the most runs of one basin gathered into one batch while they wait for a slot (1: none; see
    :class:`~hydroagent_hpc.train.generation.coalesce.RunCoalescer`).
    """
    if sim_batch < 1:
        raise ValueError(f"sim_batch={sim_batch}: must be at least 1 (1 runs every simulation alone)")
    gate = TurnGate(len(specs)) if lockstep else None
    coalescer = RunCoalescer(slots, sim_batch) if sim_batch > 1 else None

    def play(spec: RolloutSpec) -> Rollout:
        t0 = time.perf_counter()
        try:
            try:
                sim = RolloutSimulator(simulators[spec.basin_dir], slots, shared, spec.basin_dir, runner, coalescer)
                env = env_factory(spec, sim)
                policy = policy_factory(spec)
                policy.gate = gate
            except Exception as exc:  # no episode began: the rollout is recorded as failed, the batch goes on
                return _failed(spec, None, exc, time.perf_counter() - t0)
            try:
                episode = run_episode(policy, env)
            except Exception as exc:  # the episode so far is kept, ended with the error; the batch goes on
                return _failed(spec, env, exc, time.perf_counter() - t0)
        finally:
            if gate is not None:
                gate.leave()
        ids, mask = policy.token_sequence()
        spans = assistant_spans(mask)
        error = None
        if any(t.rerendered for t in policy.trace):
            error = "rerendered: the template rewrote the history; the sequence is not the sampled one"
        elif len(spans) != len(policy.trace):
            error = f"{len(spans)} sampled spans for {len(policy.trace)} turns"
        return Rollout(spec, episode, ids, mask, spans, message_rewards(episode, len(spans)),
                       float(episode.terminal_reward or 0.0), list(policy.sample_logprobs), error,
                       time.perf_counter() - t0, policy.generation_wait_s)

    workers = max_workers or max(1, len(specs))
    if gate is not None and workers < len(specs):
        raise ValueError(f"lockstep needs one worker per rollout ({len(specs)}), got max_workers={workers}")
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="rollout") as pool:
        return list(pool.map(play, specs))
