"""The simulation pool: order, failures as results, timeouts and dying workers never hang."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from helpers.waiting import wait_until
from hydroagent_hpc.hpc.pool import ProcessPool, SerialPool, open_pool


def square(x):
    return x * x


def boom(x):
    if x == 2:
        raise RuntimeError("bad input 2")
    return x


def sleepy(x):
    if x == 1:
        time.sleep(30)
    return x


def dies(x):
    if x == 3:
        os._exit(7)
    return x


def test_serial_and_processes_agree():
    items = list(range(12))
    serial = [r.value for r in SerialPool().map(square, items)]
    with ProcessPool(workers=2) as pool:
        par = [r.value for r in pool.map(square, items)]
        again = [r.value for r in pool.map(square, items)]  # the pool is reusable
    assert serial == par == again == [x * x for x in items]


@pytest.mark.parametrize("backend", ["serial", "processes"])
def test_exceptions_are_failed_results(backend):
    with open_pool(backend, workers=2) as pool:
        out = list(pool.map(boom, range(4)))
    assert [r.ok for r in out] == [True, True, False, True]
    assert "RuntimeError: bad input 2" in out[2].error and out[3].value == 3


def test_timeout_kills_and_continues():
    t0 = time.monotonic()
    with ProcessPool(workers=2, timeout_s=1.0) as pool:
        out = list(pool.map(sleepy, range(4)))
    assert time.monotonic() - t0 < 15
    assert [r.ok for r in out] == [True, False, True, True] and "timed out" in out[1].error


def test_dead_worker_is_a_failed_task_not_a_hang():
    with ProcessPool(workers=2, timeout_s=20) as pool:
        out = list(pool.map(dies, range(6)))
    assert [r.ok for r in out] == [True, True, True, False, True, True]
    assert "died" in out[3].error and [r.value for r in out if r.ok] == [0, 1, 2, 4, 5]


def test_in_flight_limit_caps_workers():
    assert ProcessPool(workers=8, max_in_flight=3).workers == 3
    with pytest.raises(ValueError):
        open_pool("mpi-ish")


def held_first(item):
    """Task 0 finishes only once ``release`` exists (a file: the event crosses processes); the others at once."""
    x, release = item
    if x == 0:
        wait_until(Path(release).exists, 60, "the test to release task 0")
    return x


def test_unordered_map_yields_each_result_as_it_finishes(tmp_path):
    release = tmp_path / "release"
    items = [(x, str(release)) for x in range(6)]
    out = []
    with ProcessPool(workers=2) as pool:
        for r in pool.map(held_first, items, ordered=False):
            out.append(r)
            if len(out) == 5:  # every other task came back while task 0 was still running: let it finish
                release.touch()
    assert sorted(r.index for r in out) == list(range(6)) and all(r.ok for r in out), [r.error for r in out]
    assert out[-1].index == 0 and not out[-1].error  # the held task did not hold back the others
    release.touch()
    assert [r.value for r in SerialPool().map(held_first, items[1:3], ordered=False)] == [1, 2]


def test_open_pool_mpi_points_to_the_launcher():
    with pytest.raises(ValueError, match="mpiexec or srun --mpi=pmi2"):
        open_pool("mpi")
