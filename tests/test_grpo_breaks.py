"""Tests that fail when the GRPO recipe is broken on purpose (issue 30, "Tests that can fail").

Each test names the breaks it catches; every one was checked by applying the break to the source
by hand, running the test (it failed) and restoring the source:

- advantages zeroed inside the trainer, advantages normalised over the batch instead of per group:
  :func:`test_advantages_are_normalised_within_each_group_not_over_the_batch`,
  :func:`test_one_update_is_the_written_grpo_gradient`, :func:`test_grpo_learns_an_easy_task`;
- KL taken against the live policy instead of the frozen reference, a flipped advantage sign,
  per-turn advantages put on another turn's tokens: :func:`test_one_update_is_the_written_grpo_gradient`;
- gradient clipping off: :func:`test_gradient_clipping_bounds_the_update`;
- per-turn rewards credited to another message, an end token the model did not sample trained
  as if generated: :func:`test_rewards_and_trained_tokens_follow_the_messages_that_earned_them`;
- lr 0, zeroed advantages, a flipped sign: :func:`test_grpo_learns_an_easy_task`.

Everything is the real code: the tiny offline Qwen3, :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler`,
the trainer's own ``_advantages``, ``training_batch`` and ``optimise`` with ``Ranks.one_process``,
real environments and the real simulator.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np
import pytest
import torch

from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.params import PARAMS
from hydroagent_hpc.sim import open_simulator
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.train.generation.rollout import Rollout, RolloutPolicy, RolloutSpec, SimulationSlots, run_rollouts
from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sample, Sampling
from hydroagent_hpc.train.grpo.config import GRPOConfig, grpo_config_from_mapping
from hydroagent_hpc.train.grpo.trainer import Ranks, _advantages, _Sequence, optimise, rollout_seed, training_batch
from hydroagent_hpc.train.tiny import build_tiny
from hydroagent_hpc.types import ToolCall


def _config(**values: object) -> GRPOConfig:
    return grpo_config_from_mapping({"basins": ["unused"], **values})


def _rollout(group: int, member: int, rewards: Sequence[float], terminal: float, spans: int = 1) -> Rollout:
    """A trainable rollout of ``spans`` one-token assistant turns (ids only matter for the loss)."""
    ids = list(range(1, 2 * spans + 1))
    mask = [0, 1] * spans
    return Rollout(RolloutSpec(group, member, f"b{group}", member, f"g{group}k{member}"), None, ids, mask,
                   [(2 * j + 1, 2 * j + 2) for j in range(spans)], list(rewards), terminal)


# ---------------------------------------------------------------------------------------------
# advantages per group


def test_advantages_are_normalised_within_each_group_not_over_the_batch():
    """Two groups on very different reward scales: each is normalised by its own mean and sample std.

    group 0 returns [0, 1, 2]: mean 1, sample std 1 -> advantages [-1, 0, 1] (/(1 + eps));
    group 1 returns [10, 14]: mean 12, sample std sqrt(8) -> [-2, 2] / sqrt(8) = [-0.7071, 0.7071];
    group 2 returns [5, 5]: degenerate, zeros. Normalised over the batch of seven returns instead,
    group 0 would get about [-1.17, -0.98, -0.79] (mean 5.29, std 5.19) and group 1 [0.91, 1.68]."""
    rollouts = [_rollout(0, 0, [0.0], 0.0), _rollout(0, 1, [0.5], 0.5), _rollout(0, 2, [1.0], 1.0),
                _rollout(1, 0, [4.0, 1.0], 5.0, spans=2), _rollout(1, 1, [6.0, 2.0], 6.0, spans=2),
                _rollout(2, 0, [2.0], 3.0), _rollout(2, 1, [1.0], 4.0)]
    per_turn, degenerate = _advantages(_config(advantage="episode"), rollouts, 3)
    eps = 1e-6
    want = {0: [-1 / (1 + eps)], 1: [0.0], 2: [1 / (1 + eps)],
            3: [-2 / (math.sqrt(8) + eps)] * 2, 4: [2 / (math.sqrt(8) + eps)] * 2, 5: [0.0], 6: [0.0]}
    assert sorted(per_turn) == sorted(want) and degenerate == 1
    for i, expected in want.items():
        np.testing.assert_allclose(per_turn[i], expected, rtol=1e-12, atol=1e-15)
    # and the training batch carries them to the loss unchanged, rollout by rollout
    batch = training_batch(rollouts, per_turn)
    assert [list(s.advantages) for s in batch] == [list(per_turn[i]) for i in per_turn]


# ---------------------------------------------------------------------------------------------
# one update against the GRPO objective written out


def _sequences(seed: int = 3) -> list[_Sequence]:
    """Three sequences of 2, 1 and 3 assistant turns, each turn its own advantage (and one negative)."""
    rng = np.random.default_rng(seed)
    out = []
    for n, spans in ((19, [(4, 8), (12, 16)]), (11, [(5, 11)]), (23, [(2, 5), (9, 12), (17, 22)])):
        mask = [0] * n
        for s, e in spans:
            mask[s:e] = [1] * (e - s)
        out.append(_Sequence(rng.integers(7, 900, size=n).tolist(), mask, spans, [],
                             np.array([1.5, -0.5, 0.8][:len(spans)]) * (1 if n != 11 else -1)))
    return out


def _written_loss(model, reference, batch: Sequence[_Sequence], kl_coef: float, entropy_coef: float) -> torch.Tensor:
    """The GRPO loss of one PPO epoch (ratio 1), token-mean, written out from plain forward passes:
    ``sum over trained tokens of [-A_t logp_t + kl_coef (e^d - d - 1) - entropy_coef H_t] / N``,
    ``d = logp_ref - logp``, with each turn's advantage put on its own span's tokens by hand."""
    total = sum(sum(s.mask) for s in batch)
    loss = torch.zeros(())
    for s in batch:
        ids = torch.tensor([s.ids])
        logits = model(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        with torch.no_grad():
            ref = reference(input_ids=ids).logits[0, :-1].float().log_softmax(-1)
        target = ids[0, 1:, None]
        logp = logits.gather(-1, target)[:, 0]  # logp[t - 1] = log p(ids[t] | ids[<t])
        d = ref.gather(-1, target)[:, 0] - logp
        entropy = -(logits.exp() * logits).sum(-1)
        # pg_tokens: arguments: the advantage only on the tokens the mask keeps (1 everywhere without one)
        keep = torch.ones(len(s.ids)) if s.pg_mask is None else torch.from_numpy(s.pg_mask)
        for adv, (start, end) in zip(s.advantages, s.spans):
            sl = slice(start - 1, end - 1)
            loss = loss + (-float(adv) * keep[start:end] * logp[sl] + kl_coef * (d[sl].exp() - d[sl] - 1)
                           - entropy_coef * entropy[sl]).sum() / total
    return loss


def _sgd_update(model, reference, batch: Sequence[_Sequence], config: GRPOConfig) -> tuple[dict[str, torch.Tensor],
                                                                                          dict[str, float]]:
    """The change of every parameter in one ``optimise`` step with SGD at lr 1 (so it is ``-g``)."""
    before = {k: p.detach().clone() for k, p in model.named_parameters()}
    model.train()
    parts = optimise(config, model, torch.optim.SGD(model.parameters(), lr=1.0), batch, 0,
                      Ranks.one_process(model, reference))
    return {k: p.detach() - before[k] for k, p in model.named_parameters()}, parts


def test_one_update_is_the_written_grpo_gradient():
    """``optimise`` moves the weights by exactly the gradient of the GRPO objective written out by
    hand: per-turn advantages on their own turn's tokens with their sign, the k3 KL to the frozen
    reference (another model here, so the KL and its gradient are far from zero) and the entropy
    bonus. Breaks caught: advantages zeroed or their sign flipped in the trainer; a turn's
    advantage put on another turn's tokens; the KL taken against the live policy; the reference
    updated by the step."""
    model, _ = build_tiny(seed=1)
    reference, _ = build_tiny(seed=2)
    reference.eval().requires_grad_(False)
    ref_before = {k: p.clone() for k, p in reference.named_parameters()}
    kl_coef, entropy_coef = 0.3, 0.01
    config = _config(kl_coef=kl_coef, entropy_coef=entropy_coef, max_grad_norm=1e9, logprob_chunk=5)
    batch = _sequences()
    model.eval()  # the written loss needs no dropout either way; the tiny model has none
    grads = torch.autograd.grad(_written_loss(model, reference, batch, kl_coef, entropy_coef),
                                list(model.parameters()))
    want = {k: -g for (k, _), g in zip(model.named_parameters(), grads)}
    delta, parts = _sgd_update(model, reference, batch, config)
    scale = max(float(g.abs().max()) for g in want.values())
    for k in want:
        torch.testing.assert_close(delta[k], want[k], rtol=0, atol=2e-5 * scale, msg=lambda m, k=k: f"{k}: {m}")
    assert parts["kl"] > 0.01 and parts["grad_norm"] == pytest.approx(
        math.sqrt(sum(float((g * g).sum()) for g in grads)), rel=1e-4)
    assert all(torch.equal(p, ref_before[k]) for k, p in reference.named_parameters())


def test_with_pg_tokens_arguments_the_advantage_moves_only_the_kept_tokens_and_kl_all():
    """``pg_tokens: arguments`` (train/grpo/decisions.py): the update is the written gradient with each
    turn's advantage on the tokens of its mask only, while the KL and entropy terms and the token-mean's
    normaliser keep every sampled token. Breaks caught: the mask ignored by the loss (the update is then
    ``pg_tokens: all``'s, which the test also checks differs); the KL or entropy masked with it."""
    model, _ = build_tiny(seed=1)
    reference, _ = build_tiny(seed=2)
    reference.eval().requires_grad_(False)
    kl_coef, entropy_coef = 0.3, 0.01
    config = _config(kl_coef=kl_coef, entropy_coef=entropy_coef, max_grad_norm=1e9, pg_tokens="arguments")
    rng = np.random.default_rng(5)
    batch = [dataclasses.replace(s, pg_mask=(rng.random(len(s.ids)) < 0.4).astype(np.float32)) for s in _sequences()]
    model.eval()
    want = torch.autograd.grad(_written_loss(model, reference, batch, kl_coef, entropy_coef), list(model.parameters()))
    plain = [dataclasses.replace(s, pg_mask=None) for s in batch]
    unmasked = torch.autograd.grad(_written_loss(model, reference, plain, kl_coef, entropy_coef),
                                   list(model.parameters()))
    delta, _ = _sgd_update(model, reference, batch, config)
    scale = max(float(g.abs().max()) for g in want)
    for (k, _), g in zip(model.named_parameters(), want):
        torch.testing.assert_close(delta[k], -g, rtol=0, atol=2e-5 * scale, msg=lambda m, k=k: f"{k}: {m}")
    assert max(float((a - b).abs().max()) for a, b in zip(want, unmasked)) > 100 * 2e-5 * scale


def test_gradient_clipping_bounds_the_update():
    """With ``max_grad_norm`` below the gradient's norm the step is the gradient scaled to that norm
    (SGD at lr 1: the update's norm is ``max_grad_norm``); ``grad_norm`` reports the norm before
    clipping. Break caught: gradient clipping off (or an infinite max norm)."""
    free, _ = build_tiny(seed=1)
    clipped, _ = build_tiny(seed=1)
    batch = _sequences()
    full, parts = _sgd_update(free, None, batch, _config(kl_coef=0.0, entropy_coef=0.0, max_grad_norm=1e9))
    norm = math.sqrt(sum(float((d * d).sum()) for d in full.values()))
    assert parts["grad_norm"] == pytest.approx(norm, rel=1e-5) and norm > 0.1
    cap = norm / 8
    step, parts = _sgd_update(clipped, None, batch, _config(kl_coef=0.0, entropy_coef=0.0, max_grad_norm=cap))
    assert parts["grad_norm"] == pytest.approx(norm, rel=1e-5)
    assert math.sqrt(sum(float((d * d).sum()) for d in step.values())) == pytest.approx(cap, rel=1e-4)
    tol = 1e-3 * max(float(d.abs().max()) for d in full.values()) * cap / norm  # (w + u) - w rounds
    for k in full:  # the same direction, scaled
        torch.testing.assert_close(step[k], full[k] * (cap / norm), rtol=1e-3, atol=tol)


# ---------------------------------------------------------------------------------------------
# per-message credit and the trained tokens of real rollouts


class _Scripted:
    """A generation server for one rollout: turn ``j`` emits ``script[j]`` (forced ids, through the
    real sampler with the model's log-probs) or samples freely where ``script[j]`` is None."""

    def __init__(self, server: GenerationServer, script: Sequence[list[int] | None]) -> None:
        self.server = server
        self.turns: Iterator[list[int] | None] = iter(script)
        self.samples: list[Sample] = []

    def generate(self, ids: Sequence[int], seed: int | None, key: object = None) -> Sample:
        sample = self.server.generate(ids, seed, key=key, forced=next(self.turns))
        self.samples.append(sample)
        return sample


def test_rewards_and_trained_tokens_follow_the_messages_that_earned_them(grpo_basins: Path):
    """Three messages with known payments: a forced run_simulation (``simulation_ok``), a free turn
    of the random model cut by ``max_new_tokens`` (a parse failure), a forced set_parameters to a
    new set (``set_parameters_ok``); the episode ends at max_turns 3 with no evaluation
    (``empty_penalty``). ``turn_rewards`` must be exactly those, message by message. The trained
    tokens (mask 1) must be exactly the ids the sampler emitted, one log-prob each: not the
    ``<|im_end|>`` the policy appends after a ``</tool_call>`` stop, nor the one the template writes
    after the cut turn. Breaks caught: per-turn rewards credited to another message; an end token
    the model did not sample trained as if generated."""
    model, tok = build_tiny(seed=0)
    probe = HFLocalPolicy(model, tok)
    d = str(grpo_basins / "b1")
    wm = PARAMS["wm"]
    run = probe.builder.encode(render_hermes(ToolCall("run_simulation", {})))
    new_set = probe.builder.encode(render_hermes(ToolCall("set_parameters",
                                                          {"wm": round((wm.lower + wm.upper) / 3, 2)})))
    sampling = Sampling(max_new_tokens=max(len(run), len(new_set)) + 2)  # room for the calls, not for the free turn
    env_config = preset("paper", max_turns=3)
    servers: dict[int, _Scripted] = {}
    policies: dict[int, RolloutPolicy] = {}
    with GenerationServer(BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling)) as server:
        def policy(spec: RolloutSpec) -> RolloutPolicy:
            servers[spec.member] = _Scripted(server, [run, None, new_set])
            policies[spec.member] = RolloutPolicy(model, tok, servers[spec.member], sampling,  # type: ignore[arg-type]
                                                  seed=spec.seed, max_context_tokens=8192)
            return policies[spec.member]

        rollouts = run_rollouts(
            [RolloutSpec(0, k, d, 7 + k, f"credit{k}") for k in range(2)],
            env_factory=lambda s, sim: CalibrationEnv(load_basin(d), sim, env_config, seed=s.seed,
                                                      episode_id=s.episode_id),
            simulators={d: open_simulator(Path(d) / "control.txt")}, slots=SimulationSlots(2), policy_factory=policy)
    pay = env_config.rewards
    end, call_end = probe.im_end_id, probe.tool_call_end_id
    for k, r in enumerate(rollouts):
        assert r.trainable and r.episode is not None, r.error
        assert [t.kind for t in r.episode.turns] == ["tool", "parse_failure", "tool"]
        assert r.turn_rewards == [pay.simulation_ok, pay.parse_failure, pay.set_parameters_ok]
        assert r.terminal == pay.empty_penalty
        trace = policies[k].trace
        assert [t.finish_reason for t in trace] == ["stop", "length", "stop"]
        emitted = [s.ids for s in servers[k].samples]
        assert emitted[0] == run and emitted[2] == new_set  # forced calls end at their </tool_call>
        # mask 1 exactly on the emitted ids, turn by turn, with the sampler's log-prob of each
        assert len(r.spans) == 3 and [r.ids[a:b] for a, b in r.spans] == emitted
        assert sum(r.mask) == sum(map(len, emitted)) == len(r.sample_logprobs)
        np.testing.assert_allclose(r.sample_logprobs, [x for s in servers[k].samples for x in s.logprobs])
        # the end tokens nobody sampled are in the sequence, and untrained
        (_, e0), (_, e1), (_, e2) = r.spans
        assert r.ids[e0 - 1] == call_end and (r.ids[e0], r.mask[e0]) == (end, 0)  # the policy's glue
        assert end not in emitted[1] and (r.ids[e1], r.mask[e1]) == (end, 0)  # the template's, after the cut
        assert r.ids[e2 - 1] == call_end and (r.ids[e2], r.mask[e2]) == (end, 0)
    # the trainer takes these rewards and tokens as they are
    # reward-to-go per message: [-1.43, -1.48, -0.98] (the parse failure's turn is the worst, the last the best)
    per_turn, degenerate = _advantages(_config(advantage="turn", gamma=1.0), rollouts, 1)
    assert degenerate == 0 and np.array_equal(per_turn[0], per_turn[1])
    assert np.argsort(per_turn[0]).tolist() == [1, 0, 2]
    batch = training_batch(rollouts, per_turn)
    assert [(s.mask, s.spans) for s in batch] == [(r.mask, r.spans) for r in rollouts]


# ---------------------------------------------------------------------------------------------
# learning an easy task

#: The easy task: after a short user prompt, write tokens that contain a digit (182 of the tiny
#: tokenizer's 1024 ids; the random model puts about 18 % of its mass on them). A completion's
#: reward is the share of its tokens that contain one.
BANDIT_PROMPTS = ("Calibrate the CREST model.", "The simulated peaks are too low.")
BANDIT_K, BANDIT_NEW_TOKENS, BANDIT_STEPS, BANDIT_LR = 8, 8, 6, 3e-2

#: The gain in mean reward (64 completions, the same seeds before and after) of 6 GRPO steps from
#: the random tiny model, model and sampling seeds 0-9, measured on a 2-core CPU with torch on one
#: thread and on two (the rounding differs, and a run's path with it):
#:   1 thread:  +0.812 +0.601 +0.394 +0.648 +0.749 +0.527 +0.806 +0.785 +0.838 +0.824
#:   2 threads: +0.812 +0.855 +0.568 +0.811 +0.860 +0.787 +0.806 +0.816 +0.838 +0.824
#: 20 runs: mean 0.748, sample std 0.129, smallest 0.394. The test needs mean - 3 std = 0.361.
#: With lr 0 or zeroed advantages the weights do not move (gain exactly 0); with the sign flipped
#: the policy learns to avoid digits (gain below 0).
BANDIT_GAINS = (0.812, 0.601, 0.394, 0.648, 0.749, 0.527, 0.806, 0.785, 0.838, 0.824,
                0.812, 0.855, 0.568, 0.811, 0.860, 0.787, 0.806, 0.816, 0.838, 0.824)
BANDIT_THRESHOLD = float(np.mean(BANDIT_GAINS) - 3 * np.std(BANDIT_GAINS, ddof=1))


def _bandit(seed: int, lr: float) -> tuple[float, float, list[float]]:
    """``(mean reward before, after, adv std per step)`` of ``BANDIT_STEPS`` GRPO steps: K samples
    per prompt from the real sampler, rewards, the trainer's group advantages, training batch and
    ``optimise``, AdamW as the trainer builds it."""
    model, tok = build_tiny(seed=seed)
    digit = torch.tensor([any(c.isdigit() for c in t) for t in tok.convert_ids_to_tokens(list(range(len(tok))))])
    probe = HFLocalPolicy(model, tok)
    prompts = [tok(f"<|im_start|>user\n{p}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]
               for p in BANDIT_PROMPTS]
    sampling = Sampling(max_new_tokens=BANDIT_NEW_TOKENS)
    config = _config(lr=lr, kl_coef=0.0, entropy_coef=0.0, group_size=BANDIT_K,
                     prompts_per_step=len(prompts), seed=seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, betas=(0.9, 0.999), eps=1e-8,
                                  weight_decay=config.weight_decay)
    ranks = Ranks.one_process(model)

    def reward(ids: list[int]) -> float:
        return float(digit[ids].float().mean()) if ids else 0.0

    def sample(rows: list[int], seeds: list[int]) -> list[Sample]:
        model.eval()
        return BatchedSampler(model, probe.stop_ids, probe.pad_id, sampling).sample([prompts[g] for g in rows], seeds)

    def evaluate() -> float:
        rows = [g for g in range(len(prompts)) for _ in range(32)]
        return float(np.mean([reward(s.ids) for s in sample(rows, [10_000 + i for i in range(len(rows))])]))

    before = evaluate()
    adv_std = []
    for step in range(1, BANDIT_STEPS + 1):
        specs = [RolloutSpec(g, k, f"prompt{g}", rollout_seed(seed, step, g, k), f"s{step}g{g}k{k}")
                 for g in range(len(prompts)) for k in range(config.group_size)]
        out = sample([s.group for s in specs], [s.seed for s in specs])
        rollouts = [Rollout(s, None, prompts[s.group] + o.ids, [0] * len(prompts[s.group]) + [1] * len(o.ids),
                            [(len(prompts[s.group]), len(prompts[s.group]) + len(o.ids))], [reward(o.ids)], 0.0,
                            list(o.logprobs)) for s, o in zip(specs, out)]
        per_turn, _ = _advantages(config, rollouts, len(prompts))
        adv_std.append(float(np.concatenate(list(per_turn.values())).std()))
        optimise(config, model, optimizer, training_batch(rollouts, per_turn), probe.pad_id, ranks)
    return before, evaluate(), adv_std


@pytest.mark.slow
def test_grpo_learns_an_easy_task():
    """Six GRPO steps raise the mean reward of the easy task by more than ``BANDIT_THRESHOLD`` (the
    measured mean gain less three standard deviations over 20 runs, 0.36; seed 0 gained 0.81).
    Breaks caught: lr 0, advantages zeroed, the advantage's sign flipped (each leaves the gain at or
    below 0)."""
    assert 0.3 < BANDIT_THRESHOLD < 0.4
    before, after, adv_std = _bandit(0, BANDIT_LR)
    assert adv_std[0] > 0.5, adv_std  # the first step's groups had different rewards (late steps may all score 1)
    assert after - before > BANDIT_THRESHOLD, (before, after)


def test_the_valid_baseline_takes_the_scale_from_the_rollouts_without_a_parse_failure():
    """``baseline: valid`` in the trainer: the members whose episode has a parse-failure turn are left out of
    the group's mean and std (and clipped by ``adv_clip``); the default is the paper's whole-group baseline."""
    from types import SimpleNamespace

    returns = [1.0, 1.1, 1.3, -0.4]
    rollouts = [_rollout(0, i, [0.0], r) for i, r in enumerate(returns)]
    for i, r in enumerate(rollouts):
        r.episode = SimpleNamespace(turns=[SimpleNamespace(kind="parse_failure" if i == 3 else "tool_call")])
    valid = np.array(returns[:3])
    per_turn, _ = _advantages(_config(advantage="episode", baseline="valid", adv_clip=3.0), rollouts, 1)
    got = np.array([per_turn[i][0] for i in range(4)])
    assert got[:3] == pytest.approx((valid - valid.mean()) / (valid.std(ddof=1) + 1e-6))
    assert got[3] == -3.0
    only, _ = _advantages(_config(advantage="episode", baseline="valid_only", adv_clip=3.0), rollouts, 1)
    assert [only[i][0] for i in range(3)] == pytest.approx(list(got[:3])) and only[3][0] == 0.0
    plain, _ = _advantages(_config(advantage="episode"), rollouts, 1)
    everyone = np.array(returns)
    assert [plain[i][0] for i in range(4)] == pytest.approx(list((everyone - everyone.mean())
                                                                 / (everyone.std(ddof=1) + 1e-6)))
