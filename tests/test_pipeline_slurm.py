"""``hydroagent pipeline submit`` on a real Slurm (../shared/scripts/start-local-slurm.sh), end to end.

The demo pipeline cut to seconds goes in as a chain of jobs (``afterok``), with the tiny model and
the training stages on CPU (the site file says ``gpus: 0``); the test waits for the report job and
checks every stage's record, the dependencies Slurm was given, and that submitting again submits
nothing. Skips, saying why, where no Slurm controller answers.
"""

from __future__ import annotations

import json
import re
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from helpers.pipeline import smaller_demo, write
from hydroagent_hpc.hpc.slurm import slurm_available
from hydroagent_hpc.pipeline.spec import STAGES
from hydroagent_hpc.pipeline.state import read_record
from hydroagent_hpc.pipeline.submit import load_site, submit_pipeline

pytestmark = [pytest.mark.slurm, pytest.mark.slow]  # real jobs through the queue: minutes


@pytest.fixture(scope="module", autouse=True)
def slurm() -> None:
    if not slurm_available():
        pytest.skip("no Slurm controller answers (sinfo failed): start one with "
                    "../shared/scripts/start-local-slurm.sh (root, Debian), as .ci/run does")


def _dependency(run: Path, job: str) -> str | None:
    script = run / "logs" / job / f"{job}_submission.sh"
    if not script.is_file():  # an array: submitit names the folder by the array's first task
        script = next((run / "logs").glob(f"{job}_0/{job}_submission.sh"), None) or next(
            (run / "logs").glob(f"{job}_*/*_submission.sh"))
    m = re.search(r"^#SBATCH --dependency=(\S+)$", Path(script).read_text(), re.M)
    return m.group(1) if m else None


def _state(job: str) -> str:
    p = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True,
                       timeout=30)
    return next((line.split("|")[1].split()[0] for line in p.stdout.splitlines() if line.split("|")[0] == job), "")


def test_the_pipeline_as_slurm_jobs_a_failed_stage_resubmitted_and_a_resubmit_that_submits_nothing(tmp_path):
    data = smaller_demo()
    data["sft"]["max_seq_len"] = 64  # shorter than every teacher trajectory: the SFT trainer refuses, its job fails
    spec = write(tmp_path / "demo.yaml", data)
    site = tmp_path / "site.yaml"
    # grpo_sim_ranks: GRPO's simulations on an MPI rank beside the trainer, inside its Slurm job
    site.write_text(yaml.safe_dump({"gpus": 0, "cpus_per_task": 1, "grpo_sim_ranks": 1, "time_min": {"default": 15}}))
    run = tmp_path / "run"

    first = submit_pipeline(spec, run, load_site(site), cluster="slurm", wait=True)
    assert first["cluster"] == "slurm" and list(first["jobs"]) == list(STAGES)
    assert len(first["failed"]) == 1 and first["failed"][0].startswith("sft:"), first["failed"]
    assert [read_record(run, s)["status"] for s in STAGES[:4]] == ["done"] * 4 and read_record(run, "sft")["status"] \
        == "failed"
    done_before = {s: read_record(run, s)["finished_utc"] for s in STAGES[:4]}
    waiting = first["jobs"]["grpo"][0]
    assert _state(waiting) == "PENDING"  # afterok on a failed job: it can never start

    del data["sft"]["max_seq_len"]  # fixed: the SFT section changed, so sft and everything after it rerun
    write(spec, data)
    t0 = time.perf_counter()
    second = submit_pipeline(spec, run, load_site(site), cluster="slurm", wait=True)
    wall = time.perf_counter() - t0
    assert second["failed"] == [], second
    assert second["skipped"] == list(STAGES[:4]) and list(second["jobs"]) == list(STAGES[4:])
    assert waiting in second["cancelled"]
    assert {s: read_record(run, s)["finished_utc"] for s in STAGES[:4]} == done_before  # finished work kept
    records = {s: read_record(run, s) for s in STAGES}
    assert all(r["status"] == "done" for r in records.values()), {s: r["status"] for s, r in records.items()}
    assert all(r["job"] for r in records.values())  # each stage began inside a Slurm job
    # the chain: every job waits (afterok) for the one submitted before it; an array for its predecessor
    chain = [j for s in STAGES[4:] for j in second["jobs"][s] if "_" not in j or j.endswith("_0")]
    assert _dependency(run, chain[0]) is None
    for before, after in zip(chain, chain[1:]):
        assert _dependency(run, after.split("_")[0]) == f"afterok:{before.split('_')[0]}"
    assert (run / "report" / "report.md").read_text().startswith("# Pipeline demo")
    grpo_logs = "".join(p.read_text(errors="replace") for p in (run / "logs" / second["jobs"]["grpo"][0]).glob("*")
                        if p.suffix in (".out", ".err"))
    assert "-launcher fork -n 2" in grpo_logs and "--pool mpi" in grpo_logs  # the trainer and one simulation rank
    stage_s = sum(records[s]["wall_s"] or 0.0 for s in STAGES[4:])
    (tmp_path / "timing.json").write_text(json.dumps({"submit_to_report_s": wall, "stages_s": stage_s}))
    print(f"sft..report: submit to report {wall:.0f} s, stages {stage_s:.0f} s")

    again = submit_pipeline(spec, run, load_site(site), cluster="slurm", wait=True)
    assert again["jobs"] == {} and again["skipped"] == list(STAGES) and again["cancelled"] == []
