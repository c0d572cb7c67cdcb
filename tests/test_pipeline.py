"""The whole recipe as one pipeline (issue 18): strict file, skip / resume / rerun, the report.

One module-scoped run of ``data/pipelines/demo.yaml`` cut smaller still (two 5-day training basins,
one held-out basin, SFT of 4 steps, one GRPO step; about a minute on 2 cores) is shared by the
tests, each working on its own copy of the run folder. The run is interrupted for real on the way:
the ``pipeline run`` process group is killed as soon as the SFT trainer has written its first
checkpoint, and the next ``pipeline run`` resumes the stage from that checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from helpers.paths import pythonpath
from helpers.pipeline import DEMO, ROOT, smaller_demo, write
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.pipeline.runner import pipeline_status, run_pipeline
from hydroagent_hpc.pipeline.spec import STAGES, load_pipeline
from hydroagent_hpc.pipeline.state import read_record


def _cli(*args: str, **kw) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": pythonpath(), "HF_HUB_OFFLINE": "1"}
    return subprocess.Popen([sys.executable, "-m", "hydroagent_hpc.cli", "-q", *args], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> dict:
    """The smaller demo, run to the end with one real interruption inside the SFT stage."""
    base = tmp_path_factory.mktemp("pipeline")
    spec = write(base / "demo.yaml", smaller_demo())
    run = base / "run"
    t0 = time.perf_counter()
    run_pipeline(spec, run, until="sft-data")
    proc = _cli("pipeline", "run", str(spec), "--run-dir", str(run), start_new_session=True)
    latest = run / "sft" / "run" / "checkpoints" / "latest"
    deadline = time.monotonic() + 180
    while not latest.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert proc.poll() is None, f"the pipeline ended before the SFT checkpoint: {proc.communicate()[0][-2000:]}"
    os.killpg(proc.pid, signal.SIGKILL)  # the pipeline and its trainer child, mid-stage
    proc.wait()
    cut = {"checkpoint": latest.read_text().strip(), "record": read_record(run, "sft")}
    result = run_pipeline(spec, run)
    return {"spec": spec, "run": run, "cut": cut, "result": result, "wall_s": time.perf_counter() - t0}


def _copy(demo_run: dict, tmp_path: Path) -> tuple[Path, Path]:
    run = tmp_path / "run"
    shutil.copytree(demo_run["run"], run, symlinks=True)
    return Path(demo_run["spec"]), run


def _actions(result: dict) -> dict[str, str]:
    return {s["stage"]: s["action"] for s in result["stages"]}


# --------------------------------------------------------------------------- the file


def test_the_shipped_pipeline_files_load():
    for name in ("demo.yaml", "paper.yaml", "released.yaml"):
        spec = load_pipeline(ROOT / "data" / "pipelines" / name)
        assert spec.group("train") and spec.group("heldout")
        assert set(spec.policies) == {"base", "sft", "grpo"}


def test_the_paper_files_use_the_papers_gauges_and_settings():
    paper = load_pipeline(ROOT / "data" / "pipelines" / "paper.yaml")
    released = load_pipeline(ROOT / "data" / "pipelines" / "released.yaml")
    assert len(paper.group("train")) == 10 and len(paper.group("heldout")) == 4
    assert {b.settings["paper_gauge_id"] for b in paper.group("heldout")} == {"02338660", "01403060", "06279500",
                                                                              "07144100"}
    assert paper.grpo["group_size"] == 8 and paper.grpo["kl_coef"] == 0.2 and paper.grpo["init"] == "sft"
    assert paper.grpo["env"]["max_turns"] == 50
    assert released.grpo["group_size"] == 6 and released.grpo["kl_coef"] == 0.05 and released.grpo["init"] == "base"
    for name in ("paper.yaml", "released.yaml"):  # every value says where it comes from
        for i, line in enumerate((ROOT / "data" / "pipelines" / name).read_text().splitlines(), 1):
            text = line.split("#", 1)[0].strip()
            if text and ":" in text and not text.endswith(":") and not text.startswith("- {gauge"):
                assert "#" in line, f"{name}:{i}: a value without its source: {line.strip()}"


@pytest.mark.parametrize("change, where, says", [
    (lambda d: d.update(extra=1), "extra", "unknown key"),
    (lambda d: d["sft"].update(lr="fast"), "lr", "sft.lr: expected a number"),
    (lambda d: d["grpo"].update(group_sise=4), "group_sise", "grpo.group_sise: unknown key"),
    (lambda d: d["grpo"].update(init="teacher"), "init", "grpo.init"),
    (lambda d: d["sft"].update(data="x.h5"), "data", "set by the pipeline"),
    (lambda d: d["teacher"]["agents"][0].update(kind="oracle"), "kind", "unknown kind"),
    (lambda d: d["evaluation"]["references"].append({"name": "sft", "kind": "dds"}), "references", "kept for"),
    (lambda d: d["basins"]["heldout"].append(dict(d["basins"]["train"][0])), "heldout", "listed twice"),
    (lambda d: d["basins"]["train"][0].update(area_km2=-3), "area_km2", "area_km2"),
    (lambda d: d["evaluation"]["policy"].update(temprature=0.5), "temprature", "takes no option"),
    (lambda d: d["sft_data"].update(recovery=1.5), "recovery", "sft_data.recovery: must be at most 1, got 1.5"),
    (lambda d: d["sft_data"].update(recovery=True), "recovery", "sft_data.recovery: expected a number, got True"),
    (lambda d: d["sft_data"].update(recovery_seed=-1), "recovery_seed",
     "sft_data.recovery_seed: must be at least 0, got -1"),
    (lambda d: d["sft_data"].update(recovery_sed=1), "recovery_sed", "sft_data.recovery_sed: unknown key"),
])
def test_errors_name_the_file_line_and_key(tmp_path, change, where, says):
    data = yaml.safe_load(DEMO.read_text())
    change(data)
    path = write(tmp_path / "p.yaml", data)
    with pytest.raises(ConfigError) as err:
        load_pipeline(path)
    message = err.value.message
    lines = list(enumerate(path.read_text().splitlines(), 1))
    line = next((i for i, text in lines if text.strip().startswith(f"{where}:")), None) or next(
        i for i, text in lines if f"{where}:" in text or (where == "kind" and "oracle" in text))
    assert message.startswith(f"{path}:"), message
    assert says in message, message
    # the line named is the key's own (or, for an entry, the entry's)
    assert f"{path}:{line}:" in message or where in ("references", "heldout"), message


def test_sft_data_recovery_reaches_build_sft_data(tmp_path, monkeypatch):
    """``sft_data: {recovery, recovery_seed}`` as ``train sft-data --recovery P --recovery-seed N``;
    left out, the section (and so the stage's input checksum) is the one it was before the keys existed."""
    import hydroagent_hpc.train.sft.data as sft_data
    from hydroagent_hpc.pipeline import stages

    data = yaml.safe_load(DEMO.read_text())
    data["sft_data"].pop("recovery", None)  # the demo sets it; this test needs the section without the keys
    data["sft_data"].pop("recovery_seed", None)
    assert "recovery" not in load_pipeline(write(tmp_path / "p.yaml", data)).section("sft-data")
    data["sft_data"].update(recovery=0.1, recovery_seed=3)
    spec = load_pipeline(write(tmp_path / "p.yaml", data))
    assert spec.section("sft-data")["recovery"] == 0.1 and spec.section("sft-data")["recovery_seed"] == 3
    seen = {}

    class Report:
        kept = examples = dropped = recovery_turns = 0

    def fake_build(*args, **kw):
        seen.update(kw)
        return Report()

    monkeypatch.setattr(sft_data, "build_sft_data", fake_build)
    assert stages._sft_data(spec, tmp_path / "run")["recovery_turns"] == 0
    assert seen["recovery"] == 0.1 and seen["recovery_seed"] == 3


def test_a_gauge_id_must_be_quoted(tmp_path):
    path = tmp_path / "p.yaml"
    text = DEMO.read_text().replace('- {name: syn_heldout2, area_km2: 80, seed: 1001, window_days: 10, warmup_days: 3, '
                                    'start: "2021-07-01"}', "- {gauge: 01403060}")  # YAML 1.1: an octal number
    path.write_text(text)
    with pytest.raises(ConfigError, match="quote the id"):
        load_pipeline(path)


# --------------------------------------------------------------------------- skip, resume, rerun


@pytest.mark.slow
def test_the_interrupted_sft_stage_resumed_from_its_checkpoint(demo_run):
    run = demo_run["run"]
    assert demo_run["cut"]["record"]["status"] == "running"  # killed: never recorded as done
    rec = read_record(run, "sft")
    assert rec["status"] == "done" and rec["action"] == "resume" and rec["attempts"] == 2
    steps = [int(line.split(",")[0]) for line in (run / "sft" / "run" / "metrics.csv").read_text().splitlines()[1:]]
    assert steps == [1, 2, 3, 4]  # each step once: the resumed trainer dropped nothing and repeated nothing
    before = {s["stage"]: s["action"] for s in demo_run["result"]["stages"]}
    assert before["sft"] == "resume"
    assert all(before[s] == "skip" for s in ("basins", "base", "teacher", "sft-data"))
    assert all(before[s] == "fresh" for s in ("grpo", "evaluation", "report"))


@pytest.mark.slow
def test_a_finished_run_skips_every_stage(demo_run, tmp_path):
    spec, run = _copy(demo_run, tmp_path)
    before = {s: read_record(run, s)["finished_utc"] for s in STAGES}
    result = run_pipeline(spec, run)
    assert _actions(result) == dict.fromkeys(STAGES, "skip")
    assert {s: read_record(run, s)["finished_utc"] for s in STAGES} == before
    status = pipeline_status(run)
    assert [(r["status"], r["next"]) for r in status["stages"]] == [("done", "skip")] * len(STAGES)


@pytest.mark.slow
def test_a_changed_section_reruns_that_stage_and_every_stage_that_reads_it(demo_run, tmp_path):
    spec, run = _copy(demo_run, tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["report"]["compare"] = ["heuristic", "grpo"]
    changed = write(tmp_path / "report-changed.yaml", data)
    assert _actions(run_pipeline(changed, run)) == {**dict.fromkeys(STAGES[:-1], "skip"), "report": "fresh"}
    assert "section" in read_record(run, "report")["why"]

    data["teacher"]["seeds"] = [0, 1]  # upstream: the teacher, then everything that reads what it wrote
    changed = write(tmp_path / "teacher-changed.yaml", data)
    result = run_pipeline(changed, run, until="sft-data")
    assert _actions(result) == {"basins": "skip", "base": "skip", "teacher": "fresh", "sft-data": "fresh"}
    from hydroagent_hpc.store import stored_ids

    assert len(stored_ids(run / "teacher" / "campaign.h5")) == 2 * 2  # the old episodes were cleared, not kept
    rows = {r["stage"]: r for r in pipeline_status(run)["stages"]}
    assert rows["sft"]["next"] == "fresh" and "sft-data outputs" in rows["sft"]["why"]
    assert [rows[s]["next"] for s in ("grpo", "evaluation", "report")] == ["wait"] * 3


@pytest.mark.slow
def test_a_damaged_output_makes_its_stage_run_again(demo_run, tmp_path):
    spec, run = _copy(demo_run, tmp_path)
    (run / "report" / "report.md").write_text("edited by hand\n")
    rows = {r["stage"]: r for r in pipeline_status(run)["stages"]}
    assert rows["report"]["next"] == "resume" and "changed since the stage wrote it" in rows["report"]["why"]
    result = run_pipeline(spec, run)
    assert _actions(result)["report"] == "resume"
    assert (run / "report" / "report.md").read_text().startswith("# Pipeline demo")


# --------------------------------------------------------------------------- what the run wrote


@pytest.mark.slow
def test_the_report_opens_with_table1_and_has_the_figures(demo_run):
    run = demo_run["run"]
    md = (run / "report" / "report.md").read_text()
    first_table = md[md.index("| Basin |"):].split("\n\n")[0].splitlines()
    assert first_table[0] == "| Basin | Method | Best NSE | Sims | Turns | Parse fail |"
    assert [line.split("|")[2].strip() for line in first_table[2:]] == ["Base", "SFT-only", "SFT+GRPO", "heuristic"]
    assert md.index("| Basin |") < md.index("| stage |")
    assert md.index("## Overall") < md.index("| Basin |") and "SFT+GRPO reaches a mean best NSE" in md
    assert (run / "report" / "tables" / "overall.csv").read_text().startswith("agent,method,episodes,seeds,best_nse")
    for name in ("nse_vs_sims.png", "training.png"):
        assert (run / "report" / "figures" / name).stat().st_size > 1000
    html = (run / "report" / "report.html").read_text()
    assert "data:image/png;base64," in html and "Parse fail" in html
    assert (run / "report" / "campaign" / "report.md").is_file()
    table = (run / "report" / "tables" / "table1.csv").read_text().splitlines()
    assert table[0] == "basin,method,agent,seeds,best_nse,best_nse_std,sims,turns,parse_failures"
    assert len(table) == 1 + 4


@pytest.mark.slow
def test_the_evaluation_plays_every_policy_under_one_budget(demo_run):
    from hydroagent_hpc.campaign import expand, load_campaign

    run = demo_run["run"]
    spec = load_campaign(run / "evaluation" / "campaign.yaml")
    assert [a.name for a in spec.agents] == ["base", "sft", "grpo", "heuristic"]
    paths = {a.name: a.options.get("path") for a in spec.agents}
    assert paths["sft"] == str(run / "sft" / "run" / "final") and paths["grpo"] == str(run / "grpo" / "run" / "final")
    assert paths["base"] == str(run / "base" / "model")
    assert {t.env for t in expand(spec)} == {spec.env} and spec.env.max_turns == 3
    grpo_cfg = yaml.safe_load((run / "grpo" / "grpo.yaml").read_text())
    assert grpo_cfg["model"] == paths["sft"]  # init: sft
    assert [Path(b).name for b in grpo_cfg["basins"]] == ["syn_teach1", "syn_teach2"]


@pytest.mark.slow
def test_the_run_folder_keeps_the_file_the_commit_and_each_stages_checksums(demo_run):
    run = demo_run["run"]
    record = json.loads((run / "pipeline.json").read_text())
    assert record["provenance"]["git_commit"] and record["sections"]["sft"]["max_steps"] == 4
    assert yaml.safe_load((run / "pipeline.yaml").read_text()) == yaml.safe_load(Path(demo_run["spec"]).read_text())
    sft = read_record(run, "sft")
    assert set(sft["input_parts"]["upstream"]) == {"sft-data", "base"}
    assert sft["input_parts"]["upstream"]["sft-data"]["data"] == read_record(run, "sft-data")["outputs"]["data"][
        "sha256"]
    assert set(sft["outputs"]) == {"final", "metrics"} and sft["outputs"]["final"]["path"] == "sft/run/final"


# --------------------------------------------------------------------------- the site file (pipeline submit)


def test_the_site_file_puts_training_and_the_policies_on_the_gpu_partition(tmp_path):
    from hydroagent_hpc.pipeline.submit import load_site

    site = tmp_path / "site.yaml"
    site.write_text("partition: cpu\ngpu_partition: gpu\ngpus: 1\ncpus_per_task: 4\ntrain_cpus_per_task: 16\n"
                    "time_min: {default: 30, sft: 600}\nmodules: [python/3.11]\n")
    s = load_site(site)
    sft, grpo, teacher = s.settings("sft"), s.settings("grpo"), s.settings("teacher", shards=True)
    assert (sft.partition, sft.gpus_per_node, sft.cpus_per_task, sft.time_min) == ("gpu", 1, 16, 600)
    assert (grpo.partition, grpo.time_min) == ("gpu", 30)
    assert (teacher.partition, teacher.gpus_per_node, teacher.cpus_per_task) == ("cpu", 0, 4)
    assert s.settings("evaluation", shards=True).partition == "gpu"  # the LLM policies play on GPUs
    assert s.settings("evaluation").gpus_per_node == 0  # its begin and merge jobs do not
    assert sft.setup_lines() == ["module load python/3.11"]
    # GRPO's simulations on MPI ranks beside the trainer: its one task gets a CPU per rank
    site.write_text("gpus: 1\ntrain_cpus_per_task: 4\ngrpo_sim_ranks: 7\n")
    s = load_site(site)
    assert s.settings("grpo").cpus_per_task == 8 and s.settings("sft").cpus_per_task == 4


def test_the_grpo_stage_job_runs_simulation_ranks_when_the_site_asks(tmp_path):
    from hydroagent_hpc.pipeline.submit import TrainStageJob

    pytest.importorskip("mpi4py")
    cmd = TrainStageJob(str(tmp_path), "grpo", sim_ranks=2)._command()
    assert cmd.argv[cmd.argv.index("-n") + 1] == "3" and cmd.argv[-2:] == ["--pool", "mpi"] and cmd.rank0_only
    assert TrainStageJob(str(tmp_path), "grpo")._command().argv[-1] == "threads"


@pytest.mark.parametrize("text, says", [
    ("gpus: 2\n", "gpus: must be at most 1, got 2"),
    ("grpo_sim_ranks: -1\n", "grpo_sim_ranks"),
    ("partitoin: gpu\n", "unknown key"),
    ("time_min: {sft: 0}\n", "time_min"),
    ("time_min: {trian: 10}\n", "time_min"),
])
def test_site_file_errors_name_the_line(tmp_path, text, says):
    from hydroagent_hpc.errors import ConfigError
    from hydroagent_hpc.pipeline.submit import load_site

    site = tmp_path / "site.yaml"
    site.write_text("partition: cpu\n" + text)
    with pytest.raises(ConfigError) as err:
        load_site(site)
    assert err.value.message.startswith(f"{site}:2:") and says in err.value.message


def test_greedy_policies_play_one_seed_and_the_references_every_seed(tmp_path):
    from hydroagent_hpc.pipeline.stages import _campaign_mapping

    spec = load_pipeline(DEMO)
    assert spec.policy_options.get("greedy") is True and len(spec.evaluation.seeds) > 1
    agents = {a["name"]: a for a in _campaign_mapping(spec, tmp_path, "evaluation")["agents"]}
    assert {p: agents[p]["seeds"] for p in ("base", "sft", "grpo")} == {p: [spec.evaluation.seeds[0]]
                                                                       for p in ("base", "sft", "grpo")}
    assert all("seeds" not in agents[r] for r in ("heuristic", "dds", "random"))


def test_the_overall_table_counts_unscored_episodes_and_says_what_it_shows():
    import pandas as pd

    from hydroagent_hpc.pipeline.report import in_words, overall

    eps, turns = [], []

    def ep(agent, basin, seed, nse, messages, failed, sims, failures_per_message=1):
        eid = f"{agent}/{basin}/{seed}"
        eps.append({"episode_id": eid, "agent": agent, "basin_id": basin, "seed": seed, "best_nse": nse,
                    "counters.parse_failures": failed * failures_per_message, "n_sims": sims, "total_reward": 1.0})
        for m in range(messages):
            kinds = ["parse_failure"] * failures_per_message if m < failed else ["tool"]
            turns.extend({"episode_id": eid, "message_index": m, "kind": k} for k in kinds)

    ep("base", "a", 0, float("nan"), 4, 4, 0, failures_per_message=3)  # several malformed calls in a message
    ep("base", "b", 0, float("nan"), 4, 4, 0)
    ep("sft", "a", 0, 0.5, 10, 1, 4)
    ep("sft", "b", 0, 0.7, 10, 0, 4)
    ep("grpo", "a", 0, 0.6, 10, 0, 4)
    ep("grpo", "b", 0, 0.8, 10, 0, 4)
    for seed, (x, y) in enumerate(((0.2, 0.4), (0.4, 0.6))):
        ep("random", "a", seed, x, 10, 0, 4)
        ep("random", "b", seed, y, 10, 0, 4)
    ov = overall(pd.DataFrame(eps), pd.DataFrame(turns), ["base", "sft", "grpo", "random"]).set_index("agent")
    assert ov.loc["base", "best_nse"] == -1.0 and ov.loc["base", "unscored"] == 2
    assert ov.loc["base", "valid_calls"] == 0.0 and ov.loc["sft", "valid_calls"] == 0.95
    assert ov.loc["base", "parse_failures"] == 8.0  # calls, where valid_calls counts messages
    assert ov.loc["grpo", "best_nse"] == pytest.approx(0.7) and ov.loc["sft", "best_nse"] == pytest.approx(0.6)
    assert ov.loc["random", "best_nse"] == pytest.approx(0.4) and ov.loc["random", "best_nse_sd"] == pytest.approx(
        (0.02) ** 0.5)
    words = in_words(ov.reset_index(), 2)
    assert "SFT+GRPO reaches a mean best NSE of 0.700, above SFT by 0.100 (0.600)" in words
    assert "100% of its messages are valid tool calls (SFT 95%, Base 0%)" in words
    assert "random 0.400: SFT+GRPO is above random" in words
