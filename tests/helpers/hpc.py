"""Shared by the HPC tests (serial, processes, MPI, Slurm): a small campaign file, the job environment,
comparisons of stored episodes, and the pieces of the trainer stand-ins that the Slurm/submitit tests
of SFT and GRPO run in place of the real trainers."""

from __future__ import annotations

import csv
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from helpers.paths import pythonpath
from hydroagent_hpc.store import read_episodes, read_sims, read_turns

ROOT = Path(__file__).resolve().parents[2]  # the repository
BIN = Path(sys.executable).parent


def write_campaign(folder: Path, basin: Path, seeds: int = 3, sims: int = 30, name: str = "t") -> Path:
    """Two agents (heuristic, DDS) x ``seeds`` seeds on ``basin``, ``sims`` simulations each."""
    p = folder / f"{name}.yaml"
    p.write_text(f"name: {name}\nbasins: [{basin}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                 f"  - {{name: dds, kind: dds}}\nseeds: {list(range(seeds))}\n"
                 f"env: {{preset: paper, max_simulations: {sims}, max_turns: null, patience: null, "
                 f"target_nse: 0.999}}\n")
    return p


def episode_content(path: Path) -> dict[str, pd.DataFrame]:
    """What must agree between backends: every episode, simulation and turn, without timings."""
    ep = read_episodes(path).drop(columns=["wall_time_s", "started_utc", "provenance", "basin_key"],
                                  errors="ignore")
    sims = read_sims(path).drop(columns=["wall_time_s"])
    turns = read_turns(path).drop(columns=["started_s", "duration_s"])
    return {"episodes": ep.sort_values("episode_id").reset_index(drop=True),
            "sims": sims.sort_values(["episode_id", "run_id"]).reset_index(drop=True),
            "turns": turns.sort_values(["episode_id", "index"]).reset_index(drop=True)}


def assert_same_episodes(a: Path, b: Path) -> None:
    ca, cb = episode_content(a), episode_content(b)
    for key in ca:
        pd.testing.assert_frame_equal(ca[key], cb[key], check_exact=True, obj=f"{key} of {a.name} vs {b.name}")


def job_env() -> dict[str, str]:
    """The environment for jobs and subprocesses: this venv first on PATH, the shared numba cache."""
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env.get('PATH', '')}"
    env.setdefault("NUMBA_CACHE_DIR", str(ROOT / ".cache" / "numba"))
    env["HYDROAGENT_HOME"] = str(ROOT)
    env["HYDROAGENT_VENV"] = str(BIN.parent)
    return env


def mpiexec_or_skip() -> str:
    """The ``mpiexec`` of the PyPI mpich wheel (beside this Python, else on PATH) when it can start
    2 ranks here; otherwise the test is skipped, saying why."""
    import pytest

    mpiexec = shutil.which("mpiexec", path=str(BIN)) or shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec: install the mpi extra (pip install mpi4py mpich)")
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        pytest.skip("mpi4py is not installed: pip install mpi4py mpich")
    # only rank 0 prints: unbuffered ranks writing at once interleave ("22\n\n")
    p = subprocess.run([mpiexec, "-n", "2", str(BIN / "python"), "-c", "from mpi4py import MPI; c = MPI.COMM_WORLD; "
                        "c.Get_rank() or print('size', c.Get_size())"], capture_output=True, text=True, timeout=60,
                       env=job_env(), stdin=subprocess.DEVNULL)  # hydra finds its proxy on PATH
    if p.returncode != 0 or "size 2" not in p.stdout:
        pytest.skip(f"mpiexec cannot start 2 ranks here (exit {p.returncode}; stdout {p.stdout.strip()[:100]!r}; "
                    f"stderr {p.stderr.strip()[:300]!r})")
    return mpiexec


def write_standin(tmp_path: Path, module: str, source: str) -> tuple[str, str]:
    """Write a stand-in trainer module; return (its module name, a PYTHONPATH with it first)."""
    mods = tmp_path / "mods"
    mods.mkdir(exist_ok=True)
    (mods / f"{module}.py").write_text(source)
    return module, pythonpath(mods)


def standin_log(run: Path) -> str:
    """What a stand-in trainer noted in its run folder (``standin.log``), or "" before it starts."""
    p = run / "standin.log"
    return p.read_text() if p.exists() else ""


def fake_bin(tmp_path: Path, **scripts: str) -> Path:
    """A folder of executable bash scripts (``name=body``) to put first on PATH."""
    fake = tmp_path / "bin"
    fake.mkdir(exist_ok=True)
    for name, body in scripts.items():
        (fake / name).write_text("#!/bin/bash\n" + body)
        (fake / name).chmod(0o755)
    return fake


def metric_steps(run: Path) -> list[int]:
    """The steps in a training run's ``metrics.csv`` so far."""
    p = run / "metrics.csv"
    if not p.exists():
        return []
    with open(p, newline="") as f:
        return [int(r["step"]) for r in csv.DictReader(f) if r.get("step")]


def signal_script_when(script: Path, args: list[str], *, env: dict[str, str], cwd: Path, ready: Callable[[], object],
                       what: str, sig: signal.Signals = signal.SIGUSR1, timeout: float = 120.0) -> tuple[int, str, str]:
    """Run ``bash script args`` (a batch script outside Slurm), wait until ``ready()``, send it ``sig`` as
    Slurm's warning would, and return ``(exit status, stdout, stderr)``; the script is killed if it hangs."""
    from helpers.waiting import wait_until

    proc = subprocess.Popen(["bash", str(script), *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, cwd=cwd)
    try:
        wait_until(ready, timeout, what)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return proc.returncode, out, err
