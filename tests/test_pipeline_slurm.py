"""``hydroagent pipeline submit`` on a real Slurm (../shared/scripts/start-local-slurm.sh), end to end.

The demo pipeline cut to seconds goes in as a chain of jobs (``afterok``), with the tiny model and
the training stages on CPU (the site file says ``gpus: 0``); the test waits for the report job and
checks every stage's record, the dependencies Slurm was given, and that submitting again submits
nothing. Skips, saying why, where no Slurm controller answers.
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest
import yaml

from helpers.pipeline import smaller_demo, write
from hydroagent_hpc.hpc.slurm import slurm_available
from hydroagent_hpc.pipeline.spec import STAGES
from hydroagent_hpc.pipeline.state import read_record
from hydroagent_hpc.pipeline.submit import load_site, submit_pipeline

pytestmark = pytest.mark.slurm


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


def test_the_pipeline_as_slurm_jobs_end_to_end_and_a_resubmit_submits_nothing(tmp_path):
    spec = write(tmp_path / "demo.yaml", smaller_demo())
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump({"gpus": 0, "cpus_per_task": 1, "time_min": {"default": 15}}))
    run = tmp_path / "run"
    t0 = time.perf_counter()
    out = submit_pipeline(spec, run, load_site(site), cluster="slurm", wait=True)
    wall = time.perf_counter() - t0
    assert out["cluster"] == "slurm" and out["failed"] == [], out
    assert list(out["jobs"]) == list(STAGES)
    records = {s: read_record(run, s) for s in STAGES}
    assert all(r["status"] == "done" for r in records.values()), {s: r["status"] for s, r in records.items()}
    assert all(r["job"] for r in records.values())  # each stage began inside a Slurm job
    # the chain: every job waits (afterok) for the one submitted before it; an array for its predecessor
    chain = [j for s in STAGES for j in out["jobs"][s] if "_" not in j or j.endswith("_0")]
    for before, after in zip(chain, chain[1:]):
        assert _dependency(run, after.split("_")[0] if "_" in after else after) == f"afterok:{before.split('_')[0]}"
    assert _dependency(run, out["jobs"]["basins"][0]) is None
    assert (run / "report" / "report.md").read_text().startswith("# Pipeline demo")
    stage_s = sum(r["wall_s"] or 0.0 for r in records.values())
    (tmp_path / "timing.json").write_text(json.dumps({"submit_to_report_s": wall, "stages_s": stage_s}))
    print(f"submit to report {wall:.0f} s, stages {stage_s:.0f} s, overhead {wall - stage_s:.0f} s")

    again = submit_pipeline(spec, run, load_site(site), cluster="slurm", wait=True)
    assert again["jobs"] == {} and again["skipped"] == list(STAGES)
    assert json.loads((run / "submit.json").read_text())["skipped"] == list(STAGES)
