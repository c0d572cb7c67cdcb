"""One step of overlap (``max_staleness: 1``, train/grpo/overlap.py): the next step's rollouts played while
this step trains, corrected by truncated importance weights (train/grpo/loss.py).

Fast: the weights and their cap on a hand-built batch (and through the loss's gradient), the config's
refusals, the thread that plays ahead and its file. Slow: real tiny-Qwen3 runs on the real environment
and simulator, on-policy and one step stale, and a stale run killed and resumed."""

from __future__ import annotations

import csv
import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from helpers.cases import every_case
from helpers.paths import pythonpath
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.checkpoint import FAULT_ENV
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.train.grpo.loss import grpo_loss, truncated_importance_weights
from hydroagent_hpc.train.grpo.overlap import BehaviourModel, RolloutsAhead

ROOT = Path(__file__).resolve().parents[1]


# --------------------------------------------------------------------------------------------- the loss


def _batch() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Six positions, five sampled (mask 1); the trainer's log-probs against the sampler's give the ratios
    1, 3 (above a cap of 2), 0.5, 2 (at the cap) and 10 (above it); the last position is not sampled."""
    behaviour = torch.log(torch.tensor([[0.4, 0.1, 0.6, 0.25, 0.05, 0.3]]))
    ratio = torch.tensor([[1.0, 3.0, 0.5, 2.0, 10.0, 7.0]])
    logp = (behaviour + torch.log(ratio)).requires_grad_(True)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    advantages = torch.tensor([[1.0, -2.0, 0.5, 1.5, 3.0, 4.0]])
    return logp, behaviour, mask, advantages


def test_ratios_above_the_cap_contribute_the_capped_value():
    logp, behaviour, mask, adv = _batch()
    tis = truncated_importance_weights(logp, behaviour, mask, cap=2.0)
    assert torch.allclose(tis.weights, torch.tensor([[1.0, 2.0, 0.5, 2.0, 2.0, 1.0]]), rtol=1e-6)
    assert tis.truncated == 2 and tis.ratio_max == pytest.approx(10.0, rel=1e-6)
    assert tis.ratio_sum == pytest.approx(1 + 3 + 0.5 + 2 + 10, rel=1e-6)
    # through the loss: with the PPO ratio at 1 (old = logp, one epoch) the token-mean policy gradient of
    # token t is -A_t * w_t / N, so a truncated token pulls with the cap, not with its ratio
    parts = grpo_loss(logp, logp.detach(), None, None, adv, mask, is_weights=tis.weights)
    parts.loss.backward()
    expected = -adv * torch.tensor([[1.0, 2.0, 0.5, 2.0, 2.0, 0.0]]) / 5
    assert logp.grad is not None and torch.allclose(logp.grad, expected, rtol=1e-6)
    # without weights the same tokens pull with their advantage alone
    logp.grad = None
    grpo_loss(logp, logp.detach(), None, None, adv, mask).loss.backward()
    assert torch.allclose(logp.grad, -adv * mask / 5, rtol=1e-6)
    # only the policy-gradient term is weighted: the KL and entropy terms are not
    ref, entropy = behaviour.clone(), torch.rand(1, 6)
    one = grpo_loss(logp, logp.detach(), ref, entropy, torch.zeros_like(adv), mask, kl_coef=0.3, entropy_coef=0.1)
    weighted = grpo_loss(logp, logp.detach(), ref, entropy, torch.zeros_like(adv), mask, kl_coef=0.3,
                         entropy_coef=0.1, is_weights=tis.weights)
    assert torch.equal(one.loss, weighted.loss)


def test_the_weights_are_the_trainers_former_inline_formula_bit_for_bit():
    """The trainer multiplied ``min(exp(logp - logp_sampler), cap)`` into the advantages of the mask-1
    tokens in place before this module existed; the weights give the same advantages, bit for bit, so
    an on-policy run with ``tis_cap`` is unchanged."""
    g = torch.Generator().manual_seed(3)
    logp = torch.randn(1, 40, generator=g) * 0.3 - 2
    behaviour = logp + torch.randn(1, 40, generator=g) * 0.5
    mask = (torch.rand(1, 40, generator=g) > 0.3).float()
    adv = torch.randn(1, 40, generator=g)
    old = adv.clone()
    delta = (logp.detach().float() - behaviour)[mask.bool()]
    old[mask.bool()] = old[mask.bool()] * torch.exp(delta).clamp(max=1.3)
    tis = truncated_importance_weights(logp, behaviour, mask, cap=1.3)
    assert 0 < tis.truncated < int(mask.sum())
    assert torch.equal(adv * tis.weights, old)


def test_importance_weights_refuse_a_cap_that_is_not_positive_and_other_shapes():
    logp, behaviour, mask, _ = _batch()
    with pytest.raises(ValueError, match="cap must be > 0"):
        truncated_importance_weights(logp, behaviour, mask, cap=0.0)
    with pytest.raises(ValueError, match="mask's shape"):
        truncated_importance_weights(logp, behaviour[:, :3], mask, cap=2.0)


# --------------------------------------------------------------------------------------------- the config


def _write(tmp_path: Path, **values: object) -> Path:
    values = {"basins": "[b1]", **values}
    path = tmp_path / "grpo.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def test_staleness_is_off_by_default_and_refused_where_it_cannot_run(tmp_path):
    assert load_grpo_config(_write(tmp_path)).max_staleness == 0
    assert load_grpo_config(_write(tmp_path, max_staleness=1, tis_cap=2.0)).max_staleness == 1
    with pytest.raises(ConfigError, match=r"grpo\.yaml:\d+: max_staleness: .*needs truncated importance.*\n"
                                          r"  fix: set tis_cap: 2\.0"):
        load_grpo_config(_write(tmp_path, max_staleness=1))
    with pytest.raises(ConfigError, match=r"max_staleness: 1 with generator: colocated.*sleep.*\n"
                                          r"  fix: set colocated\.awake_while_training: true .*, or "
                                          r"max_staleness: 0, or generator: engine or local"):
        load_grpo_config(_write(tmp_path, max_staleness=1, tis_cap=2.0, generator="colocated"))
    with pytest.raises(ConfigError, match=r"max_staleness"):
        load_grpo_config(_write(tmp_path, max_staleness=2, tis_cap=2.0))


# --------------------------------------------------------------------------------------------- playing ahead


def test_rollouts_played_ahead_are_taken_once_kept_for_a_resume_and_pruned(tmp_path):
    model = torch.nn.Linear(3, 2)
    ahead: RolloutsAhead[dict[str, int]] = RolloutsAhead(tmp_path, BehaviourModel(model, copy_weights=True))
    assert ahead.take(2) is None  # nothing played ahead: the step plays now
    ahead.start(2, lambda: {"played": 2})
    with pytest.raises(RuntimeError, match="still being played"):
        ahead.start(3, lambda: {"played": 3})
    ahead.wait()
    assert ahead.take(3) is None and ahead.take(2) == {"played": 2} and ahead.take(2) is None
    # the file a resume from checkpoint 1 reads back
    again: RolloutsAhead[dict[str, int]] = RolloutsAhead(tmp_path, BehaviourModel(model, copy_weights=True))
    again.resume(2)
    assert again.take(2) == {"played": 2}
    again.resume(3)  # no such file
    assert again.take(3) is None
    # a file cut short (a kill during its write would leave only the .tmp; a damaged one is refused)
    (tmp_path / "overlap" / "step-000004.pkl").write_bytes(b"\x80\x05cut")
    again.resume(4)
    assert again.take(4) is None
    for step in (5, 6):
        (tmp_path / "overlap" / f"step-{step:06d}.pkl").write_bytes(b"")
    # checkpoint 2: a resume reads step 3 (none here) or, from the next checkpoint, the newest (6)
    again.prune(2)
    assert sorted(p.name for p in (tmp_path / "overlap").iterdir()) == ["step-000006.pkl"]
    again.prune(5)  # checkpoint 5: step 6's file is the one its resume reads
    assert sorted(p.name for p in (tmp_path / "overlap").iterdir()) == ["step-000006.pkl"]
    again.prune(6)
    assert not list((tmp_path / "overlap").iterdir())


def test_an_error_in_the_playing_thread_reaches_the_trainer():
    ahead: RolloutsAhead[int] = RolloutsAhead(Path("/nonexistent"), BehaviourModel(torch.nn.Linear(1, 1),
                                                                                     copy_weights=True))

    def fails() -> int:
        raise OSError("the engine went away")

    ahead.start(5, fails)
    with pytest.raises(OSError, match="the engine went away"):
        ahead.wait()
    assert ahead.take(5) is None


def test_the_behaviour_copy_holds_the_weights_it_was_refreshed_with():
    model = torch.nn.Linear(3, 2)
    behaviour = BehaviourModel(model, copy_weights=True)
    sampler = behaviour.refresh(model, 4)
    assert behaviour.version == 4 and sampler is not model and not sampler.training
    with torch.no_grad():
        model.weight.add_(1.0)  # the trainer's optimizer step
    assert not torch.equal(sampler.weight, model.weight)
    behaviour.refresh(model, 5)
    assert torch.equal(sampler.weight, model.weight) and not sampler.weight.requires_grad


# --------------------------------------------------------------------------------------------- runs


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


def _config(basins: Path, folder: Path, **extra: object) -> Path:
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 1, "max_steps": 3, "max_new_tokens": 12, "lr": "1.0e-3",
                                 "generation_batch": 1, "env": "{max_turns: 2}", "tis_cap": 1.02, **extra}
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "grpo.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def _module(cfg: Path, out: Path, *args: str, faults: str = "") -> subprocess.CompletedProcess[str]:
    # one thread: the runs compared bit for bit do the same arithmetic
    env = dict(os.environ, PYTHONPATH=pythonpath(), HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    env.pop(FAULT_ENV, None)
    if faults:
        env[FAULT_ENV] = faults
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.train.grpo", str(cfg), "--out", str(out), *args],
                          env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)


def _rows(run: Path) -> list[dict[str, str]]:
    return list(csv.DictReader(open(run / "metrics.csv")))


def _versions(run: Path) -> dict[str, int]:
    from hydroagent_hpc.store import read_episodes

    eps = read_episodes(run / "rollouts.h5")
    return {e: json.loads(p)["policy_version"] for e, p in zip(eps.episode_id, eps.provenance)}


def _params(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    return load_file(str(folder / "model.safetensors"))


TIMES = {"generation_s", "simulation_s", "training_s", "step_s", "weight_sync_s"}


@pytest.mark.slow
def test_stale_rollouts_come_from_the_previous_weights_and_on_policy_runs_stay_on_policy(basins, tmp_path):
    runs = {}
    for staleness in (0, 1):
        out = tmp_path / f"s{staleness}"
        done = _module(_config(basins, tmp_path / f"cfg{staleness}", max_staleness=staleness), out)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[staleness] = out
    on, stale = _rows(runs[0]), _rows(runs[1])
    # on-policy: every step's rollouts were sampled by the weights that train on them
    assert [int(r["staleness"]) for r in on] == [0, 0, 0]
    assert all(float(r["logprob_mismatch_max"]) < 1e-4 for r in on), on
    assert all(float(r["tis_truncated_share"]) == 0 for r in on)
    assert set(_versions(runs[0]).values()) == {0, 1, 2} and all(
        v == int(e.split("-s")[1][:5]) - 1 for e, v in _versions(runs[0]).items())
    assert not (runs[0] / "overlap").exists()
    # one step stale: step n's rollouts were sampled by the weights of step n - 2 (the first on-policy)
    assert [int(r["staleness"]) for r in stale] == [0, 1, 1]
    versions = _versions(runs[1])
    assert len(versions) == 3 * 2
    assert all(v == max(int(e.split("-s")[1][:5]) - 2, 0) for e, v in versions.items()), versions
    # the first step is the on-policy run's step, bit for bit; the later ones train on other weights' samples
    assert {k: v for k, v in stale[0].items() if k not in TIMES} == {k: v for k, v in on[0].items() if k not in TIMES}
    for r in stale[1:]:
        assert float(r["logprob_mismatch_max"]) > 1e-3, r
        assert float(r["tis_ratio_mean"]) != 1.0 and float(r["tis_ratio_max"]) > 1.02
        assert 0 < float(r["tis_truncated_share"]) < 1 and float(r["tis_weight_mean"]) <= 1.02
    assert not list((runs[1] / "overlap").iterdir())  # no file is kept once the run has ended
    a, b = _params(runs[0] / "final"), _params(runs[1] / "final")
    assert any(not torch.equal(a[k], b[k]) for k in a)


# two kill moments; the one inside the playing thread runs unless HYDROAGENT_CASES=all (tests/helpers/cases.py)
@pytest.mark.slow
@pytest.mark.parametrize("faults", ["usr1:1,kill_after_rollouts:3", *(["usr1:2,kill:2"] if every_case() else [])])
def test_a_stale_run_killed_and_resumed_neither_repeats_nor_skips_a_step(basins, tmp_path, faults):
    """``usr1:2,kill:2``: killed after checkpoint 2, with step 3's rollouts (played during step 2) on disk;
    ``kill_after_rollouts:3``: killed by the thread playing step 3 during step 2, after checkpoint 1."""
    cfg = _config(basins, tmp_path / "cfg", max_staleness=1)
    whole = _module(cfg, tmp_path / "whole")
    assert whole.returncode == 0, whole.stderr[-3000:]
    cut = tmp_path / "cut"
    killed = _module(cfg, cut, faults=faults)
    assert killed.returncode == -9, killed.stderr[-3000:]
    saved = int(faults.split(",")[0].split(":")[1])
    assert (cut / "checkpoints" / "latest").read_text().strip() == f"step-{saved}"
    assert (cut / "overlap" / f"step-{saved + 1:06d}.pkl").is_file()  # played ahead before the kill
    resumed = _module(cfg, cut, "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "read back from" in resumed.stderr
    rows, whole_rows = _rows(cut), _rows(tmp_path / "whole")
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    for r, w in zip(rows, whole_rows):  # the same steps, trained on the same rollouts
        assert {k: v for k, v in r.items() if k not in TIMES} == {k: v for k, v in w.items() if k not in TIMES}
    assert _versions(cut) == _versions(tmp_path / "whole")  # every episode stored once, by the same weights
    a, b = _params(tmp_path / "whole" / "final"), _params(cut / "final")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_planted_pending_file_cannot_run_code(tmp_path, caplog):
    """The pending-rollouts file is read by an unpickler that builds only our dataclasses, numpy arrays and
    plain values: a file that would call ``os.system`` (or any function) is refused and the step plays anew."""
    import pickle

    from hydroagent_hpc.train.grpo.overlap import _FORMAT

    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    ahead: RolloutsAhead[object] = RolloutsAhead(tmp_path, BehaviourModel(torch.nn.Linear(1, 1), copy_weights=True))
    path = tmp_path / "overlap" / "step-000003.pkl"
    path.parent.mkdir(parents=True)
    path.write_bytes(pickle.dumps({"format": _FORMAT, "step": 3, "rollouts": Evil()}))
    with caplog.at_level(logging.WARNING):
        ahead.resume(3)
    assert not marker.exists() and ahead.take(3) is None
    assert "cannot be read" in caplog.text


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """The loopback engine server (train/generation/engine_server.py) with the tiny Qwen3, in this process."""
    from hydroagent_hpc.train.generation.engine_server import EngineServer
    from hydroagent_hpc.train.tiny import build_tiny, save_tiny

    model, tok = build_tiny(seed=0)
    folder = save_tiny(tmp_path_factory.mktemp("overlap-engine") / "tiny", model, tok)
    with EngineServer(str(folder)) as server:
        yield server


@pytest.mark.slow
def test_with_an_engine_the_next_steps_rollouts_come_from_the_previous_push(basins, engine, tmp_path):
    """``generator: engine`` with one step of overlap: the engine keeps serving the weights pushed before
    step n while step n trains, so step n + 1's rollouts were sampled by the weights of step n - 1, and the
    importance ratios are not all 1; the run ends with every step once and no pending file left."""
    cfg = _config(basins, tmp_path / "cfg", max_staleness=1, generator="engine",
                  engine=f"{{api: sglang, url: '{engine.url}'}}")
    out = tmp_path / "run"
    done = _module(cfg, out)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _rows(out)
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert [int(r["staleness"]) for r in rows] == [0, 1, 1]
    versions = _versions(out)
    assert len(versions) == 3 * 2
    assert all(v == max(int(e.split("-s")[1][:5]) - 2, 0) for e, v in versions.items()), versions
    assert float(rows[0]["logprob_mismatch_max"]) < 1e-4  # step 1: the engine serves the starting weights
    for r in rows[1:]:
        assert float(r["logprob_mismatch_max"]) > 1e-3 and float(r["tis_ratio_max"]) > 1.0, r
    assert not list((out / "overlap").iterdir())
