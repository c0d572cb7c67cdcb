"""``needs_c``: skip a test, saying so, where no C compiler builds ``hydroagent_hpc/sim/crest_kernel.c``."""

from __future__ import annotations

import pytest

from hydroagent_hpc.sim import kernels


def c_available() -> bool:
    from hydroagent_hpc.sim.ckernel import CKernelUnavailable

    try:
        kernels.KERNELS.lookup("c")()
    except CKernelUnavailable:  # no compiler here: the C tests skip, saying so (a built library that disagrees
        return False            # with the parameter record, KernelRecordMismatch, fails them instead)
    return True


needs_c = pytest.mark.skipif(not c_available(), reason="no C compiler builds hydroagent_hpc/sim/crest_kernel.c")
