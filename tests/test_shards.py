"""Run folders without a scheduler: shards partition the campaign, merges are exact, reruns resume."""

from __future__ import annotations

import json
import subprocess

import pytest

from helpers.hpc import BIN, assert_same_episodes, job_env, write_campaign
from hydroagent_hpc.campaign import expand, load_campaign, run_campaign, shard_of
from hydroagent_hpc.campaign.shards import list_shards, merge_run, parse_shard, shard_path, skip_stores
from hydroagent_hpc.store import MergeError, stored_ids


def test_parse_shard_is_strict():
    assert parse_shard("3/8") == (3, 8) and parse_shard("0/1") == (0, 1)
    for bad in ("8/8", "-1/4", "a/4", "3", "3/0", "1/2/3"):
        with pytest.raises(ValueError, match="--shard"):
            parse_shard(bad)


def test_shards_partition_the_campaign(tmp_path, small_basin_dir):
    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=5))
    ids = [t.episode_id for t in expand(spec)]
    for n in (1, 2, 3, 4, 7, 11):
        parts = [[t.episode_id for t in shard_of(expand(spec), (i, n))] for i in range(n)]
        flat = [e for p in parts for e in p]
        assert sorted(flat) == sorted(ids) and len(flat) == len(set(flat))
        assert max(map(len, parts)) - min(map(len, parts)) <= 1  # balanced


def test_shards_merge_to_the_serial_result_and_remerge_is_a_no_op(tmp_path, small_basin_dir):
    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=2, sims=12))
    run = tmp_path / "run"
    for i in range(3):
        run_campaign(spec, shard_path(run, i, 3), shard=(i, 3), skip_stores=skip_stores(run, 3), progress=False)
    s = merge_run(spec, run)
    assert s["episodes"] == s["expected"] == 4 and s["missing"] == 0 and s["new"] == 4
    assert sorted(stored_ids(run / "campaign.h5")) == sorted(t.episode_id for t in expand(spec))
    run_campaign(spec, tmp_path / "serial.h5", progress=False)
    assert_same_episodes(run / "campaign.h5", tmp_path / "serial.h5")
    again = merge_run(spec, run)  # the shards are kept; a second merge adds nothing and loses nothing
    assert again["new"] == 0 and again["episodes"] == 4
    assert len(stored_ids(run / "campaign.h5")) == 4


def test_missing_episodes_refuse_the_merge_unless_allowed(tmp_path, small_basin_dir):
    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=2, sims=12))
    run = tmp_path / "run"
    run_campaign(spec, shard_path(run, 0, 2), shard=(0, 2), progress=False)
    with pytest.raises(MergeError, match=r"2 of 4 episodes are in no shard yet.*resubmit"):
        merge_run(spec, run)
    assert not (run / "campaign.h5").exists()  # nothing written half
    partial = merge_run(spec, run, allow_missing=True)
    assert partial["episodes"] == 2 and partial["missing"] == 2
    # the second shard arrives later (a resubmission); the merge completes the file
    run_campaign(spec, shard_path(run, 1, 2), shard=(1, 2), skip_stores=skip_stores(run, 2), progress=False)
    assert merge_run(spec, run)["episodes"] == 4


def test_a_resubmission_with_another_array_size_repeats_nothing(tmp_path, small_basin_dir):
    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=3, sims=12))
    run = tmp_path / "run"
    r = run_campaign(spec, shard_path(run, 0, 2), shard=(0, 2), progress=False)
    assert r["ran"] == 3
    done = set(stored_ids(shard_path(run, 0, 2)))
    ran = []
    for i in range(3):  # resubmitted as 3 shards: each skips what the old 2-shard array finished
        out = run_campaign(spec, shard_path(run, i, 3), shard=(i, 3), skip_stores=skip_stores(run, 3),
                           progress=False)
        ran += stored_ids(shard_path(run, i, 3)) if shard_path(run, i, 3).exists() else []
        assert out["ran"] + out["already_stored"] == out["episodes"]
    assert not done & set(ran) and len(done) + len(ran) == 6
    assert merge_run(spec, run)["episodes"] == 6 and len(list_shards(run)) == 4


def test_overlapping_shards_of_one_submission_are_an_error(tmp_path, small_basin_dir):
    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12))
    run = tmp_path / "run"
    run_campaign(spec, shard_path(run, 0, 2), progress=False)  # wrongly: the whole campaign in shard 0
    run_campaign(spec, shard_path(run, 1, 2), progress=False)  # and again in shard 1
    with pytest.raises(MergeError, match="stored by two shards of one submission"):
        merge_run(spec, run)


def test_cli_shard_and_merge(tmp_path, small_basin_dir):
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    run = tmp_path / "run"
    env = job_env()
    for i in range(2):
        p = subprocess.run([str(BIN / "hydroagent"), "campaign", "run", str(camp), "--run-dir", str(run),
                            "--shard", f"{i}/2", "--no-progress"], capture_output=True, text=True, env=env,
                           timeout=300)
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout.splitlines()[-1])["ran"] == 1
    p = subprocess.run([str(BIN / "hydroagent"), "campaign", "merge", str(camp), "--run-dir", str(run)],
                       capture_output=True, text=True, env=env, timeout=300)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["episodes"] == 2
    bad = subprocess.run([str(BIN / "hydroagent"), "campaign", "run", str(camp), "--run-dir", str(run),
                          "--shard", "2/2"], capture_output=True, text=True, env=env, timeout=120)
    assert bad.returncode == 2 and "0 <= 2 < 2" in bad.stderr
    both = subprocess.run([str(BIN / "hydroagent"), "campaign", "run", str(camp)], capture_output=True, text=True,
                          env=env, timeout=120)
    assert both.returncode == 2 and "exactly one of --out FILE or --run-dir DIR" in both.stderr


def test_submit_through_submitit_local_executor(tmp_path, small_basin_dir):
    """`hydroagent campaign submit` without Slurm: submitit's local executor, then the merge here."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    run = tmp_path / "run"
    p = subprocess.run([str(BIN / "hydroagent"), "-q", "campaign", "submit", str(camp), "--run-dir", str(run),
                        "--array", "2", "--cluster", "local", "--no-report"], capture_output=True, text=True,
                       env=job_env(), timeout=300)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["cluster"] == "local" and len(out["shard_jobs"]) == 2 and not out["shard_failures"]
    assert out["merge"]["episodes"] == 2 and out["merge"]["missing"] == 0
    assert len(stored_ids(run / "campaign.h5")) == 2
    record = json.loads((run / "run.json").read_text())
    assert record["array"] == 2 and "git_commit" in json.dumps(record["provenance"])
    from hydroagent_hpc.campaign import load_campaign
    from hydroagent_hpc.settings import dump

    assert record["spec"] == json.loads(json.dumps(dump(load_campaign(camp))))  # the whole resolved campaign
    logs = sorted(x.name for x in (run / "logs").iterdir() if x.name.isdigit())  # one folder per job (%j)
    assert len(logs) == 2 and all(any(f.name.endswith("_log.err") for f in (run / "logs" / d).iterdir())
                                  for d in logs)


def test_status_of_a_run_folder_while_and_after_it_runs(tmp_path, small_basin_dir):
    from hydroagent_hpc.campaign.shards import run_status

    spec = load_campaign(write_campaign(tmp_path, small_basin_dir, seeds=2, sims=12))
    run = tmp_path / "run"
    with pytest.raises(FileNotFoundError, match="no such run folder"):
        run_status(spec, run)
    run.mkdir()
    empty = run_status(spec, run)
    assert empty["done"] == 0 and empty["missing"] == 4 and empty["files"] == []
    run_campaign(spec, shard_path(run, 1, 2), shard=(1, 2), progress=False)
    half = run_status(spec, run)
    assert half["done"] == 2 and half["missing"] == 2
    assert half["files"] == [{"file": "shard-0001-of-0002.h5", "stored": 2, "expected": 2, "state": "closed"}]
    assert sorted(a["done"] for a in half["agents"]) == [1, 1]
    run_campaign(spec, shard_path(run, 0, 2), shard=(0, 2), progress=False)
    merge_run(spec, run)
    full = run_status(spec, run)  # merged file and shards hold the same episodes: counted once
    assert full["done"] == 4 and full["missing"] == 0 and full["files"][0]["file"] == "campaign.h5"
    assert all(a["median_best_nse"] > 0 for a in full["agents"])
    p = subprocess.run([str(BIN / "hydroagent"), "campaign", "status", str(tmp_path / "t.yaml"), "--run-dir",
                        str(run), "--json"], capture_output=True, text=True, env=job_env(), timeout=120)
    assert p.returncode == 0 and json.loads(p.stdout)["done"] == 4
