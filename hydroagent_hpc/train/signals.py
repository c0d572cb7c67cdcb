"""The Slurm warning signal before a trainer's handler exists (torch-free: the MPI launcher imports it).

Slurm sends SIGUSR1 shortly before a job's time limit (``--signal``). A trainer installs its
checkpoint handler once its steps run (:class:`hydroagent_hpc.train.distributed.Signals`); before
that (loading the model) and after it (the final save) the default action would kill the process.
:func:`early_usr1_ignored` covers those windows.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

__all__ = ["early_usr1_ignored"]


@contextlib.contextmanager
def early_usr1_ignored() -> Iterator[None]:
    """Slurm's warning signal may come while the model loads, before the trainer's handler is
    installed (or after it is removed, during the final save): its default action would kill the
    process. Ignore it until then (the trainer's handler replaces this while steps run), and put the
    caller's disposition back afterwards: an ignored signal is inherited by every child process, and
    a shell cannot trap a signal it started with ignored, so a caller that runs ``main`` in-process
    (tests, notebooks) must not be left with SIGUSR1 ignored."""
    import signal
    import threading

    if threading.current_thread() is not threading.main_thread():
        yield
        return
    old = signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGUSR1, old)
