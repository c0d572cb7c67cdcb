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
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from transformers import PreTrainedModel

__all__ = ["EpisodeShape", "GRPOStepParts", "measure_prefill", "measure_decode", "measure_train", "measure_parts",
           "estimate_step"]


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

    with torch.no_grad():
        long_run = _timed(sample(new_tokens + 1), device, repeats)
        short_run = _timed(sample(1), device, repeats)
    return max(long_run - short_run, 0.0) / new_tokens


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
