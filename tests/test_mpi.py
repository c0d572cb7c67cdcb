"""The MPI pool under a real ``mpiexec`` (PyPI mpich + mpi4py): results, failures, identical episodes."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest

from helpers.hpc import BIN, ROOT, assert_same_episodes, job_env, mpiexec_or_skip, write_campaign
from hydroagent_hpc.campaign import load_campaign, run_campaign
from hydroagent_hpc.store import stored_ids

pytestmark = pytest.mark.mpi

PROBE = ROOT / "tests" / "scripts" / "mpi_pool_probe.py"


@pytest.fixture(scope="module")
def mpiexec() -> str:
    return mpiexec_or_skip()


def _probe(mpiexec: str, *args: str, n: int = 3, timeout: float = 120) -> dict:
    p = subprocess.run([mpiexec, "-n", str(n), str(BIN / "python"), str(PROBE), *args], capture_output=True,
                       text=True, timeout=timeout, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, f"exactly the root prints: {p.stdout}"
    return json.loads(lines[0])


def test_mpi_pool_maps_in_order_on_worker_ranks(mpiexec):
    out = _probe(mpiexec, "square", "12")
    assert out["size"] == 3 and out["workers"] == 2 and out["rank"] == 0
    assert [r[2] for r in out["results"]] == [x * x for x in range(12)]
    assert all(r[1] for r in out["results"])


@pytest.mark.parametrize("isolate", [True, False])
def test_mpi_pool_without_tasks_is_fine(mpiexec, isolate):
    args = ["trivial", "0"] + ([] if isolate else ["--no-isolate"])
    assert _probe(mpiexec, *args)["results"] == []


def test_mpi_pool_failures_are_results_not_hangs(mpiexec):
    """A raise, a worker that dies (os._exit) and a task past its timeout: failed results, the rest fine."""
    out = _probe(mpiexec, "mixed", "8", timeout=90)
    ok = {r[0]: r for r in out["results"]}
    assert [ok[i][1] for i in range(8)] == [True, True, False, False, True, False, True, True]
    assert "RuntimeError: bad input 2" in ok[2][3]
    assert "died" in ok[3][3]
    assert "timed out after 3 s" in ok[5][3]
    assert [ok[i][2] for i in (0, 1, 4, 6, 7)] == [0, 1, 16, 36, 49]


@pytest.mark.slow
def test_serial_processes_and_mpi_give_identical_episodes(mpiexec, tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=2, sims=20)
    spec = load_campaign(camp)
    run_campaign(spec, tmp_path / "serial.h5", progress=False)
    run_campaign(spec, tmp_path / "processes.h5", workers=2, progress=False)
    p = subprocess.run([mpiexec, "-n", "3", str(BIN / "hydroagent"), "campaign", "run", str(camp), "--out",
                        str(tmp_path / "mpi.h5"), "--pool", "mpi", "--no-progress"], capture_output=True, text=True,
                       timeout=300, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr
    summaries = [json.loads(ln) for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["pool"] == "mpi" and summaries[0]["workers"] == 2
    assert summaries[0]["ran"] == 4
    assert len(stored_ids(tmp_path / "mpi.h5")) == 4
    assert_same_episodes(tmp_path / "serial.h5", tmp_path / "processes.h5")
    assert_same_episodes(tmp_path / "serial.h5", tmp_path / "mpi.h5")


def test_pool_mpi_outside_a_launcher_is_a_clear_error(tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    env = {k: v for k, v in job_env().items() if k not in ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")}
    p = subprocess.run([str(BIN / "hydroagent"), "campaign", "run", str(camp), "--out", str(tmp_path / "x.h5"),
                        "--pool", "mpi"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 2 and "not started by an MPI launcher" in p.stderr and "mpiexec -n N" in p.stderr
    assert not Path(tmp_path / "x.h5").exists()


def test_a_killed_worker_rank_ends_the_job_promptly_never_a_hang(mpiexec):
    """Losing a whole rank (a node) cannot be a task failure in MPI; the launcher must end the job at once."""
    t0 = time.monotonic()
    p = subprocess.run([mpiexec, "-n", "3", str(BIN / "python"), str(PROBE), "killrank", "8"], capture_output=True,
                       text=True, timeout=120, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and time.monotonic() - t0 < 60
    assert "Killed" in p.stdout + p.stderr
