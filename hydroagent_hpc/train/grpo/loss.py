"""The GRPO policy loss: token log-probabilities, the clipped surrogate, k3 KL, entropy, aggregation.

Pure tensor functions (docs/rl-notes.md, section 3), composed by :func:`grpo_loss`. With ``m`` the
0/1 loss mask (1 on the tokens the policy wrote), ``A`` the token advantages
(:func:`hydroagent_hpc.train.grpo.advantages.token_advantages`) and ``agg`` one of :data:`AGGREGATIONS`::

    rho  = exp(logp - logp_old)
    pg   = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)       (PPO clipped surrogate)
    kl   = exp(d) - d - 1,  d = logp_ref - logp                             (k3, verl's low_var_kl)
    H    = -sum_v p_v log p_v                                              (entropy of the next-token distribution)
    loss = agg(pg) + kl_coef * agg(kl) - entropy_coef * agg(H)

every term aggregated with the same mask and mode. :func:`token_logprobs` computes ``logp`` and
``H`` from a Hugging Face causal LM a chunk of positions at a time, so the ``[B, T, V]`` logits
never exist at once.

References: Schulman, J. et al. (2017), Proximal Policy Optimization Algorithms, arXiv 1707.06347,
eq. 7; Shao, Z. et al. (2024), DeepSeekMath, arXiv 2402.03300, eq. 3-4 (GRPO, the k3 KL term);
Schulman, J. (2020), Approximating KL Divergence, http://joschu.net/blog/kl-approx.html (k3);
Liu, Z. et al. (2025), Understanding R1-Zero-Like Training, arXiv 2503.20783 (Dr. GRPO's
constant normaliser); Yu, Q. et al. (2025), DAPO, arXiv 2503.14476 (token-level mean, asymmetric clip).

Rollouts sampled by other weights than the trainer's (an engine's bf16 kernels, or the previous
policy when the next step's rollouts are played while this step trains, ``max_staleness: 1``) are
corrected by truncated importance weights ``w = min(exp(logp - logp_behaviour), cap)`` on each
sampled token, multiplied into the policy-gradient term (:func:`truncated_importance_weights`, the
``is_weights`` of :func:`grpo_loss`); Yao, F. et al. (2025), Your Efficient RL Framework Secretly
Brings You Off-Policy RL Training, https://fengyao.notion.site/off-policy-rl (TIS).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch.utils.checkpoint import checkpoint

if TYPE_CHECKING:
    from transformers import PreTrainedModel

__all__ = ["AGGREGATIONS", "LossParts", "LogprobModel", "token_logprobs", "k3_kl", "clipped_pg", "aggregate",
           "grpo_loss", "ImportanceWeights", "truncated_importance_weights"]

#: verl's ``loss_agg_mode`` names (TRL: ``dapo``/``bnpo``, ``grpo``, ``dr_grpo``); see :func:`aggregate`.
AGGREGATIONS = ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm")

#: verl's clamps: the log-ratio and the k3 exponent to [-20, 20], the k3 value to [-10, 10].
_LOG_RATIO_CLAMP = 20.0
_KL_CLAMP = 10.0


def _chunk_logprobs(hidden: torch.Tensor, targets: torch.Tensor, lm_head: torch.nn.Module,
                    with_entropy: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    logits = lm_head(hidden).float()
    logp = torch.log_softmax(logits, dim=-1)
    token = logp.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    entropy = -(logp.exp() * logp).sum(-1) if with_entropy else None
    return token, entropy


def token_logprobs(model: PreTrainedModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, *,
                   chunk_size: int = 1024, with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
    """``(logp, entropy)``, both ``[B, T]`` float32 and aligned with ``input_ids``.

    ``logp[:, t] = log p(ids[t] | ids[<t])`` and ``entropy[:, t] = -sum_v p_v log p_v`` of the
    distribution that predicted token ``t``; both are 0 at ``t = 0`` (nothing predicts the first
    token) and wherever ``attention_mask`` is 0 (right padding). ``entropy`` is None when
    ``with_entropy`` is False.

    The decoder body (``model.get_decoder()``) runs once over the batch; the output embedding
    (``model.get_output_embeddings()``, the lm_head) then runs on ``chunk_size`` positions at a time,
    with ``log_softmax`` in float32, so only ``[B, chunk_size, V]`` logits exist at once. When a
    gradient is being recorded each chunk runs under activation checkpointing (its logits are
    recomputed in the backward pass instead of kept), so the saving holds for the loss's backward
    pass too. Sampling temperature is not applied: the log-probs are those of the raw logits.

    Works for a Hugging Face causal LM whose forward is ``lm_head(decoder(...).last_hidden_state)``
    (Qwen2/3, Llama, Mistral, ...); models that post-process the logits (Gemma 2's final logit
    soft-capping, Cohere's ``logit_scale``) are refused. The top-level ``forward`` is not called, so
    hooks registered on the model itself do not run: under FSDP2 (or DDP), wrap the model in
    :class:`LogprobModel` and shard (or wrap) that, so the root's hooks run around this function.

    Raises:
        ValueError: ``chunk_size < 1``, ``input_ids`` not ``[B, T]``, a mask of another shape, or a
            model that post-processes its logits.
    """
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if input_ids.dim() != 2 or attention_mask.shape != input_ids.shape:
        raise ValueError(f"input_ids must be [B, T] and attention_mask the same shape, got "
                         f"{tuple(input_ids.shape)} and {tuple(attention_mask.shape)}")
    config = getattr(model, "config", None)
    for attr in ("final_logit_softcapping", "logit_scale"):
        if getattr(config, attr, None) not in (None, 1.0):
            raise ValueError(f"the model's config sets {attr}; token_logprobs computes lm_head logits unchanged")

    hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask,
                                 use_cache=False).last_hidden_state
    lm_head = model.get_output_embeddings()
    n_batch, n_pos = input_ids.shape
    recompute = torch.is_grad_enabled() and (hidden.requires_grad or any(p.requires_grad for p in lm_head.parameters()))
    tokens: list[torch.Tensor] = [hidden.new_zeros((n_batch, 1), dtype=torch.float32)]
    entropies: list[torch.Tensor] = [hidden.new_zeros((n_batch, 1), dtype=torch.float32)]
    # hidden state at position t predicts token t + 1
    for start in range(0, n_pos - 1, chunk_size):
        stop = min(start + chunk_size, n_pos - 1)
        args = (hidden[:, start:stop], input_ids[:, start + 1:stop + 1], lm_head, with_entropy)
        if recompute:
            token, entropy = checkpoint(_chunk_logprobs, *args, use_reentrant=False)
        else:
            token, entropy = _chunk_logprobs(*args)
        tokens.append(token)
        if entropy is not None:
            entropies.append(entropy)

    valid = attention_mask.bool()
    logp = torch.where(valid, torch.cat(tokens, dim=1)[:, :n_pos], 0.0)
    if not with_entropy:
        return logp, None
    return logp, torch.where(valid, torch.cat(entropies, dim=1)[:, :n_pos], 0.0)


class LogprobModel(torch.nn.Module):
    """:func:`token_logprobs` of the causal LM ``lm`` as a module's ``forward``.

    FSDP2 gathers the parameters of a sharded module in a hook around its ``forward`` (and DDP
    prepares its gradient reduction there). :func:`token_logprobs` calls the decoder and the lm_head
    directly, never the model's own ``forward``; with this module as the FSDP2 root (each decoder
    layer its own unit), the root's hooks gather the embeddings, the final norm and the lm_head for
    the call and reduce their gradients after the backward pass. ``lm``'s parameter names are
    unchanged (``lm`` is a submodule), so checkpoints and state dicts are taken from ``lm`` itself.
    """

    def __init__(self, lm: torch.nn.Module) -> None:
        super().__init__()
        self.lm = lm

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, chunk_size: int = 1024,
                with_entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        lm: PreTrainedModel = self.lm  # type: ignore[assignment]
        return token_logprobs(lm, input_ids, attention_mask, chunk_size=chunk_size, with_entropy=with_entropy)


def k3_kl(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference): ``exp(d) - d - 1`` with ``d = ref_logp - logp``.

    Unbiased for the KL when tokens are sampled from the policy and never negative. As verl's
    ``low_var_kl``, ``d`` is clamped to [-20, 20] and the result to [-10, 10]. The gradient flows
    through ``logp`` only (``ref_logp`` is detached).

    Reference: Schulman, J. (2020), Approximating KL Divergence, http://joschu.net/blog/kl-approx.html;
    Shao, Z. et al. (2024), DeepSeekMath, arXiv 2402.03300, eq. 4.
    """
    delta = torch.clamp(ref_logp.detach() - logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    return torch.clamp(torch.exp(delta) - delta - 1.0, -_KL_CLAMP, _KL_CLAMP)


def clipped_pg(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, *, clip_low: float = 0.2,
               clip_high: float = 0.2) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO clipped surrogate loss and the indicator that its clipped branch was taken.

    ``rho = exp(logp - old_logp)``, ``loss = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)``.
    The indicator (float, 1.0 or 0.0) is 1 where the clipped term is strictly the smaller one, i.e.
    ``rho`` is outside the band on the side where it binds (``rho > 1 + clip_high`` with ``A > 0``,
    ``rho < 1 - clip_low`` with ``A < 0``); there the token gives no gradient. ``old_logp`` and
    ``advantages`` are detached; the log-ratio is clamped to [-20, 20] before ``exp`` as in verl
    (beyond any ratio that matters, it keeps garbage at padded positions finite).

    Reference: Schulman, J. et al. (2017), arXiv 1707.06347, eq. 7; Yu, Q. et al. (2025), DAPO,
    arXiv 2503.14476 (``clip_high != clip_low``, "clip-higher").
    """
    log_ratio = torch.clamp(logp - old_logp.detach(), -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP)
    ratio = torch.exp(log_ratio)
    adv = advantages.detach()
    unclipped = -ratio * adv
    clipped = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    return torch.maximum(unclipped, clipped), (clipped > unclipped).float()


def _positive(value: float | None, name: str) -> float | None:
    if value is not None and not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r}")
    return value


def aggregate(values: torch.Tensor, mask: torch.Tensor, mode: str, *, norm_length: int | None = None,
              total_tokens: float | None = None, num_sequences: float | None = None) -> torch.Tensor:
    """Reduce per-token ``values [B, T]`` over the tokens where ``mask`` is nonzero to a scalar.

    With ``m`` the 0/1 mask (any nonzero entry counts as 1; values where ``m = 0`` are ignored, even
    NaN or inf), ``N = total_tokens`` (default ``sum m``) and ``S = num_sequences`` (default ``B``):

    - ``token-mean``: ``sum_{i,t} m v / N``; every token weighs the same (verl's default, TRL ``dapo``).
    - ``seq-mean-token-mean``: ``sum_i (sum_t m v / max(sum_t m, 1)) / S``; a row without tokens counts
      as 0 (original GRPO, TRL ``grpo``).
    - ``seq-mean-token-sum-norm``: ``sum_{i,t} m v / (norm_length * S)`` (Dr. GRPO, TRL ``dr_grpo``);
      ``norm_length`` is a fixed budget such as the episode's token limit, not the padded length of
      this batch, so the weight of a token does not depend on its batch. (Some verl versions divide by
      ``T`` only, without ``S``: a constant factor.)

    ``total_tokens`` and ``num_sequences`` are for gradient accumulation and several ranks: given the
    counts over all micro-batches and ranks of one optimizer step, the sum of the micro-batches'
    results equals the result on the whole batch, so accumulation does not change the loss.

    Reference: docs/rl-notes.md section 3; Liu, Z. et al. (2025), arXiv 2503.20783 (Dr. GRPO);
    Yu, Q. et al. (2025), arXiv 2503.14476, section 3.3.

    Raises:
        ValueError: an unknown ``mode`` (the modes are listed), ``values`` not 2-D or ``mask`` of
            another shape, ``norm_length`` missing for ``seq-mean-token-sum-norm``, or a count <= 0.
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation {mode!r}; the aggregations are {', '.join(AGGREGATIONS)}")
    if values.dim() != 2 or mask.shape != values.shape:
        raise ValueError(f"values must be [B, T] and mask the same shape, got {tuple(values.shape)} "
                         f"and {tuple(mask.shape)}")
    _positive(total_tokens, "total_tokens")
    _positive(num_sequences, "num_sequences")
    keep = mask.bool()
    masked = torch.where(keep, values, torch.zeros((), dtype=values.dtype, device=values.device))
    sequences = float(values.shape[0]) if num_sequences is None else num_sequences
    if mode == "token-mean":
        denominator = keep.sum().to(values.dtype).clamp(min=1) if total_tokens is None else total_tokens
        return masked.sum() / denominator
    if mode == "seq-mean-token-mean":
        per_row = masked.sum(dim=1) / keep.sum(dim=1).to(values.dtype).clamp(min=1)
        return per_row.sum() / sequences
    if norm_length is None:
        raise ValueError("seq-mean-token-sum-norm needs norm_length, a fixed token budget (not the padded length)")
    _positive(norm_length, "norm_length")
    return masked.sum() / (norm_length * sequences)


def _masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """``sum(m v) / max(sum m, 1)`` on this batch only (for statistics, never the loss)."""
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(keep, values, zero).sum() / keep.sum().to(values.dtype).clamp(min=1)


@dataclass
class LossParts:
    """The loss of one (micro-)batch and its parts, all scalars.

    ``loss`` carries the gradient; the rest are detached. ``pg``, ``kl`` and ``entropy`` are aggregated
    as the loss is (``kl`` and ``entropy`` are NaN when their input was not given); ``clip_fraction``
    and ``ratio_mean`` are plain means over this batch's mask-1 tokens.
    """

    loss: torch.Tensor
    pg: torch.Tensor
    kl: torch.Tensor
    entropy: torch.Tensor
    clip_fraction: torch.Tensor
    ratio_mean: torch.Tensor


@dataclass
class ImportanceWeights:
    """Truncated importance weights of the sampled tokens and what they were truncated from.

    ``weights`` is ``[B, T]``: ``min(ratio, cap)`` where the mask is 1, exactly 1 elsewhere.
    ``ratio_sum``, ``ratio_max`` and ``truncated`` are over the mask-1 tokens: the sum and the largest
    of the untruncated ratios, and how many exceeded ``cap``.
    """

    weights: torch.Tensor
    ratio_sum: float
    ratio_max: float
    truncated: int


def truncated_importance_weights(logp: torch.Tensor, behaviour_logp: torch.Tensor, mask: torch.Tensor,
                                 cap: float) -> ImportanceWeights:
    """``w = min(exp(logp - behaviour_logp), cap)`` on the mask-1 tokens (1 elsewhere), detached.

    ``logp`` is the trainer's log-prob of each sampled token under the weights being trained,
    ``behaviour_logp`` the sampler's (the weights that sampled it); the ratio corrects the policy
    gradient for tokens sampled by another policy and the cap bounds its variance (TIS, module
    docstring). Tokens where the trainer's policy is less likely than the sampler's get ``w < 1``, and
    are not floored.

    Raises:
        ValueError: ``cap`` not > 0, or shapes that differ from ``mask``'s.
    """
    _positive(cap, "cap")
    if logp.shape != mask.shape or behaviour_logp.shape != mask.shape:
        raise ValueError(f"logp {tuple(logp.shape)} and behaviour_logp {tuple(behaviour_logp.shape)} must have the "
                         f"mask's shape {tuple(mask.shape)}")
    keep = mask.bool()
    with torch.no_grad():
        ratio = torch.exp(logp.detach().float() - behaviour_logp.float())[keep]
        weights = torch.ones_like(mask, dtype=torch.float32)
        weights[keep] = ratio.clamp(max=cap)
    return ImportanceWeights(weights, float(ratio.sum()), float(ratio.max()) if ratio.numel() else 0.0,
                             int((ratio > cap).sum()))


def grpo_loss(logp: torch.Tensor, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
              entropy: torch.Tensor | None, advantages: torch.Tensor, mask: torch.Tensor, *,
              clip_low: float = 0.2, clip_high: float = 0.2, kl_coef: float = 0.0, entropy_coef: float = 0.0,
              aggregation: str = "token-mean", norm_length: int | None = None, total_tokens: float | None = None,
              num_sequences: float | None = None, is_weights: torch.Tensor | None = None) -> LossParts:
    """``loss = agg(pg) + kl_coef * agg(k3_kl) - entropy_coef * agg(H)`` (module docstring).

    All tensors are ``[B, T]`` and aligned with the token sequence (as :func:`token_logprobs` returns
    them); ``mask`` is 0/1 (float or bool), ``advantages`` per token. ``old_logp`` is the detached
    ``logp`` itself for one PPO epoch (``rho = 1``) or the log-probs the generator sampled with.
    ``aggregation``, ``norm_length``, ``total_tokens`` and ``num_sequences`` are those of
    :func:`aggregate`, applied to every term. A term whose coefficient is 0 is left out of ``loss``
    (its value is still reported when its input is given). ``is_weights`` (``[B, T]``, detached): the
    truncated importance weights of :func:`truncated_importance_weights`, multiplied into each token's
    advantage, so they scale the policy-gradient term only (not the KL or the entropy).

    Reference: Shao, Z. et al. (2024), DeepSeekMath, arXiv 2402.03300, eq. 3; docs/rl-notes.md section 3.

    Raises:
        ValueError: ``kl_coef != 0`` without ``ref_logp``, ``entropy_coef != 0`` without ``entropy``,
            a tensor whose shape differs from ``mask``'s, or an :func:`aggregate` error.
    """
    if kl_coef != 0 and ref_logp is None:
        raise ValueError(f"kl_coef is {kl_coef} but no reference log-probs were given (ref_logp is None)")
    if entropy_coef != 0 and entropy is None:
        raise ValueError(f"entropy_coef is {entropy_coef} but no entropy was given (entropy is None)")
    named = {"logp": logp, "old_logp": old_logp, "ref_logp": ref_logp, "entropy": entropy, "advantages": advantages,
             "is_weights": is_weights}
    for name, tensor in named.items():
        if tensor is not None and tensor.shape != mask.shape:
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}, the mask {tuple(mask.shape)}")

    def agg(values: torch.Tensor) -> torch.Tensor:
        return aggregate(values, mask, aggregation, norm_length=norm_length, total_tokens=total_tokens,
                         num_sequences=num_sequences)

    if is_weights is not None:
        advantages = advantages * is_weights.detach().to(advantages.dtype)
    per_token, clipped = clipped_pg(logp, old_logp, advantages, clip_low=clip_low, clip_high=clip_high)
    pg = agg(per_token)
    loss = pg
    nan = torch.full((), float("nan"), dtype=pg.dtype, device=pg.device)
    kl, ent = nan, nan
    if ref_logp is not None:
        with torch.set_grad_enabled(torch.is_grad_enabled() and kl_coef != 0):
            kl = agg(k3_kl(logp, ref_logp))
        if kl_coef != 0:
            loss = loss + kl_coef * kl
    if entropy is not None:
        with torch.set_grad_enabled(torch.is_grad_enabled() and entropy_coef != 0):
            ent = agg(entropy)
        if entropy_coef != 0:
            loss = loss - entropy_coef * ent

    keep = mask.bool()
    with torch.no_grad():
        ratio = torch.exp(torch.clamp(logp - old_logp, -_LOG_RATIO_CLAMP, _LOG_RATIO_CLAMP))
        return LossParts(loss=loss, pg=pg.detach(), kl=kl.detach(), entropy=ent.detach(),
                         clip_fraction=_masked_mean(clipped, keep), ratio_mean=_masked_mean(ratio, keep))
