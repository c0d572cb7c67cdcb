"""Run under mpiexec: map tasks through the MPI pool and print the results as JSON (root only).

    mpiexec -n 3 python tests/scripts/mpi_pool_probe.py KIND [N] [--no-isolate]

KIND: square (x*x), mixed (a raise, an os._exit and a sleep past the timeout among squares),
trivial (N no-op tasks, prints the seconds per task), killrank (task 2 SIGKILLs its worker rank).
"""

import json
import os
import sys
import time

from hydroagent_hpc.hpc.mpi import mpi_pool, world


def square(x):
    return x * x


def mixed(x):
    if x == 2:
        raise RuntimeError("bad input 2")
    if x == 3:
        os._exit(9)
    if x == 5:
        time.sleep(60)
    return x * x


def trivial(x):
    return x


def killrank(x):
    """Task 2 kills the worker rank that hosts it (the task runs in the rank's child process)."""
    if x == 2:
        import signal

        os.kill(os.getppid(), signal.SIGKILL)
        time.sleep(30)
    time.sleep(0.2)
    return x


def main() -> None:
    kind = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 and sys.argv[2].isdigit() else 12
    isolate = "--no-isolate" not in sys.argv
    fn = {"square": square, "mixed": mixed, "trivial": trivial, "killrank": killrank}[kind]
    with mpi_pool(max_in_flight=4, timeout_s=3.0 if kind == "mixed" else None, isolate=isolate) as pool:
        if pool is None:
            return
        t0 = time.perf_counter()
        out = list(pool.map(fn, range(n)))
        dt = time.perf_counter() - t0
        rank, size = world()
        print(json.dumps({"rank": rank, "size": size, "workers": pool.workers, "seconds": dt,
                          "results": [[r.index, r.ok, r.value, r.error[:80]] for r in out]}), flush=True)


if __name__ == "__main__":
    main()
