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

:class:`GenerationServer` is a thread that owns the model while rollouts run: a rollout thread
submits ``(ids, seed)`` and blocks; the server takes every request that is waiting (up to
``max_batch``), samples them in one batch and answers each. So the rollouts that wait for a model
turn at the same moment share one forward pass, and no rollout waits for another's simulation.
"""

from __future__ import annotations

import inspect
import logging
import queue
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch

log = logging.getLogger(__name__)

__all__ = ["Sampling", "Sample", "BatchedSampler", "GenerationServer"]


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


def _filter(logits: torch.Tensor, s: Sampling) -> torch.Tensor:
    """Per-row next-token probabilities after temperature, top-k and top-p (rows of ``logits``)."""
    scaled = logits / s.temperature
    if s.top_k and s.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, s.top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)
    if s.top_p < 1.0:
        sorted_p, order = torch.sort(probs, dim=-1, descending=True)
        before = torch.cumsum(sorted_p, dim=-1) - sorted_p  # mass of the ids ranked above each id
        keep_sorted = before < s.top_p  # the first id is always kept
        keep = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        probs = torch.where(keep, probs, torch.zeros_like(probs))
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


class BatchedSampler:
    """Sample continuations of several prompts in one KV-cached decode loop (see the module doc)."""

    def __init__(self, model: Any, stop_ids: Sequence[int], pad_id: int, sampling: Sampling,
                 max_batch: int = 64) -> None:
        self.model = model
        self.stop_ids = tuple(int(i) for i in stop_ids)
        self.pad_id = int(pad_id)
        self.sampling = sampling
        self.max_batch = int(max_batch)
        if self.max_batch < 1:
            raise ValueError("max_batch must be at least 1")
        # transformers 5.x renamed the forward's past_key_values to cache
        params = inspect.signature(type(model).forward).parameters
        self._cache_arg = "cache" if "cache" in params else "past_key_values"

    def sample(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None]) -> list[Sample]:
        if len(prompts) != len(seeds):
            raise ValueError("one seed per prompt")
        out: list[Sample] = []
        for start in range(0, len(prompts), self.max_batch):
            out += self._batch(prompts[start:start + self.max_batch], seeds[start:start + self.max_batch])
        return out

    @torch.inference_mode()
    def _batch(self, prompts: Sequence[Sequence[int]], seeds: Sequence[int | None]) -> list[Sample]:
        device = self.model.device
        n = len(prompts)
        width = max(len(p) for p in prompts)
        ids = torch.full((n, width), self.pad_id, dtype=torch.long, device=device)
        attn = torch.zeros((n, width), dtype=torch.long, device=device)
        for r, p in enumerate(prompts):
            if not p:
                raise ValueError("an empty prompt cannot be continued")
            ids[r, width - len(p):] = torch.tensor(list(p), dtype=torch.long, device=device)
            attn[r, width - len(p):] = 1
        positions = (attn.cumsum(-1) - 1).clamp(min=0)
        gens = []
        for seed in seeds:
            g = None
            if seed is not None and not self.sampling.greedy:
                g = torch.Generator(device=device)
                g.manual_seed(int(seed))
            gens.append(g)
        out = self.model(input_ids=ids, attention_mask=attn, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        past = _cache_of(out)
        logits = out.logits[:, -1, :].float()
        done = [False] * n
        sampled: list[list[int]] = [[] for _ in range(n)]
        logps: list[list[float]] = [[] for _ in range(n)]
        stop = set(self.stop_ids)
        last_pos = positions[:, -1]
        for _ in range(self.sampling.max_new_tokens):
            model_logp = torch.log_softmax(logits, dim=-1)
            if self.sampling.greedy:
                chosen = logits.argmax(dim=-1).tolist()
            else:
                probs = _filter(logits, self.sampling)
                chosen = []
                for r in range(n):
                    if done[r]:
                        chosen.append(self.pad_id)
                        continue
                    chosen.append(int(torch.multinomial(probs[r], 1, generator=gens[r]).item()))
            for r in range(n):
                if done[r]:
                    continue
                tok = int(chosen[r])
                sampled[r].append(tok)
                logps[r].append(float(model_logp[r, tok]))
                if tok in stop:
                    done[r] = True
            if all(done):
                break
            nxt = torch.tensor([self.pad_id if d else s[-1] for d, s in zip(done, sampled)],
                               dtype=torch.long, device=device)[:, None]
            attn = torch.cat([attn, torch.ones((n, 1), dtype=torch.long, device=device)], dim=-1)
            last_pos = last_pos + 1
            out = self.model(input_ids=nxt, attention_mask=attn, position_ids=last_pos[:, None],
                             use_cache=True, **{self._cache_arg: past})
            past = _cache_of(out)
            logits = out.logits[:, -1, :].float()
        return [Sample(s, lp) for s, lp in zip(sampled, logps)]


def _cache_of(out: Any) -> Any:
    cache = getattr(out, "cache", None)
    return cache if cache is not None else out.past_key_values


@dataclass
class _Request:
    ids: list[int]
    seed: int | None
    future: Future[Sample]


class GenerationServer:
    """A thread that answers generation requests in batches (see the module doc).

    Use as a context manager around the rollouts; :meth:`generate` blocks the calling rollout until
    its turn is sampled. ``linger_s`` is how long the server waits for more requests after the
    first one arrives (a few ms lets rollouts that finished their tool calls together share a
    batch). ``stats`` counts batches, rows and the time spent sampling.
    """

    def __init__(self, sampler: BatchedSampler, linger_s: float = 0.002) -> None:
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

    def generate(self, ids: Sequence[int], seed: int | None) -> Sample:
        if self._thread is None:
            raise RuntimeError("GenerationServer is not running (use it as a context manager)")
        request = _Request(list(ids), seed, Future())
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
                samples = self.sampler.sample([r.ids for r in batch], [r.seed for r in batch])
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
