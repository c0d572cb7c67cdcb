"""GRPO on a cluster: slurm/grpo.sbatch and `hydroagent train submit grpo`.

The signal and requeue plumbing is checked first with a stand-in trainer written by the test (a real
process that saves a checkpoint folder on SIGUSR1, saves and exits 143 on SIGTERM, and finishes when it
finds a checkpoint, as the real trainer's --resume does; with --pool mpi its worker ranks only record
what they see and wait), behind real bash, a stand-in srun that starts and signals the ranks as srun
does, submitit and real signals. Where a Slurm controller answers (../shared/scripts/start-local-slurm.sh),
the real trainer runs a tiny CPU config through sbatch on MPI ranks (also through a requeue), with two CPU
trainer ranks beside a simulation rank (HYDROAGENT_GRPO_TRAINERS=2; also through the time-limit signal), and
through `hydroagent train submit grpo`; those tests skip, saying why, without Slurm or without a working MPI.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers.hpc import (
    ROOT,
    fake_bin,
    job_env,
    metric_steps,
    mpiexec_or_skip,
    signal_script_when,
    standin_log,
    write_standin,
)
from helpers.paths import pythonpath
from helpers.waiting import wait_until
from hydroagent_hpc.hpc.slurm import slurm_available

SBATCH = ROOT / "slurm" / "grpo.sbatch"
HAVE_MPI4PY = importlib.util.find_spec("mpi4py") is not None

STANDIN = '''
import os, signal, sys, time
from pathlib import Path

def main():
    args = sys.argv[1:]
    run = Path(args[args.index("--out") + 1])
    pool = args[args.index("--pool") + 1]
    # torchrun sets RANK and WORLD_SIZE; srun SLURM_PROCID, with --trainers T in the command line
    rank = int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", os.environ.get("PMI_RANK", "0"))))
    trainers = int(args[args.index("--trainers") + 1] if "--trainers" in args else os.environ.get("WORLD_SIZE", "1"))
    ck = run / "checkpoints"
    ck.mkdir(parents=True, exist_ok=True)
    log = run / "standin.log"
    def note(text):
        with open(log, "a") as f:
            f.write(text + "\\n")
    usr1 = "ignored" if signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN else "default"
    if rank >= trainers:  # a simulation rank: say what it sees, then wait for the trainer to finish (or for SIGTERM)
        note(f"worker {rank} pool={pool} usr1={usr1} cuda={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
        while not (run / "final").exists():
            time.sleep(0.05)
        return 0
    if rank:  # another trainer rank: note the signals it gets, wait for rank 0 to finish (or for SIGTERM)
        note(f"trainer {rank} of {trainers} pool={pool} usr1={usr1} cuda={os.environ.get('CUDA_VISIBLE_DEVICES')!r}")
        signal.signal(signal.SIGUSR1, lambda sig, frame: note(f"trainer {rank} usr1"))
        def on_term_rank(sig, frame):
            note(f"trainer {rank} term")
            sys.exit(143)
        signal.signal(signal.SIGTERM, on_term_rank)
        while not (run / "final").exists():
            time.sleep(0.05)
        return 0
    found = sorted(p.name for p in ck.iterdir())
    note(f"start config={args[0]} resume={'--resume' in args} pool={pool} found={','.join(found)}")
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

# Starts -n ranks of the command with SLURM_PROCID set and passes SIGUSR1 and SIGTERM on to every rank,
# as srun does; exits with rank 0's status once every rank has ended.
FAKE_SRUN = r'''echo "$*" > "$SRUN_LOG"
n=1
while [ $# -gt 0 ]; do case $1 in -n) n=$2; shift 2;; -*) shift;; *) break;; esac; done
pids=()
for ((i = 0; i < n; i++)); do SLURM_PROCID=$i "$@" & pids+=($!); done
trap 'kill -USR1 "${pids[@]}" 2>/dev/null' USR1
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM
rc0=0
for i in "${!pids[@]}"; do
  while true; do wait "${pids[$i]}"; rc=$?; kill -0 "${pids[$i]}" 2>/dev/null || break; done
  [ "$i" = 0 ] && rc0=$rc
done
exit "$rc0"
'''








def _sbatch_env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    module, pythonpath = write_standin(tmp_path, "standin_grpo", STANDIN)
    fake = fake_bin(tmp_path, scontrol='echo "$@" >> "$SCONTROL_LOG"\n', srun=FAKE_SRUN)
    env.update(PATH=f"{fake}:{env['PATH']}", PYTHONPATH=pythonpath, HYDROAGENT_GRPO_MODULE=module,
               HYDROAGENT_GRPO_GPUS="0", HYDROAGENT_GRPO_CPU="1", SCONTROL_LOG=str(tmp_path / "scontrol.log"),
               SRUN_LOG=str(tmp_path / "srun.log"), HYDROAGENT_SAVE_WAIT="60")
    env.update(extra)
    return env




def _tiny_config(tmp_path: Path, max_steps: int = 2) -> Path:
    """The tiny CPU GRPO config (offline tiny Qwen3, two 5-day synthetic basins)."""
    from hydroagent_hpc.sim.synth.basins import synthesize_basin

    basins = []
    for i, name in enumerate(("b1", "b2")):
        synthesize_basin(tmp_path / "basins" / name, name=f"syn_{name}", area_km2=80.0, window_days=5,
                         warmup_days=2, seed=40 + i, start="2021-07-01")
        basins.append(str(tmp_path / "basins" / name))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"basins: [{', '.join(basins)}]\ngroup_size: 2\nprompts_per_step: 1\nmax_steps: {max_steps}\n"
                   "max_new_tokens: 12\nlr: 1.0e-3\ngeneration_batch: 1\nenv: {max_turns: 2}\n")
    return cfg


# --------------------------------------------------------------------------- slurm/grpo.sbatch, no Slurm

def test_the_grpo_script_launches_the_trainer_instead_of_refusing():
    text = SBATCH.read_text()
    assert subprocess.run(["bash", "-n", str(SBATCH)], capture_output=True).returncode == 0
    assert "no hydroagent_hpc.grpo yet" not in text and "lands with the GRPO issue" not in text
    assert "MODULE=${HYDROAGENT_GRPO_MODULE:-hydroagent_hpc.train.grpo}" in text
    for needed in ("srun --mpi=pmi2", "--pool mpi", "--pool threads", "--resume", "scontrol requeue",
                   "HYDROAGENT_MAX_REQUEUES", "trap on_usr1 USR1", "HYDROAGENT_GRPO_CPU"):
        assert needed in text, needed


@pytest.mark.parametrize("ntasks", [1, 3], ids=["threads", "mpi"])
def test_sigusr1_checkpoints_requeues_and_the_next_attempt_resumes(tmp_path, ntasks):
    """USR1 -> the trainer (rank 0) saves -> requeue -> TERM (save, 143) -> exit 3; the requeued attempt
    finds the checkpoint and finishes. With ranks, srun starts them all; the simulation ranks ignore
    SIGUSR1 and see no GPU, and the pool is mpi."""
    if ntasks > 1 and not HAVE_MPI4PY:
        pytest.skip("mpi4py is not installed: the script refuses --ntasks > 1 without it")
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="4242", SLURM_RESTART_COUNT="0", SLURM_NTASKS=str(ntasks),
                      CUDA_VISIBLE_DEVICES="0")
    pool = "mpi" if ntasks > 1 else "threads"
    rc, out, err = signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                     ready=lambda: ("ready" in standin_log(run)
                                                    and standin_log(run).count("worker ") == ntasks - 1),
                                     what="the stand-in ranks to start")
    assert rc == 3, err
    assert f"{ntasks} rank(s), pool {pool}, 0 GPU(s) (job 4242, restart 0)" in out
    assert "checkpoint written" in out and "requeueing job 4242" in out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4242"]
    lines = standin_log(run).splitlines()
    trainer = [ln for ln in lines if not ln.startswith("worker ")]
    assert trainer[0] == f"start config={tmp_path / 'cfg.yaml'} resume=True pool={pool} found="
    assert trainer[-2:] == ["usr1", "term"]  # saved on USR1 first, then on the requeue's TERM
    workers = sorted(ln for ln in lines if ln.startswith("worker "))
    assert workers == [f"worker {r} pool=mpi usr1=ignored cuda=''" for r in range(1, ntasks)]
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == ["step-term", "step-usr1"]
    assert not list(run.glob(".usr1.*"))  # the marker is cleaned up
    if ntasks > 1:
        srun = (tmp_path / "srun.log").read_text().split()
        assert srun[:6] == ["--mpi=pmi2", "--kill-on-bad-exit=1", "-n", str(ntasks), "bash", "-c"]
        assert srun[-8:] == ["-m", "standin_grpo", str(tmp_path / "cfg.yaml"), "--out", str(run), "--resume",
                             "--pool", "mpi"]
    else:
        assert not (tmp_path / "srun.log").exists()  # one process, no srun

    env["SLURM_RESTART_COUNT"] = "1"
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml", str(run)], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=120)
    assert p.returncode == 0, p.stderr
    assert "restart 1" in p.stdout and (run / "final").is_dir()
    trainer = [ln for ln in standin_log(run).splitlines() if not ln.startswith("worker ")]
    assert trainer[-2:] == [f"start config={tmp_path / 'cfg.yaml'} resume=True pool={pool} "
                            "found=step-term,step-usr1", "finished"]


def test_the_requeue_limit_stops_requeueing_and_says_how_to_continue(tmp_path):
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="7", SLURM_RESTART_COUNT="3", HYDROAGENT_MAX_REQUEUES="3")
    rc, _, err = signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                     ready=lambda: "ready" in standin_log(run),
                                     what="the stand-in trainer to start")
    assert rc == 3
    assert "requeued 3 times already" in err and "longer --time" in err
    assert not (tmp_path / "scontrol.log").exists()
    assert (run / "checkpoints" / "step-usr1").is_dir()


def test_mpi_ranks_need_mpi4py(tmp_path):
    """--ntasks > 1 with an environment that cannot import mpi4py: refused before anything starts."""
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    mods = tmp_path / "nompi"
    mods.mkdir()
    (mods / "mpi4py.py").write_text("raise ImportError('no mpi4py here')\n")
    env = _sbatch_env(tmp_path, SLURM_NTASKS="3")
    env["PYTHONPATH"] = os.pathsep.join([str(mods), env["PYTHONPATH"]])
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml", "run"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and "cannot import mpi4py" in p.stderr and "--ntasks=1" in p.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "srun.log").exists()


@pytest.mark.slow
@pytest.mark.parametrize("ntasks", [1, 4], ids=["torchrun", "mpi"])
def test_two_trainers_all_get_sigusr1_and_the_simulation_ranks_do_not(tmp_path, ntasks):
    """HYDROAGENT_GRPO_TRAINERS=2: with MPI ranks (--ntasks=4) srun starts every rank with --trainers 2, ranks
    0-1 keep SIGUSR1 (srun passes it on) and ranks 2-3 ignore it and see no GPU; with --ntasks=1 torchrun starts
    the two trainers and the script sends SIGUSR1 and SIGTERM to both ranks itself (torchrun would not)."""
    if ntasks > 1 and not HAVE_MPI4PY:
        pytest.skip("mpi4py is not installed: the script refuses --ntasks > 1 without it")
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    run = tmp_path / "run"
    env = _sbatch_env(tmp_path, SLURM_JOB_ID="4343", SLURM_RESTART_COUNT="0", SLURM_NTASKS=str(ntasks),
                      HYDROAGENT_GRPO_TRAINERS="2", CUDA_VISIBLE_DEVICES="0,1", OMP_NUM_THREADS="1")
    pool = "mpi" if ntasks > 1 else "threads"
    rc, out, err = signal_script_when(SBATCH, ["cfg.yaml", str(run)], env=env, cwd=tmp_path,
                                     ready=lambda: ("ready" in standin_log(run) and "trainer 1 of 2" in standin_log(run)
                                                    and standin_log(run).count("worker ") == max(ntasks - 2, 0)),
                                     what="the stand-in ranks to start")
    assert rc == 3, err
    assert f"{ntasks} rank(s), pool {pool}, 0 GPU(s) (job 4343, restart 0); 2 trainer process(es)" in out
    assert "checkpoint written" in out and "requeueing job 4343" in out
    assert (tmp_path / "scontrol.log").read_text().split() == ["requeue", "4343"]
    lines = standin_log(run).splitlines()
    assert f"trainer 1 of 2 pool={pool} usr1=default cuda='0,1'" in lines
    assert "trainer 1 usr1" in lines and "trainer 1 term" in lines  # rank 1 got both signals
    rank0 = [ln for ln in lines if not ln.startswith(("worker ", "trainer "))]
    assert rank0[-2:] == ["usr1", "term"]
    workers = sorted(ln for ln in lines if ln.startswith("worker "))
    assert workers == [f"worker {r} pool=mpi usr1=ignored cuda=''" for r in range(2, ntasks)]
    if ntasks > 1:
        srun = (tmp_path / "srun.log").read_text().split()
        assert srun[:4] == ["--mpi=pmi2", "--kill-on-bad-exit=1", "-n", "4"]
        assert srun[-10:] == ["-m", "standin_grpo", str(tmp_path / "cfg.yaml"), "--out", str(run), "--resume",
                              "--pool", "mpi", "--trainers", "2"]
    else:
        assert not (tmp_path / "srun.log").exists()
        assert "torchrun --standalone --nproc_per_node 2 -m standin_grpo" in out


@pytest.mark.parametrize(("extra", "message"), [
    ({"HYDROAGENT_GRPO_TRAINERS": "two"}, "HYDROAGENT_GRPO_TRAINERS 'two' is not a positive whole number"),
    ({"HYDROAGENT_GRPO_TRAINERS": "0"}, "HYDROAGENT_GRPO_TRAINERS '0' is not a positive whole number"),
    ({"HYDROAGENT_GRPO_TRAINERS": "3", "HYDROAGENT_GRPO_GPUS": "2"},
     "HYDROAGENT_GRPO_TRAINERS=3 trainer processes but 2 GPU(s) on the node"),
    ({"HYDROAGENT_GRPO_TRAINERS": "2", "SLURM_NTASKS": "2"},
     "--ntasks=2 with 2 trainer process(es) leaves no simulation rank: submit with --ntasks=3"),
    ({"HYDROAGENT_GRPO_GPUS": "2", "HYDROAGENT_GRPO_CPU": "0", "SLURM_NTASKS": "2"},
     "--ntasks=2 with 2 trainer process(es) leaves no simulation rank"),  # one trainer per GPU by default
])
def test_trainer_counts_that_cannot_work_are_refused_before_anything_starts(tmp_path, extra, message):
    (tmp_path / "cfg.yaml").write_text("basins: [b]\n")
    env = _sbatch_env(tmp_path, **extra)
    p = subprocess.run(["bash", str(SBATCH), "cfg.yaml", "run"], capture_output=True, text=True, env=env,
                       cwd=tmp_path, timeout=60)
    assert p.returncode == 2 and message in p.stderr, p.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "srun.log").exists()


# --------------------------------------------------------------------------- slurm/grpo.sbatch on Slurm

def _slurm_or_skip() -> None:
    if not slurm_available():
        pytest.skip("no Slurm controller answers (sinfo failed): start one with "
                    "../shared/scripts/start-local-slurm.sh (root, Debian)")
    mpiexec_or_skip()  # the MPI runtime (mpi4py + mpich) the ranks need


def _slurm_env() -> dict[str, str]:
    env = {k: v for k, v in job_env().items() if not k.startswith("SLURM_")}
    env.update(PYTHONPATH=pythonpath(), HF_HUB_OFFLINE="1", HYDROAGENT_GRPO_CPU="1")
    return env


def _sacct_state(job: str) -> str:
    p = subprocess.run(["sacct", "-j", job, "-X", "-n", "-P", "-o", "JobID,State"], capture_output=True, text=True,
                       timeout=30)
    for line in p.stdout.splitlines():
        jid, _, state = line.partition("|")
        if jid == job:
            return state.split()[0] if state else ""
    return ""


def _wait_job(job: str, timeout: float) -> str:
    done = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "OUT_OF_MEMORY", "NODE_FAIL", "PREEMPTED"}
    try:
        return wait_until(lambda: s if (s := _sacct_state(job)) in done else "", timeout, f"job {job} to end",
                          interval=0.5, max_interval=2.0)
    except AssertionError:
        subprocess.run(["scancel", job], timeout=30)
        raise


def _sbatch(tmp_path: Path, *args: str) -> str:
    # -O: three ranks on a node that may have fewer CPUs (the local test cluster has 2)
    p = subprocess.run(["sbatch", "--parsable", "-O", "--ntasks=3", "--gpus-per-node=0", "--mincpus=1",
                        "--mem-per-cpu=2G", "--time=30", *args, str(SBATCH), "cfg.yaml", "run"],
                       capture_output=True, text=True,
                       cwd=tmp_path, env=_slurm_env(), timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
def test_sbatch_trains_a_tiny_run_with_simulations_on_mpi_ranks(tmp_path):
    _slurm_or_skip()
    _tiny_config(tmp_path, max_steps=2)
    job = _sbatch(tmp_path)
    assert _wait_job(job, 600) == "COMPLETED", (tmp_path / f"slurm-hydroagent-grpo-{job}.out").read_text()[-3000:]
    run = tmp_path / "run"
    assert (run / "final").is_dir() and metric_steps(run) == [1, 2]
    log = (tmp_path / f"slurm-hydroagent-grpo-{job}.out").read_text()
    assert "3 rank(s), pool mpi" in log and "mpi pool: 2 worker ranks" in log


def _release_requeued(job: str, timeout: float = 120) -> None:
    """Start a requeued job now: Slurm holds a requeued job about 2 minutes (BeginTime), which only slows tests."""
    def pending_again() -> bool:
        p = subprocess.run(["scontrol", "show", "job", job], capture_output=True, text=True, timeout=30)
        restarts = re.search(r"Restarts=(\d+)", p.stdout)
        return "JobState=PENDING" in p.stdout and restarts is not None and int(restarts.group(1)) >= 1

    wait_until(pending_again, timeout, f"job {job} to be requeued", interval=0.2, max_interval=0.2)
    time.sleep(3)  # slurmd refuses a relaunch in the second its credential was revoked ("Job credential revoked")
    subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], check=True, timeout=30)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
def test_the_time_limit_warning_checkpoints_on_rank_0_requeues_and_the_run_resumes(tmp_path):
    """The USR1 that --signal=B:USR1@... sends: srun passes it to every rank, the simulation ranks ignore
    it, the trainer saves; the job requeues itself and the next attempt continues the same curve."""
    _slurm_or_skip()
    _tiny_config(tmp_path, max_steps=6)
    job = _sbatch(tmp_path)
    run = tmp_path / "run"
    out = tmp_path / f"slurm-hydroagent-grpo-{job}.out"
    try:
        wait_until(lambda: metric_steps(run), 300, "the first GRPO step", interval=0.2, max_interval=0.5)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
        _release_requeued(job)
    except BaseException:
        subprocess.run(["scancel", job], timeout=30)
        raise
    assert _wait_job(job, 600) == "COMPLETED", out.read_text()[-3000:]
    log = out.read_text()
    assert "checkpoint written" in log and f"requeueing job {job}" in log and "restart 1" in log
    assert "User defined signal 1" not in log  # no rank died of the checkpoint signal
    saved = int(re.search(r"saved checkpoint \S+/step-(\d+)", log).group(1))  # the USR1 checkpoint
    assert 1 <= saved < 6 and f"resumed from {run}/checkpoints/step-" in log
    assert metric_steps(run) == [1, 2, 3, 4, 5, 6]  # one curve: resumed, not restarted, no step twice
    assert (run / "final").is_dir()


@pytest.fixture(scope="module")
def engine_url(tmp_path_factory):
    """The loopback engine server (tiny offline Qwen3) in this process: the jobs of the local Slurm run on this
    host, so their trainer rank 0 reaches it at 127.0.0.1."""
    from hydroagent_hpc.train.generation.engine_server import EngineServer
    from hydroagent_hpc.train.tiny import build_tiny, save_tiny

    model, tok = build_tiny(seed=0)
    folder = save_tiny(tmp_path_factory.mktemp("grpo-ops-engine") / "tiny", model, tok)
    with EngineServer(str(folder)) as server:
        yield server.url


def _engine_config(tmp_path: Path, basins: Path, url: str, max_steps: int) -> Path:
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(f"basins: [{basins / 'b1'}, {basins / 'b2'}]\ngroup_size: 2\nprompts_per_step: 1\n"
                   f"max_steps: {max_steps}\nmax_new_tokens: 12\nlr: 1.0e-3\ngeneration_batch: 1\n"
                   f"env: {{max_turns: 2}}\ngenerator: engine\nengine: {{api: sglang, url: '{url}'}}\n")
    return cfg


def _sbatch_two_trainers(tmp_path: Path, *args: str) -> str:
    """grpo.sbatch with 2 CPU trainer ranks and 1 simulation rank (-O: 3 ranks may exceed the node's CPUs)."""
    env = _slurm_env()
    env.update(HYDROAGENT_GRPO_TRAINERS="2", OMP_NUM_THREADS="1")
    p = subprocess.run(["sbatch", "--parsable", "-O", "--ntasks=3", "--gpus-per-node=0", "--mincpus=1",
                        "--mem-per-cpu=2G", "--time=30", *args, str(SBATCH), "cfg.yaml", "run"],
                       capture_output=True, text=True,
                       cwd=tmp_path, env=env, timeout=60)
    assert p.returncode == 0, p.stderr
    return p.stdout.strip().split(";")[0]


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
def test_sbatch_trains_with_two_trainer_ranks_beside_a_simulation_rank(tmp_path, grpo_basins, engine_url):
    """HYDROAGENT_GRPO_TRAINERS=2 --ntasks=3: ranks 0-1 train one step together (FSDP2 on gloo, rollouts from the
    engine), rank 2 is the MPI pool's simulation rank; both trainer ranks reach the end."""
    _slurm_or_skip()
    _engine_config(tmp_path, grpo_basins, engine_url, max_steps=1)
    job = _sbatch_two_trainers(tmp_path)
    out = tmp_path / f"slurm-hydroagent-grpo-{job}.out"
    assert _wait_job(job, 300) == "COMPLETED", out.read_text()[-3000:]
    log = out.read_text()
    run = tmp_path / "run"
    assert "3 rank(s), pool mpi" in log and "2 trainer process(es)" in log and "--trainers 2" in log
    assert "trainer rank 0 of 2 (local rank 0 of 2)" in log and "trainer rank 1 of 2 (local rank 1 of 2)" in log
    assert "mpi pool: 1 worker ranks" in log and "2 process(es) FSDP2" in log
    assert "trainer rank 1: done at step 1" in log and "'world_size': 2" in log  # rank 1 ended, rank 0's result
    assert (run / "final").is_dir() and metric_steps(run) == [1]
    import yaml

    assert yaml.safe_load((run / "config.yaml").read_text())["world_size"] == 2


def _cancel_and_wait(job: str, timeout: float = 120) -> None:
    """Cancel ``job`` (again while it is still queued: a cancel during its requeue may not take) and wait until it
    has left the queue. sacct is no help here: a requeued job cancelled while pending keeps the state REQUEUED."""
    def gone() -> bool:
        queued = subprocess.run(["squeue", "-h", "-j", job], capture_output=True, text=True, timeout=30).stdout.strip()
        if queued:
            subprocess.run(["scancel", job], capture_output=True, timeout=30)
        return not queued

    wait_until(gone, timeout, f"job {job} to leave the queue", interval=0.5, max_interval=2.0)


@pytest.mark.slow
@pytest.mark.slurm
@pytest.mark.mpi
def test_the_time_limit_warning_reaches_both_trainer_ranks_and_they_save(tmp_path, grpo_basins, engine_url):
    """The batch script's SIGUSR1 goes through srun to ranks 0-1 (rank 2 ignores it); each says it got the
    signal, they save one checkpoint together and the job requeues itself (cancelled here once requeued)."""
    _slurm_or_skip()
    _engine_config(tmp_path, grpo_basins, engine_url, max_steps=30)
    job = _sbatch_two_trainers(tmp_path)
    run = tmp_path / "run"
    out = tmp_path / f"slurm-hydroagent-grpo-{job}.out"
    try:
        wait_until(lambda: metric_steps(run), 300, "the first GRPO step", interval=0.2, max_interval=0.5)
        subprocess.run(["scancel", "--batch", "--signal=USR1", job], check=True, timeout=30)
        wait_until(lambda: f"requeueing job {job}" in out.read_text(), 300, "the job to requeue itself")
    finally:
        _cancel_and_wait(job)
    log = out.read_text()
    assert "checkpoint written" in log and "User defined signal 1" not in log, log[-3000:]
    for rank in (0, 1):
        assert re.search(rf"rank {rank} of 2: checkpoint on a signal at step \d+ \(the signal reached this rank: "
                         r"yes\)", log), log[-3000:]
    saved = [int(s) for s in re.findall(r"saved checkpoint \S+/step-(\d+)", log)]
    assert saved and saved[0] < 30 and (run / "checkpoints" / f"step-{saved[0]}").is_dir()


# --------------------------------------------------------------------------- hydroagent train submit grpo

def test_the_grpo_job_command_line():
    from hydroagent_hpc.train.submit import GRPOJob, grpo_argv

    py = "/venv/bin/python"
    assert grpo_argv("c.yaml", "R", python=py) == [py, "-m", "hydroagent_hpc.train.grpo", "c.yaml", "--out", "R",
                                                   "--resume", "--pool", "threads"]
    job = GRPOJob("c.yaml", "R")
    assert job.argv[1:] == grpo_argv("c.yaml", "R")[1:] and job.ranks_match is None  # the trainer gets the signals
    assert job.checkpoints == str(Path("R") / "checkpoints") and job.save_wait_s == 540.0 and job.name == "grpo"


def test_the_grpo_job_with_several_trainers_is_torchrun_or_an_mpiexec_with_trainer_ranks(tmp_path, monkeypatch):
    """Several trainer processes: torchrun (signals to every trainer) without simulation ranks; with them,
    one mpiexec of trainers + simulation ranks with --trainers T (signals to rank 0, whose trainers agree)."""
    from hydroagent_hpc.train.submit import GRPOJob, SubmitError, grpo_argv

    py = sys.executable
    argv = grpo_argv("c.yaml", "R", python=py, trainers=2)
    assert Path(argv[0]).name == "torchrun" and argv[1:5] == ["--standalone", "--nproc_per_node", "2", "-m"]
    assert argv[5:] == ["hydroagent_hpc.train.grpo", "c.yaml", "--out", "R", "--resume", "--pool", "threads"]
    job = GRPOJob("c.yaml", "R", trainers=2)
    assert job.ranks_match == "hydroagent_hpc.train.grpo" and not job.rank0_only  # every trainer
    mpiexec = mpiexec_or_skip()
    py = str(Path(mpiexec).parent / "python")
    argv = grpo_argv("c.yaml", "R", python=py, sim_ranks=3, trainers=2)
    assert argv == [mpiexec, "-launcher", "fork", "-n", "5", py, "-m", "hydroagent_hpc.train.grpo", "c.yaml",
                    "--out", "R", "--resume", "--pool", "mpi", "--trainers", "2"]
    job = GRPOJob("c.yaml", "R", sim_ranks=1, trainers=2)
    assert job.ranks_match == "hydroagent_hpc.train.grpo" and job.rank0_only
    with pytest.raises(SubmitError, match="--trainers 0"):
        grpo_argv("c.yaml", "R", trainers=0)
    empty = tmp_path / "venv" / "bin"
    empty.mkdir(parents=True)
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SubmitError, match="need torchrun"):
        grpo_argv("c.yaml", "R", python=str(empty / "python"), trainers=2)


def _preempted_local_grpo(tmp_path, monkeypatch, ready, **submit):
    """Submit the stand-in trainer on submitit's local backend, wait until ``ready(log)``, deliver the
    preemption signal to the job's task as Slurm would, and wait for the requeued job's result.
    Returns (cfg, run, submit summary, submit.json record, result)."""
    from submitit.local.local import LocalJobEnvironment

    from hydroagent_hpc.hpc.jobs import child_pids
    from hydroagent_hpc.hpc.slurm import SiteSettings
    from hydroagent_hpc.train.submit import submit_grpo_job

    module, pythonpath = write_standin(tmp_path, "standin_grpo", STANDIN)
    monkeypatch.setenv("PYTHONPATH", pythonpath)
    monkeypatch.syspath_prepend(str(tmp_path / "mods"))
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("basins: [b]\n")
    run = tmp_path / "run"
    job, out = submit_grpo_job(cfg, run, SiteSettings(time_min=30), cluster="local", module=module, save_wait_s=20,
                               **submit)
    record = json.loads((run / "submit.json").read_text())
    try:
        wait_until(lambda: ready(standin_log(run)), 120, "the stand-in trainer to start under submitit")
        (task, _), = child_pids(job._process.pid)
        os.kill(task, LocalJobEnvironment._usr_sig())  # preemption as Slurm delivers it, to the job's task
        result = job.result()
    finally:
        if not job.done():
            job.cancel(check=False)
    return cfg, run, out, record, result


def test_submit_grpo_on_the_local_executor_requeues_on_preemption_and_resumes(tmp_path, monkeypatch):
    """submitit's local backend: the job is interrupted (its preemption signal), GRPOJob.checkpoint has the
    trainer save and stop, submitit requeues, and the second attempt resumes from the checkpoint."""
    cfg, run, out, record, result = _preempted_local_grpo(tmp_path, monkeypatch, lambda log: "ready" in log)
    assert out["cluster"] == "local" and out["final"] == str(run / "final")
    assert record["command"] == "train submit grpo" and record["pool"] == "threads" and record["max_requeues"] == 3
    assert result["attempts"] == 2 and result["returncode"] == 0 and result["run_dir"] == str(run)
    log = standin_log(run).splitlines()
    assert log[:4] == [f"start config={cfg} resume=True pool=threads found=", "ready", "usr1", "term"]
    assert log[-1] == "finished" and log[-2].endswith("found=step-term,step-usr1")


def test_the_grpo_job_with_simulation_ranks_is_an_mpiexec_of_the_mpi_pool(tmp_path, monkeypatch):
    from hydroagent_hpc.train.submit import GRPOJob, SubmitError, grpo_argv

    mpiexec = mpiexec_or_skip()
    py = str(Path(mpiexec).parent / "python")
    argv = grpo_argv("c.yaml", "R", python=py, sim_ranks=3)
    assert argv == [mpiexec, "-launcher", "fork", "-n", "4", py, "-m", "hydroagent_hpc.train.grpo", "c.yaml",
                    "--out", "R", "--resume", "--pool", "mpi"]
    job = GRPOJob("c.yaml", "R", sim_ranks=2)
    assert job.argv[4] == "3" and job.argv[-1] == "mpi"
    assert job.ranks_match == "hydroagent_hpc.train.grpo" and job.rank0_only  # signals: rank 0 only
    with pytest.raises(SubmitError, match="--sim-ranks -1"):
        grpo_argv("c.yaml", "R", sim_ranks=-1)
    empty = tmp_path / "venv" / "bin"
    empty.mkdir(parents=True)
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(SubmitError, match="need mpiexec"):
        grpo_argv("c.yaml", "R", python=str(empty / "python"), sim_ranks=1)


@pytest.mark.slow
def test_submit_grpo_with_simulation_ranks_signals_rank_0_only_and_resumes(tmp_path, monkeypatch):
    """--sim-ranks 1 on submitit's local backend: mpiexec starts the trainer (rank 0) and a simulation
    rank; on preemption only rank 0 gets SIGUSR1 and SIGTERM (a worker would die of SIGUSR1), the job
    requeues, and the second attempt resumes from the checkpoint."""
    mpiexec_or_skip()
    cfg, run, _, record, result = _preempted_local_grpo(
        tmp_path, monkeypatch, lambda log: "ready" in log and "worker 1" in log, sim_ranks=1)
    assert record["pool"] == "mpi" and record["sim_ranks"] == 1
    assert result["attempts"] == 2 and result["returncode"] == 0
    lines = standin_log(run).splitlines()
    trainer = [ln for ln in lines if not ln.startswith("worker")]
    assert trainer[:4] == [f"start config={cfg} resume=True pool=mpi found=", "ready", "usr1", "term"]
    assert trainer[-1] == "finished" and trainer[-2].endswith("found=step-term,step-usr1")
    workers = [ln for ln in lines if ln.startswith("worker")]
    assert len(workers) == 2 and all(ln.startswith("worker 1 pool=mpi usr1=default") for ln in workers)
    logs = "".join(p.read_text(errors="replace") for p in (run / "logs").rglob("*") if p.is_file())
    assert "signal 10" not in logs and "User defined signal 1" not in logs  # no worker died of SIGUSR1


@pytest.mark.slow
def test_submit_grpo_with_two_trainers_and_a_simulation_rank_signals_rank_0_and_resumes(tmp_path, monkeypatch):
    """--trainers 2 --sim-ranks 1 on submitit's local backend: one mpiexec of 3 ranks (2 trainers, 1
    simulation rank) with --trainers 2; on preemption rank 0 alone gets SIGUSR1 and SIGTERM, the job
    requeues, and the second attempt (the same 3 ranks) resumes from the checkpoint."""
    mpiexec_or_skip()
    cfg, run, _, record, result = _preempted_local_grpo(
        tmp_path, monkeypatch, lambda log: "ready" in log and "worker 2" in log and "trainer 1 of 2" in log,
        sim_ranks=1, trainers=2)
    assert record["pool"] == "mpi" and record["sim_ranks"] == 1 and record["trainers"] == 2
    assert result["attempts"] == 2 and result["returncode"] == 0
    lines = standin_log(run).splitlines()
    rank0 = [ln for ln in lines if not ln.startswith(("worker", "trainer"))]
    assert rank0[:4] == [f"start config={cfg} resume=True pool=mpi found=", "ready", "usr1", "term"]
    assert rank0[-1] == "finished" and rank0[-2].endswith("found=step-term,step-usr1")
    others = [ln for ln in lines if ln.startswith(("worker", "trainer"))]
    assert sum(ln.startswith("worker 2 pool=mpi") for ln in others) == 2  # one simulation rank per attempt
    assert sum(ln.startswith("trainer 1 of 2 pool=mpi") for ln in others) == 2
    assert not any(ln.endswith((" usr1", " term")) for ln in others)  # only rank 0 was signalled


def test_submit_grpo_arguments_and_errors_name_the_problem(tmp_path):
    env = {**job_env(), "PYTHONPATH": pythonpath()}
    cli = [sys.executable, "-m", "hydroagent_hpc.cli", "train", "submit", "grpo"]
    p = subprocess.run([*cli, "--help"], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0 and "--out RUN_DIR, --run-dir RUN_DIR" in p.stdout and "slurm/grpo.sbatch" in p.stdout
    for flag in ("--gpus", "--cluster", "--partition", "--account", "--time", "--cpus-per-task", "--max-requeues",
                 "--save-wait", "--wait"):
        assert flag in p.stdout, flag
    p = subprocess.run([*cli, "c.yaml"], capture_output=True, text=True, env=env, cwd=tmp_path,
                       timeout=120)
    assert p.returncode == 2 and "--out" in p.stderr  # the run folder is required
    p = subprocess.run([*cli, "nope.yaml", "--out", "r"], capture_output=True, text=True,
                       env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "nope.yaml: no such GRPO config file" in p.stderr
    (tmp_path / "c.yaml").write_text("model: tiny\n")
    p = subprocess.run([*cli, "c.yaml", "--run-dir", "r", "--gpus", "2", "--trainers", "3"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "--trainers 3 with --gpus 2: one trainer process per GPU" in p.stderr
    (tmp_path / "g.yaml").write_text(f"basins: [{tmp_path}]\n")  # generator: local (the default)
    p = subprocess.run([*cli, "g.yaml", "--out", "r", "--trainers", "2", "--cluster", "local"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120)
    assert p.returncode == 2 and "generator: local with 2 training processes" in p.stderr, p.stderr
    assert "set generator: colocated" in p.stderr and "or engine" in p.stderr
    p = subprocess.run([*cli, "c.yaml", "--out", "r", "--cluster", "local"], capture_output=True,
                       text=True, env=env, cwd=tmp_path, timeout=120)
    # the trainer's own strict loader refuses the config before anything is queued
    assert p.returncode == 2 and "c.yaml" in p.stderr and "basins: missing" in p.stderr
    assert not (tmp_path / "r").exists()  # nothing submitted, nothing written


@pytest.mark.slow
@pytest.mark.slurm
def test_submit_grpo_trains_a_tiny_run_on_slurm(tmp_path):
    if not slurm_available():
        pytest.skip("no Slurm controller answers (sinfo failed): start one with "
                    "../shared/scripts/start-local-slurm.sh (root, Debian)")
    cfg = _tiny_config(tmp_path, max_steps=2)
    cmd = [sys.executable, "-m", "hydroagent_hpc.cli", "train", "submit", "grpo", str(cfg),
           "--out", str(tmp_path / "run"), "--cluster", "slurm", "--time", "30", "--mem-gb", "4", "--wait"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=_slurm_env(), cwd=tmp_path, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["cluster"] == "slurm" and out["result"]["returncode"] == 0 and out["result"]["attempts"] == 1
    run = tmp_path / "run"
    assert (run / "final").is_dir() and metric_steps(run) == [1, 2]
    assert json.loads((run / "submit.json").read_text())["job_id"] == out["job_id"]
