"""Run under ``mpiexec -n N``: split the world into TRAINERS training ranks and the simulation ranks
(:func:`hydroagent_hpc.hpc.mpi.split_trainers`), run a small MPI pool on the pool's communicator, and
print one JSON line (from world rank 0) with what every rank saw."""

from __future__ import annotations

import json
import os
import sys


def _square(x: int) -> tuple[int, int]:
    from mpi4py import MPI

    return x * x, MPI.COMM_WORLD.Get_rank()


def main() -> None:
    from mpi4py import MPI

    from hydroagent_hpc.hpc.mpi import mpi_pool, split_trainers

    trainers = int(sys.argv[1])
    split = split_trainers(trainers, master_port=int(os.environ["MASTER_PORT"]) if "MASTER_PORT" in os.environ
                           else None)
    seen = {"world": MPI.COMM_WORLD.Get_rank(), "trainer": split.trainer, "env": split.torch_env(),
            "pool_size": split.pool_comm.Get_size() if split.pool_comm is not None else None}
    served = None
    if split.pool_comm is not None:
        with mpi_pool(max_in_flight=4, comm=split.pool_comm, isolate=False) as pool:
            if pool is not None:
                served = sorted({r.value[1] for r in pool.map(_square, range(12))})
    seen["served_by"] = served
    everything = MPI.COMM_WORLD.gather(seen, root=0)
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(json.dumps(everything), flush=True)


if __name__ == "__main__":
    main()
