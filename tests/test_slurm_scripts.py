"""The sbatch scripts: valid bash, every #SBATCH option documented, usable outside Slurm, accepted by sbatch."""

from __future__ import annotations

import json
import re
import subprocess

import pytest

from helpers.hpc import ROOT, job_env, write_campaign
from hydroagent_hpc.hpc.slurm import SiteSettings, slurm_available
from hydroagent_hpc.store import stored_ids

SLURM = ROOT / "slurm"
SCRIPTS = sorted(SLURM.glob("*.sbatch"))


def test_the_expected_scripts_exist():
    assert {p.name for p in SCRIPTS} >= {"campaign.sbatch", "report.sbatch", "sft.sbatch", "grpo.sbatch"}


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax_and_every_option_documented(script):
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    header = "\n".join(ln for ln in text.splitlines() if ln.startswith("#") and not ln.startswith("#SBATCH"))
    options = re.findall(r"^#SBATCH\s+(--[a-z-]+)", text, flags=re.M)
    assert options, "no #SBATCH lines"
    undocumented = [o for o in options if not re.search(rf"^#\s+{re.escape(o)}\b", header, flags=re.M)]
    assert not undocumented, f"{script.name}: document {undocumented} in the header"
    for site_key in ("--partition", "--account", "-p ", "-A "):
        assert not re.search(rf"^#SBATCH\s+{site_key}", text, flags=re.M), "site settings must not be hard-coded"
    assert "SBATCH_PARTITION" in text and "env.sh" in text


def test_campaign_script_runs_without_slurm_as_one_shard(tmp_path, small_basin_dir):
    """Outside Slurm the script is a plain bash program: shard 0 of 1, no merge job."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    p = subprocess.run(["bash", str(SLURM / "campaign.sbatch"), str(camp), str(tmp_path / "run")],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "shard 0 of 1" in p.stdout and "merge job" not in p.stdout
    assert len(stored_ids(tmp_path / "run" / "shards" / "shard-0000-of-0001.h5")) == 2


def test_campaign_script_errors_name_the_fix(tmp_path):
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    p = subprocess.run(["bash", str(SLURM / "campaign.sbatch"), "nope.yaml"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "campaign file nope.yaml not found" in p.stderr
    (tmp_path / "c.yaml").write_text("name: x\n")
    env["HYDROAGENT_VENV"] = str(tmp_path / "no-venv")
    p = subprocess.run(["bash", str(SLURM / "campaign.sbatch"), "c.yaml"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "run 'make venv'" in p.stderr
    env["HYDROAGENT_SITE"] = str(tmp_path / "missing-site.env")
    p = subprocess.run(["bash", str(SLURM / "campaign.sbatch"), "c.yaml"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "HYDROAGENT_SITE" in p.stderr


def test_grpo_script_validates_its_arguments_before_starting_anything(tmp_path):
    """The GRPO template runs the trainer now (tests/test_grpo_ops.py runs it); before it starts anything it
    refuses, with sft.sbatch's messages, a missing config, a missing trainer, a GPU-less allocation unless
    HYDROAGENT_GRPO_CPU=1, and a GPU count that is not a number."""
    script = SLURM / "grpo.sbatch"
    text = script.read_text()
    assert "no hydroagent_hpc.grpo yet" not in text
    assert "MODULE=${HYDROAGENT_GRPO_MODULE:-hydroagent_hpc.train.grpo}" in text
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    env.update(HYDROAGENT_GRPO_GPUS="0")

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["bash", str(script), *args], capture_output=True, text=True, env={**env, **extra},
                              cwd=tmp_path, timeout=60)

    p = run()
    assert p.returncode != 0 and "usage: sbatch slurm/grpo.sbatch GRPO_CONFIG.yaml [RUN_DIR]" in p.stderr
    p = run("nope.yaml")
    assert p.returncode == 2 and "config nope.yaml not found" in p.stderr
    p = run("cfg.yaml")
    assert p.returncode == 2 and "no GPU" in p.stderr and "HYDROAGENT_GRPO_CPU=1" in p.stderr
    p = run("cfg.yaml", HYDROAGENT_GRPO_GPUS="two")
    assert p.returncode == 2 and "'two' is not a whole number" in p.stderr
    p = run("cfg.yaml", HYDROAGENT_GRPO_CPU="1", HYDROAGENT_GRPO_MODULE="hydroagent_hpc.no_such_trainer")
    assert p.returncode == 2 and "cannot import hydroagent_hpc.no_such_trainer" in p.stderr
    p = run("cfg.yaml", HYDROAGENT_VENV=str(tmp_path / "no-venv"))
    assert p.returncode == 2 and "run 'make venv'" in p.stderr
    assert not (tmp_path / "results").exists()  # nothing was created


def test_sft_script_no_longer_refuses(tmp_path):
    """The SFT template's refusal is gone: it launches hydroagent_hpc.train.sft (tests/test_sft_ops.py runs it)."""
    text = (SLURM / "sft.sbatch").read_text()
    assert "no hydroagent_hpc.sft yet" not in text and "-m \"$MODULE\"" in text
    assert "MODULE=${HYDROAGENT_SFT_MODULE:-hydroagent_hpc.train.sft}" in text


def test_site_settings_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("SBATCH_PARTITION", "cpu-long")
    monkeypatch.setenv("SBATCH_ACCOUNT", "hydro")
    monkeypatch.setenv("HYDROAGENT_MODULES", "python/3.11 hdf5")
    site = SiteSettings.from_env(time_min=30, account="given-wins")
    assert site.partition == "cpu-long" and site.account == "given-wins" and site.time_min == 30
    assert site.setup_lines() == ["module load python/3.11 hdf5"]
    with pytest.raises(ValueError, match="cpus_per_task: must be at least 1, got 0"):
        SiteSettings.from_env(cpus_per_task=0)


@pytest.mark.slurm
@pytest.mark.parametrize("script,arg,extra", [
    ("campaign.sbatch", "c.yaml", ()), ("report.sbatch", "x.h5", ()),
    # the local test cluster has no GPUs: the documented CPU path (the header's third example)
    ("sft.sbatch", "c.yaml", ("--gpus-per-node=0", "--mem=1G", "--cpus-per-task=1")),
    # --mincpus: the GPU default (40: a trainer's 8 CPUs + 32 simulation ranks) does not fit a small test node
    ("grpo.sbatch", "c.yaml", ("--gpus-per-node=0", "--ntasks=2", "--mincpus=2", "--mem-per-cpu=1G")),
])
def test_sbatch_accepts_the_scripts(tmp_path, script, arg, extra):
    if not slurm_available():
        pytest.skip("no Slurm controller answers (sinfo failed): start ../shared/scripts/start-local-slurm.sh")
    p = subprocess.run(["sbatch", "--test-only", *extra, str(SLURM / script), arg], capture_output=True, text=True,
                       cwd=tmp_path, timeout=60, env=job_env())
    assert p.returncode == 0 and "to start at" in p.stderr, p.stderr


def test_run_record_is_json_with_commit(tmp_path):
    from hydroagent_hpc.campaign.shards import write_run_record

    write_run_record(tmp_path, {"array": 2})
    write_run_record(tmp_path, {"array": 3})  # a resubmission keeps the earlier record
    assert json.loads((tmp_path / "run.json").read_text())["array"] == 3
    assert json.loads((tmp_path / "run-1.json").read_text())["array"] == 2


def test_a_node_that_refuses_sbatch_still_runs_the_shard_and_says_how_to_merge(tmp_path, small_basin_dir):
    """Some sites forbid sbatch inside jobs: the task warns with the merge command and runs its shard."""
    camp = write_campaign(tmp_path, small_basin_dir, seeds=1, sims=12)
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "sbatch").write_text("#!/bin/sh\necho 'sbatch: error: Batch job submission failed: Access/permission "
                                 "denied' >&2\nexit 1\n")
    (fake / "sbatch").chmod(0o755)
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{fake}:{env['PATH']}", SLURM_ARRAY_JOB_ID="999", SLURM_ARRAY_TASK_ID="0",
               SLURM_ARRAY_TASK_MIN="0", SLURM_ARRAY_TASK_COUNT="1", SLURM_JOB_ID="1000")
    run = tmp_path / "run"
    p = subprocess.run(["bash", str(SLURM / "campaign.sbatch"), str(camp), str(run)], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=300)
    assert p.returncode == 0, p.stderr
    assert "could not submit the merge job" in p.stderr and "campaign merge" in p.stderr
    assert "--after-array 999" in p.stderr
    assert not (run / "logs" / ".merge-for-999").exists()  # another task may try again
    assert len(stored_ids(run / "shards" / "shard-0000-of-0001.h5")) == 2
