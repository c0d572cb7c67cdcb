"""GRPO with several training processes (torchrun on gloo, CPU): FSDP2 and DDP against one process.

Rank 0 alone plays the rollouts through the loopback engine server (``train/generation/engine_server.py``,
the tiny offline Qwen3, in this test process) and broadcasts them; every rank trains on its share.
The rollouts of both runs are the same episodes (rank 0 samples them with the same seeds from the
same pushed weights), so the per-step loss, KL and the final weights must match a one-process run
up to float rounding of the differently ordered sums (tolerances below, measured).
"""

from __future__ import annotations

import csv
import logging
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from helpers.paths import pythonpath
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.checkpoint import FAULT_ENV
from hydroagent_hpc.train.generation.engine_server import EngineServer
from hydroagent_hpc.train.grpo.config import grpo_config_from_mapping, load_grpo_config
from hydroagent_hpc.train.grpo.launch import main as launch
from hydroagent_hpc.train.grpo.loss import LogprobModel
from hydroagent_hpc.train.grpo.trainer import _accumulate, _local_counts, _Sequence, rank_passes, train_grpo
from hydroagent_hpc.train.tiny import build_tiny, save_tiny

ROOT = Path(__file__).resolve().parents[1]
#: Measured on the 2-core CPU (FP32, lr 1e-3, 2 AdamW steps, the parameters moved by up to 2.0e-3):
#: loss, KL and entropy of the 2-process runs differ from the 1-process run's by <= 1.0e-7 relative,
#: the gradient norm by 3.6e-6 (FSDP2; 0 with DDP): the first step's gradient is small (1.9e-3) and
#: the reduce-scatter adds the two ranks' float32 sums in another order than one process does; the
#: final parameters by 1.0e-6. The bounds leave 10x for other CPUs and thread counts.
LOSS_REL = 1e-6
GRAD_REL = 5e-5
PARAM_ATOL = 1e-5
COMPARED = ("loss", "pg", "kl", "entropy", "tokens", "reward_mean")
#: The sampler's and the trainer's log-probabilities of the sampled tokens differ by float rounding only
#: (same weights, same FP32): a few units in the last place of a log-probability, 4.8e-7 or 9.5e-7 as the
#: thread counts of the sampling and training processes fall. Compared against a bound, not between runs.
MISMATCH_MAX = 1e-5


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    model, tok = build_tiny(seed=0)
    folder = save_tiny(tmp_path_factory.mktemp("grpo-fsdp-engine") / "tiny", model, tok)
    with EngineServer(str(folder)) as s:
        yield s


def _config(path: Path, basins: Path, url: str, **extra: object) -> Path:
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 2, "max_steps": 2, "max_new_tokens": 12, "lr": "1.0e-3",
                                 "generation_batch": 1, "env": "{max_turns: 2}", "save_every": 1,
                                 "activation_checkpointing": "true", "generator": "engine",
                                 "engine": f"{{api: sglang, url: '{url}'}}", "collective_timeout_s": 4321, **extra}
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def _metrics(run: Path) -> list[dict[str, str]]:
    with open(run / "metrics.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def _params(run: Path) -> dict[str, torch.Tensor]:
    return load_file(run / "final" / "model.safetensors")


def _files(run: Path) -> list[str]:
    return sorted(str(p.relative_to(run)) for p in run.rglob("*") if p.is_file())


def _assert_one_event_writer(run: Path, rows: list[dict[str, str]]) -> None:
    """RUN/tensorboard holds one event file (rank 0's writer), each metrics.csv step in it once."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    files = sorted(p.name for p in (run / "tensorboard").iterdir())
    assert len(files) == 1 and files[0].startswith("events.out.tfevents."), files
    acc = EventAccumulator(str(run / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    for column in ("loss", "reward_mean", "kl", "grad_norm"):
        logged = acc.Scalars(f"grpo/{column}")
        assert [e.step for e in logged] == [int(r["step"]) for r in rows], column  # no step twice
        assert [e.value for e in logged] == pytest.approx([float(r[column]) for r in rows], rel=2e-7), column


def _episodes(run: Path) -> list[tuple[str, float]]:
    """The stored episodes' ids and rewards, sorted."""
    from hydroagent_hpc.store import read_episodes

    eps = read_episodes(run / "rollouts.h5")
    return sorted(zip(eps["episode_id"], eps["total_reward"].round(12)))


@pytest.fixture(scope="module")
def one(basins, server, tmp_path_factory) -> Path:
    """The one-process run of the config (in this process)."""
    tmp = tmp_path_factory.mktemp("grpo-fsdp-one")
    cfg = load_grpo_config(_config(tmp / "grpo.yaml", basins, server.url))
    summary = train_grpo(cfg, tmp / "run")
    assert summary["steps"] == 2 and summary["world_size"] == 1
    return tmp / "run"


@pytest.mark.slow
@pytest.mark.parametrize("fsdp", [True, False], ids=["fsdp2", "ddp"])
def test_two_processes_train_what_one_process_trains(basins, server, one, tmp_path, fsdp):
    # report_to: only rank 0 may open the live sinks (one event file below)
    cfg = _config(tmp_path / "grpo.yaml", basins, server.url, fsdp=str(fsdp).lower(), report_to="[tensorboard]")
    run = tmp_path / "run"
    env = dict(os.environ, PYTHONPATH=pythonpath(),
               HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1")
    env.pop(FAULT_ENV, None)
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "hydroagent_hpc.train.grpo", str(cfg), "--out", str(run)],
                          env=env, capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert ("2 process(es) FSDP2" if fsdp else "2 process(es) DDP") in proc.stderr
    # the config's collective timeout reached the process group of both ranks (NCCL's own is 10 minutes)
    assert proc.stderr.count("collectives time out after 4321 s") == 2, proc.stderr[-3000:]
    # the same episodes were played and stored once, by rank 0
    assert _episodes(run) == _episodes(one)
    two_rows, one_rows = _metrics(run), _metrics(one)
    assert [r["step"] for r in two_rows] == [r["step"] for r in one_rows] == ["1", "2"]
    assert int(one_rows[0]["trainable"]) >= 2  # both ranks had a real sequence to train on
    for col in COMPARED:
        got = [float(r[col]) for r in two_rows]
        want = [float(r[col]) for r in one_rows]
        assert got == pytest.approx(want, rel=LOSS_REL, abs=1e-9), col
    assert all(0 <= float(r["logprob_mismatch_max"]) <= MISMATCH_MAX for r in two_rows + one_rows), two_rows
    assert [float(r["grad_norm"]) for r in two_rows] == pytest.approx([float(r["grad_norm"]) for r in one_rows],
                                                                      rel=GRAD_REL)
    a, b = _params(run), _params(one)
    assert a.keys() == b.keys()
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    assert worst <= PARAM_ATOL, f"final parameters differ by up to {worst:.3g}"
    assert worst < float(max((b[k] - build_tiny(seed=0)[0].state_dict()[k]).abs().max() for k in b))  # it trained
    # the checkpoints hold the same (gathered) state as a one-process run's, under the same names
    ckpt_two = torch.load(run / "checkpoints" / "step-2" / "model.pt", weights_only=True)
    ckpt_one = torch.load(one / "checkpoints" / "step-2" / "model.pt", weights_only=True)
    assert ckpt_two.keys() == ckpt_one.keys()
    assert max(float((ckpt_two[k] - ckpt_one[k]).abs().max()) for k in ckpt_one) <= PARAM_ATOL
    # each rank's own RNG states, for each rank to restore its own (gpu-audit F12)
    extra = torch.load(run / "checkpoints" / "step-2" / "trainer.pt", weights_only=False)
    assert len(extra["rng_ranks"]) == 2 and extra["rng"] is not None
    # only rank 0 wrote the run folder: the one-process run's files, each once (metrics not appended twice),
    # and one TensorBoard writer holding each step's row once
    assert [f for f in _files(run) if not f.startswith("tensorboard/")] == _files(one)
    _assert_one_event_writer(run, two_rows)
    # the step timeline has both ranks' lanes (gathered on rank 0): rank 1 waits while rank 0 plays the
    # rollouts, both train and take part in the weight gather for the engine
    from hydroagent_hpc.train.grpo.timeline import read_timeline, utilisation

    records = read_timeline(run)
    assert [r["step"] for r in records] == [1, 2]
    for r in records:
        names = [x["name"] for x in r["lanes"]]
        phases = {lane: {s[1] for s in r["spans"] if names[s[0]] == lane} for lane in ("rank 0", "rank 1")}
        assert {"generate", "train", "forward", "backward", "sync"} <= phases["rank 0"], phases
        assert {"wait", "train", "forward", "backward", "sync"} <= phases["rank 1"], phases
        assert "generate" not in phases["rank 1"]
    lanes = utilisation(records)["lanes"]
    assert lanes["rank 1"]["seconds"]["wait"] >= 0.8 * lanes["rank 0"]["seconds"]["generate"]
    import h5py

    with h5py.File(run / "metrics.h5") as f:
        assert f["metrics/step"][:].tolist() == [1.0, 2.0]


def _batch(seed: int = 3) -> list[_Sequence]:
    """Five sequences of different lengths, 1-3 assistant turns each, with advantages."""
    rng = np.random.default_rng(seed)
    out = []
    for n, turns in ((14, 1), (9, 2), (21, 3), (11, 1), (17, 2)):
        ids = rng.integers(5, 200, size=n).tolist()
        cuts = np.linspace(2, n, turns + 1).astype(int)
        spans = [(int(cuts[j]), int(cuts[j]) + max(1, (int(cuts[j + 1]) - int(cuts[j])) // 2)) for j in range(turns)]
        mask = [0] * n
        for s, e in spans:
            mask[s:e] = [1] * (e - s)
        out.append(_Sequence(ids, mask, spans, [], rng.normal(size=turns)))
    return out


@pytest.mark.slow
@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_the_loss_of_a_batch_split_over_ranks_has_the_one_process_gradient(aggregation):
    """The denominators summed over the ranks (what the all-reduce does) and the backward of
    ``W x`` each rank's part make the ranks' averaged gradient (what DDP/FSDP do) that of one process."""
    model, _ = build_tiny(seed=1)
    reference, _ = build_tiny(seed=2)
    scorer, ref = LogprobModel(model), LogprobModel(reference).eval()
    norm = {"norm_length": 32} if aggregation == "seq-mean-token-sum-norm" else {}  # only that mode takes one
    cfg = grpo_config_from_mapping({"basins": ["x"], "aggregation": aggregation, **norm,
                                    "kl_coef": 0.2, "entropy_coef": 0.01, "logprob_chunk": 4})
    batch = _batch()
    device = torch.device("cpu")

    def grads(world: int, rank: int, totals: tuple[float, float]) -> tuple[list[torch.Tensor], float]:
        model.zero_grad(set_to_none=True)
        sums = _accumulate(cfg, scorer, ref, batch, rank_passes(len(batch), world, rank), *totals, world, device)
        return [p.grad.clone() for p in model.parameters()], sums["loss"]

    one, loss_one = grads(1, 0, _local_counts(batch, rank_passes(len(batch), 1, 0)))
    for world in (2, 3):
        shares = [rank_passes(len(batch), world, r) for r in range(world)]
        assert sorted(k for s in shares for k in s if k is not None) == list(range(len(batch)))  # disjoint, complete
        assert len({len(s) for s in shares}) == 1  # the same number of passes on every rank
        counts = [_local_counts(batch, s) for s in shares]
        totals = (sum(c[0] for c in counts), sum(c[1] for c in counts))  # the all-reduce
        per_rank = [grads(world, r, totals) for r in range(world)]
        assert sum(loss for _, loss in per_rank) == pytest.approx(loss_one, rel=1e-6)
        averaged = [sum(g[i] for g, _ in per_rank) / world for i in range(len(one))]  # DDP / FSDP's average
        worst = max(float((a - b).abs().max()) for a, b in zip(averaged, one))
        scale = max(float(b.abs().max()) for b in one)
        assert worst <= 1e-5 * scale, f"{aggregation}, {world} ranks: gradients differ by {worst:.3g} (max {scale:.3g})"


def test_several_processes_need_an_engine_and_the_thread_pool(basins, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.ERROR)
    local = tmp_path / "local.yaml"
    local.write_text(f"basins: [{basins / 'b1'}]\ngenerator: local\nmax_steps: 1\n")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert launch([str(local), "--out", str(tmp_path / "run")]) == 2
    assert "local.yaml:2: generator: local with 2 training processes" in caplog.text
    assert "fix: set generator: colocated" in caplog.text and "or engine" in caplog.text
    assert not (tmp_path / "run").exists()
    engine = _config(tmp_path / "engine.yaml", basins, "http://127.0.0.1:9")
    caplog.clear()
    assert launch([str(engine), "--out", str(tmp_path / "run"), "--pool", "mpi"]) == 2
    assert "--pool mpi with 2 training processes" in caplog.text and not (tmp_path / "run").exists()
    # one process keeps both
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert load_grpo_config(local).generator == "local"
    with pytest.raises(ConfigError, match=r"local\.yaml:2: generator: local with 4 training processes"):
        load_grpo_config(local, world_size=4)
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"basins: [{basins / 'b1'}]\nfsdp: sometimes\n")
    with pytest.raises(ConfigError, match=r"bad\.yaml:2: fsdp: .* is not one of true, false, auto"):
        load_grpo_config(bad)
