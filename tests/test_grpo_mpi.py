"""GRPO rollouts with their simulations on MPI worker ranks (real mpiexec, real simulator)."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.hpc import BIN, ROOT, job_env, mpiexec_or_skip

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "tests" / "scripts" / "grpo_mpi_rollouts.py"


def test_rollout_simulations_on_worker_ranks_equal_local_ones_under_the_cap(small_basin_dir):
    mpiexec = mpiexec_or_skip()
    p = subprocess.run([mpiexec, "-n", "3", str(BIN / "python"), str(SCRIPT), str(small_basin_dir), "2"],
                       capture_output=True, text=True, timeout=300, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    lines = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(lines) == 1, p.stdout
    out = json.loads(lines[0])
    mpi, local = out["mpi"], out["local"]
    assert mpi["errors"] == [None] * 4
    assert all(len(n) == 2 and all(isinstance(v, float) for v in n) for n in mpi["nse"])
    assert mpi["nse"] == local["nse"]  # the same runs, wherever they ran
    assert mpi["nse"][0] == mpi["nse"][2]  # same parameters, same result
    assert 1 <= mpi["peak"] <= 2
    # 3 distinct parameter sets x 2 runs each (the second run repeats the first one's parameters)
    assert mpi["misses"] == 3 and mpi["runs"] == 3 and mpi["hits"] == 5


def test_train_grpo_with_the_mpi_pool_runs_a_step_on_rank_0(tmp_path, small_basin_dir):
    """`hydroagent train grpo --pool mpi` under mpiexec: rank 0 trains, the other rank serves
    simulations and leaves when training is done; one result line, from rank 0 only."""
    mpiexec = mpiexec_or_skip()
    cfg = tmp_path / "grpo.yaml"
    cfg.write_text(f"basins: [{small_basin_dir}]\ngroup_size: 2\nprompts_per_step: 1\nmax_steps: 1\n"
                   f"max_new_tokens: 8\nenv: {{max_turns: 1}}\n")
    p = subprocess.run([mpiexec, "-n", "2", str(BIN / "hydroagent"), "train", "grpo", str(cfg), "--out",
                        str(tmp_path / "run"), "--pool", "mpi"], capture_output=True, text=True, timeout=300,
                       env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    results = [ln for ln in p.stdout.splitlines() if ln.startswith("{")]
    assert len(results) == 1 and json.loads(results[0])["steps"] == 1
    assert (tmp_path / "run" / "final" / "config.json").is_file()
