"""What a GRPO step costs: its parts measured on one device, and the step they add up to.

A GRPO step (:mod:`hydroagent_hpc.train.grpo.trainer`) samples ``prompts x K`` episodes, each a chain of
assistant turns and tool replies, and then trains on every episode's tokens. Its device time has
three parts, each measured here with the trainer's own code on random weights (the cost of a step
does not depend on what the weights say, only on the token counts, which :class:`EpisodeShape`
fixes):

* **prefill** (:func:`measure_prefill`): a forward pass without gradient over ``batch x length``
  new tokens (the last position's logits only, as the sampler asks for them): the first prompt of
  every rollout, and each turn's tool reply appended to a cached history (the sampler's prefix
  cache, :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler`).
* **decode** (:func:`measure_decode`): one sampled token for every row of a batch, with the KV cache
  of a context of a given length, through :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler`
  (temperature 1.0, top-p 0.95, as the paper samples). Timed as the difference between
  ``new_tokens + 1`` and 1 sampled tokens, so the prompt's prefill cancels out.
* **train** (:func:`measure_train`): one optimizer step of the GRPO loss on ``micro`` sequences: the
  policy's token log-probs and entropy with gradient (:func:`~hydroagent_hpc.train.grpo.loss.token_logprobs`,
  chunked), the frozen reference's log-probs without, the loss (k3 KL, entropy bonus, token-mean,
  :func:`~hydroagent_hpc.train.grpo.loss.grpo_loss`), backward, clipping at 1.0 and AdamW.

:func:`estimate_step` adds them up for a step of ``episodes`` rollouts of ``turns`` turns each::

    c_t       = prompt + t (turn + tool)                     context before turn t (t = 0 .. turns - 1)
    prefill   = episodes (prompt + turns tool) / prefill_tps / engines
    decode    = sum_t turn decode_s(c_t)
    generate  = prefill + decode
    train     = episodes L train_s(L) / gpus                L = prompt + turns (turn + tool)
    simulate  = episodes sims_per_episode sim_s / sim_slots
    step      = generate + train + max(0, simulate - generate)

with ``decode_s(c)`` the decode step time at batch ``episodes / engines`` (each of ``engines``
devices decodes its share of the rollouts at once), interpolated linearly between the two measured
context lengths (attention's cost grows about linearly with the context), and ``train_s(L)`` the
measured seconds per trained token scaled to the episode's length by the model FLOPs per token
(:func:`~hydroagent_hpc.train.measure.throughput.flops_per_token`).
The simulation overlaps generation (the asynchronous rollout engine: a rollout's simulation runs
while the others generate), so only the part longer than generation adds to the step. Training on
``gpus`` devices is taken as ideally parallel (FSDP's gathers are not counted): the estimate is a
lower bound of what a real step costs, to compare with a measured one.

Worst case by default: every episode runs all its turns (the paper's cap, 50); real episodes stop
early at the target NSE or after 5 evaluations without improvement.

**The layout model** (issue 33; :func:`estimate_layout`, :func:`paper_layouts`, :func:`paper_costs`) replaces
that formula's lock-step generation with the step played as events (:func:`simulate_rollouts`): each
episode alternates its own decoded turns and its own simulations (so these sit on its critical path:
25 of them at 1 s add 25 s to a step even on 32 free slots), on the engine of its group, batched
continuously (an engine) or statically (the in-process sampler, where a batch waits for its slowest
member: convoying). It adds the training (:func:`train_s_per_token_roofline` or a measured value), the
weight sync (bytes over the links per bucket, or through the disk) and, colocated, each engine's sleep
and wake; with one-step overlap the training hides in the engines' idle time. Its documented defaults
reproduce the audit's hand numbers (tests/test_grpo_throughput.py) and give, for the paper's step on 4
H100s: ~24 min as the audit found the code, ~5 min with the engine on its own GPU, ~2.3 min colocated,
~1.8 min colocated with overlap (``python -m hydroagent_hpc.bench.train --grpo --layouts``).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from transformers import PreTrainedModel

log = logging.getLogger(__name__)

__all__ = ["EpisodeShape", "GRPOStepParts", "measure_prefill", "measure_decode", "measure_train", "measure_parts",
           "estimate_step", "DecodeCost", "PrefillCost", "StepCosts", "Layout", "RolloutTimes", "paper_costs",
           "paper_layouts", "simulate_rollouts", "simulation_turns", "estimate_layout", "layout_table",
           "train_s_per_token_roofline", "measure_sleep_wake", "measure_weight_sync"]


@dataclass(frozen=True)
class EpisodeShape:
    """The token counts of the estimated step (assumptions, each a command-line flag of the benchmark).

    ``prompt``: the system and task prompt; ``turn``: assistant tokens per turn (a short diagnosis and
    one tool call); ``tool``: tokens of each tool reply (the simulator's diagnostics); ``turns``:
    assistant turns per episode; ``sims_per_episode``: simulator runs per episode."""

    episodes: int = 32
    prompt: int = 1500
    turn: int = 150
    tool: int = 250
    turns: int = 50
    sims_per_episode: int = 25

    def __post_init__(self) -> None:
        for name, value in asdict(self).items():
            if value < (0 if name == "sims_per_episode" else 1):
                raise ValueError(f"EpisodeShape.{name}={value}: must be at least "
                                 f"{0 if name == 'sims_per_episode' else 1}")

    @property
    def tokens(self) -> int:
        """Tokens of one whole episode."""
        return self.prompt + self.turns * (self.turn + self.tool)


@dataclass(frozen=True)
class GRPOStepParts:
    """Measured costs on one device (seconds, tokens per second)."""

    device: str
    dtype: str
    params: int
    prefill_tps: float        # prefill tokens per second (batch x length new tokens, no gradient)
    decode_batch: int         # rows of the decode measurements
    decode_ctx: tuple[int, int]   # the two context lengths of the decode measurements
    decode_s: tuple[float, float]  # seconds per decode step at those lengths
    train_seq_len: int
    train_s_per_token: float  # one GRPO optimizer step's seconds per trained token, at train_seq_len
    peak_memory_mb: float
    matmul_params: int        # for the attention term when the episode is longer than train_seq_len
    layers: int
    attn_width: int           # heads x head_dim

    def train_at(self, seq_len: int) -> float:
        """Seconds per trained token at ``seq_len``: the measured value scaled by the model FLOPs per
        token (:func:`~hydroagent_hpc.train.measure.throughput.flops_per_token`: its attention term grows with
        the length)."""
        from hydroagent_hpc.train.measure.throughput import flops_per_token

        def f(s: int) -> float:
            return flops_per_token(self.matmul_params, self.layers, 1, self.attn_width, s)

        return self.train_s_per_token * f(seq_len) / f(self.train_seq_len)

    def decode_at(self, ctx: float) -> float:
        """Seconds per decode step at context ``ctx``: linear through the two measurements, never falling
        with the context (a longer context costs at least as much; timing noise can say otherwise) and never
        below the smaller of them."""
        (c0, c1), (s0, s1) = self.decode_ctx, self.decode_s
        slope = max(0.0, (s1 - s0) / (c1 - c0)) if c1 != c0 else 0.0
        return max(min(s0, s1), s0 + slope * (ctx - c0))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    """The fastest of ``repeats`` timed calls of ``fn`` (after one untimed call)."""
    fn()
    best = math.inf
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        best = min(best, time.perf_counter() - t0)
    return best


def _random_ids(batch: int, length: int, vocab: int, device: torch.device, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    # ids from 1: 0 is the padding id of the decode measurement
    return torch.randint(1, vocab, (batch, length), generator=gen).to(device)


def measure_prefill(model: PreTrainedModel, *, batch: int, length: int, repeats: int = 2) -> float:
    """Prefill tokens per second: a forward pass without gradient over ``batch x length`` tokens."""
    device = next(model.parameters()).device
    ids = _random_ids(batch, length, int(model.config.vocab_size), device)
    model.eval()

    def forward() -> None:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False, logits_to_keep=1)  # as the sampler's prefill: the last logits only

    return batch * length / _timed(forward, device, repeats)


def measure_decode(model: PreTrainedModel, *, batch: int, ctx: int, new_tokens: int, repeats: int = 2) -> float:
    """Seconds per decode step of ``batch`` rows at context ``ctx``, through the rollout sampler."""
    from hydroagent_hpc.train.generation.sampler import BatchedSampler, Sampling

    if new_tokens < 1:
        raise ValueError(f"new_tokens={new_tokens}: must be at least 1")
    device = next(model.parameters()).device
    model.eval()
    prompts = _random_ids(batch, ctx, int(model.config.vocab_size), device).tolist()
    seeds = list(range(batch))

    def sample(n: int) -> Callable[[], object]:
        sampler = BatchedSampler(model, stop_ids=(), pad_id=0, sampling=Sampling(max_new_tokens=n), max_batch=batch)
        return lambda: sampler.sample(prompts, seeds)

    # the difference of two timings: on a loaded machine the short run can time slower than the long one, so
    # the pair is timed again with more repeats (the fastest of each) before falling back to an upper bound
    with torch.no_grad():
        for attempt in range(3):
            long_run = _timed(sample(new_tokens + 1), device, repeats * 2**attempt)
            short_run = _timed(sample(1), device, repeats * 2**attempt)
            if long_run > short_run:
                return (long_run - short_run) / new_tokens
    log.warning("decode at batch %d, context %d: %d more tokens never timed slower than 1 (a loaded machine?); "
                "reporting the whole run per token, an upper bound", batch, ctx, new_tokens)
    return long_run / (new_tokens + 1)


def measure_train(model: PreTrainedModel, reference: PreTrainedModel, *, seq_len: int, micro: int = 1,
                  repeats: int = 2, kl_coef: float = 0.2, entropy_coef: float = 0.01, chunk: int = 1024,
                  lr: float = 1e-6) -> float:
    """Seconds per trained token of one GRPO optimizer step on ``micro`` sequences of ``seq_len`` tokens
    (module docstring); every token counts as an assistant token (mask 1), advantages are random."""
    from hydroagent_hpc.train.grpo.loss import grpo_loss, token_logprobs

    device = next(model.parameters()).device
    model.train()
    model.config.use_cache = False
    reference.eval()
    ids = _random_ids(micro, seq_len, int(model.config.vocab_size), device, seed=1)
    mask = torch.ones_like(ids)
    gen = torch.Generator(device="cpu").manual_seed(2)
    advantages = torch.randn((micro, 1), generator=gen).expand(micro, seq_len).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=device.type == "cuda")

    def step() -> None:
        with torch.no_grad():
            ref_logp, _ = token_logprobs(reference, ids, mask, chunk_size=chunk, with_entropy=False)
        logp, entropy = token_logprobs(model, ids, mask, chunk_size=chunk, with_entropy=True)
        parts = grpo_loss(logp, logp.detach(), ref_logp, entropy, advantages, mask.float(), kl_coef=kl_coef,
                          entropy_coef=entropy_coef)
        parts.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return _timed(step, device, repeats) / (micro * seq_len)


def measure_parts(model: PreTrainedModel, reference: PreTrainedModel, *, prefill_batch: int, prefill_len: int,
                  decode_batch: int, decode_ctx: tuple[int, int], decode_tokens: int, train_seq_len: int,
                  train_micro: int = 1, repeats: int = 2) -> GRPOStepParts:
    """Measure the three parts on ``model``'s device (``reference``: a frozen copy, on the same device)."""
    from hydroagent_hpc.train.measure.throughput import matmul_params, peak_rss_mb

    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.reset_peak_memory_stats(device)
    prefill = measure_prefill(model, batch=prefill_batch, length=prefill_len, repeats=repeats)
    decode = tuple(measure_decode(model, batch=decode_batch, ctx=c, new_tokens=decode_tokens, repeats=repeats)
                   for c in decode_ctx)
    if cuda:
        torch.cuda.empty_cache()
    train = measure_train(model, reference, seq_len=train_seq_len, micro=train_micro, repeats=repeats)
    cfg = model.config
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    return GRPOStepParts(
        device=torch.cuda.get_device_name(device) if cuda else "cpu",
        dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
        params=sum(p.numel() for p in model.parameters()), prefill_tps=prefill, decode_batch=decode_batch,
        decode_ctx=(int(decode_ctx[0]), int(decode_ctx[1])), decode_s=(decode[0], decode[1]),
        train_seq_len=train_seq_len, train_s_per_token=train,
        peak_memory_mb=torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_rss_mb(),
        matmul_params=matmul_params(model), layers=int(cfg.num_hidden_layers),
        attn_width=int(cfg.num_attention_heads) * head_dim)


def estimate_step(parts: GRPOStepParts, shape: EpisodeShape, *, gpus: int = 1, engines: int = 1,
                  sim_s_per_run: float = 0.0, sim_slots: int = 32) -> dict[str, float]:
    """The step time of ``shape`` from measured ``parts`` (the formula in the module docstring).

    ``gpus``: devices that train (FSDP, taken as ideally parallel); ``engines``: devices that generate,
    each for ``episodes / engines`` rollouts (its decode batch, which is the one measured when
    ``parts.decode_batch`` equals it); ``sim_s_per_run`` and ``sim_slots``: one simulator run's
    seconds and the runs in flight. Returns the parts and the total, in seconds.
    """
    if gpus < 1 or engines < 1 or sim_slots < 1:
        raise ValueError("gpus, engines and sim_slots must be at least 1")
    n = shape.episodes
    prefill = n * (shape.prompt + shape.turns * shape.tool) / parts.prefill_tps / engines
    decode = sum(shape.turn * parts.decode_at(shape.prompt + t * (shape.turn + shape.tool))
                 for t in range(shape.turns))
    generate = prefill + decode
    train = n * shape.tokens * parts.train_at(shape.tokens) / gpus
    simulate = n * shape.sims_per_episode * sim_s_per_run / sim_slots
    step = generate + train + max(0.0, simulate - generate)
    return {"prefill_s": prefill, "decode_s": decode, "generate_s": generate, "train_s": train,
            "simulate_s": simulate, "step_s": step,
            "episode_tokens": float(shape.tokens)}


# ---------------------------------------------------------------------------------------------
# Layouts: which GPUs generate, how the weights reach them, and the step played as events
#
# The formula of :func:`estimate_step` takes every episode in lock-step, hides the simulations behind
# the generation and leaves out the weight sync. The layout model below plays the step instead
# (:func:`simulate_rollouts`): each episode alternates its own turns (decoded by its group's engine)
# and its own simulations (on the shared slots), so the simulations an episode waits for sit on its
# critical path; an engine either batches continuously (a row joins at the next decode step and leaves
# when its turn ends, as SGLang and vLLM do) or statically (a batch is decoded until its longest row
# ends, as the in-process sampler does: the rows that ended first wait, convoying); and
# :func:`estimate_layout` adds the training, the weight sync and the sleep/wake of each layout.

#: NVIDIA H100 SXM: HBM3 bytes per second and dense BF16 FLOP/s (datasheet; the audit's figures).
H100_HBM_BYTES_PER_S = 3.35e12
H100_BF16_FLOPS = 989e12
#: Qwen3-4B (model card): parameters, layers, attention width (32 heads x 128), key/value bytes per token
#: in BF16 (36 layers x K and V x 8 KV heads x 128 x 2 bytes = 144 KiB).
QWEN3_4B_PARAMS = 4.02e9
QWEN3_4B_LAYERS = 36
QWEN3_4B_ATTN_WIDTH = 32 * 128
QWEN3_4B_KV_BYTES = 36 * 2 * 8 * 128 * 2


@dataclass(frozen=True)
class DecodeCost:
    """Seconds of one decode step of an engine: ``fixed_s + per_row_s x rows + per_ctx_token_s x (the
    rows' contexts summed)``: reading the weights (and the launch floor) once per step, and each row's
    keys and values (the KV cache) once per step."""

    fixed_s: float
    per_row_s: float = 0.0
    per_ctx_token_s: float = 0.0

    def step(self, rows: int, ctx_sum: float) -> float:
        return self.fixed_s + self.per_row_s * rows + self.per_ctx_token_s * ctx_sum

    @classmethod
    def roofline(cls, weight_bytes: float, kv_bytes_per_token: float, hbm_bytes_per_s: float = H100_HBM_BYTES_PER_S,
                 efficiency: float = 0.75, floor_s: float = 1e-3) -> DecodeCost:
        """Memory-bound decode: the weights and every row's KV cache read once per step at ``efficiency``
        of the HBM bandwidth, plus ``floor_s`` (launch overhead). The audit's assumptions: 0.75 (vLLM's
        single-stream decode reaches ~77 % of the roofline) and 1 ms."""
        bw = efficiency * hbm_bytes_per_s
        return cls(weight_bytes / bw + floor_s, 0.0, kv_bytes_per_token / bw)

    @classmethod
    def fit(cls, points: Sequence[tuple[int, float, float]]) -> DecodeCost:
        """The cost through measured decode steps ``(batch, context, seconds)`` (least squares; with one
        batch size the per-row term cannot be told from the fixed one and is 0). Negative terms (timing
        noise) are dropped and the rest refitted."""
        import numpy as np

        if len(points) < 2:
            raise ValueError("fit a decode cost to at least 2 measured (batch, context, seconds) points")
        b = np.array([p[0] for p in points], dtype=float)
        c = np.array([p[1] for p in points], dtype=float)
        t = np.array([p[2] for p in points], dtype=float)
        names = ["fixed_s", "per_row_s", "per_ctx_token_s"]
        columns = {"fixed_s": np.ones_like(b), "per_row_s": b, "per_ctx_token_s": b * c}
        use = [n for n in names if n != "per_row_s" or len(set(b.tolist())) > 1]
        while True:
            coef, *_ = np.linalg.lstsq(np.stack([columns[n] for n in use], axis=1), t, rcond=None)
            values = dict(zip(use, (float(x) for x in coef)))
            negative = [n for n in use if values[n] < 0 and n != "fixed_s"]
            if not negative:
                break
            use.remove(negative[0])
        return cls(max(values.get("fixed_s", 0.0), 0.0), values.get("per_row_s", 0.0),
                   values.get("per_ctx_token_s", 0.0))


@dataclass(frozen=True)
class PrefillCost:
    """Seconds to prefill ``new`` tokens appended to a cached context of ``ctx``:
    ``new x (per_token_s + per_ctx_token_s x (ctx + new / 2))`` (the matrix products, then attention
    over the context each new token sees)."""

    per_token_s: float
    per_ctx_token_s: float = 0.0

    def seconds(self, new: int, ctx: float) -> float:
        return new * (self.per_token_s + self.per_ctx_token_s * (ctx + new / 2))

    @classmethod
    def roofline(cls, params: float, layers: int, attn_width: int, peak_flops: float = H100_BF16_FLOPS,
                 mfu: float = 0.5) -> PrefillCost:
        """Compute-bound prefill: ``2 N + 4 L width ctx`` FLOPs per new token at ``mfu`` of the peak."""
        rate = peak_flops * mfu
        return cls(2 * params / rate, 4 * layers * attn_width / rate)


def train_s_per_token_roofline(params: float, layers: int, attn_width: int, seq_len: int,
                               peak_flops: float = H100_BF16_FLOPS, mfu: float = 0.35) -> float:
    """Seconds per trained token of a GRPO step on one GPU: 5 forward passes' FLOPs (forward and backward
    count 3, the activation-checkpointing recompute 1, the reference model's forward 1), a forward being
    ``2 N + 2 L width S`` (causal attention at length ``S``), at ``mfu`` of the peak (torchtitan reports
    33-39 % for Llama 3.1 8B with FSDP on H100)."""
    forward = 2 * params + 2 * layers * attn_width * seq_len
    return 5 * forward / (peak_flops * mfu)


@dataclass(frozen=True)
class StepCosts:
    """What a step's parts cost besides the episode shape (:func:`paper_costs` holds the documented defaults).

    ``train_s_per_token``: one GPU's seconds per trained token at the episode's length. The weight sync
    in memory: each of ``ceil(weight_bytes / sync_bucket_bytes)`` buckets gathered from the FSDP shards
    (``(G - 1) / G`` of it over the links at ``link_bytes_per_s``) and handed to the engine (a device copy
    at ``copy_bytes_per_s`` when the engine shares the GPU, a transfer over the links otherwise) with
    ``sync_per_bucket_s`` of call overhead; through the disk: ``disk_sync_s`` (``save_pretrained`` and the
    engine's reload). ``sleep_s`` / ``wake_s``: a colocated engine releasing and taking back its memory."""

    decode: DecodeCost
    prefill: PrefillCost
    train_s_per_token: float
    weight_bytes: float
    link_bytes_per_s: float = 360e9
    copy_bytes_per_s: float = 1.5e12
    sync_bucket_bytes: float = float(2**30)
    sync_per_bucket_s: float = 5e-3
    disk_sync_s: float = 25.0
    sleep_s: float = 1.0
    wake_s: float = 2.0
    sim_s: float = 1.0
    sim_slots: int = 32
    engine_max_batch: int = 256
    source: str = "documented defaults"

    def memory_sync_s(self, gather_ranks: int, same_gpu: bool) -> float:
        """The in-memory weight sync (class doc) from ``gather_ranks`` FSDP shards."""
        buckets = math.ceil(self.weight_bytes / self.sync_bucket_bytes)
        gather = self.weight_bytes * (gather_ranks - 1) / gather_ranks / self.link_bytes_per_s
        hand = self.weight_bytes / (self.copy_bytes_per_s if same_gpu else self.link_bytes_per_s)
        return buckets * self.sync_per_bucket_s + gather + hand

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def paper_costs(shape: EpisodeShape | None = None, **over: Any) -> StepCosts:
    """The documented default parts for Qwen3-4B on H100 SXM (the audit's section 4 and its public figures):
    roofline decode (75 % of 3.35 TB/s, 1 ms floor), prefill at 50 % MFU, training at 35 % MFU with
    activation checkpointing and the reference, BF16 weights (8.04 GB) synced in 1 GiB buckets over 360 GB/s
    links (NCCL's all-gather bus bandwidth on NVLink 4), 25 s for a sync through the disk (the audit's
    10-40 s with SGLang), sleep 1 s and wake 2 s (assumed: to be measured), 1 s simulations on 32 slots.
    ``over`` replaces any field."""
    s = shape or EpisodeShape()
    weights = 2 * QWEN3_4B_PARAMS
    base = StepCosts(decode=DecodeCost.roofline(weights, QWEN3_4B_KV_BYTES),
                     prefill=PrefillCost.roofline(QWEN3_4B_PARAMS, QWEN3_4B_LAYERS, QWEN3_4B_ATTN_WIDTH),
                     train_s_per_token=train_s_per_token_roofline(QWEN3_4B_PARAMS, QWEN3_4B_LAYERS,
                                                                  QWEN3_4B_ATTN_WIDTH, s.tokens),
                     weight_bytes=weights)
    return replace(base, **over)


@dataclass(frozen=True)
class Layout:
    """Where a step runs. ``engines`` GPUs generate and ``trainers`` train: on the same GPUs when
    ``colocated`` (an engine on every trainer GPU, asleep while it trains), else on their own.
    ``overlap``: the next step's rollouts run while this step trains (colocated, engines kept awake: one
    step of staleness). ``sync``: ``memory`` or ``disk``. ``batching``: ``continuous`` (an engine) or
    ``static`` (the in-process sampler). ``decode_tokens_per_turn``: every turn decodes this many tokens
    whatever it writes (SGLang as coded, ``ignore_eos`` with 1,024 new tokens: audit F6)."""

    name: str
    engines: int
    trainers: int
    colocated: bool = False
    overlap: bool = False
    sync: str = "memory"
    batching: str = "continuous"
    decode_tokens_per_turn: int | None = None

    def __post_init__(self) -> None:
        if self.engines < 1 or self.trainers < 1:
            raise ValueError(f"layout {self.name!r}: engines and trainers must be at least 1")
        if self.colocated and self.engines != self.trainers:
            raise ValueError(f"layout {self.name!r}: colocated means one engine on each trainer GPU")
        if self.overlap and not self.colocated:
            raise ValueError(f"layout {self.name!r}: overlap is modelled for the colocated layout only")
        if self.sync not in ("memory", "disk") or self.batching not in ("continuous", "static"):
            raise ValueError(f"layout {self.name!r}: sync is memory or disk, batching continuous or static")

    @property
    def gpus(self) -> int:
        return self.trainers if self.colocated else self.trainers + self.engines


def paper_layouts(gpus: int = 4) -> tuple[Layout, ...]:
    """The layouts compared on ``gpus`` GPUs: the audit's code (one SGLang GPU fed through the disk, every turn
    decoding 1,024 tokens, one batch at a time: F6, F7),
    the engine on its own GPU with the first-contact fixes (weights through the disk, then in memory),
    colocated, and colocated with one-step overlap."""
    return (Layout("engine on its own GPU, as coded (SGLang, ignore_eos)", 1, gpus - 1, sync="disk",
                   batching="static", decode_tokens_per_turn=1024),
            Layout("engine on its own GPU, weights through the disk", 1, gpus - 1, sync="disk"),
            Layout("engine on its own GPU, weights in memory", 1, gpus - 1),
            Layout("colocated", gpus, gpus, colocated=True),
            Layout("colocated + one-step overlap", gpus, gpus, colocated=True, overlap=True))


@dataclass(frozen=True)
class RolloutTimes:
    """One step's rollouts played as events (:func:`simulate_rollouts`); seconds."""

    wall_s: float                      # the last episode's end
    engine_busy_s: tuple[float, ...]   # per engine: its decode steps (prefill included)
    prefill_s: float                   # of it, prefill (all engines)
    gpu_wait_s: float                  # per episode, mean: queued for its engine (a batch in progress, convoying)
    sim_wait_s: float                  # per episode, mean: waiting for a simulation slot
    simulate_s: float                  # per episode, mean: its own simulations
    decode_steps: int                  # all engines

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def _turn_lengths(shape: EpisodeShape, cv: float, seed: int, fixed: int | None) -> list[list[int]]:
    """Decode tokens of each episode's turns: ``fixed``, or ``shape.turn`` with a lognormal spread of
    coefficient of variation ``cv`` (seeded)."""
    if fixed is not None:
        return [[int(fixed)] * shape.turns for _ in range(shape.episodes)]
    if cv <= 0:
        return [[shape.turn] * shape.turns for _ in range(shape.episodes)]
    import numpy as np

    sigma = math.sqrt(math.log1p(cv * cv))
    rng = np.random.default_rng(seed)
    draws = rng.lognormal(math.log(shape.turn) - sigma * sigma / 2, sigma, size=(shape.episodes, shape.turns))
    return [[max(1, round(float(x))) for x in row] for row in draws]


def simulation_turns(shape: EpisodeShape) -> list[bool]:
    """Which turns run a simulation: ``sims_per_episode`` spread evenly over the turns (25 of 50: every
    second turn), each after its turn's decode and before the tool reply."""
    n, t = shape.sims_per_episode, shape.turns
    return [(k + 1) * n // t > k * n // t for k in range(t)]


def simulate_rollouts(shape: EpisodeShape, costs: StepCosts, *, engines: int = 1, group_size: int = 8,
                      batching: str = "continuous", decode_tokens_per_turn: int | None = None,
                      turn_cv: float = 0.0, seed: int = 0,
                      turn_tokens: Sequence[Sequence[int]] | None = None) -> RolloutTimes:
    """Play one step's rollouts as events, decode step by decode step.

    Episode ``i`` belongs to group ``i // group_size``, which stays on engine ``group % engines`` (its
    prefix cache). An episode starts queued with its prompt to prefill; admitted to a decode step, it
    decodes its turn (one token per step; the step costs :class:`DecodeCost` for the rows in the batch and
    their contexts, plus :class:`PrefillCost` for the new tokens of the rows admitted to it); its turn
    over, it runs its simulation if the turn has one (:func:`simulation_turns`; a slot of
    ``costs.sim_slots``, ``costs.sim_s`` each, first come first served), then queues again with the tool
    reply to prefill, until its last turn. A turn that decodes ``decode_tokens_per_turn`` tokens keeps
    only its own length in the history (the rows are trimmed after the engine returns them: audit F6).
    ``continuous``: a queued row joins at the next step, a row whose
    turn ended leaves; ``static``: a batch forms when the engine is idle and is decoded until its longest
    row ends (the others wait in it: counted as ``gpu_wait_s``, as the time queued for a step is). At most
    ``costs.engine_max_batch`` rows per engine. ``turn_tokens[i][t]``: the tokens of episode ``i``'s turn
    ``t`` (default ``shape.turn``, or spread by ``turn_cv``)."""
    import heapq
    from collections import deque

    if batching not in ("continuous", "static"):
        raise ValueError(f"batching={batching!r}: continuous or static")
    n = shape.episodes
    if turn_tokens is not None:
        kept = [[max(1, int(x)) for x in row] for row in turn_tokens]
        if len(kept) != n or any(len(row) != shape.turns for row in kept):
            raise ValueError(f"turn_tokens: {n} episodes x {shape.turns} turns expected")
    else:
        kept = _turn_lengths(shape, turn_cv, seed, None)  # the tokens each turn keeps in the history
    lengths = kept if decode_tokens_per_turn is None else \
        [[int(decode_tokens_per_turn)] * shape.turns for _ in range(n)]  # the tokens each turn decodes
    sims = simulation_turns(shape)
    engine_of = [(i // max(group_size, 1)) % engines for i in range(n)]
    turn = [0] * n
    ctx = [0.0] * n
    new = [shape.prompt] * n
    asked = [0.0] * n
    gpu_wait = [0.0] * n
    sim_wait = [0.0] * n
    done = [0.0] * n
    queue: list[deque[int]] = [deque() for _ in range(engines)]
    batch: list[list[int]] = [[] for _ in range(engines)]
    finishing: list[list[tuple[int, int]]] = [[] for _ in range(engines)]  # (global step its turn ends, episode)
    held: list[list[int]] = [[] for _ in range(engines)]  # static: rows whose turn ended, waiting for the batch
    generating = [0] * engines
    ctx_sum = [0.0] * engines
    steps = [0] * engines
    busy = [False] * engines
    busy_s = [0.0] * engines
    prefill_total = 0.0
    free_slots = costs.sim_slots
    slot_queue: deque[tuple[int, float]] = deque()
    events: list[tuple[float, int, str, int]] = []
    order = 0

    def push(when: float, kind: str, who: int) -> None:
        nonlocal order
        order += 1
        heapq.heappush(events, (when, order, kind, who))

    def start_step(e: int, now: float) -> None:
        nonlocal prefill_total
        prefill = 0.0
        if batching == "continuous" or not batch[e]:
            while queue[e] and len(batch[e]) < costs.engine_max_batch:
                i = queue[e].popleft()
                gpu_wait[i] += now - asked[i]
                prefill += costs.prefill.seconds(new[i], ctx[i])
                ctx[i] += new[i]
                new[i] = 0
                batch[e].append(i)
                ctx_sum[e] += ctx[i]
                generating[e] += 1
                heapq.heappush(finishing[e], (steps[e] + lengths[i][turn[i]], i))
        if not batch[e]:
            busy[e] = False
            return
        duration = costs.decode.step(len(batch[e]), ctx_sum[e]) + prefill
        prefill_total += prefill
        busy[e] = True
        busy_s[e] += duration
        push(now + duration, "step", e)

    def request_engine(i: int, now: float) -> None:
        e = engine_of[i]
        asked[i] = now
        queue[e].append(i)
        if not busy[e]:  # an idle engine starts once every request of this moment is in
            busy[e] = True
            push(now, "start", e)

    def tool_reply(i: int, now: float) -> None:
        if turn[i] >= shape.turns:
            done[i] = now
            return
        new[i] = shape.tool
        request_engine(i, now)

    def turn_over(i: int, now: float) -> None:
        nonlocal free_slots
        had_sim = sims[turn[i]]
        turn[i] += 1
        if not had_sim:
            tool_reply(i, now)
        elif free_slots > 0:
            free_slots -= 1
            push(now + costs.sim_s, "sim", i)
        else:
            slot_queue.append((i, now))

    for i in range(n):  # every episode asks at once: the first steps take them all
        queue[engine_of[i]].append(i)
    for e in range(engines):
        start_step(e, 0.0)
    while events:
        now, _, kind, who = heapq.heappop(events)
        if kind == "sim":
            free_slots += 1
            if slot_queue:
                j, since = slot_queue.popleft()
                sim_wait[j] += now - since
                free_slots -= 1
                push(now + costs.sim_s, "sim", j)
            tool_reply(who, now)
            continue
        e = who
        if kind == "start":
            start_step(e, now)
            continue
        steps[e] += 1
        ctx_sum[e] += generating[e]
        ended = []
        while finishing[e] and finishing[e][0][0] <= steps[e]:
            _, i = heapq.heappop(finishing[e])
            ctx_sum[e] -= lengths[i][turn[i]] - kept[i][turn[i]]  # decoded past its end, trimmed (F6)
            ctx[i] += kept[i][turn[i]]
            generating[e] -= 1
            ended.append(i)
        if batching == "continuous":
            for i in ended:
                batch[e].remove(i)
                ctx_sum[e] -= ctx[i]
                turn_over(i, now)
        else:
            for i in ended:
                asked[i] = now  # from here it waits for the batch's longest row
            held[e] += ended
            if generating[e] == 0:  # the batch's longest row is done: every row goes on now
                released, held[e], batch[e], ctx_sum[e] = held[e], [], [], 0.0
                for i in released:
                    gpu_wait[i] += now - asked[i]
                    turn_over(i, now)
        start_step(e, now)
    return RolloutTimes(wall_s=max(done), engine_busy_s=tuple(busy_s), prefill_s=prefill_total,
                        gpu_wait_s=sum(gpu_wait) / n, sim_wait_s=sum(sim_wait) / n,
                        simulate_s=shape.sims_per_episode * costs.sim_s, decode_steps=sum(steps))


def estimate_layout(shape: EpisodeShape, costs: StepCosts, layout: Layout, *, group_size: int = 8,
                    turn_cv: float = 0.0, seed: int = 0) -> dict[str, Any]:
    """The step of ``shape`` in ``layout``, in seconds, part by part:

    * ``rollouts_s``: :func:`simulate_rollouts` on ``layout.engines`` engines (the simulations on each
      episode's critical path, convoying in a static batch);
    * ``train_s`` = episodes x tokens x ``costs.train_s_per_token`` / trainers (FSDP taken as ideally parallel);
    * ``sync_s``: the weights to the engines (:meth:`StepCosts.memory_sync_s`, or ``disk_sync_s``);
    * ``sleep_wake_s``: colocated without overlap, each engine sleeps before training and wakes after;
    * step, without overlap: ``rollouts + train + sync + sleep_wake``. With overlap the next step's
      rollouts run while this step trains, on the same GPUs (the engines stay awake: the trainer must fit
      beside their KV cache): the GPUs' work is the busiest engine's decode plus the training, the
      rollouts' wall time (their simulations) can hide it or be hidden, so the step is
      ``sync + max(rollouts, busiest engine + train)`` in the steady state.

    What is built for that row (``colocated.awake_while_training``, docs/colocated.md "Overlap") matches
    its order: the rollouts start once the batch is shared, the sync waits for them, and nobody sleeps or
    wakes. The row assumes two things the build does not guarantee, both unmeasured. First, decode and
    training share a GPU without slowing each other: their work adds up as if they ran one after the
    other at full speed. Real contention for SMs, memory bandwidth and NCCL would make it longer.
    Second, each engine decodes all its rollouts as one batch. Beside the training, the memory plan gives
    the paper's engine a KV pool for 3 of its 8 rollouts at full context, so long episodes queue.
    """
    r = simulate_rollouts(shape, costs, engines=layout.engines, group_size=group_size, batching=layout.batching,
                          decode_tokens_per_turn=layout.decode_tokens_per_turn, turn_cv=turn_cv, seed=seed)
    train = shape.episodes * shape.tokens * costs.train_s_per_token / layout.trainers
    sync = costs.disk_sync_s if layout.sync == "disk" else costs.memory_sync_s(layout.trainers, layout.colocated)
    sleep_wake = costs.sleep_s + costs.wake_s if layout.colocated and not layout.overlap else 0.0
    busiest = max(r.engine_busy_s)
    if layout.overlap:
        step = sync + max(r.wall_s, busiest + train)
    else:
        step = r.wall_s + train + sync + sleep_wake
    return {"layout": layout.name, "gpus": layout.gpus, "engines": layout.engines, "trainers": layout.trainers,
            "rollouts_s": r.wall_s, "engine_busy_s": busiest, "prefill_s": r.prefill_s / layout.engines,
            "gpu_wait_s": r.gpu_wait_s, "sim_wait_s": r.sim_wait_s, "simulate_s": r.simulate_s,
            "train_s": train, "sync_s": sync, "sleep_wake_s": sleep_wake, "step_s": step}


def layout_table(shape: EpisodeShape, costs: StepCosts, layouts: Sequence[Layout], **kw: Any) -> list[dict[str, Any]]:
    """:func:`estimate_layout` for each layout."""
    return [estimate_layout(shape, costs, layout, **kw) for layout in layouts]


# ---------------------------------------------------------------------------------------------
# The parts of the layouts that one GPU can measure (``python -m hydroagent_hpc.bench.train --gpu --grpo``)


def measure_sleep_wake(model: PreTrainedModel, repeats: int = 2) -> tuple[float, float]:
    """Seconds of an engine's sleep and wake on this device, as torch does them: the weights copied to
    pinned host memory and their device memory freed (sleep), then copied back (wake). The engines' own
    calls (SGLang ``release_memory_occupation`` / ``resume_memory_occupation``, vLLM ``sleep(level=1)`` /
    ``wake_up``) do this and their allocator's bookkeeping, so these are lower bounds. The fastest of
    ``repeats``; the model is awake again afterwards."""
    device = next(model.parameters()).device
    params = list(model.parameters())
    host = [torch.empty(p.shape, dtype=p.dtype, pin_memory=device.type == "cuda") for p in params]
    best_sleep = best_wake = math.inf
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        for h, p in zip(host, params):
            h.copy_(p.data, non_blocking=True)
        _sync(device)
        for p in params:
            p.data = torch.empty(0, dtype=p.dtype, device=device)
        if device.type == "cuda":
            torch.cuda.empty_cache()
        t1 = time.perf_counter()
        for h, p in zip(host, params):
            p.data = h.to(device, non_blocking=True)
        _sync(device)
        t2 = time.perf_counter()
        best_sleep, best_wake = min(best_sleep, t1 - t0), min(best_wake, t2 - t1)
    return best_sleep, best_wake


def measure_weight_sync(model: PreTrainedModel, *, bucket_bytes: int = 2**30, dtype: torch.dtype = torch.bfloat16,
                        repeats: int = 2) -> dict[str, Any]:
    """The part of an in-memory weight sync that one device does: the trainer's parameters cast to ``dtype``
    and packed into flat buckets of about ``bucket_bytes``, each unpacked into a second copy of the weights
    (the engine's, on the same device), then one layer compared (the last parameter, bit for bit). The
    gather of FSDP shards between GPUs is not here (one device has none): the layout model adds it from
    the link bandwidth. Returns the fastest ``seconds`` of ``repeats``, ``buckets``, ``bytes`` and ``equal``."""
    device = next(model.parameters()).device
    named = [(n, p) for n, p in model.named_parameters()]
    engine = {n: torch.empty(p.shape, dtype=dtype, device=device) for n, p in named}
    size = torch.tensor([], dtype=dtype).element_size()
    groups: list[list[tuple[str, torch.Tensor]]] = [[]]
    filled = 0
    for n, p in named:
        if groups[-1] and filled + p.numel() * size > bucket_bytes:
            groups.append([])
            filled = 0
        groups[-1].append((n, p))
        filled += p.numel() * size

    def sync() -> None:
        with torch.no_grad():
            for group in groups:
                flat = torch.cat([p.detach().to(dtype).reshape(-1) for _, p in group])
                offset = 0
                for n, p in group:
                    engine[n].copy_(flat[offset:offset + p.numel()].view(p.shape))
                    offset += p.numel()

    seconds = _timed(sync, device, repeats)
    last_name, last = named[-1]
    equal = bool(torch.equal(engine[last_name], last.detach().to(dtype)))
    return {"seconds": seconds, "buckets": len(groups), "bytes": sum(p.numel() for _, p in named) * size,
            "equal": equal}
