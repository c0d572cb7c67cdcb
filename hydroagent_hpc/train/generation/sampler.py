"""Generation for rollouts: a batched sampler with per-row seeds, and a server that batches turns.

:class:`Sampling` is the decoding setting of GRPO rollouts, written out in full (temperature 1.0,
top-p 0.95, no top-k by default, the paper's): nothing is read from a checkpoint's
``generation_config.json`` (Qwen3 ships temperature 0.7, top-p 0.8, top-k 20) or from
transformers' global defaults.

:class:`BatchedSampler` runs one decode loop over a batch of prompts of different lengths with
the model's KV cache (prompts left-padded, position ids from the attention mask). Each row draws
its tokens from its **own** ``torch.Generator`` seeded with the row's seed, so a row's sample does
not depend on which other rows shared its batch (up to float rounding of the batched matmuls;
``max_batch=1`` makes it exact). Per row, the step's distribution is
``p = softmax(logits / T)`` restricted to the top-k ids and then to the smallest set of ids whose
probabilities, sorted, sum to at least ``top_p`` (nucleus sampling, Holtzman et al. 2020), and
renormalised. A row stops at its first stop id (kept in its output) or after
``max_new_tokens``. Alongside the ids it returns each sampled token's log-probability under the
model itself (temperature 1, no filtering): the quantity the trainer recomputes, so the two can
be compared (they agree to float rounding on one device; another engine's differ, which is what
truncated importance weights correct).

The decode step is built for a GPU, where every value the host reads waits for the device:

* Draws. Row ``r``'s generator gives ``max_new_tokens`` uniforms ``u`` before the loop (one draw
  per row per call, not per token); step ``t`` picks the id where ``u[r, t]`` falls in the
  cumulative distribution of the kept ids, ranked by probability (inverse CDF, float64). Every row
  is sampled at once on the device, and the step's ids and their log-probs come back in **one**
  transfer; the host and the device each decide from the same ids which rows are done, and the
  next step's input ids and masks are computed on the device, so nothing is uploaded either. A
  given seed therefore picks other tokens than the per-row ``torch.multinomial`` of earlier
  versions did; the distribution is the same.
* Top-p without sorting the vocabulary. The nucleus is found among the ``top_p_candidates + 1``
  most probable ids (``torch.topk``, 512 by default): the mass ranked above an id only grows down
  the ranking, so when the candidate after the first ``top_p_candidates`` is outside the nucleus
  the nucleus lies inside them, and it is the same set, with the same probabilities, as the full
  sort gives. A row whose nucleus is wider (a flat distribution) is redrawn from the full sort with
  the same uniform, so it draws the token the full sort would; that step costs one more transfer
  (``stats["top_p_wide_rows"]`` counts these rows).

Prefix cache (``prefix_cache=True``, the GRPO default). A rollout's sequence only grows: turn
``t + 1``'s prompt is turn ``t``'s prompt, its sampled ids, then the template glue, tool responses
and the next generation prompt. With a ``key`` per rollout the sampler keeps each row's keys and
values after its turn (padding removed) and feeds only the new ids next time, so a turn costs its
new tokens instead of the whole history (on the CPU with ~3,000-token histories, prefill was
~90 % of generation time). A prompt that does not extend its key's cached ids is prefilled in
full. The cache lives as long as the sampler: one rollout batch, since the weights change after
it (:meth:`BatchedSampler.forget`; the server calls it on exit). Memory: the keys and values of
every live rollout (for Qwen3-4B in BF16, about 144 KiB per token: 32 rollouts x 8k tokens is
about 37 GB), so switch it off where that does not fit.

:class:`GenerationServer` is a thread that owns the model while rollouts run: a rollout thread
submits ``(ids, seed)`` and blocks; the server takes every request that is waiting (up to
``max_batch``), samples them in one batch and answers each. So the rollouts that wait for a model
turn at the same moment share one forward pass, and no rollout waits for another's simulation.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import queue
import threading
import time
from collections.abc import Hashable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any, Protocol

import torch

log = logging.getLogger(__name__)

__all__ = ["Sampling", "Sample", "RolloutSampler", "BatchedSampler", "GenerationServer", "sampling_probs",
           "draw_tokens", "draw_tokens_sorted"]


@dataclass(frozen=True)
class Sampling:
    """Decoding settings of a rollout turn (every value explicit; see the module doc)."""

    temperature: float = 1.0
    top_p: float = 0.95
    top_k: int = 0
    max_new_tokens: int = 512
    greedy: bool = False

    def __post_init__(self) -> None:
        if not self.greedy and not self.temperature > 0:
            raise ValueError(f"temperature={self.temperature!r}: must be > 0 when sampling")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p={self.top_p!r}: must be in (0, 1]")
        if self.top_k < 0 or self.max_new_tokens < 1:
            raise ValueError("top_k must be >= 0 and max_new_tokens >= 1")


@dataclass(frozen=True)
class Sample:
    """One row's output: the sampled ids (ending with a stop id unless cut by ``max_new_tokens``)
    and each one's log-probability under the model (temperature 1, unfiltered)."""

    ids: list[int]
    logprobs: list[float]


class RolloutSampler(Protocol):
    """What :class:`GenerationServer` drives: :class:`BatchedSampler` (in-process) or
    :class:`~hydroagent_hpc.train.generation.engine.EngineSampler` (an external inference engine)."""

    max_batch: int
    stats: dict[str, Any]

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None] | None = None,
               forced: Sequence[Sequence[int] | None] | None = None) -> list[Sample]: ...

    def forget(self) -> None: ...


#: Default number of candidate ids for top-p (see :func:`_nucleus`): enough for the nucleus of almost
#: every decode step of an instruct model at temperature 1, top-p 0.95; a row whose nucleus is wider
#: falls back to the full sort.
TOP_P_CANDIDATES = 512


def sampling_probs(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Per-row ``softmax(logits / T)`` after top-k (ids below the k-th largest logit get 0; ties kept)."""
    scaled = logits / s.temperature
    if s.top_k and s.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, s.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    return torch.softmax(scaled, dim=-1)


def _keep_ranked(ranked_p: torch.Tensor, top_p: float) -> torch.Tensor:
    """Which ids of each row, ranked by probability (descending), the nucleus keeps: rank ``i`` is
    kept when ``sum_{j < i} p_j < top_p`` (the mass ranked above it), so the first is always kept."""
    before = torch.cumsum(ranked_p, dim=-1) - ranked_p
    return before < top_p


def _nucleus(probs: torch.Tensor, top_p: float, width: int = TOP_P_CANDIDATES
             ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The top-p nucleus of each row from its ``width + 1`` most probable ids, without sorting the
    vocabulary: ``(ids, kept_p, covered)``, ``ids`` and ``kept_p`` of shape ``(rows, w)`` ranked by
    probability (``kept_p`` is 0 for the ranked ids the nucleus drops; not renormalised), ``covered``
    per row.

    Why ``width + 1`` candidates decide it: the mass ranked above rank ``i``, ``sum_{j < i} p_j``,
    only grows with ``i``, so once rank ``width`` (the candidate after the first ``width``) is
    dropped every rank below it is dropped too, and the nucleus lies inside the first ``width``
    ids. ``covered`` is that test. A row that fails it (its nucleus is wider than ``width``) must
    be redone with :func:`_nucleus_sorted`. The candidates are the full sort's first ``width + 1``
    entries and their masses are the same prefix sums, so the kept ids and probabilities are the
    sort's (bit for bit on the CPU, whose cumsum is sequential; ties between equal probabilities
    may be ranked in another order; in float32 the prefix sums are only non-decreasing up to
    rounding, so an id below ~1e-7 of probability is where the two could part). When ``width + 1``
    reaches the vocabulary this is the full sort.
    """
    vocab = probs.shape[-1]
    if width + 1 >= vocab:
        ids, kept = _nucleus_sorted(probs, top_p)
        return ids, kept, torch.ones(probs.shape[:-1], dtype=torch.bool, device=probs.device)
    ranked_p, ids = torch.topk(probs, width + 1, dim=-1, sorted=True)
    keep = _keep_ranked(ranked_p, top_p)
    covered = ~keep[..., -1]
    kept = torch.where(keep[..., :-1], ranked_p[..., :-1], torch.zeros_like(ranked_p[..., :-1]))
    return ids[..., :-1], kept, covered


def _nucleus_sorted(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """The nucleus from a full sort of the vocabulary: ``(ids, kept_p)`` as in :func:`_nucleus`
    with ``w`` the vocabulary (the fallback for rows :func:`_nucleus` does not cover)."""
    ranked_p, ids = torch.sort(probs, dim=-1, descending=True)
    keep = _keep_ranked(ranked_p, top_p)
    return ids, torch.where(keep, ranked_p, torch.zeros_like(ranked_p))


def _filter(logits: torch.Tensor, s: Sampling, width: int = TOP_P_CANDIDATES) -> torch.Tensor:
    """Per-row next-token probabilities after temperature, top-k and top-p, renormalised (a dense
    ``(rows, vocab)`` tensor; the decode loop itself samples from :func:`_nucleus`'s candidates)."""
    probs = sampling_probs(logits, s)
    if s.top_p < 1.0:
        ids, kept, covered = _nucleus(probs, s.top_p, width)
        dense = torch.zeros_like(probs).scatter(-1, ids, kept)
        wide = (~covered).nonzero().flatten()
        if wide.numel():
            wide_ids, wide_kept = _nucleus_sorted(probs[wide], s.top_p)
            dense[wide] = torch.zeros_like(wide_kept).scatter(-1, wide_ids, wide_kept)
        probs = dense / dense.sum(dim=-1, keepdim=True)
    return probs


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Per row, the index ``i`` with ``c_{i-1} <= u * c_last < c_i``, ``c = cumsum(weights)`` in
    float64 (``weights`` >= 0, not necessarily normalised; ``u`` in [0, 1), one per row): a draw
    from ``weights / sum(weights)`` driven by ``u`` alone. Only ids with positive weight come out
    (a zero weight leaves ``c`` flat, so no ``u`` lands on it; a ``u * c_last`` rounded up to
    ``c_last`` is pulled back to the first index that reaches ``c_last``)."""
    cdf = torch.cumsum(weights.double(), dim=-1)
    total = cdf[:, -1:].contiguous()
    idx = torch.searchsorted(cdf, u.double()[:, None] * total, right=True)
    last = torch.searchsorted(cdf, total, right=False)
    return torch.minimum(idx, last)[:, 0]


def draw_tokens(probs: torch.Tensor, u: torch.Tensor, top_p: float, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's token from its probabilities (after temperature and top-k) and its uniform ``u``:
    ``(tokens, covered)``; rows not ``covered`` must be redrawn with :func:`draw_tokens_sorted` (see
    :func:`_nucleus`). Everything stays on the device: no host sync."""
    if top_p >= 1.0:
        return _inverse_cdf(probs, u), torch.ones_like(u, dtype=torch.bool)
    ids, kept, covered = _nucleus(probs, top_p, width)
    return ids.gather(-1, _inverse_cdf(kept, u)[:, None])[:, 0], covered


def draw_tokens_sorted(probs: torch.Tensor, u: torch.Tensor, top_p: float) -> torch.Tensor:
    """:func:`draw_tokens` from a full sort (the rows whose nucleus is wider than the candidates)."""
    ids, kept = _nucleus_sorted(probs, top_p)
    return ids.gather(-1, _inverse_cdf(kept, u)[:, None])[:, 0]


class BatchedSampler:
    """Sample continuations of several prompts in one KV-cached decode loop (see the module doc)."""

    def __init__(self, model: Any, stop_ids: Sequence[int], pad_id: int, sampling: Sampling,
                 max_batch: int = 64, prefix_cache: bool = False, top_p_candidates: int = TOP_P_CANDIDATES,
                 autocast_dtype: torch.dtype | None = None) -> None:
        self.model = model
        # the forward passes under torch.autocast to this dtype (bf16 over a trainer's fp32 master
        # weights on a GPU); None: in the weights' own dtype
        self.autocast_dtype = autocast_dtype
        self.prefix_cache = bool(prefix_cache)
        self._prefix: dict[Hashable, tuple[list[int], list[Any]]] = {}
        self.stats: dict[str, Any] = {"prefix_hits": 0, "prefix_misses": 0, "prefix_tokens": 0,
                                      "top_p_wide_rows": 0}
        self.top_p_candidates = int(top_p_candidates)
        if self.top_p_candidates < 1:
            raise ValueError(f"top_p_candidates={top_p_candidates!r}: must be at least 1")
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        self.sampling = sampling
        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        # transformers 5.x renamed the forward's past_key_values to cache
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None] | None = None,
               forced: Sequence[Sequence[int] | None] | None = None) -> list[Sample]:
        """Sample a continuation of each prompt; ``keys`` (one per prompt, e.g. a rollout id) turn on
        the prefix cache for those rows when the sampler was built with ``prefix_cache=True``.

        ``forced[r]`` (benchmarks and tests): row ``r`` emits these ids instead of sampling, through
        the same decode steps (the same cost, the model's log-probs of them), and ends after the
        last one or at a stop id among them.
        """
        n = len(prompts)
        if len(seeds) != n or (keys is not None and len(keys) != n) or (forced is not None and len(forced) != n):
            raise ValueError("one seed (and one key / forced list, when given) per prompt")
        row_keys = list(keys) if keys is not None else [None] * n
        row_forced = list(forced) if forced is not None else [None] * n
        out: list[Sample] = []
        # no autocast_dtype: leave whatever autocast the caller set (a disabled context would switch it off)
        with (torch.autocast(torch.device(self.model.device).type, dtype=self.autocast_dtype)
              if self.autocast_dtype is not None else contextlib.nullcontext()):
            for start in range(0, n, self.max_batch):
                end = start + self.max_batch
                out += self._batch(prompts[start:end], seeds[start:end], row_keys[start:end], row_forced[start:end])
        return out

    def _take_prefix(self, key: Hashable | None, prompt: Sequence[int]) -> tuple[int, list[Any] | None]:
        """``(n, kv)``: the cached keys/values of the first ``n`` ids of ``prompt`` (0, None: none)."""
        if key is None or not self.prefix_cache:
            return 0, None
        entry = self._prefix.pop(key, None)
        if entry is None:
            return 0, None
        ids, kv = entry
        if len(ids) < len(prompt) and list(prompt[:len(ids)]) == ids:
            return len(ids), kv
        self.stats["prefix_misses"] += 1
        return 0, None

    @torch.inference_mode()
    def _batch(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None],
               keys: Sequence[Hashable | None], forced: Sequence[Sequence[int] | None]) -> list[Sample]:
        device = self.model.device
        n = len(prompts)
        if any(not p for p in prompts):
            raise ValueError("an empty prompt cannot be continued")
        taken = [self._take_prefix(k, p) for k, p in zip(keys, prompts)]
        held = [t[0] for t in taken]
        suffixes = [list(p[h:]) for p, h in zip(prompts, held)]
        width = max(len(x) for x in suffixes)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        new_mask = torch.zeros((n, width), dtype=torch.long, device=device)
        for r, x in enumerate(suffixes):
            ids[r, width - len(x):] = torch.tensor(x, dtype=torch.long, device=device)
            new_mask[r, width - len(x):] = 1
        cached = max(held)
        extra: dict[str, Any] = {}
        if cached:
            # the rows' cached keys/values, left-padded to one length (padding masked out)
            old_mask = torch.zeros((n, cached), dtype=torch.long, device=device)
            layers = []
            reference = next(kv for _, kv in taken if kv is not None)
            for i, (k0, v0) in enumerate(reference):
                keys_t = k0.new_zeros((n, k0.shape[0], cached, k0.shape[2]))
                values_t = v0.new_zeros((n, v0.shape[0], cached, v0.shape[2]))
                for r, (h, kv) in enumerate(taken):
                    if kv is not None:
                        keys_t[r, :, cached - h:] = kv[i][0]
                        values_t[r, :, cached - h:] = kv[i][1]
                        old_mask[r, cached - h:] = 1
                layers.append((keys_t, values_t))
            from transformers.cache_utils import DynamicCache

            extra[self._cache_arg] = DynamicCache(ddp_cache_data=layers, config=self.model.config)
            attn = torch.cat([old_mask, new_mask], dim=-1)
            self.stats["prefix_hits"] += sum(1 for h in held if h)
            self.stats["prefix_tokens"] += sum(held)
        else:
            attn = new_mask
        held_t = torch.tensor(held, dtype=torch.long, device=device)[:, None]
        positions = (held_t + new_mask.cumsum(-1) - 1).clamp(min=0)
        steps = self.sampling.max_new_tokens
        uniforms = None if self.sampling.greedy else self._uniforms(seeds, steps, device)
        forcing = [f is not None for f in forced]
        # the forced rows (which, their ids, how many) on the device once, so no step uploads anything
        forced_t: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None
        if any(forcing):
            table = torch.full((n, steps), self.pad_id, dtype=torch.long)
            for r, f in enumerate(forced):
                if f is not None:
                    table[r, :min(len(f), steps)] = torch.tensor(list(f[:steps]), dtype=torch.long)
            forced_t = (torch.tensor(forcing, device=device), table.to(device),
                        torch.tensor([len(f) if f is not None else -1 for f in forced], device=device))
        stop_t = torch.tensor(self.stop_ids, dtype=torch.long, device=device)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True,
                         logits_to_keep=1, **extra)
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        done = [False] * n
        done_t = torch.zeros(n, dtype=torch.bool, device=device)
        sampled: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        stop = set(self.stop_ids)
        last_pos = positions[:, -1]
        real = [attn.bool()]  # which cache positions hold a row's own tokens (not padding)
        for step in range(steps):
            # Every row's token and log-prob on the device, then one transfer of all of them (a second
            # one only on a step where some row's top-p nucleus is wider than the candidates).
            model_logp = torch.log_softmax(logits, dim=-1)
            if uniforms is None:
                tok, covered = logits.argmax(dim=-1), None
            else:
                probs = sampling_probs(logits, self.sampling)
                tok, covered = draw_tokens(probs, uniforms[:, step], self.sampling.top_p, self.top_p_candidates)
            if forced_t is not None:
                tok = torch.where(forced_t[0], forced_t[1][:, step], tok)
            lp_t = model_logp.gather(-1, tok[:, None])[:, 0]
            packed = [tok.double(), lp_t.double()]
            if covered is not None and self.sampling.top_p < 1.0 and self.top_p_candidates + 1 < logits.shape[-1]:
                packed.append(covered.double())
            host = torch.stack(packed).tolist()  # the step's one device-to-host transfer
            toks = [int(t) for t in host[0]]
            lps = host[1]
            if len(host) > 2:
                wide = [r for r in range(n) if not host[2][r] and not done[r] and not forcing[r]]
                if wide:
                    assert uniforms is not None
                    tok, toks, lps = self._redraw_wide(wide, probs, uniforms[:, step], model_logp, tok, toks, lps)
            for r in range(n):
                if done[r]:
                    continue
                sampled[r].append(toks[r])
                logps[r].append(float(lps[r]))
                if toks[r] in stop or (forcing[r] and len(sampled[r]) >= len(forced[r] or ())):
                    done[r] = True
            if all(done) or step == steps - 1:
                break  # nothing more to sample: the last ids are not fed
            # the same bookkeeping on the device (the same rule, from the same ids), so nothing is uploaded
            ended = torch.isin(tok, stop_t)
            if forced_t is not None:
                ended = ended | (forced_t[2] == step + 1)
            done_t = done_t | ended
            real.append(~done_t[:, None])
            nxt = torch.where(done_t, self.pad_id, tok)[:, None]
            attn = torch.cat([attn, torch.ones((n, 1), dtype=torch.long, device=device)], dim=-1)
            last_pos = last_pos + 1
            out = self.model(input_ids=nxt, attention_mask=attn, position_ids=last_pos[:, None],
                             use_cache=True, **{self._cache_arg: past})
            past = _cache_of(out)
            logits = out.logits[:, -1, :].float()
        if self.prefix_cache:
            self._keep_prefixes(keys, prompts, sampled, past, torch.cat(real, dim=-1))
        return [Sample(x, lp) for x, lp in zip(sampled, logps)]

    @staticmethod
    def _uniforms(seeds: Sequence[int | None], steps: int, device: Any) -> torch.Tensor:
        """``(rows, steps)`` uniforms in [0, 1): row ``r``'s are the first ``steps`` draws of its own
        generator seeded with ``seeds[r]`` (torch's global generator for ``None``), drawn before the
        loop, so a row's draws depend on its seed alone and no step launches a draw per row."""
        rows = []
        for seed in seeds:
            g = None
            if seed is not None:
                g = torch.Generator(device=device)
                g.manual_seed(int(seed))
            rows.append(torch.rand(steps, generator=g, dtype=torch.float64, device=device))
        return torch.stack(rows)

    def _redraw_wide(self, wide: list[int], probs: torch.Tensor, u: torch.Tensor, model_logp: torch.Tensor,
                     tok: torch.Tensor, toks: list[int], lps: list[float]
                     ) -> tuple[torch.Tensor, list[int], list[float]]:
        """Redraw the rows ``wide`` (their nucleus is wider than the candidates) from a full sort with
        the same uniforms, so their token is the one a full-sort sampler draws; one more transfer."""
        self.stats["top_p_wide_rows"] += len(wide)
        rows = torch.tensor(wide, dtype=torch.long, device=tok.device)
        new = draw_tokens_sorted(probs[rows], u[rows], self.sampling.top_p)
        lp = model_logp[rows].gather(-1, new[:, None])[:, 0]
        host = torch.stack([new.double(), lp.double()]).tolist()
        toks, lps = list(toks), list(lps)
        for i, r in enumerate(wide):
            toks[r], lps[r] = int(host[0][i]), host[1][i]
        return tok.index_copy(0, rows, new), toks, lps

    def _keep_prefixes(self, keys: Sequence[Hashable | None], prompts: Sequence[Sequence[int]],
                       sampled: list[list[int]], past: Any, real: torch.Tensor) -> None:
        """Keep each keyed row's keys/values of its prompt and the sampled ids fed back (all but the
        last, which was never fed), without the padding, for the row's next turn."""
        for r, key in enumerate(keys):
            if key is None:
                continue
            fed = list(prompts[r]) + sampled[r][:-1]
            where = real[r].nonzero().squeeze(-1)
            if int(where.numel()) != len(fed):  # never expected; a wrong cache must not be used
                log.warning("prefix cache: %d positions for %d ids of %r; not kept", int(where.numel()), len(fed), key)
                continue
            kv = [(layer.keys[r][:, where].clone(), layer.values[r][:, where].clone()) for layer in past.layers]
            self._prefix[key] = (fed, kv)

    def forget(self) -> None:
        """Drop every cached prefix (the model's weights changed, or the rollouts are over)."""
        self._prefix.clear()


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@dataclass
class _Request:
    ids: list[int]
    seed: int | None
    future: Future[Sample]
    key: Hashable | None = None
    forced: list[int] | None = None


class GenerationServer:
    """A thread that answers generation requests in batches (see the module doc).

    Use as a context manager around the rollouts; :meth:`generate` blocks the calling rollout until
    its turn is sampled. ``linger_s`` is how long the server waits for more requests after the
    first one arrives (a few ms lets rollouts that finished their tool calls together share a
    batch). ``stats`` counts batches, rows and the time spent sampling.
    """

    def __init__(self, sampler: RolloutSampler, linger_s: float = 0.002) -> None:
        self.sampler = sampler
        self.linger_s = float(linger_s)
        self._queue: queue.Queue[_Request | None] = queue.Queue()
        self._thread: threading.Thread | None = None
        self.stats = {"batches": 0, "rows": 0, "max_batch": 0, "busy_s": 0.0}

    def __enter__(self) -> GenerationServer:
        self._thread = threading.Thread(target=self._serve, name="generation-server", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._queue.put(None)
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        self.sampler.forget()

    def generate(self, ids: Sequence[int], seed: int | None, key: Hashable | None = None,
                 forced: Sequence[int] | None = None) -> Sample:
        """Sample a turn after ``ids`` (blocks until done); ``key`` names the caller's sequence for
        the sampler's prefix cache (the same key on every turn of one rollout); ``forced`` see
        :meth:`BatchedSampler.sample`."""
        if self._thread is None:
            raise RuntimeError("GenerationServer is not running (use it as a context manager)")
        if forced is not None and not forced:
            raise ValueError("forced ids must not be empty")
        request = _Request(list(ids), seed, Future(), key, None if forced is None else [int(i) for i in forced])
        self._queue.put(request)
        return request.future.result()

    def _serve(self) -> None:
        while True:
            first = self._queue.get()
            if first is None:
                return
            batch = [first]
            deadline = time.perf_counter() + self.linger_s
            closing = False
            while len(batch) < self.sampler.max_batch:
                timeout = deadline - time.perf_counter()
                try:
                    item = self._queue.get(timeout=max(timeout, 0.0)) if timeout > 0 else self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is None:
                    closing = True
                    break
                batch.append(item)
            t0 = time.perf_counter()
            try:
                samples = self.sampler.sample([r.ids for r in batch], [r.seed for r in batch],
                                              [r.key for r in batch], [r.forced for r in batch])
            except BaseException as exc:  # answer every waiting rollout; none may hang
                for r in batch:
                    r.future.set_exception(exc)
            else:
                for r, s in zip(batch, samples):
                    r.future.set_result(s)
            self.stats["busy_s"] += time.perf_counter() - t0
            self.stats["batches"] += 1
            self.stats["rows"] += len(batch)
            self.stats["max_batch"] = max(self.stats["max_batch"], len(batch))
            if closing:
                return
