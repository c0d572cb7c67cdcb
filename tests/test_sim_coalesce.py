"""Queued simulations of one basin gathered into batches (train/generation/coalesce.py), on the real simulator.

The slot is held by the test while the requests queue, so what joins which batch does not depend on
timing; every batched result is compared bit for bit with a solo ``run()`` of the same parameters.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.hpc.pool import TaskResult
from hydroagent_hpc.sim import kernels, open_simulator
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import SimulationError
from hydroagent_hpc.sim.task import simulate_task
from hydroagent_hpc.train.generation.coalesce import RunCoalescer
from hydroagent_hpc.train.generation.rollout import (
    RemoteRunner,
    RolloutSimulator,
    SharedRuns,
    SimulationSlots,
    run_rollouts,
)
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.types import SimulationResult

#: Makes the discharge non-finite (SimulationError from the run), a member's own failure.
BAD = {"alpha": 1e300}

# BAD's multiplier overflows float32 on its way into the kernel (numpy warns); that is the point
pytestmark = pytest.mark.filterwarnings("ignore:overflow encountered:RuntimeWarning")


def _params(n: int, seed: int = 0) -> list[dict[str, float]]:
    rng = np.random.default_rng(seed)
    return [{"wm": float(rng.uniform(0.5, 2.0)), "alpha": float(rng.uniform(0.5, 2.0)), "alpha0": 0.5}
            for _ in range(n)]


@pytest.fixture(scope="module")
def sims(grpo_basins: Path) -> dict[str, EmbeddedSimulator]:
    out = {name: open_simulator(grpo_basins / name / "control.txt") for name in ("b1", "b2")}
    assert all(isinstance(s, EmbeddedSimulator) for s in out.values())
    return out  # type: ignore[return-value]


class Calls:
    """Wraps a simulator's ``run``/``run_batch`` (same object, so it stays an EmbeddedSimulator) to
    record each call's size and the kernel threads it was allowed."""

    def __init__(self, sim: Any, monkeypatch: pytest.MonkeyPatch) -> None:
        self.batches: list[int] = []
        self.singles = 0
        self.threads: list[int] = []
        run, run_batch = sim.run, sim.run_batch

        def spy_batch(sets: Any) -> Any:
            self.batches.append(len(sets))
            self.threads.append(kernels.threads())
            return run_batch(sets)

        def spy_run(params: Any = None) -> Any:
            self.singles += 1
            return run(params)

        monkeypatch.setattr(sim, "run_batch", spy_batch)
        monkeypatch.setattr(sim, "run", spy_run)


def _same(a: SimulationResult, b: SimulationResult) -> None:
    assert a.gauges.keys() == b.gauges.keys()
    for g in a.gauges:
        assert np.array_equal(a.gauges[g].discharge, b.gauges[g].discharge), g
        assert np.array_equal(a.gauges[g].soil_moisture, b.gauges[g].soil_moisture), g


def _wait_until(cond: Callable[[], bool], timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, "the requests never queued"
        time.sleep(0.002)


def _queue_then_release(slots: SimulationSlots, coalescer: RunCoalescer,
                        jobs: list[tuple[RolloutSimulator, Mapping[str, float] | None]],
                        queued: int | None = None) -> list[SimulationResult | BaseException]:
    """Hold the only free slot while every job's thread asks for its run, then let them go."""
    out: list[SimulationResult | BaseException] = [RuntimeError("not run")] * len(jobs)

    def ask(i: int) -> None:
        sim, params = jobs[i]
        try:
            out[i] = sim.run(params)
        except BaseException as exc:
            out[i] = exc

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(jobs))]
    with slots.slot():
        for t in threads:
            t.start()
        _wait_until(lambda: coalescer.waiting() == (len(jobs) if queued is None else queued))
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    return out


# ---------------------------------------------------------------------------------------- batches


def test_queued_runs_of_one_basin_run_as_one_batch_on_one_thread_and_equal_solo_runs(sims, monkeypatch):
    inner = sims["b1"]
    expected = [inner.run(p) for p in _params(8)]
    calls = Calls(inner, monkeypatch)
    monkeypatch.setattr(kernels, "_THREADS", 4)  # the process may use 4 threads; a batch in one slot uses 1
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots, max_batch=8)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=coalescer)
    out = _queue_then_release(slots, coalescer, [(sim, p) for p in _params(8)])
    for got, want in zip(out, expected):
        assert isinstance(got, SimulationResult)
        _same(got, want)
    assert calls.batches == [8] and calls.singles == 0 and calls.threads == [1]
    assert kernels.threads() == 4
    # the test's own hold is one batch of one run; the 8 requests one batch of 8
    assert (slots.runs, slots.batches, slots.batched_runs) == (9, 2, 8)
    assert slots.in_flight == 0 and coalescer.waiting() == 0 and coalescer.splits == 0


def test_a_batch_takes_at_most_max_batch_members(sims, monkeypatch):
    inner = sims["b1"]
    calls = Calls(inner, monkeypatch)
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots, max_batch=3)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=coalescer)
    out = _queue_then_release(slots, coalescer, [(sim, p) for p in _params(7)])
    assert all(isinstance(r, SimulationResult) for r in out)
    assert sorted(calls.batches) == [3, 3] and calls.singles == 1  # 3 + 3 + a batch of one
    assert slots.runs == 1 + 7 and slots.batched_runs == 6


def test_a_leader_takes_its_share_of_the_waiting_runs_and_the_next_member_leads_the_rest(sims, monkeypatch):
    """6 runs wait, 2 slots: the first slot to free takes ceil(6 / 2) = 3 of them, not all 6, so the
    other slot is not left idle while one slot works through the whole queue."""
    inner = sims["b1"]
    sets = _params(6, seed=7)
    expected = [inner.run(p) for p in sets]
    calls = Calls(inner, monkeypatch)
    slots = SimulationSlots(2)
    coalescer = RunCoalescer(slots)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=coalescer)
    out: dict[int, SimulationResult] = {}
    threads = [threading.Thread(target=lambda i=i: out.__setitem__(i, sim.run(sets[i]))) for i in range(6)]
    with slots.slot():  # the second slot stays busy throughout
        with slots.slot():
            for t in threads:
                t.start()
            _wait_until(lambda: coalescer.waiting() == 6)
        for t in threads:
            t.join(timeout=60)
            assert not t.is_alive()
    # 3 of 6 waiting on 2 slots; then 2 of the 3 left (ceil(3 / 2)); then the last one alone
    assert calls.batches == [3, 2] and calls.singles == 1
    for i, want in enumerate(expected):
        _same(out[i], want)
    assert (slots.runs, slots.batches, slots.batched_runs) == (2 + 6, 2 + 3, 5) and coalescer.waiting() == 0


def test_free_running_rollouts_on_one_slot_batch_and_still_equal_solo_runs(sims):
    inner = sims["b1"]
    sets = _params(24, seed=1)
    expected = [inner.run(p) for p in sets]
    slots = SimulationSlots(1)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=RunCoalescer(slots))
    out: dict[int, SimulationResult] = {}
    start = threading.Barrier(8)

    def rollout(r: int) -> None:
        start.wait()
        for i in range(r, len(sets), 8):
            out[i] = sim.run(sets[i])

    threads = [threading.Thread(target=rollout, args=(r,)) for r in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, want in enumerate(expected):
        _same(out[i], want)
    assert slots.runs == 24 and slots.batches < slots.runs and slots.peak == 1


def test_two_basins_never_share_a_batch(sims, monkeypatch):
    calls = {name: Calls(sims[name], monkeypatch) for name in ("b1", "b2")}
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots)
    wrapped = {name: RolloutSimulator(sims[name], slots, None, name, coalescer=coalescer) for name in ("b1", "b2")}
    sets = _params(4, seed=2)
    jobs = [(wrapped[name], p) for p in sets for name in ("b1", "b2")]
    out = _queue_then_release(slots, coalescer, jobs)
    assert calls["b1"].batches == [4] and calls["b2"].batches == [4]
    for (sim, p), got in zip(jobs, out):
        assert isinstance(got, SimulationResult)
        _same(got, sim.inner.run(p))
    assert slots.batches == 1 + 2 and slots.batched_runs == 8


def test_a_failing_member_fails_alone_and_the_others_succeed(sims, monkeypatch):
    inner = sims["b1"]
    sets = _params(4, seed=3)
    expected = [inner.run(p) for p in sets]
    calls = Calls(inner, monkeypatch)
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=coalescer)
    jobs = [(sim, p) for p in sets[:2]] + [(sim, BAD)] + [(sim, p) for p in sets[2:]]
    out = _queue_then_release(slots, coalescer, jobs)
    bad = out.pop(2)
    assert isinstance(bad, SimulationError) and "non-finite discharge" in str(bad)
    for got, want in zip(out, expected):
        assert isinstance(got, SimulationResult)
        _same(got, want)
    assert calls.batches == [5] and calls.singles == 5  # the batched call failed; each member reran alone
    assert coalescer.splits == 1 and slots.runs == 1 + 5 and slots.batched_runs == 0


def test_a_lone_request_with_a_free_slot_runs_at_once_as_a_batch_of_one(sims, monkeypatch):
    inner = sims["b1"]
    calls = Calls(inner, monkeypatch)
    slots = SimulationSlots(2)
    coalescer = RunCoalescer(slots)
    sim = RolloutSimulator(inner, slots, None, "b1", coalescer=coalescer)
    done: list[SimulationResult] = []
    with slots.slot():  # one slot busy for as long as the request takes: it must not wait for it
        t = threading.Thread(target=lambda: done.append(sim.run({"wm": 0.8})))
        t.start()
        t.join(timeout=30)
        assert not t.is_alive() and len(done) == 1
    assert calls.singles == 1 and calls.batches == []
    assert "batch_size" not in done[0].info  # the plain run, not a batch
    assert (slots.runs, slots.batches, slots.batched_runs) == (2, 2, 0)


def test_identical_parameter_sets_are_still_simulated_once_before_batching(sims, monkeypatch):
    inner = sims["b1"]
    calls = Calls(inner, monkeypatch)
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots)
    shared = SharedRuns()
    sim = RolloutSimulator(inner, slots, shared, "b1", coalescer=coalescer)
    sets = _params(3, seed=4)
    out = _queue_then_release(slots, coalescer, [(sim, p) for p in sets + sets], queued=3)
    assert shared.misses == 3 and shared.hits == 3 and calls.batches == [3]
    for i in range(3):
        assert out[i] is out[i + 3]


def test_simulators_whose_batches_are_not_one_call_keep_one_run_per_slot(sims):
    class NotEmbedded:  # e.g. EF5, whose run_batch starts a process per core
        base_params = sims["b1"].base_params

        def run(self, params: Any = None) -> SimulationResult:
            return sims["b1"].run(params)

        def run_batch(self, sets: Any) -> list[SimulationResult]:
            raise AssertionError("must not batch")

    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots)
    assert RolloutSimulator(NotEmbedded(), slots, None, "b1", coalescer=coalescer).coalescer is None
    assert RolloutSimulator(sims["b1"], slots, None, "b1", coalescer=coalescer).coalescer is coalescer
    runner = RemoteRunner(pool=None, backend="ef5")
    assert RolloutSimulator(sims["b1"], slots, None, "b1", runner, coalescer).coalescer is None


# ----------------------------------------------------------------------------------- remote path


class InlinePool:
    """A pool that runs each task at once in the caller's thread (an MPI pool's submit, without MPI)."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def submit(self, fn: Callable[[Any], Any], item: Any) -> Future[TaskResult]:
        self.items.append(item)
        fut: Future[TaskResult] = Future()
        try:
            fut.set_result(TaskResult(len(self.items) - 1, True, fn(item)))
        except Exception as exc:
            fut.set_result(TaskResult(len(self.items) - 1, False, None, f"{type(exc).__name__}: {exc}"))
        return fut


def test_simulate_task_takes_a_list_as_one_batch_and_a_single_set_as_before(grpo_basins, sims):
    basin = str(grpo_basins / "b1")
    sets: list[dict[str, float] | None] = [*_params(3, seed=5), None]
    batch = simulate_task((basin, "embedded", sets))
    assert isinstance(batch, list) and len(batch) == 4
    for got, p in zip(batch, sets):
        _same(got, sims["b1"].run(p))
        assert got.info.get("batch_size") == 4
    one = simulate_task((basin, "embedded", sets[0]))
    assert isinstance(one, SimulationResult)
    _same(one, sims["b1"].run(sets[0]))


def test_a_remote_batch_is_one_task_and_a_bad_member_fails_alone(grpo_basins, sims):
    basin = str(grpo_basins / "b1")
    pool = InlinePool()
    slots = SimulationSlots(1)
    coalescer = RunCoalescer(slots)
    sim = RolloutSimulator(sims["b1"], slots, None, basin, RemoteRunner(pool), coalescer)
    sets = _params(3, seed=6)
    out = _queue_then_release(slots, coalescer, [(sim, p) for p in sets])
    assert [type(i[2]) for i in pool.items] == [list] and len(pool.items[0][2]) == 3
    for got, p in zip(out, sets):
        assert isinstance(got, SimulationResult)
        _same(got, sims["b1"].run(p))
    pool.items.clear()
    out = _queue_then_release(slots, coalescer, [(sim, sets[0]), (sim, BAD)])
    assert [type(i[2]) for i in pool.items] == [list, dict, dict]  # the batch failed; each member alone
    assert isinstance(out[0], SimulationResult)
    assert isinstance(out[1], SimulationError) and "non-finite discharge" in str(out[1])


# ------------------------------------------------------------------------------------ thread cap


def test_thread_cap_holds_on_the_calling_thread_only(monkeypatch):
    monkeypatch.setattr(kernels, "_THREADS", 3)
    capped, seen_elsewhere = threading.Event(), []
    release = threading.Event()
    seen_inside: list[int] = []

    def worker() -> None:
        with kernels.thread_cap(1):
            seen_inside.append(kernels.threads())
            with kernels.thread_cap(2):  # nested: the smaller cap holds
                seen_inside.append(kernels.threads())
            capped.set()
            release.wait(10)
            seen_inside.append(kernels.threads())
        seen_inside.append(kernels.threads())

    t = threading.Thread(target=worker)
    t.start()
    assert capped.wait(10)
    seen_elsewhere.append(kernels.threads())  # while the other thread is capped
    other = threading.Thread(target=lambda: seen_elsewhere.append(kernels.threads()))
    other.start()
    other.join()
    release.set()
    t.join()
    assert seen_inside == [1, 1, 1, 3] and seen_elsewhere == [3, 3]
    with pytest.raises(ValueError, match="at least 1"):
        with kernels.thread_cap(0):
            pass


def test_thread_cap_caps_numbas_threads_too_when_numba_is_the_kernel():
    import numba

    with kernels.using("numba"):
        before = numba.get_num_threads()
        with kernels.thread_cap(1):
            assert numba.get_num_threads() == 1
        assert numba.get_num_threads() == before


# ---------------------------------------------------------------------------------------- config


def test_sim_batch_config_defaults_to_a_group_and_refuses_less_than_one(tmp_path):
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text("basins: [b]\n")
    assert load_grpo_config(cfg).sim_batch == 8
    cfg.write_text("preset: released\nbasins: [b]\nsim_batch: 1\n")
    assert load_grpo_config(cfg).sim_batch == 1
    for bad in ("0", "-2", "true", "2.5", "'4'"):
        cfg.write_text(f"basins: [b]\nsim_batch: {bad}\n")
        with pytest.raises(ConfigError) as err:
            load_grpo_config(cfg)
        message = str(err.value)
        assert f"{cfg}:2" in message and "sim_batch" in message and "1 runs every simulation alone" in message
    with pytest.raises(ValueError, match="sim_batch=0"):
        run_rollouts([], env_factory=None, simulators={}, policy_factory=None,  # type: ignore[arg-type]
                     slots=SimulationSlots(1), sim_batch=0)
