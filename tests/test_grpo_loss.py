"""The GRPO loss (train/grpo/loss.py): each piece by hand, masking down to the gradient, chunked log-probs.

Log-probs are checked against a plain ``model(...).logits`` pass of a tiny random Qwen3 (2 layers,
hidden 16, vocabulary 50), built in milliseconds.
"""

from __future__ import annotations

import math
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from hydroagent_hpc.train.grpo.loss import (
    AGGREGATIONS,
    aggregate,
    clipped_pg,
    grpo_loss,
    k3_kl,
    token_logprobs,
)

LOG = math.log


def _tiny_model(seed: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                                      num_attention_heads=2, num_key_value_heads=1, head_dim=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen3ForCausalLM(config)
    model.eval()
    return model


@pytest.fixture(scope="module")
def model() -> Qwen3ForCausalLM:
    return _tiny_model(0)


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    """Three right-padded rows of 9 tokens: 9, 6 and 4 real tokens."""
    ids = torch.randint(0, 50, (3, 9), generator=torch.Generator().manual_seed(1))
    attention = torch.ones_like(ids)
    attention[1, 6:] = 0
    attention[2, 4:] = 0
    return ids, attention


# ---------------------------------------------------------------------------------------------
# k3 KL


def test_k3_kl_by_hand() -> None:
    logp = torch.tensor([LOG(0.5), LOG(0.25), LOG(0.3)], dtype=torch.float64)
    ref = torch.tensor([LOG(0.25), LOG(0.5), LOG(0.3)], dtype=torch.float64)
    # d = log(0.25/0.5) = log 0.5: 0.5 - log 0.5 - 1 = 0.1931471805599453
    # d = log 2:                   2 - log 2 - 1   = 0.3068528194400547
    # d = 0:                       1 - 0 - 1       = 0
    expected = [0.5 - LOG(0.5) - 1, 2 - LOG(2) - 1, 0.0]
    torch.testing.assert_close(k3_kl(logp, ref), torch.tensor(expected, dtype=torch.float64), rtol=1e-12, atol=0)
    assert k3_kl(logp, ref)[0].item() == pytest.approx(0.1931471805599453, rel=1e-12)


def test_k3_kl_clamps() -> None:
    logp = torch.zeros(4, dtype=torch.float64)
    ref = torch.tensor([-5.0, 30.0, -30.0, -1e30], dtype=torch.float64)
    # d = -5 is inside [-20, 20] and exp(-5) + 5 - 1 = 4.0067... is inside [-10, 10]
    # d = 30 -> 20 -> exp(20) - 21 -> 10; d = -30 and -1e30 -> -20 -> exp(-20) + 19 -> 10
    expected = torch.tensor([math.exp(-5) + 4, 10.0, 10.0, 10.0], dtype=torch.float64)
    torch.testing.assert_close(k3_kl(logp, ref), expected, rtol=1e-12, atol=0)


def test_k3_kl_gradient_flows_through_the_policy_only() -> None:
    logp = torch.tensor([LOG(0.5)], requires_grad=True)
    ref = torch.tensor([LOG(0.25)], requires_grad=True)
    k3_kl(logp, ref).sum().backward()
    # d/dlogp (exp(ref - logp) - (ref - logp) - 1) = 1 - exp(ref - logp) = 1 - 0.5
    assert logp.grad is not None and logp.grad.item() == pytest.approx(0.5, rel=1e-6)
    assert ref.grad is None


# ---------------------------------------------------------------------------------------------
# clipped surrogate


def test_clipped_pg_by_hand() -> None:
    # ratios 0.5 (below the band), 1.0 (inside), 1.5 (above), each with A = +2 and A = -2; clip 0.2
    ratio = torch.tensor([0.5, 0.5, 1.0, 1.0, 1.5, 1.5], dtype=torch.float64)
    adv = torch.tensor([2.0, -2.0, 2.0, -2.0, 2.0, -2.0], dtype=torch.float64)
    logp = ratio.log().requires_grad_(True)
    loss, clipped = clipped_pg(logp, torch.zeros_like(logp), adv)
    # 0.5,+2: -min(1.0,  0.8*2 = 1.6)  = -1.0 unclipped    0.5,-2: -min(-1.0, -1.6) = 1.6 clipped
    # 1.0,+2: -min(2, 2)               = -2   unclipped    1.0,-2: -min(-2, -2)     = 2   unclipped
    # 1.5,+2: -min(3.0,  1.2*2 = 2.4)  = -2.4 clipped      1.5,-2: -min(-3.0, -2.4) = 3.0 unclipped
    torch.testing.assert_close(loss.detach(), torch.tensor([-1.0, 1.6, -2.0, 2.0, -2.4, 3.0], dtype=torch.float64))
    assert clipped.tolist() == [0.0, 1.0, 0.0, 0.0, 1.0, 0.0]
    # gradient: d(-rho A)/dlogp = -rho A where unclipped, 0 where the clipped branch binds
    loss.sum().backward()
    assert logp.grad is not None
    torch.testing.assert_close(logp.grad, torch.tensor([-1.0, 0.0, -2.0, 2.0, 0.0, 3.0], dtype=torch.float64))


def test_clipped_pg_asymmetric_band() -> None:
    # clip_high 0.28 (DAPO): 1.25 * 2 = 2.5 is now inside; 1.5 clips at 1.28 * 2 = 2.56; the low side keeps 0.2
    logp = torch.tensor([1.25, 1.5, 0.5], dtype=torch.float64).log()
    adv = torch.tensor([2.0, 2.0, -2.0], dtype=torch.float64)
    loss, clipped = clipped_pg(logp, torch.zeros_like(logp), adv, clip_low=0.2, clip_high=0.28)
    torch.testing.assert_close(loss, torch.tensor([-2.5, -2.56, 1.6], dtype=torch.float64))
    assert clipped.tolist() == [0.0, 1.0, 1.0]
    # the symmetric default clips 1.25 at 1.2 * 2 = 2.4
    loss, clipped = clipped_pg(logp, torch.zeros_like(logp), adv)
    assert loss[0].item() == pytest.approx(-2.4) and clipped[0].item() == 1.0


def test_clipped_pg_detaches_old_logp() -> None:
    # passing logp itself as old_logp must not cancel the gradient: rho = 1, d(-rho A)/dlogp = -A
    logp = torch.tensor([-1.0, -2.0], requires_grad=True)
    adv = torch.tensor([0.5, -3.0])
    clipped_pg(logp, logp, adv)[0].sum().backward()
    assert logp.grad is not None and logp.grad.tolist() == [-0.5, 3.0]


# ---------------------------------------------------------------------------------------------
# aggregation

VALUES = torch.tensor([[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]])
MASK = torch.tensor([[1.0, 1.0, 0.0, 0.0], [1.0, 1.0, 1.0, 0.0]])


def test_aggregations_by_hand() -> None:
    # masked tokens: row 0 -> 1 + 2 = 3 over 2 tokens, row 1 -> 5 + 6 + 7 = 18 over 3 tokens; 21 over 5
    assert aggregate(VALUES, MASK, "token-mean").item() == pytest.approx(21 / 5)  # 4.2
    assert aggregate(VALUES, MASK, "seq-mean-token-mean").item() == pytest.approx((3 / 2 + 18 / 3) / 2)  # 3.75
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=4).item() == pytest.approx(21 / (4 * 2))
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=10).item() == pytest.approx(21 / 20)
    # global counts replace the local ones
    assert aggregate(VALUES, MASK, "token-mean", total_tokens=10).item() == pytest.approx(21 / 10)
    assert aggregate(VALUES, MASK, "seq-mean-token-mean", num_sequences=4).item() == pytest.approx(7.5 / 4)
    assert aggregate(VALUES, MASK, "seq-mean-token-sum-norm", norm_length=4,
                     num_sequences=3).item() == pytest.approx(21 / 12)
    # a bool mask is the same mask
    for mode in AGGREGATIONS:
        assert aggregate(VALUES, MASK.bool(), mode, norm_length=4) == aggregate(VALUES, MASK, mode, norm_length=4)


def test_aggregation_ignores_masked_garbage_and_empty_rows() -> None:
    values = torch.tensor([[math.nan, math.inf], [3.0, -math.inf]])
    mask = torch.tensor([[0, 0], [1, 0]])
    assert aggregate(values, mask, "token-mean").item() == 3.0
    assert aggregate(values, mask, "seq-mean-token-mean").item() == 1.5  # (0 + 3/1) / 2: the empty row counts as 0
    assert aggregate(values, mask, "seq-mean-token-sum-norm", norm_length=3).item() == 0.5  # 3 / (3 * 2)
    assert aggregate(values, torch.zeros_like(mask), "token-mean").item() == 0.0


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_micro_batches_with_global_counts_sum_to_the_full_batch(mode: str) -> None:
    gen = torch.Generator().manual_seed(3)
    values = torch.randn(6, 5, generator=gen, dtype=torch.float64)
    mask = (torch.rand(6, 5, generator=gen) < 0.6).double()
    mask[4] = 0  # a row without trained tokens
    full = aggregate(values, mask, mode, norm_length=8)
    counts = dict(total_tokens=float(mask.sum()), num_sequences=6.0)
    parts = [aggregate(values[rows], mask[rows], mode, norm_length=8, **counts)
             for rows in (slice(0, 2), slice(2, 3), slice(3, 6))]
    torch.testing.assert_close(sum(parts), full, rtol=1e-12, atol=1e-12)


def test_gradient_accumulation_with_global_counts_matches_the_full_batch() -> None:
    gen = torch.Generator().manual_seed(4)
    logp = (-torch.rand(4, 6, generator=gen, dtype=torch.float64) * 3).requires_grad_(True)
    old = logp.detach() + 0.3 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    ref = logp.detach() + 0.5 * torch.randn(4, 6, generator=gen, dtype=torch.float64)
    entropy = torch.rand(4, 6, generator=gen, dtype=torch.float64)
    adv = torch.randn(4, 6, generator=gen, dtype=torch.float64)
    mask = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1], [1, 1, 0, 0, 0, 0], [0, 0, 0, 1, 0, 0]])
    kwargs = dict(kl_coef=0.05, entropy_coef=0.01)
    for mode in AGGREGATIONS:
        full = grpo_loss(logp, old, ref, entropy, adv, mask, aggregation=mode, norm_length=6, **kwargs)
        (full_grad,) = torch.autograd.grad(full.loss, logp)
        grad = torch.zeros_like(logp)
        total = torch.zeros((), dtype=torch.float64)
        for rows in (slice(0, 1), slice(1, 4)):
            part = grpo_loss(logp[rows], old[rows], ref[rows], entropy[rows], adv[rows], mask[rows], aggregation=mode,
                             norm_length=6, total_tokens=float(mask.sum()), num_sequences=4, **kwargs)
            grad += torch.autograd.grad(part.loss, logp)[0]
            total += part.loss.detach()
        torch.testing.assert_close(total, full.loss.detach(), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(grad, full_grad, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# grpo_loss


def test_grpo_loss_by_hand() -> None:
    # one PPO epoch (old = logp, rho = 1): pg = -A per token; token-mean over the 2 mask-1 tokens
    logp = torch.tensor([[LOG(0.5), LOG(0.5), -7.0]], dtype=torch.float64)
    ref = torch.tensor([[LOG(0.25), LOG(0.5), 0.0]], dtype=torch.float64)
    entropy = torch.tensor([[0.3, 0.5, 9.0]], dtype=torch.float64)
    adv = torch.tensor([[1.5, -0.5, 4.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 0]])
    parts = grpo_loss(logp, logp.detach(), ref, entropy, adv, mask, kl_coef=0.1, entropy_coef=0.01)
    pg = -(1.5 - 0.5) / 2  # -0.5
    kl = (0.5 - LOG(0.5) - 1 + 0.0) / 2  # 0.0965735902799...
    ent = (0.3 + 0.5) / 2  # 0.4
    assert parts.pg.item() == pytest.approx(pg, rel=1e-12)
    assert parts.kl.item() == pytest.approx(kl, rel=1e-12)
    assert parts.entropy.item() == pytest.approx(ent, rel=1e-12)
    assert parts.loss.item() == pytest.approx(pg + 0.1 * kl - 0.01 * ent, rel=1e-12)
    assert parts.clip_fraction.item() == 0.0 and parts.ratio_mean.item() == 1.0
    # the same with seq-mean-token-sum-norm and a budget of 8 tokens: sums over 8 * 1
    norm = grpo_loss(logp, logp.detach(), ref, entropy, adv, mask, kl_coef=0.1, entropy_coef=0.01,
                     aggregation="seq-mean-token-sum-norm", norm_length=8)
    assert norm.loss.item() == pytest.approx((-1.0 + 0.1 * 2 * kl - 0.01 * 0.8) / 8, rel=1e-12)


def test_grpo_loss_statistics_and_absent_terms() -> None:
    # ratios 1.5 and 0.5 with A = +1: the first clips (2 mask-1 tokens -> clip fraction 1/2), ratio mean 1
    logp = torch.tensor([[LOG(1.5), LOG(0.5), 5.0]], requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0]])
    parts = grpo_loss(logp, torch.zeros(1, 3), None, None, adv, torch.tensor([[1, 1, 0]]))
    assert parts.clip_fraction.item() == 0.5
    assert parts.ratio_mean.item() == pytest.approx(1.0)
    assert parts.pg.item() == pytest.approx(-(1.2 + 0.5) / 2)
    assert math.isnan(parts.kl.item()) and math.isnan(parts.entropy.item())
    assert parts.loss.requires_grad
    assert not any(t.requires_grad for t in (parts.pg, parts.kl, parts.entropy, parts.clip_fraction,
                                             parts.ratio_mean))


@pytest.mark.parametrize("mode", AGGREGATIONS)
def test_mask_zero_tokens_get_exactly_zero_gradient(mode: str) -> None:
    gen = torch.Generator().manual_seed(5)
    mask = torch.tensor([[1, 1, 1, 0, 0, 0], [0, 0, 1, 1, 0, 0]], dtype=torch.float32)
    keep = mask.bool()
    logp = -torch.rand(2, 6, generator=gen) * 4
    old = logp + 0.2 * torch.randn(2, 6, generator=gen)
    ref = logp + 0.5 * torch.randn(2, 6, generator=gen)
    entropy = torch.rand(2, 6, generator=gen)
    adv = torch.randn(2, 6, generator=gen)
    # garbage where the mask is 0, as padding may hold: impossible log-probs, infinities
    logp = torch.where(keep, logp, torch.tensor([[0, 0, 0, 50.0, -math.inf, 3.0], [-1e4, 7.0, 0, 0, 50.0, 0]]))
    ref = torch.where(keep, ref, -1e30)
    entropy = torch.where(keep, entropy, math.inf)
    logp.requires_grad_(True)
    entropy.requires_grad_(True)
    parts = grpo_loss(logp, old, ref, entropy, adv, mask, kl_coef=0.1, entropy_coef=0.01, aggregation=mode,
                      norm_length=6)
    assert torch.isfinite(parts.loss)
    parts.loss.backward()
    for grad in (logp.grad, entropy.grad):
        assert grad is not None
        assert torch.all(grad[~keep] == 0)
        assert torch.any(grad[keep] != 0)


def test_grpo_loss_errors() -> None:
    x = torch.zeros(2, 3)
    mask = torch.ones(2, 3)
    with pytest.raises(ValueError, match="ref_logp is None"):
        grpo_loss(x, x, None, x, x, mask, kl_coef=0.1)
    with pytest.raises(ValueError, match="entropy is None"):
        grpo_loss(x, x, x, None, x, mask, entropy_coef=0.01)
    with pytest.raises(ValueError, match="token-mean, seq-mean-token-mean, seq-mean-token-sum-norm"):
        grpo_loss(x, x, None, None, x, mask, aggregation="seq-mean-token-sum")
    with pytest.raises(ValueError, match="norm_length"):
        grpo_loss(x, x, None, None, x, mask, aggregation="seq-mean-token-sum-norm")
    with pytest.raises(ValueError, match="advantages has shape"):
        grpo_loss(x, x, None, None, torch.zeros(2, 1), mask)
    with pytest.raises(ValueError, match="total_tokens"):
        aggregate(x, mask, "token-mean", total_tokens=0)
    with pytest.raises(ValueError, match="same shape"):
        aggregate(x, torch.ones(3, 2), "token-mean")


# ---------------------------------------------------------------------------------------------
# token_logprobs


def _plain_logprobs(model: Qwen3ForCausalLM, ids: torch.Tensor,
                    attention: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Full [B, T, V] logits in one pass: logp[:, t] from the logits at t - 1, zero at 0 and on padding."""
    logits_logp = model(input_ids=ids, attention_mask=attention).logits.float().log_softmax(-1)
    logp = torch.zeros(ids.shape)
    entropy = torch.zeros(ids.shape)
    logp[:, 1:] = logits_logp[:, :-1].gather(-1, ids[:, 1:, None]).squeeze(-1)
    entropy[:, 1:] = -(logits_logp.exp() * logits_logp).sum(-1)[:, :-1]
    return logp * attention, entropy * attention


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_token_logprobs_match_a_plain_forward(model: Qwen3ForCausalLM,
                                              batch: tuple[torch.Tensor, torch.Tensor], chunk_size: int) -> None:
    ids, attention = batch
    with torch.no_grad():
        expected_logp, expected_entropy = _plain_logprobs(model, ids, attention)
        logp, entropy = token_logprobs(model, ids, attention, chunk_size=chunk_size)
    assert entropy is not None and logp.dtype == torch.float32 and logp.shape == ids.shape
    torch.testing.assert_close(logp, expected_logp, rtol=0, atol=1e-5)
    torch.testing.assert_close(entropy, expected_entropy, rtol=0, atol=1e-5)
    assert torch.all(logp[:, 0] == 0) and torch.all(logp[attention == 0] == 0)
    assert torch.all(entropy[attention == 0] == 0) and torch.all(logp[:, 1:][attention[:, 1:] == 1] < 0)
    _, none = token_logprobs(model, ids, attention, chunk_size=chunk_size, with_entropy=False)
    assert none is None


@pytest.mark.parametrize("chunk_size", [1, 3, 1024])
def test_token_logprobs_gradient_matches_a_plain_forward(model: Qwen3ForCausalLM,
                                                         batch: tuple[torch.Tensor, torch.Tensor],
                                                         chunk_size: int) -> None:
    # the chunks are recomputed in the backward pass (activation checkpointing): same gradients
    ids, attention = batch
    weights = torch.randn(ids.shape, generator=torch.Generator().manual_seed(6))
    params = [p for p in model.parameters() if p.requires_grad]
    expected_logp, expected_entropy = _plain_logprobs(model, ids, attention)
    expected = torch.autograd.grad((weights * expected_logp).sum() + expected_entropy.sum(), params)
    logp, entropy = token_logprobs(model, ids, attention, chunk_size=chunk_size)
    assert entropy is not None and logp.requires_grad
    actual = torch.autograd.grad((weights * logp).sum() + entropy.sum(), params)
    for a, e in zip(actual, expected):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-6)


def test_token_logprobs_rejects_bad_arguments(model: Qwen3ForCausalLM,
                                              batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    ids, attention = batch
    with pytest.raises(ValueError, match="chunk_size"):
        token_logprobs(model, ids, attention, chunk_size=0)
    with pytest.raises(ValueError, match="same shape"):
        token_logprobs(model, ids, attention[:, :5])


def test_tokens_after_the_last_trained_token_do_not_change_the_loss(model: Qwen3ForCausalLM) -> None:
    # end to end: policy log-probs and entropy from token_logprobs, a reference model for the KL
    reference = _tiny_model(1)
    ids = torch.randint(0, 50, (2, 10), generator=torch.Generator().manual_seed(7))
    attention = torch.ones_like(ids)
    attention[1, 7:] = 0  # right padding
    mask = torch.zeros(2, 10)
    mask[0, 4:8] = 1  # last trained token of row 0: 7
    mask[1, 3:6] = 1  # last trained token of row 1: 5
    adv = torch.where(mask.bool(), torch.tensor([[0.7], [-1.3]]), 0.0)

    def loss_for(tokens: torch.Tensor) -> tuple[torch.Tensor, list[torch.Tensor]]:
        logp, entropy = token_logprobs(model, tokens, attention, chunk_size=3)
        with torch.no_grad():
            ref, _ = token_logprobs(reference, tokens, attention, with_entropy=False)
        parts = grpo_loss(logp, logp.detach(), ref, entropy, adv, mask, kl_coef=0.2, entropy_coef=0.01)
        grads = torch.autograd.grad(parts.loss, list(model.parameters()))
        return parts.loss.detach(), list(grads)

    changed = ids.clone()
    changed[0, 8:] = (ids[0, 8:] + 1) % 50  # attended tokens after the last trained one
    changed[1, 6:] = (ids[1, 6:] + 7) % 50  # one attended token, then the padding
    loss, grads = loss_for(ids)
    loss_changed, grads_changed = loss_for(changed)
    assert loss.item() != 0.0
    assert torch.equal(loss, loss_changed)
    for a, b in zip(grads, grads_changed):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    # and a change at a trained position does change it
    changed[1, 5] = (ids[1, 5] + 1) % 50
    assert not torch.equal(loss_for(changed)[0], loss)
