"""One torch thread for a test module: the tiny model's sums in one order, whatever the machine."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Autouse in any module that imports it: torch on one thread for the module, restored after."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)
