"""Campaigns on a real Slurm (../shared/scripts/start-local-slurm.sh): sbatch arrays, submitit, requeues.

Every test submits real jobs and waits for them through ``sacct``; they skip, saying why, where no
Slurm controller answers. `.ci/run` starts a single-node Slurm before the suite.
"""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

import pytest

from helpers.hpc import ROOT, assert_same_episodes, job_env, write_campaign
from helpers.waiting import wait_until
from hydroagent_hpc.campaign import expand, load_campaign, run_campaign
from hydroagent_hpc.campaign.shards import shard_path
from hydroagent_hpc.hpc.slurm import SiteSettings, slurm_available
from hydroagent_hpc.store import stored_ids

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # real jobs through the queue: minutes

TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
            "DEADLINE"}


@pytest.fixture(scope="module", autouse=True)
def slurm() -> None:
    if not slurm_available():
        pytest.skip("no Slurm controller answers (sinfo failed): start one with "
                    "../shared/scripts/start-local-slurm.sh (root, Debian), as .ci/run does")


def _state(job: str) -> str:
    p = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True,
                       timeout=30)
    for line in p.stdout.splitlines():
        jid, _, state = line.partition("|")
        if jid == job:
            return state.split()[0] if state else ""
    return ""


def wait_job(job: str, timeout: float = 240) -> str:
    """The job's terminal state; a job still running after ``timeout`` s is cancelled and the test fails."""
    def finished() -> str:
        state = _state(job)
        return state if state in TERMINAL else ""

    try:
        return wait_until(finished, timeout, f"job {job} to finish", interval=0.5)
    except AssertionError:
        subprocess.run(["scancel", job], timeout=30)
        raise AssertionError(f"job {job} did not finish within {timeout} s (last state {_state(job)!r})") from None


def wait_for(predicate, timeout: float, what: str) -> None:
    wait_until(predicate, timeout, what, interval=0.2, max_interval=0.2)  # catch short-lived states


def _stored(path: Path) -> int:
    try:
        return len(stored_ids(path)) if path.exists() else 0
    except Exception:  # the writer holds it at this instant; ask again
        return 0


def release_requeued(job: str, timeout: float = 60) -> None:
    """Start a requeued job now: Slurm holds a requeued job about 2 minutes (BeginTime), which only slows tests."""
    def pending_again() -> bool:
        p = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30)
        restarts = re.search(r"Restarts=(\d+)", p.stdout)
        return "JobState=PENDING" in p.stdout and restarts is not None and int(restarts.group(1)) >= 1

    wait_for(pending_again, timeout, f"job {job} to be requeued")
    time.sleep(3)  # slurmd refuses a relaunch in the second its credential was revoked ("Job credential revoked")
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)


def follow_merge(run: Path, job: str, timeout: float = 300) -> tuple[str, int]:
    """Wait for a merge job and for the merges it deferred to; return the last state and the deferrals."""
    deferrals = 0
    while True:
        state = wait_job(job, timeout)
        log = run / "logs" / f"merge-{job}.out"
        m = re.search(r'"deferred_to": "(\d+)"', log.read_text()) if log.exists() else None
        if state != "COMPLETED" or m is None:
            return state, deferrals
        job, deferrals = m.group(1), deferrals + 1


def follow_submitit_merge(run: Path, job: str) -> tuple[dict, int]:
    import submitit

    deferrals = 0
    while True:
        wait_job(job)
        result = submitit.SlurmJob(folder=run / "logs" / "%j", job_id=job).result()
        if "deferred_to" not in result:
            return result, deferrals
        job, deferrals = result["deferred_to"], deferrals + 1


def _sbatch(tmp_path: Path, *args: str) -> str:
    p = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True, cwd=tmp_path, env=job_env(),
                       timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


def _merge_job(tmp_path: Path, array: str) -> str:
    found: list[str] = []

    def seen() -> bool:
        for log in tmp_path.glob(f"slurm-*-{array}_*.out"):
            m = re.search(r"merge job (\d+) submitted", log.read_text())
            if m:
                found.append(m.group(1))
                return True
        return False

    wait_for(seen, 120, f"the merge job of array {array} to be submitted")
    return found[0]


def test_sbatch_array_shards_merge_and_report(tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=2, sims=20)
    run = tmp_path / "run"
    array = _sbatch(tmp_path, "--array=0-1", "--cpus-per-task=1", str(ROOT / "slurm" / "campaign.sbatch"),
                    str(camp), str(run))
    merge = _merge_job(tmp_path, array)
    assert follow_merge(run, merge) == ("COMPLETED", 0)
    assert [wait_job(f"{array}_{i}") for i in range(2)] == ["COMPLETED", "COMPLETED"]
    spec = load_campaign(camp)
    ids = stored_ids(run / "campaign.h5")
    assert sorted(ids) == sorted(t.episode_id for t in expand(spec)) and len(ids) == len(set(ids))
    run_campaign(spec, tmp_path / "serial.h5", progress=False)
    assert_same_episodes(run / "campaign.h5", tmp_path / "serial.h5")
    assert (run / "report" / "report.md").exists() and (run / "report" / "report.html").exists()


def test_sbatch_task_requeued_halfway_completes_each_episode_once(tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=8, sims=60)
    run = tmp_path / "run"
    array = _sbatch(tmp_path, "--array=0-1", "--cpus-per-task=1", str(ROOT / "slurm" / "campaign.sbatch"),
                    str(camp), str(run))
    merge = _merge_job(tmp_path, array)
    shard0 = shard_path(run, 0, 2)
    wait_for(lambda: _stored(shard0) >= 1, 120, "shard 0 to store its first episode")
    before = _stored(shard0)
    assert before < 8, "the shard finished before the requeue; make the episodes longer"
    from hydroagent_hpc.campaign.shards import run_status

    live = run_status(load_campaign(camp), run)  # read beside the writing tasks
    assert 1 <= live["done"] < 16 and any(f["state"].startswith("open") for f in live["files"])
    subprocess.run(["scontrol", "requeue", f"{array}_0"], check=True, timeout=30)
    release_requeued(f"{array}_0")
    assert follow_merge(run, merge)[0] == "COMPLETED"
    spec = load_campaign(camp)
    ids = stored_ids(run / "campaign.h5")
    assert sorted(ids) == sorted(t.episode_id for t in expand(spec)) and len(ids) == len(set(ids)) == 16
    log0 = next(tmp_path.glob(f"slurm-*-{array}_0.out")).read_text()
    assert "restart 1" in log0  # the requeued task ran again (open-mode=append keeps both runs)
    m = re.findall(r"shard 0 of 2\): 8 episodes, (\d+) already stored", log0)
    assert len(m) == 2 and int(m[1]) >= before  # the second run resumed from the shard file


def test_submitit_preempted_shard_is_requeued_and_resumes(tmp_path, small_basin_dir):
    from hydroagent_hpc.campaign.submit import submit_campaign

    camp = write_campaign(tmp_path, small_basin_dir, seeds=8, sims=60)
    run = tmp_path / "run"
    site = SiteSettings(time_min=10, cpus_per_task=1)
    out = submit_campaign(camp, run, array=2, site=site, cluster="slurm", report=False)
    assert out["cluster"] == "slurm" and len(out["shard_jobs"]) == 2
    task0 = out["shard_jobs"][0]
    shard0 = shard_path(run, 0, 2)
    wait_for(lambda: _stored(shard0) >= 1, 120, "shard 0 to store its first episode")
    assert _stored(shard0) < 8, "the shard finished before the preemption; make the episodes longer"
    # what submitit's Job._interrupt() does for a preemption: SIGTERM, then its USR2 signal
    subprocess.run(["scancel", task0, "--signal", "SIGTERM"], check=True, timeout=30)
    subprocess.run(["scancel", task0, "--signal", "USR2"], check=True, timeout=30)
    release_requeued(task0)  # submitit's handler ran `scontrol requeue` inside the job
    result, _ = follow_submitit_merge(run, out["merge_job"])
    assert result["episodes"] == 16 and result["missing"] == 0
    ids = stored_ids(run / "campaign.h5")
    spec = load_campaign(camp)
    assert sorted(ids) == sorted(t.episode_id for t in expand(spec)) and len(ids) == len(set(ids)) == 16
    err = (run / "logs" / task0 / f"{task0}_0_log.err").read_text()
    assert "requeueing (finished episodes are kept)" in err and "attempt 2" in err


def test_submitit_mpi_ranks_inside_the_allocation(tmp_path, small_basin_dir):
    """``--ntasks 2``: submitit starts 2 ranks with srun --mpi=pmi2; rank 0 coordinates the MPI pool."""
    from hydroagent_hpc.campaign.submit import submit_campaign

    camp = write_campaign(tmp_path, small_basin_dir, seeds=2, sims=20)
    run = tmp_path / "run"
    out = submit_campaign(camp, run, array=1, site=SiteSettings(time_min=10, cpus_per_task=1, ntasks=2),
                          cluster="slurm", wait=True, report=False)
    assert out["merge"]["episodes"] == 4 and out["merge"]["missing"] == 0
    job = out["shard_jobs"][0]
    err = (run / "logs" / job / f"{job}_0_log.err").read_text()
    assert "on the mpi pool with 1 worker(s)" in err
    run_campaign(load_campaign(camp), tmp_path / "serial.h5", progress=False)
    assert_same_episodes(run / "campaign.h5", tmp_path / "serial.h5")


def test_sbatch_time_limit_warning_requeues_the_task_itself(tmp_path, small_basin_dir):
    """The USR1 that --signal=B:USR1@120 sends before the limit: the script stops its run and requeues itself."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=8, sims=60)
    run = tmp_path / "run"
    array = _sbatch(tmp_path, "--array=0-1", "--cpus-per-task=1", str(ROOT / "slurm" / "campaign.sbatch"),
                    str(camp), str(run))
    merge = _merge_job(tmp_path, array)
    shard1 = shard_path(run, 1, 2)
    wait_for(lambda: _stored(shard1) >= 1, 120, "shard 1 to store its first episode")
    subprocess.run(["scancel", "--batch", "--signal=USR1", f"{array}_1"], check=True, timeout=30)
    release_requeued(f"{array}_1")
    assert follow_merge(run, merge)[0] == "COMPLETED"
    ids = stored_ids(run / "campaign.h5")
    assert len(ids) == len(set(ids)) == 16
    log1 = next(tmp_path.glob(f"slurm-*-{array}_1.out")).read_text()
    assert "time limit near: stopping shard 1 and requeueing" in log1 and "restart 1" in log1


def test_a_merge_that_finds_the_array_still_queued_defers_itself(tmp_path, small_basin_dir):
    """If a merge starts while a task of its array is queued again, it resubmits itself after the array."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    run = tmp_path / "run"
    run_campaign(load_campaign(camp), shard_path(run, 0, 2), shard=(0, 2), progress=False)  # shard 1 missing
    (run / "logs").mkdir(parents=True)
    holder = _sbatch(tmp_path, "--begin=now+600", "--wrap", "true")  # stands in for a requeued, waiting task
    try:
        cmd = ["hydroagent", "campaign", "merge", str(camp), "--run-dir", str(run), "--after-array", holder]
        p = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), timeout=120)
        assert p.returncode == 0, p.stderr
        deferred = re.search(r'"deferred_to": "(\d+)"', p.stdout).group(1)
        q = subprocess.run(["squeue", "-h", "-j", deferred, "-o", "%T %E"], capture_output=True, text=True,
                           timeout=30)
        assert q.stdout.startswith("PENDING") and f"afterany:{holder}" in q.stdout
        assert not (run / "campaign.h5").exists()
    finally:
        subprocess.run(["scancel", holder], timeout=30)
    wait_job(holder)
    p = subprocess.run(cmd, capture_output=True, text=True, env=job_env(), timeout=120)
    assert p.returncode == 1 and "1 of 2 episodes are in no shard yet" in p.stderr  # no queued task: a real gap


def test_a_cancelled_task_fails_the_merge_and_resubmitting_completes_the_campaign(tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=8, sims=60)
    run = tmp_path / "run"
    args = ["--array=0-1", "--cpus-per-task=1", str(ROOT / "slurm" / "campaign.sbatch"), str(camp), str(run)]
    array = _sbatch(tmp_path, *args)
    merge = _merge_job(tmp_path, array)
    shard0 = shard_path(run, 0, 2)
    wait_for(lambda: _stored(shard0) >= 1, 120, "shard 0 to store its first episode")
    subprocess.run(["scancel", f"{array}_0"], check=True, timeout=30)
    assert follow_merge(run, merge)[0] == "FAILED"  # episodes missing and nothing queued: a clear failure
    log = (run / "logs" / f"merge-{merge}.out").read_text()
    assert "episodes are in no shard yet" in log and "resubmit the same campaign" in log
    assert not (run / "campaign.h5").exists()
    kept = _stored(shard0)
    assert 1 <= kept < 8
    again = _sbatch(tmp_path, *args)  # the same command again
    assert follow_merge(run, _merge_job(tmp_path, again))[0] == "COMPLETED"
    ids = stored_ids(run / "campaign.h5")
    assert len(ids) == len(set(ids)) == 16
    log0 = next(tmp_path.glob(f"slurm-*-{again}_0.out")).read_text()
    assert f"8 episodes, {kept} already stored" in log0  # finished episodes were not run again


def test_sbatch_with_ntasks_runs_the_shard_on_mpi_ranks(tmp_path, small_basin_dir):
    """``--ntasks=2``: the task starts its ranks with srun --mpi=pmi2 and runs episodes on the MPI pool."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=20)
    run = tmp_path / "run"
    array = _sbatch(tmp_path, "--array=0-0", "--ntasks=2", "--cpus-per-task=1", str(ROOT / "slurm" / "campaign.sbatch"),
                    str(camp), str(run))
    assert follow_merge(run, _merge_job(tmp_path, array)) == ("COMPLETED", 0)
    log = next(tmp_path.glob(f"slurm-*-{array}_0.out")).read_text()
    assert "mpi pool: 1 worker ranks" in log and '"pool": "mpi"' in log
    run_campaign(load_campaign(camp), tmp_path / "serial.h5", progress=False)
    assert_same_episodes(run / "campaign.h5", tmp_path / "serial.h5")
