"""SFT on a cluster (issue 14, items 5-6): slurm/sft.sbatch, `hydroagent train submit sft`, the teacher and
evaluation campaign files, the SFT configs and the throughput benchmark.

The trainer (hydroagent_hpc.train.sft.trainer) is its own branch: nothing here imports it at module level.
The signal and requeue plumbing is checked with a stand-in trainer written by the test (a real
process that saves a checkpoint folder on SIGUSR1, saves and exits 143 on SIGTERM, and finishes when
it finds a checkpoint, as the real trainer's --resume does), behind real bash, submitit and signals.
"""

from __future__ import annotations

import csv
import importlib.util
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from helpers.hpc import ROOT, fake_bin, job_env, metric_steps, signal_script_when, standin_log, write_standin
from helpers.paths import pythonpath
from helpers.waiting import wait_until
from hydroagent_hpc.campaign import check_requirements, load_campaign

SBATCH = ROOT / "slurm" / "sft.sbatch"
HAVE_TRAINER = importlib.util.find_spec("hydroagent_hpc.train.sft.trainer") is not None
CONTRACT_KEYS = {"data", "model", "lr", "weight_decay", "warmup_steps", "max_steps", "micro_batch_size", "grad_accum",
                 "max_grad_norm", "seed", "dtype", "fsdp", "activation_checkpointing", "save_every", "log_every",
                 "bucket_by_length"}

STANDIN = '''
import os, signal, sys
from pathlib import Path

def main():
    args = sys.argv[1:]
    run = Path(args[args.index("--out") + 1])
    ck = run / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    log = run / "standin.log"
    def note(text):
        with open(log, "a") as f:
            f.write(text + "\\n")
    found = sorted(p.name for p in ck.iterdir())
    note(f"start config={args[0]} resume={'--resume' in args} found={','.join(found)}")
    if found:  # a resumed attempt: finish the run
        (run / "final").mkdir(exist_ok=True)
        note("finished")
        return 0
    def save(tag):
        tmp = ck / f".tmp-{tag}"
        tmp.mkdir()
        (tmp / "state.json").write_text("{}")
        tmp.rename(ck / f"step-{tag}")
    def on_usr1(sig, frame):  # note first: once the checkpoint appears, SIGTERM may interrupt this handler
        note("usr1")
        save("usr1")
    def on_term(sig, frame):
        save("term")
        note("term")
        sys.exit(143)
    signal.signal(signal.SIGUSR1, on_usr1)
    signal.signal(signal.SIGTERM, on_term)
    note("ready")
    while True:
        signal.pause()

if __name__ == "__main__":
    sys.exit(main())
'''










def _sbatch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    module, pythonpath = write_standin(tmp_path, "standin_sft", STANDIN)
    fake = fake_bin(tmp_path, scontrol='echo "$@" >> "$SCONTROL_LOG"\n')
    env.update(PATH=f"{fake}:{env['PATH']}", PYTHONPATH=pythonpath, HYDROAGENT_SFT_MODULE=module,
               HYDROAGENT_SFT_GPUS="0", HYDROAGENT_SFT_CPU="1", SCONTROL_LOG=str(tmp_path / "scontrol.log"),
               HYDROAGENT_SAVE_WAIT="60")
    env.update(extra)
    return env


# --------------------------------------------------------------------------- slurm/sft.sbatch

def test_the_sft_script_launches_the_trainer_instead_of_refusing():
    text = SBATCH.read_text()
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    assert "no hydroagent_hpc.sft yet" not in text and "lands with the SFT issue" not in text
    assert "hydroagent_hpc.train.sft" in text and "--resume" in text
    for needed in ("SLURM_NNODES", "SLURM_NODEID", "scontrol show hostnames", "accelerate\" launch",
                   "--machine_rank", "scontrol requeue", "HYDROAGENT_MAX_REQUEUES", "trap on_usr1 USR1"):
        assert needed in text, needed


def test_the_sft_script_refuses_a_gpu_less_allocation_unless_asked_for_the_cpu_path(tmp_path):
    (tmp_path / "cfg.yaml").write_text("model: tiny\n")
    env = _sbatch_env(tmp_path)
    env.pop("HYDROAGENT_SFT_CPU")
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert p.returncode == 2 and "no GPU" in p.stderr and "HYDROAGENT_SFT_CPU=1" in p.stderr
    assert not (tmp_path / "results").exists()
    env = _sbatch_env(tmp_path, HYDROAGENT_SFT_MODULE="hydroagent_hpc.no_such_trainer")
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert p.returncode == 2 and "cannot import hydroagent_hpc.no_such_trainer" in p.stderr
    p = subprocess.run(["bash", str(SBATCH), "nope.yaml"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=60)
    assert p.returncode == 2 and "config nope.yaml not found" in p.stderr


def test_sigusr1_checkpoints_requeues_and_the_next_attempt_resumes(tmp_path):
    """The CPU path end to end: USR1 -> the trainer saves -> requeue -> TERM (save, 143) -> exit 3; the
    requeued attempt finds the checkpoint and finishes."""
    (tmp_path / "cfg.yaml").write_text("model: tiny\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0")
    rc, out, err = signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                     ready=lambda: "ready" in standin_log(run),
                                     what="the stand-in trainer to start")
    assert rc == 3, err
    assert "checkpoint written" in out and "requeueing job 4242" in out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    log = standin_log(run).splitlines()
    assert log[0] == f"start config={tmp_path / 'cfg.yaml'} resume=True found="
    assert log[-2:] == ["usr1", "term"]  # saved on USR1 first, then on the requeue's TERM
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-term", "step-usr1"]
    assert not list(run.glob(".usr1.*"))  # the marker is cleaned up

    env["SLURM_RESTART_COUNT"] = "1"
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml", str(run)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "restart 1" in p.stdout and (run / "final").is_dir()
    assert standin_log(run).splitlines()[-2:] == ["start config=%s resume=True found=step-term,step-usr1"
                                           % (tmp_path / "cfg.yaml"), "finished"]


def test_the_requeue_limit_stops_requeueing_and_says_how_to_continue(tmp_path):
    (tmp_path / "cfg.yaml").write_text("model: tiny\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="7", SLURM_RESTART_COUNT="3", HYDROAGENT_MAX_REQUEUES="3")
    rc, _, err = signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                     ready=lambda: "ready" in standin_log(run),
                                     what="the stand-in trainer to start")
    assert rc == 3
    assert "requeued 3 times already" in err and "longer --time" in err
    assert not (tmp_path / "scontrol.log").exists()
    assert (run / "checkpoints" / "step-usr1").is_dir()


def test_several_nodes_start_one_launcher_per_node_with_the_rendezvous(tmp_path):
    """Multi-node: srun gets one task per node running this script in --node mode, MASTER_ADDR is the
    first host; each node's accelerate launch gets its machine rank and the rendezvous address."""
    (tmp_path / "cfg.yaml").write_text("model: tiny\n")
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="1234", SLURM_NNODES="2", SLURM_JOB_NODELIST="gpu-[a17,b03]",
                      HYDROAGENT_SFT_GPUS="4", SRUN_LOG=str(tmp_path / "srun.log"))
    fake_bin(tmp_path,  # replaces the logging scontrol of _sbatch_env (same folder, first on PATH)
              scontrol='[ "$1 $2" = "show hostnames" ] && printf "gpu-a17\\ngpu-b03\\n"\n',
              srun='echo "MASTER=$MASTER_ADDR:$MASTER_PORT ARGS=$*" > "$SRUN_LOG"\n')
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml", str(tmp_path / "run")], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    line = (tmp_path / "srun.log").read_text().split()
    assert line[0] == "MASTER=gpu-a17:29734"  # 29500 + 1234 % 1000
    assert line[1:5] == ["ARGS=--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1", "bash"]
    assert line[5:] == [str(SBATCH), "--node", str(tmp_path / "cfg.yaml"), str(tmp_path / "run"), "4", "2"]

    venv = tmp_path / "venv"
    (venv / "bin").mkdir(parents=True)
    (venv / "bin" / "accelerate").write_text('#!/bin/bash\necho "$@" > "$ACCEL_LOG"\n')
    (venv / "bin" / "accelerate").chmod(0o755)
    env.update(HYDROAGENT_VENV=str(venv), SLURM_NODEID="1", MASTER_ADDR="gpu-a17", MASTER_PORT="29734",
               HYDROAGENT_SFT_MODULE="hydroagent_hpc.train.sft", ACCEL_LOG=str(tmp_path / "accel.log"))
    p = subprocess.run(["bash", str(SBATCH), "--node", "cfg.yaml", "run", "4", "2"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=60)
    assert p.returncode == 0, p.stderr
    args = (tmp_path / "accel.log").read_text().split()
    assert args[:9] == ["launch", "--num_processes", "8", "--num_machines", "2", "--machine_rank", "1",
                        "--dynamo_backend", "no"]
    assert args[args.index("--main_process_ip") + 1] == "gpu-a17" and "--multi_gpu" in args
    assert args[args.index("--main_process_port") + 1] == "29734"
    assert args[-6:] == ["-m", "hydroagent_hpc.train.sft", "cfg.yaml", "--out", "run", "--resume"]




@pytest.mark.slow
@pytest.mark.skipif(not HAVE_TRAINER, reason="needs hydroagent_hpc.train.sft.trainer (the trainer branch, t1-sft)")
def test_the_cpu_path_runs_the_real_trainer_through_a_requeue(tmp_path):
    """sft.sbatch with the real trainer on one CPU process: SIGUSR1 -> checkpoint -> requeue; the next
    attempt resumes from it and continues the step count; SIGTERM saves and the script exits 143."""
    from helpers.sft import short_trajectories, write_sft_data
    from hydroagent_hpc.train.tiny import build_tiny_tokenizer

    trajs = short_trajectories(build_tiny_tokenizer(), 8)
    data = write_sft_data(tmp_path / "data.h5", trajs, [1.0] * len(trajs))
    (tmp_path / "cfg.yaml").write_text(
        f"data: {data}\nmodel: tiny\nlr: 1.0e-3\nmax_steps: 1000000\nmicro_batch_size: 2\ngrad_accum: 1\n"
        "dtype: fp32\nfsdp: false\nsave_every: 0\nlog_every: 1\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="99", SLURM_RESTART_COUNT="0",
                      HYDROAGENT_SFT_MODULE="hydroagent_hpc.train.sft")

    def attempt(sig: signal.Signals, after_step: int) -> tuple[int, str, str]:
        return signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                  ready=lambda: max(metric_steps(run), default=0) > after_step,
                                  what=f"training past step {after_step}", sig=sig, timeout=240)

    rc, out, err = attempt(signal.SIGUSR1, 2)
    assert rc == 3, err[-3000:]
    assert "checkpoint written" in out and (tmp_path / "scontrol.log").read_text().split() == ["requeue", "99"]
    saved = (run / "checkpoints" / "latest").read_text().strip()
    first = int(saved.removeprefix("step-"))
    assert first >= 3 and metric_steps(run) == list(range(1, first + 1))  # SIGTERM saved the last step

    env["SLURM_RESTART_COUNT"] = "1"
    rc, out, err = attempt(signal.SIGTERM, first + 2)
    assert rc == 143, err[-3000:]
    steps = metric_steps(run)
    assert steps == list(range(1, steps[-1] + 1)) and steps[-1] > first + 2  # one curve, resumed, not restarted
    assert (run / "checkpoints" / "latest").read_text().strip() == f"step-{steps[-1]}"


# --------------------------------------------------------------------------- hydroagent train submit sft

def test_launcher_command_lines():
    from hydroagent_hpc.train.submit import launcher_argv

    py = "/venv/bin/python"
    assert launcher_argv("c.yaml", "R", gpus=0, python=py) == [py, "-m", "hydroagent_hpc.train.sft", "c.yaml",
                                                               "--out", "R", "--resume"]
    one = launcher_argv("c.yaml", "R", gpus=4, python=py)
    assert one[:3] == ["/venv/bin/accelerate", "launch", "--num_processes"] and one[3] == "4"
    assert "--multi_gpu" in one and "--main_process_ip" not in one
    assert "--multi_gpu" not in launcher_argv("c.yaml", "R", gpus=1, python=py)
    two = launcher_argv("c.yaml", "R", gpus=8, nodes=2, node_rank=1, master_addr="n0", master_port=29600, python=py)
    assert two[two.index("--num_processes") + 1] == "16" and two[two.index("--machine_rank") + 1] == "1"
    assert two[two.index("--main_process_ip") + 1] == "n0" and two[two.index("--main_process_port") + 1] == "29600"
    with pytest.raises(ValueError, match="CPU path is one process"):
        launcher_argv("c.yaml", "R", gpus=0, nodes=2)
    with pytest.raises(ValueError, match="master_addr"):
        launcher_argv("c.yaml", "R", gpus=4, nodes=2, node_rank=0)
    with pytest.raises(ValueError, match="node_rank"):
        launcher_argv("c.yaml", "R", gpus=4, nodes=2, node_rank=2, master_addr="n0")


def test_submit_sft_on_the_local_executor_requeues_on_preemption_and_resumes(tmp_path, monkeypatch):
    """submitit's local backend: the job is interrupted (its preemption signal), SFTJob.checkpoint has the
    trainer save and stop, submitit requeues, and the second attempt resumes from the checkpoint."""
    from submitit.local.local import LocalJobEnvironment

    from hydroagent_hpc.hpc.jobs import child_pids
    from hydroagent_hpc.hpc.slurm import SiteSettings
    from hydroagent_hpc.train.submit import submit_sft_job

    module, pythonpath = write_standin(tmp_path, "standin_sft", STANDIN)
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("model: tiny\n")
    run = tmp_path / "run"
    job, out = submit_sft_job(cfg, run, SiteSettings(time_min=30), gpus=0, cluster="local", module=module,
                              save_wait_s=20)
    assert out["cluster"] == "local" and out["final"] == str(run / "final")
    assert (run / "submit.json").is_file() and '"max_requeues": 3' in (run / "submit.json").read_text()
    try:
        wait_until(lambda: "ready" in standin_log(run), 120, "the stand-in trainer to start under submitit")
        # Preemption as Slurm delivers it: submitit's signal to the job's task (the controller's child).
        (task, _), = child_pids(job._process.pid)
        os.kill(task, LocalJobEnvironment._usr_sig())
        result = job.result()
    finally:
        if not job.done():
            job.cancel(check=False)
    assert result["attempts"] == 2 and result["returncode"] == 0 and result["run_dir"] == str(run)
    log = standin_log(run).splitlines()
    assert log[:4] == [f"start config={cfg} resume=True found=", "ready", "usr1", "term"]
    assert log[-1] == "finished" and log[-2].endswith("found=step-term,step-usr1")


def test_a_failing_command_is_reported_not_requeued(tmp_path):
    from hydroagent_hpc.hpc.jobs import CheckpointedCommand, CommandFailed

    job = CheckpointedCommand([sys.executable, "-c", "raise SystemExit(5)"], tmp_path / "ck", name="sft")
    with pytest.raises(CommandFailed, match="exited with status 5 \\(attempt 1\\)"):
        job()
    assert job.stop_for_requeue() is False  # nothing running: nothing to stop
    with pytest.raises(ValueError, match="argv"):
        CheckpointedCommand([], tmp_path)


def test_submit_sft_errors_name_the_problem(tmp_path):
    env = {**job_env(), "PYTHONPATH": pythonpath()}
    cli = [sys.executable, "-m", "hydroagent_hpc.cli", "train", "submit", "sft"]
    p = subprocess.run([*cli, "nope.yaml", "--run-dir", "r"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "nope.yaml: no such SFT config file" in p.stderr
    (tmp_path / "c.yaml").write_text("model: tiny\n")
    p = subprocess.run([*cli, "c.yaml", "--run-dir", "r", "--gpus", "0", "--nodes", "2"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "CPU path is one process" in p.stderr
    p = subprocess.run([*cli, "c.yaml", "--run-dir", "r", "--cluster", "local"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    if HAVE_TRAINER:  # the trainer's own strict loader refuses the config before anything is queued
        assert p.returncode == 2 and "c.yaml" in p.stderr and "data: missing" in p.stderr
    else:
        assert p.returncode == 2 and "no hydroagent_hpc.train.sft" in p.stderr
    assert not (tmp_path / "r").exists()  # nothing submitted, nothing written


# --------------------------------------------------------------------------- campaign files and configs

def _train_gauges() -> list[str]:
    with open(ROOT / "data" / "paper_gauges.csv", newline="") as f:
        return [row["gauge_id"] for row in csv.DictReader(f) if row["split"] == "train"]


def test_the_teacher_campaign_covers_the_ten_training_gauges_with_the_heuristic():
    spec = load_campaign(ROOT / "data" / "campaigns" / "teacher.yaml")
    gauges = _train_gauges()
    assert len(gauges) == 10
    assert [Path(b).name for b in spec.basins] == [f"syn_{g}" for g in gauges]
    assert [a.kind for a in spec.agents] == ["heuristic"] and len(spec.seeds) >= 4
    text = (ROOT / "data" / "campaigns" / "teacher.yaml").read_text()
    for g in gauges:  # the build recipe in the header names every basin
        assert f"{g}:" in text
    problems = check_requirements(spec)  # loading never needs the basins; running does
    assert all("control.txt" in p for p in problems) and len(problems) in (0, 10)


def test_the_eval_campaign_puts_base_and_sft_checkpoints_beside_the_references():
    from hydroagent_hpc.sim.synth.basins import DEMO_BASINS

    spec = load_campaign(ROOT / "data" / "campaigns" / "sft-eval.yaml")
    assert [Path(b).name for b in spec.basins] == [b.name for b in DEMO_BASINS]  # held-out twins
    assert not {f"syn_{g}" for g in _train_gauges()} & {Path(b).name for b in spec.basins}
    kinds = {a.name: a.kind for a in spec.agents}
    assert kinds == {"heuristic": "heuristic", "dds": "dds", "hf-base": "hf_local", "hf-sft": "hf_local"}
    paths = {a.name: a.options["path"] for a in spec.agents if a.kind == "hf_local"}
    assert paths == {"hf-base": str(ROOT / "results" / "sft" / "tiny" / "base"),
                     "hf-sft": str(ROOT / "results" / "sft" / "tiny" / "final")}


def test_hf_local_paths_resolve_against_the_campaign_file_and_hub_ids_stay(tmp_path):
    (tmp_path / "c.yaml").write_text(
        "name: c\nbasins: [b]\nagents:\n  - {name: mine, kind: hf_local, path: ./runs/x/final}\n"
        "  - {name: hub, kind: hf_local, path: Qwen/Qwen3-4B-Instruct-2507}\n")
    spec = load_campaign(tmp_path / "c.yaml")
    assert spec.agents[0].options["path"] == str(tmp_path / "runs" / "x" / "final")
    assert spec.agents[1].options["path"] == "Qwen/Qwen3-4B-Instruct-2507"


@pytest.mark.parametrize("name", ["sft-tiny.yaml", "sft-qwen3-4b.yaml"])
def test_the_sft_configs_use_the_trainer_keys_and_the_papers_values(name):
    path = ROOT / "data" / "train" / name
    doc = yaml.safe_load(path.read_text())
    assert CONTRACT_KEYS - {"max_steps"} <= set(doc) <= CONTRACT_KEYS | {"epochs", "max_seq_len"}
    assert doc["fsdp"] is (name != "sft-tiny.yaml") and doc["dtype"] == ("fp32" if "tiny" in name else "bf16")
    if name == "sft-qwen3-4b.yaml":  # the paper's values (docs/reference-implementation.md section 6)
        assert doc["lr"] == 1e-5 and doc["micro_batch_size"] == 1 and doc["grad_accum"] == 8
        assert doc["epochs"] == 3 and doc["max_seq_len"] == 16384 and "max_steps" not in doc
        assert doc["activation_checkpointing"] is True


@pytest.mark.skipif(not HAVE_TRAINER, reason="needs hydroagent_hpc.train.sft.trainer (the trainer branch, t1-sft)")
@pytest.mark.parametrize("name", ["sft-tiny.yaml", "sft-qwen3-4b.yaml"])
def test_the_trainer_loads_the_shipped_configs(name):
    from hydroagent_hpc.train.sft.config import load_sft_config

    cfg = load_sft_config(ROOT / "data" / "train" / name)
    doc = yaml.safe_load((ROOT / "data" / "train" / name).read_text())
    assert cfg.data == str((ROOT / "data" / "train" / doc["data"]).resolve())
    assert cfg.model == ("tiny" if "tiny" in name else str(ROOT / "models" / "Qwen3-4B-Instruct-2507"))
    assert cfg.grad_accum == doc["grad_accum"] and cfg.dtype == doc["dtype"]


# --------------------------------------------------------------------------- benchmarks

def test_the_gpu_benchmark_refuses_clearly_without_cuda():
    from hydroagent_hpc.train.measure.throughput import cuda_device_count

    if cuda_device_count():
        pytest.skip("this machine has CUDA: the refusal cannot be observed here")
    p = subprocess.run([sys.executable, "-m", "hydroagent_hpc.bench.train", "--gpu", "--seconds", "1"],
                       capture_output=True, text=True, env={**job_env(), "PYTHONPATH": str(ROOT)}, timeout=120)
    assert p.returncode == 2 and "needs a CUDA device" in p.stderr and p.stdout == ""


def test_the_4b_shape_and_its_flop_count():
    import torch
    from transformers import Qwen3ForCausalLM

    from hydroagent_hpc.train.measure.throughput import flops_per_token, matmul_params, qwen3_config

    cfg = qwen3_config()
    with torch.device("meta"):
        model = Qwen3ForCausalLM(cfg)
    h, q, kv, ff, v, L = 2560, 32 * 128, 8 * 128, 9728, 151936, 36
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * ff + 2 * h + 2 * 128
    expected = L * per_layer + v * h + h  # layers, the tied embedding/head, the final norm
    assert sum(p.numel() for p in model.parameters()) == expected
    assert 4.0e9 < expected < 4.05e9  # "Qwen3-4B"
    assert matmul_params(model) == expected  # tied: the one table is the head's matmul
    assert flops_per_token(expected, L, 32, 128, 8192) == 6 * expected + 12 * L * 4096 * 8192


def test_cpu_sft_steps_report_tokens_and_flops():
    import torch

    from hydroagent_hpc.train.measure.throughput import build_random_qwen3, measure_sft_steps, qwen3_config

    cfg = qwen3_config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128, vocab_size=256, tie_word_embeddings=False)
    model = build_random_qwen3(cfg, "cpu", torch.float32)
    before = model.lm_head.weight.detach().clone()
    r = measure_sft_steps(model, seq_len=32, batch=2, steps=2, warmup_steps=1)
    assert r.steps == 2 and r.tokens_per_s > 0 and r.mfu is None and r.peak_memory_mb > 0
    assert r.matmul_params == r.params - 256 * 64  # untied: the input table does no matmul
    assert r.achieved_tflops == pytest.approx(r.flops_per_token * r.tokens_per_s / 1e12)
    assert not torch.equal(before, model.lm_head.weight)  # the steps trained the model


def test_the_random_qwen3_is_built_in_the_dtype_asked():
    """build_random_qwen3 (the GPU check's and the throughput bench's model) holds the dtype it is given, through
    transformers' ``dtype`` keyword (its ``torch_dtype`` is deprecated and warns on a GPU's first contact)."""
    import torch

    from hydroagent_hpc.train.measure.throughput import build_random_qwen3, qwen3_config

    cfg = qwen3_config(num_hidden_layers=1, hidden_size=64, intermediate_size=128, num_attention_heads=2,
                       num_key_value_heads=1, head_dim=32, vocab_size=256)
    for dtype in (torch.bfloat16, "float32"):
        model = build_random_qwen3(cfg, "cpu", dtype)
        want = dtype if isinstance(dtype, torch.dtype) else torch.float32
        assert {p.dtype for p in model.parameters()} == {want} and model.config.dtype == want
