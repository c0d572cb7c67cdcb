"""The trainers' entry points ignore Slurm's early SIGUSR1 only while they run, then restore it.

An ignored signal is inherited by every child process, and bash cannot trap a signal it started with
ignored: a test or notebook that called a trainer's ``main`` in-process and was left with SIGUSR1
ignored would start sbatch scripts whose checkpoint trap never fires (they hung in CI that way).
"""

from __future__ import annotations

import signal
import threading

import pytest

from hydroagent_hpc.train.signals import early_usr1_ignored


def test_sigusr1_is_ignored_inside_and_restored_after():
    def mine(signum, frame):  # pragma: no cover - never delivered
        pass

    old = signal.signal(signal.SIGUSR1, mine)
    try:
        with early_usr1_ignored():
            assert signal.getsignal(signal.SIGUSR1) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGUSR1) is mine
        with pytest.raises(RuntimeError):
            with early_usr1_ignored():
                raise RuntimeError("a failing run")
        assert signal.getsignal(signal.SIGUSR1) is mine
    finally:
        signal.signal(signal.SIGUSR1, old)


def test_outside_the_main_thread_nothing_changes():
    seen = []
    before = signal.getsignal(signal.SIGUSR1)

    def body():
        with early_usr1_ignored():
            seen.append(signal.getsignal(signal.SIGUSR1))

    t = threading.Thread(target=body)
    t.start()
    t.join()
    assert seen == [before]


@pytest.mark.parametrize("module", ["grpo.launch", "sft.launch"])
def test_a_trainer_main_called_in_process_leaves_sigusr1_as_it_was(tmp_path, module):
    import importlib

    main = importlib.import_module(f"hydroagent_hpc.train.{module}").main
    before = signal.getsignal(signal.SIGUSR1)
    bad = tmp_path / "cfg.yaml"
    bad.write_text("no_such_key: 1\n")
    assert main([str(bad), "--out", str(tmp_path / "run")]) != 0  # a config error, reported
    assert signal.getsignal(signal.SIGUSR1) == before
