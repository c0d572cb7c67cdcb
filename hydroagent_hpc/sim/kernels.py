"""The simulator's compiled kernel, chosen once per process: ``c`` or ``numba``.

Both compute EF5's CREST water balance and kinematic-wave routing bit for bit alike
(``tests/test_ckernel.py`` runs them side by side); they differ in what a process pays to start
and to run:

- ``c`` (:mod:`hydroagent_hpc.sim.ckernel`): ``crest_kernel.c`` built with the system's C compiler
  on first use and cached; loads in milliseconds, about as fast per run as numba or faster. A
  batch runs its members on :func:`threads` threads (ctypes releases the GIL).
- ``numba`` (:mod:`hydroagent_hpc.sim.kernel`): no compiler needed; importing numba and loading its
  cache costs ~0.7 s per process. A batch runs its members on numba's threads.

``$HYDROAGENT_KERNEL`` picks one (``auto``, the default: ``c`` when a compiler builds it, else
``numba`` with one logged line saying why). Snow-17 always runs in numba (:mod:`~hydroagent_hpc.sim.snow`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np

import hydroagent_hpc.sim.ckernel as ckernel
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.registry import Registry
from hydroagent_hpc.sim.ckernel import CKernelUnavailable

__all__ = ["Kernel", "KERNELS", "kernel", "using", "threads", "set_threads", "thread_cap"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Kernel:
    """One implementation of the kernel functions (the signatures of :mod:`hydroagent_hpc.sim.kernel`)."""

    name: str
    interflow_targets: Callable[..., Any]
    run_kernel: Callable[..., Any]
    run_batch_kernel: Callable[..., Any]


def _numba() -> Kernel:
    import numba

    import hydroagent_hpc.sim.kernel as k  # numba: compiled and cached on first use

    if _THREADS is not None:
        numba.set_num_threads(min(_THREADS, numba.config.NUMBA_NUM_THREADS))  # type: ignore[attr-defined]

    return Kernel("numba", k.interflow_targets, k.run_kernel, k.run_batch_kernel)


#: Members of a batch solved together in one C call: as many as keep members x cells within this. Measured on
#: one core (docs/performance.md): since the channel solves of several steps share the lanes (the wavefront),
#: sharing gains little; with the routing state in slot arrays, 8 members of a 300-cell basin together cost 6.4
#: runs, of a 1,000-cell basin 6.9, of a 10,000-cell basin 8 (the same as one at a time; 20 % more before the
#: slots). A larger limit gained nothing on the 900-1,200-cell basins.
BATCH_CELLS = 4_096


def _c() -> Kernel:
    ckernel.load()  # build now: an unavailable compiler is found here, not in the middle of a run

    def run_batch_kernel(precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauge_nodes,
                         weights):
        """Members with the same channel cells share one ``hak_run_batch`` call (its levels' solves run
        together); with several threads each thread takes a share of the members. ``par``: the batch record
        [len(NODE_FIELDS), K, n] (:mod:`hydroagent_hpc.sim.record`)."""
        k_sets, n = par.shape[1], par.shape[2]
        groups: dict[bytes, list[int]] = {}
        for k in range(k_sets):
            groups.setdefault(np.asarray(channel[k], dtype=np.bool_).tobytes(), []).append(k)
        n_threads = max(1, min(threads(), k_sets))
        per_call = max(1, BATCH_CELLS // max(1, n))
        chunks = []
        for members in groups.values():
            calls = -(-len(members) // per_call)  # at least, for the cache
            parts = min(len(members), max(n_threads, -(-calls // n_threads) * n_threads))  # whole rounds of threads
            chunks += [list(part) for part in np.array_split(np.asarray(members), parts)]

        def one(ks: list[int]):
            return ckernel.run_batch_kernel(precip, pet, dt_hours, par[:, ks, :], channel[ks[0]], pq0, po0, down, dx,
                                            area, t0[ks], t1[ks], s0[ks], s1[ks], gauge_nodes, weights)

        if n_threads > 1 and len(chunks) > 1:
            with ThreadPoolExecutor(min(n_threads, len(chunks))) as ex:
                res = list(ex.map(one, chunks))
        else:
            res = [one(ks) for ks in chunks]
        order = np.argsort(np.concatenate([np.asarray(ks) for ks in chunks]), kind="stable")
        return tuple(np.concatenate([r[j] for r in res])[order] for j in range(4))

    return Kernel("c", ckernel.interflow_targets, ckernel.run_kernel, run_batch_kernel)


#: The kernel implementations by name (``$HYDROAGENT_KERNEL``).
KERNELS: Registry[Callable[[], Kernel]] = Registry("kernel", where="hydroagent_hpc/sim/kernels.py")
KERNELS.register("c", _c)
KERNELS.register("numba", _numba)

_CHOSEN: Kernel | None = None
_THREADS: int | None = None
_LOCAL = threading.local()  # .cap: this thread's cap (thread_cap), None when uncapped


def kernel() -> Kernel:
    """The process's kernel (chosen on the first call, from ``$HYDROAGENT_KERNEL``)."""
    global _CHOSEN
    if _CHOSEN is not None:
        return _CHOSEN
    want = os.environ.get("HYDROAGENT_KERNEL", "auto").strip().lower() or "auto"
    if want == "auto":
        try:
            _CHOSEN = _c()
        except CKernelUnavailable as exc:
            log.warning("%s; using the numba kernel", exc)
            _CHOSEN = _numba()
    elif want in KERNELS:
        _CHOSEN = KERNELS.lookup(want)()
    else:
        raise ConfigError(f"HYDROAGENT_KERNEL={want!r}: unknown kernel",
                          fix=f"use one of: auto, {', '.join(KERNELS.names())}")
    log.debug("simulator kernel: %s", _CHOSEN.name)
    return _CHOSEN


@contextmanager
def using(name: str) -> Iterator[Kernel]:
    """Run the block with kernel ``name`` (benchmarks and tests compare kernels this way)."""
    global _CHOSEN
    before = _CHOSEN
    _CHOSEN = KERNELS.lookup(name)()
    try:
        yield _CHOSEN
    finally:
        _CHOSEN = before


def threads() -> int:
    """Threads a batch may use on the calling thread (default: the CPUs this process may run on;
    :func:`set_threads` caps it for the process, :func:`thread_cap` for one thread)."""
    cap: int | None = getattr(_LOCAL, "cap", None)
    if _THREADS is not None:
        n = _THREADS
    else:
        try:
            n = len(os.sched_getaffinity(0))
        except AttributeError:  # not Linux
            n = os.cpu_count() or 1
    return n if cap is None else min(n, cap)


@contextmanager
def thread_cap(n: int) -> Iterator[None]:
    """Cap :func:`threads` at ``n`` on the calling thread only, for the block (nested caps keep the
    smaller). A rollout's batch holds one simulation slot, so it must use one thread while other
    threads of the process keep theirs. With the numba kernel, numba's own (thread-local) thread
    count is capped alike."""
    if n < 1:
        raise ValueError(f"thread_cap: need at least 1 thread, got {n}")
    before: int | None = getattr(_LOCAL, "cap", None)
    _LOCAL.cap = int(n) if before is None else min(before, int(n))
    numba = sys.modules.get("numba") if _CHOSEN is not None and _CHOSEN.name == "numba" else None
    numba_before = numba.get_num_threads() if numba is not None else None
    if numba is not None:
        numba.set_num_threads(min(_LOCAL.cap, numba.config.NUMBA_NUM_THREADS))
    try:
        yield
    finally:
        _LOCAL.cap = before
        if numba is not None:
            numba.set_num_threads(numba_before)


def set_threads(n: int) -> None:
    """Cap the threads of a batch (a pool worker sets 1: the pool is the parallelism). Also caps numba's
    threads when numba is already imported."""
    global _THREADS
    if n < 1:
        raise ValueError(f"set_threads: need at least 1 thread, got {n}")
    _THREADS = int(n)
    if "numba" in sys.modules:
        sys.modules["numba"].set_num_threads(min(n, sys.modules["numba"].config.NUMBA_NUM_THREADS))
