"""GRPO runs end to end on CPU with the tiny offline Qwen3, the real environment and simulator:
the run folder, the episode store, exact resume after SIGKILL (also mid-step) and SIGUSR1, and the
direction of one update."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from hydroagent_hpc.store import read_episodes
from hydroagent_hpc.train.checkpoint import FAULT_ENV
from hydroagent_hpc.train.grpo import plan_prompts, rollout_seed, train_grpo
from hydroagent_hpc.train.grpo_config import load_grpo_config

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


def _config(basins: Path, tmp_path: Path, **extra: object) -> Path:
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 1, "max_steps": 2, "max_new_tokens": 12, "lr": "1.0e-3",
                                 "generation_batch": 1, "env": "{max_turns: 2}", **extra}
    text = "".join(f"{k}: {v}\n" for k, v in values.items())
    path = tmp_path / "grpo.yaml"
    path.write_text(text)
    return path


def _params(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


def test_prompts_walk_seeded_epochs_and_seeds_differ_per_member():
    first, epoch, index = plan_prompts(3, 2, seed=0, epoch=0, index=0)
    second, epoch2, index2 = plan_prompts(3, 2, seed=0, epoch=epoch, index=index)
    assert (epoch, index) == (0, 2) and (epoch2, index2) == (1, 1)
    assert sorted(first + second[:1]) == [0, 1, 2]  # epoch 0 is a permutation
    seeds = {rollout_seed(0, s, g, k) for s in range(2) for g in range(2) for k in range(3)}
    assert len(seeds) == 12


def test_a_run_writes_metrics_episodes_checkpoints_and_a_loadable_policy(basins, tmp_path):
    cfg = load_grpo_config(_config(basins, tmp_path, validation_basins=f"[{basins / 'v1'}]", validate_every=1,
                                   max_steps=1))
    summary = train_grpo(cfg, tmp_path / "run")
    run = tmp_path / "run"
    assert summary["steps"] == 1 and summary["stopped"] is None
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["step"] for r in rows] == ["1"]
    assert float(rows[0]["reward_mean"]) == pytest.approx(summary["first_reward"])
    assert int(rows[0]["rollouts"]) == 2 and rows[0]["stop_reasons"]
    # the trainer scores exactly the ids that were sampled, with the sampler's own numbers
    assert float(rows[0]["logprob_mismatch_max"]) < 1e-4
    eps = read_episodes(run / "rollouts.h5")
    assert sorted(eps.agent.value_counts().items()) == [("grpo", 2), ("grpo-val", 2)]  # step 0 and step 1
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-1"
    assert (run / "config.yaml").read_text().count("provenance") == 1
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy

    policy = HFLocalPolicy(str(run / "final"), greedy=True, max_new_tokens=4, device="cpu")
    assert policy.act([{"role": "system", "content": "x"}, {"role": "user", "content": "y"}]) is not None


def _module(cfg: Path, out: Path, *args: str, faults: str = "") -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    env.pop(FAULT_ENV, None)
    if faults:
        env[FAULT_ENV] = faults
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.train.grpo", str(cfg), "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def test_resume_after_sigusr1_and_a_kill_mid_step_equals_an_uninterrupted_run(basins, tmp_path):
    cfg_path = _config(basins, tmp_path)
    whole = train_grpo(load_grpo_config(cfg_path), tmp_path / "whole")
    assert whole["steps"] == 2
    # SIGUSR1 after step 1 saves (save_every is 0); the kill comes after step 2's rollouts were stored
    killed = _module(cfg_path, tmp_path / "cut", faults="usr1:1,kill_after_rollouts:2")
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (tmp_path / "cut" / "checkpoints" / "latest").read_text().strip() == "step-1"
    assert len(read_episodes(tmp_path / "cut" / "rollouts.h5")) == 4  # step 2's episodes were stored
    resumed = _module(cfg_path, tmp_path / "cut", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = _params(tmp_path / "whole" / "final"), _params(tmp_path / "cut" / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], _params_initial(k)) for k in a)
    # the replayed step is neither stored twice nor counted twice
    assert len(read_episodes(tmp_path / "cut" / "rollouts.h5")) == 4
    assert [r["step"] for r in csv.DictReader(open(tmp_path / "cut" / "metrics.csv"))] == ["1", "2"]
    import h5py

    with h5py.File(tmp_path / "cut" / "metrics.h5") as f, h5py.File(tmp_path / "whole" / "metrics.h5") as g:
        assert list(f["metrics/step"][:]) == [1.0, 2.0]
        assert f["metrics/reward_mean"][:].tolist() == g["metrics/reward_mean"][:].tolist()
    # a finished run is not started over without --resume
    again = _module(cfg_path, tmp_path / "cut")
    assert again.returncode != 0 and "--resume" in again.stderr


_INITIAL: dict[str, torch.Tensor] = {}


def _params_initial(key: str) -> torch.Tensor:
    if not _INITIAL:
        from hydroagent_hpc.train.tiny import build_tiny

        model, _ = build_tiny(seed=0)
        _INITIAL.update({k: v.detach().clone() for k, v in model.state_dict().items()})
    return _INITIAL[key]


def test_one_update_moves_log_probs_toward_positive_advantages(basins):
    """The whole loss path (token advantages on turn spans, chunked log-probs, clipped objective,
    global normalisation, backward) pushes the policy the right way: after one SGD step the
    positive-advantage rollout's sampled tokens gained log-probability relative to the negative one's."""
    import numpy as np

    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.sim import open_simulator
    from hydroagent_hpc.sim.basin import load_basin
    from hydroagent_hpc.train.grpo import _optimise, _Ranks, _training_batch
    from hydroagent_hpc.train.grpo_config import grpo_config_from_mapping
    from hydroagent_hpc.train.grpo_loss import token_logprobs
    from hydroagent_hpc.train.rollout import RolloutPolicy, RolloutSpec, SimulationSlots, run_rollouts
    from hydroagent_hpc.train.sampler import BatchedSampler, GenerationServer, Sampling
    from hydroagent_hpc.train.tiny import build_tiny

    model, tok = build_tiny(seed=0)
    d = str(basins / "b1")
    sampling = Sampling(max_new_tokens=16)
    probe = HFLocalPolicy(model, tok)  # the stop and pad ids
    with GenerationServer(BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling)) as server:
        rollouts = run_rollouts(
            [RolloutSpec(0, k, d, k, f"u{k}") for k in range(2)],
            env_factory=lambda s, sim: CalibrationEnv(load_basin(d), sim, preset("paper", max_turns=2), seed=s.seed,
                                                      episode_id=s.episode_id),
            simulators={d: open_simulator(f"{d}/control.txt")}, slots=SimulationSlots(2),
            policy_factory=lambda s: RolloutPolicy(model, tok, server, sampling, seed=s.seed, max_context_tokens=8192))
    assert all(r.trainable for r in rollouts)

    def mean_logp(r):
        ids = torch.tensor([r.ids])
        with torch.no_grad():
            lp, _ = token_logprobs(model, ids, torch.ones_like(ids), with_entropy=False)
        m = torch.tensor(r.mask, dtype=torch.bool)
        return float(lp[0][m].mean())

    before = [mean_logp(r) for r in rollouts]
    per_turn = {0: np.ones(len(rollouts[0].spans)), 1: -np.ones(len(rollouts[1].spans))}
    config = grpo_config_from_mapping({"basins": [d], "kl_coef": 0.0, "entropy_coef": 0.0})
    model.train()
    parts = _optimise(config, model, torch.optim.SGD(model.parameters(), lr=0.05),
                      _training_batch(rollouts, per_turn), probe.pad_id, _Ranks.one_process(model))
    model.eval()
    after = [mean_logp(r) for r in rollouts]
    assert parts["tokens"] == sum(sum(r.mask) for r in rollouts) and parts["grad_norm"] > 0
    assert (after[0] - before[0]) - (after[1] - before[1]) > 0
    assert after[0] > before[0]
