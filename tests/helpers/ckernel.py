"""``needs_c``: skip a test, saying so, where no C compiler builds ``hydroagent_hpc/sim/crest_kernel.c``."""

from __future__ import annotations

import pytest

from hydroagent_hpc.sim import kernels


def c_available() -> bool:
    try:
        kernels.KERNELS.lookup("c")()
    except Exception:  # no compiler here: the C tests skip, saying so
        return False
    return True


needs_c = pytest.mark.skipif(not c_available(), reason="no C compiler builds hydroagent_hpc/sim/crest_kernel.c")
