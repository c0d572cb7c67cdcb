"""GRPO rollouts with their simulations on MPI worker ranks (real mpiexec, real simulator)."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.hpc import BIN, ROOT, job_env, mpiexec_or_skip

pytestmark = pytest.mark.mpi

SCRIPT = ROOT / "tests" / "scripts" / "grpo_mpi_rollouts.py"


@pytest.mark.slow
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


@pytest.mark.slow
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


SPLIT = ROOT / "tests" / "scripts" / "grpo_split_trainers.py"


def test_the_first_ranks_train_and_only_trainer_rank_0_drives_the_simulation_ranks():
    """`--pool mpi --trainers 2` on 4 ranks: ranks 0-1 get torchrun's variables (one process group at trainer
    rank 0's address, local ranks 0-1), the pool is rank 0 + ranks 2-3, and only ranks 2-3 run tasks."""
    mpiexec = mpiexec_or_skip()
    p = subprocess.run([mpiexec, "-n", "4", str(BIN / "python"), str(SPLIT), "2"], capture_output=True, text=True,
                       timeout=120, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode == 0, p.stderr[-3000:]
    ranks = json.loads([ln for ln in p.stdout.splitlines() if ln.startswith("[")][0])
    assert [r["trainer"] for r in ranks] == [True, True, False, False]
    port = ranks[0]["env"]["MASTER_PORT"]
    assert int(port) > 0
    for r in (0, 1):
        assert ranks[r]["env"] == {"RANK": str(r), "WORLD_SIZE": "2", "LOCAL_RANK": str(r), "LOCAL_WORLD_SIZE": "2",
                                   "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    assert ranks[2]["env"] == ranks[3]["env"] == {}
    assert [r["pool_size"] for r in ranks] == [3, None, 3, 3]
    assert ranks[0]["served_by"] == [2, 3]  # the simulation ranks; trainer rank 1 never serves a task
    # too few ranks: every rank says so and nothing starts
    p = subprocess.run([mpiexec, "-n", "2", str(BIN / "python"), str(SPLIT), "2"], capture_output=True, text=True,
                       timeout=120, env=job_env(), stdin=subprocess.DEVNULL)
    assert p.returncode != 0 and "2 training process(es) in an MPI world of 2 rank(s) leave no simulation rank" \
        in p.stderr and "launch at least 3 ranks" in p.stderr


def test_grpo_launch_refuses_trainer_layouts_that_cannot_work(tmp_path, caplog):
    """Checked before MPI or torch start: --trainers without --pool mpi, and in-process generation with several
    trainers (the config error of the torchrun path, at generator's file:line)."""
    import logging

    from hydroagent_hpc.train.grpo.launch import main as launch

    caplog.set_level(logging.ERROR)
    cfg = tmp_path / "local.yaml"
    cfg.write_text("basins: [b]\ngenerator: local\n")
    assert launch([str(cfg), "--out", str(tmp_path / "run"), "--trainers", "2"]) == 2
    assert "--trainers 2 with --pool threads" in caplog.text and "add --pool mpi" in caplog.text
    caplog.clear()
    assert launch([str(cfg), "--out", str(tmp_path / "run"), "--pool", "mpi", "--trainers", "2"]) == 2
    assert "local.yaml:2: generator: local with 2 training processes" in caplog.text
    assert "fix: set generator: colocated" in caplog.text and "or engine" in caplog.text
    assert not (tmp_path / "run").exists()
    with pytest.raises(SystemExit):
        launch([str(cfg), "--out", str(tmp_path / "run"), "--pool", "mpi", "--trainers", "0"])
