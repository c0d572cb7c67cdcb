"""The GPU job definitions give each part its own GPUs, CPUs and memory (audit F5, F10).

slurm/grpo.sbatch runs here as the real bash program with a stand-in trainer module that records, on every
rank, the environment the rank got (GPUs, thread count, CPU set) and a stand-in srun that starts the ranks
as srun does (SLURM_PROCID per task); GPUs are the script's HYDROAGENT_GRPO_GPUS and the job's CPUs
SLURM_CPUS_ON_NODE, as Slurm sets them. `hydroagent train submit sft|grpo` runs through real submitit with a
stand-in `sbatch` that keeps the submission file, so the tests read the #SBATCH lines submitit writes.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from helpers.hpc import ROOT, fake_bin, job_env, write_standin

SBATCH = ROOT / "slurm" / "grpo.sbatch"
RANKS_SH = ROOT / "slurm" / "ranks.sh"

STANDIN = '''
import json, os, signal, sys
from pathlib import Path

args = sys.argv[1:]
run = Path(args[args.index("--out") + 1])
run.mkdir(parents=True, exist_ok=True)
rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", "0")))
info = {"rank": rank, "args": args, "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "omp": os.environ.get("OMP_NUM_THREADS"), "cpus": os.environ.get("HYDROAGENT_RANK_CPUS"),
        "engine_cpus": os.environ.get("HYDROAGENT_ENGINE_CPUS"), "affinity": sorted(os.sched_getaffinity(0)),
        "usr1_ignored": signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN}
with open(run / "ranks.jsonl", "a") as f:
    f.write(json.dumps(info) + "\\n")
'''

# Starts -n ranks of the command with SLURM_PROCID set, as srun does; records its arguments and the
# SLURM_CPU_BIND it was given; exits with rank 0's status once every rank has ended.
FAKE_SRUN = r'''echo "$*" > "$SRUN_LOG"
echo "SLURM_CPU_BIND=${SLURM_CPU_BIND:-}" >> "$SRUN_LOG"
n=1
while [ $# -gt 0 ]; do case $1 in -n) n=$2; shift 2;; -*) shift;; *) break;; esac; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_PROCID=$i "$@" & pids+=($!); done
rc0=0
for i in "${!pids[@]}"; do wait "${pids[$i]}"; rc=$?; [ "$i" = 0 ] && rc0=$rc; done
exit "$rc0"
'''

LAUNCH = "[python, -m, sglang.launch_server, --model-path, '{model}', --port, '30000']"

def _mpi4py_or_skip() -> None:
    import importlib.util

    if importlib.util.find_spec("mpi4py") is None:
        pytest.skip("mpi4py is not installed: the script refuses --ntasks > 1 without it")


def _config(tmp_path: Path, launch: bool, engine: bool = True) -> Path:
    cfg = tmp_path / "cfg.yaml"
    text = "basins: [b]\n"
    if engine:
        text += "generator: engine\nengine:\n  url: http://127.0.0.1:30000\n"
        if launch:
            text += f"  launch: {LAUNCH}\n"
    cfg.write_text(text)
    return cfg


def _run(tmp_path: Path, **extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in job_env().items() if not k.startswith(("SLURM_", "HYDROAGENT_GRPO_", "CUDA_VISIBLE"))}
    module, pythonpath = write_standin(tmp_path, "standin_ranks", STANDIN)
    fake = fake_bin(tmp_path, srun=FAKE_SRUN)
    env.update(PATH=f"{fake}:{env['PATH']}", PYTHONPATH=pythonpath, HYDROAGENT_GRPO_MODULE=module,
               SRUN_LOG=str(tmp_path / "srun.log"))
    env.update(extra)
    return subprocess.run(["bash", str(SBATCH), "cfg.yaml", str(tmp_path / "run")], capture_output=True, text=True,
                          env=env, cwd=tmp_path, timeout=120)


def _ranks(tmp_path: Path) -> dict[int, dict]:
    lines = (tmp_path / "run" / "ranks.jsonl").read_text().splitlines()
    return {r["rank"]: r for r in map(json.loads, lines)}


# --------------------------------------------------------------------------- F5: the engine's GPUs


def test_an_engine_launch_leaves_the_gpus_after_the_trainers_to_the_engine(tmp_path):
    """4 GPUs and engine.launch: T = 3 trainers (cuda:0-2), the engine gets the 4th; the trainers keep the whole
    CUDA_VISIBLE_DEVICES (the engine, rank 0's child, picks the devices after the first T from it)."""
    _mpi4py_or_skip()
    _config(tmp_path, launch=True)
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="4", SLURM_NTASKS="5", SLURM_CPUS_ON_NODE="34")
    assert p.returncode == 0, p.stderr
    assert "5 rank(s), pool mpi, 4 GPU(s)" in p.stdout and "; 3 trainer process(es)" in p.stdout
    assert "engine: launched by trainer rank 0 on the GPUs after the first 3 of CUDA_VISIBLE_DEVICES=0,1,2,3 " \
           "(1 GPU(s)), 8 CPU(s)" in p.stdout
    srun = (tmp_path / "srun.log").read_text().splitlines()
    assert srun[0].split()[:4] == ["--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "5"]
    assert srun[0].split()[-2:] == ["--trainers", "3"] and srun[1] == "SLURM_CPU_BIND=none"
    ranks = _ranks(tmp_path)
    assert sorted(ranks) == [0, 1, 2, 3, 4]
    for r in (0, 1, 2):  # trainers: every GPU visible (trainer r uses cuda:r), 8 threads
        assert ranks[r]["cuda"] == "0,1,2,3" and ranks[r]["omp"] == "8" and not ranks[r]["usr1_ignored"]
    for r in (3, 4):  # simulation ranks: no GPU, one thread, SIGUSR1 ignored
        assert ranks[r]["cuda"] == "" and ranks[r]["omp"] == "1" and ranks[r]["usr1_ignored"]


def test_without_a_launch_every_gpu_trains(tmp_path):
    _mpi4py_or_skip()
    _config(tmp_path, launch=False)  # engine.url only: a server started elsewhere
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="2", SLURM_NTASKS="3", SLURM_CPUS_ON_NODE="17",
             CUDA_VISIBLE_DEVICES="5,7")
    assert p.returncode == 0, p.stderr
    assert "; 2 trainer process(es)" in p.stdout and "engine:" not in p.stdout
    assert (tmp_path / "srun.log").read_text().split("\n")[0].split()[-2:] == ["--trainers", "2"]
    assert _ranks(tmp_path)[1]["cuda"] == "5,7"  # Slurm's own list is kept


@pytest.mark.parametrize(("extra", "message"), [
    ({"HYDROAGENT_GRPO_GPUS": "1"},
     "launches an inference engine (generator: engine with engine.launch), which needs a GPU of its own, and the "
     "node has 1 GPU, so no trainer GPU is left: submit with --gpus-per-node=2 or more"),
    ({"HYDROAGENT_GRPO_GPUS": "4", "HYDROAGENT_GRPO_TRAINERS": "4"},
     "HYDROAGENT_GRPO_TRAINERS=4 trainer processes on 4 GPU(s) leave no GPU for the engine"),
])
def test_an_engine_launch_that_leaves_no_gpu_for_it_or_for_a_trainer_is_refused(tmp_path, extra, message):
    _config(tmp_path, launch=True)
    p = _run(tmp_path, SLURM_NTASKS="1", SLURM_CPUS_ON_NODE="64", **extra)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "srun.log").exists()


# --------------------------------------------------------------------------- F10: CPUs per rank


def _header(name: str) -> str | None:
    m = re.search(rf"^#SBATCH\s+--{name}=(\S+)", SBATCH.read_text(), flags=re.M)
    return m.group(1) if m else None


def test_the_default_job_holds_8_cpus_for_the_trainer_beside_one_per_simulation_rank():
    ntasks, mincpus = int(_header("ntasks")), int(_header("mincpus") or 0)
    assert (int(_header("cpus-per-task")), int(_header("gpus-per-node"))) == (1, 1)
    assert mincpus == 8 * 1 + (ntasks - 1) == 40  # 1 trainer x 8 CPUs + 32 simulation ranks x 1


def test_a_gpu_job_with_too_few_cpus_is_refused_naming_the_mincpus_it_needs(tmp_path):
    _mpi4py_or_skip()
    _config(tmp_path, launch=False, engine=False)
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="1", SLURM_NTASKS="5", SLURM_CPUS_ON_NODE="11")
    assert p.returncode == 2, p.stderr
    assert "the job has 11 CPU(s) on its node, and 1 trainer rank(s) x 8 (HYDROAGENT_GRPO_TRAINER_CPUS) + 0 for " \
           "the engine + 4 simulation rank(s) x 1 need 12: submit with --mincpus=12" in p.stderr
    assert not (tmp_path / "srun.log").exists()
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="1", SLURM_NTASKS="5", SLURM_CPUS_ON_NODE="12")
    assert p.returncode == 0, p.stderr
    ranks = _ranks(tmp_path)
    assert ranks[0]["omp"] == "8" and [ranks[r]["omp"] for r in (1, 2, 3, 4)] == ["1"] * 4
    assert "CPUs: 12 on the node; 8 per trainer rank, 0 for the engine, 1 per simulation rank (4)" in p.stdout


def test_one_process_gets_the_trainer_threads(tmp_path):
    _config(tmp_path, launch=False, engine=False)
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="1", SLURM_NTASKS="1", SLURM_CPUS_ON_NODE="40")
    assert p.returncode == 0, p.stderr
    assert _ranks(tmp_path)[0]["omp"] == "8" and not (tmp_path / "srun.log").exists()


def test_inside_a_cpuset_each_rank_runs_on_cpus_of_its_own(tmp_path):
    """Where the job's CPUs are exactly the script's (a cpuset), rank 0 is pinned to its trainer CPUs and each
    simulation rank to one CPU of its own (taskset), disjoint."""
    _mpi4py_or_skip()
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: nothing to split")
    _config(tmp_path, launch=False, engine=False)
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="1", SLURM_NTASKS="2", SLURM_JOB_ID="4747",
             SLURM_CPUS_ON_NODE=str(len(allowed)), HYDROAGENT_GRPO_TRAINER_CPUS=str(len(allowed) - 1))
    assert p.returncode == 0, p.stderr
    assert "pinned to their own CPUs" in p.stdout
    ranks = _ranks(tmp_path)
    assert ranks[0]["affinity"] == allowed[:-1] and ranks[1]["affinity"] == allowed[-1:]
    assert ranks[0]["cpus"] == ",".join(map(str, allowed[:-1])) and ranks[1]["cpus"] == str(allowed[-1])
    assert ranks[0]["omp"] == str(len(allowed) - 1) and ranks[1]["omp"] == "1"


def test_outside_a_cpuset_nothing_is_pinned(tmp_path):
    """No SLURM_JOB_ID (or a job whose CPU count is not this process's CPU set): the ranks share the CPUs."""
    _mpi4py_or_skip()
    _config(tmp_path, launch=False, engine=False)
    p = _run(tmp_path, HYDROAGENT_GRPO_GPUS="1", SLURM_NTASKS="2", SLURM_CPUS_ON_NODE="9")
    assert p.returncode == 0, p.stderr
    assert "not pinned (shared)" in p.stdout
    ranks = _ranks(tmp_path)
    assert ranks[0]["cpus"] is None and ranks[1]["affinity"] == sorted(os.sched_getaffinity(0))


def _bash(script: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", f"source {RANKS_SH}; {script}"], capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=60)


def test_rank_cpu_slices_are_disjoint_and_cover_the_layout():
    """3 trainers x 8 + an engine's 8 + 5 simulation ranks = 37 CPUs: rank 0 the first 16 (its trainer CPUs and
    the engine's), trainers 1-2 the next 8 each, then one per simulation rank."""
    t, c, e, n = 3, 8, 8, 8
    p = _bash(f"for r in $(seq 0 {n - 1}); do rank_cpus $r {t} {c} {e}; done")
    slices = [tuple(map(int, line.split())) for line in p.stdout.splitlines()]
    assert slices[:4] == [(0, 16), (16, 8), (24, 8), (32, 1)]
    used = [i for first, count in slices for i in range(first, first + count)]
    assert used == list(range(t * c + e + n - t))


def test_rank_0_hands_its_engine_the_last_engine_cpus_of_its_set():
    if shutil.which("taskset") is None:
        pytest.skip("taskset (util-linux) is not installed")
    allowed = sorted(os.sched_getaffinity(0))
    if len(allowed) < 2:
        pytest.skip("one CPU: no room for an engine CPU")
    listed = ",".join(map(str, allowed[:2]))
    code = "import os; print(sorted(os.sched_getaffinity(0)), os.environ['HYDROAGENT_ENGINE_CPUS'])"
    p = _bash(f"rank_exec 1 1 1 {listed} python -c \"{code}\"", SLURM_PROCID="0")
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == [f"[{allowed[0]},", f"{allowed[1]}]", str(allowed[1])]


# --------------------------------------------------------------------------- submitit: SFT and GRPO


QWEN3_4B = {"hidden_size": 2560, "intermediate_size": 9728, "num_hidden_layers": 36, "num_attention_heads": 32,
            "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936, "tie_word_embeddings": True}


@pytest.fixture
def fake_slurm(tmp_path, monkeypatch):
    """`sbatch` keeps each submission file it is given (and answers a job id), `sinfo` answers: real submitit
    writes the job's #SBATCH lines; nothing is queued."""
    kept = tmp_path / "submitted"
    kept.mkdir()
    fake = fake_bin(tmp_path, sbatch=f'cp "$1" {kept}/job.sh\necho "Submitted batch job 4242"\n', sinfo="exit 0\n")
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")
    for var in ("SBATCH_PARTITION", "SBATCH_ACCOUNT", "SBATCH_QOS", "HYDROAGENT_MODULES", "HYDROAGENT_SETUP"):
        monkeypatch.delenv(var, raising=False)
    return kept / "job.sh"


def _sbatch_options(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^#SBATCH --([a-z-]+)=(\S+)", path.read_text(), flags=re.M))


def test_count_parameters_of_qwen3_4b():
    from hydroagent_hpc.train.submit import count_parameters, sft_host_memory_gb

    n = count_parameters(QWEN3_4B)
    # by hand: embedding 151936*2560 (tied) + final norm 2560 + 36 layers x (q,k,v,o 2560*128*(64+16) +
    # MLP 3*2560*9728 + norms 2*2560 + 2*128)
    assert n == 151936 * 2560 + 2560 + 36 * (2560 * 128 * 80 + 3 * 2560 * 9728 + 2 * 2560 + 2 * 128) == 4_022_468_096
    # 1.1 x (4 B x P x (4 + 3) + 4 x 4 GB)
    assert sft_host_memory_gb(4, n) == pytest.approx(1.1 * (4 * 4.022468096 * 7 + 16))


def test_submit_sft_on_gpus_asks_for_cpus_and_memory_for_every_rank(tmp_path, fake_slurm, caplog):
    from hydroagent_hpc.hpc.slurm import SiteSettings
    from hydroagent_hpc.train.submit import submit_sft_job

    (tmp_path / "m4b").mkdir()
    (tmp_path / "m4b" / "config.json").write_text(json.dumps(QWEN3_4B))
    cfg = tmp_path / "sft.yaml"
    cfg.write_text("data: sft.h5\nmodel: m4b\n")
    caplog.set_level("INFO", logger="hydroagent_hpc.train.submit")
    job, _ = submit_sft_job(cfg, tmp_path / "run", SiteSettings.from_env(), gpus=4, cluster="slurm", validate=False)
    opts = _sbatch_options(fake_slurm)
    assert (opts["cpus-per-task"], opts["mem"], opts["gpus-per-node"]) == ("32", "142GB", "4")
    assert "SFT job asks for 32 CPUs and 142 GB per node" in caplog.text and "4.02e9 parameters" in caplog.text
    assert job.submission().function.env == {"OMP_NUM_THREADS": "8"}  # accelerate would give each process 1
    record = json.loads((tmp_path / "run" / "submit.json").read_text())
    assert record["host_request"]["cpus_per_task"] == 32 and record["site"]["mem_gb"] == 142.0

    # the model folder is not there yet: sft.sbatch's 64 GB per GPU; given values win
    cfg.write_text("data: sft.h5\nmodel: later/final\n")
    submit_sft_job(cfg, tmp_path / "run2", SiteSettings.from_env(), gpus=2, cluster="slurm", validate=False)
    assert (_sbatch_options(fake_slurm)["cpus-per-task"], _sbatch_options(fake_slurm)["mem"]) == ("16", "128GB")
    submit_sft_job(cfg, tmp_path / "run3", SiteSettings.from_env(cpus_per_task=6, mem_gb=100), gpus=2,
                   cluster="slurm", validate=False)
    assert (_sbatch_options(fake_slurm)["cpus-per-task"], _sbatch_options(fake_slurm)["mem"]) == ("6", "100GB")
    submit_sft_job(cfg, tmp_path / "run4", SiteSettings.from_env(cpus_per_task=1), gpus=2, cluster="slurm",
                   validate=False)  # a 1 given on purpose is kept (only defaults are replaced)
    assert _sbatch_options(fake_slurm)["cpus-per-task"] == "1"


def test_submit_sft_on_cpu_keeps_the_site_values(tmp_path, fake_slurm):
    from hydroagent_hpc.hpc.slurm import SiteSettings
    from hydroagent_hpc.train.submit import submit_sft_job

    cfg = tmp_path / "sft.yaml"
    cfg.write_text("data: sft.h5\nmodel: tiny\n")
    submit_sft_job(cfg, tmp_path / "run", SiteSettings.from_env(), gpus=0, cluster="slurm", validate=False)
    opts = _sbatch_options(fake_slurm)
    assert opts["cpus-per-task"] == "1" and "mem" not in opts


def test_submit_grpo_on_gpus_leaves_the_engine_its_gpu_and_asks_for_every_parts_cpus(tmp_path, fake_slurm):
    from hydroagent_hpc.hpc.slurm import SiteSettings
    from hydroagent_hpc.train.submit import SubmitError, submit_grpo_job

    cfg = _config(tmp_path, launch=True)
    job, _ = submit_grpo_job(cfg, tmp_path / "run", SiteSettings.from_env(), gpus=4, cluster="slurm", validate=False)
    opts = _sbatch_options(fake_slurm)
    # 3 trainers x 8 + 8 for the engine + 32 simulation threads (max_simulations_in_flight), 4 GB per CPU
    assert (opts["cpus-per-task"], opts["mem"], opts["gpus-per-node"]) == ("64", "256GB", "4")
    record = json.loads((tmp_path / "run" / "submit.json").read_text())
    assert record["trainers"] == 3
    assert job.submission().function.argv[1:4] == ["--standalone", "--nproc_per_node", "3"]
    submit_grpo_job(cfg, tmp_path / "run2", SiteSettings.from_env(), gpus=4, cluster="slurm", validate=False,
                    sim_ranks=8)
    assert _sbatch_options(fake_slurm)["cpus-per-task"] == str(3 * 8 + 8 + 8)
    with pytest.raises(SubmitError, match="no GPU is left for a trainer"):
        submit_grpo_job(cfg, tmp_path / "run3", SiteSettings.from_env(), gpus=1, cluster="slurm", validate=False)
    with pytest.raises(SubmitError, match="leave no GPU for the engine"):
        submit_grpo_job(cfg, tmp_path / "run3", SiteSettings.from_env(), gpus=2, trainers=2, cluster="slurm",
                        validate=False)
    assert not (tmp_path / "run3").exists()
