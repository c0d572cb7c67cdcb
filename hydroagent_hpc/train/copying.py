"""Copy pretraining: teach a tiny model trained from scratch to read a value back from its context.

A pretrained chat model reads the numbers in a tool reply before it acts on them; the tiny Qwen3
of :mod:`hydroagent_hpc.train.tiny` is random, and SFT on a few hundred teacher episodes teaches
it the format and the average move, never the reading (docs/learning.md: a student writes the same
NSE and the same move on every basin, even when the teacher's text quotes the value it acts on).
What is missing is the attention pattern that copies: find the key asked for earlier in the
context, repeat the tokens that follow it (an *induction head*; Olsson et al. 2022, "In-context
learning and induction heads"). It forms in a small transformer only after many short sequences in
which copying is the one way to lower the loss, which teacher episodes (about 3,600 tokens, two or
three readings each) do not give.

:func:`pretrain_copy` gives it before SFT, as pretraining gives it to a real model: documents of one
synthetic tool reply and an answer that quotes some of its values,

    <tool_response>
    {"status":"ok","NSE":0.8125,"peak_ratio":1.2685,"bfi_sim":0.31}
    </tool_response><|im_end|>
    <|im_start|>assistant
    peak_ratio=1.2685 NSE=0.8125<|im_end|>

keys drawn from the environment's observation keys (both presets), values drawn at random in the
JSON spelling the environment writes, the loss on the answer only. Nothing in a document says what
to do with a value (no rule, no move, no simulator): the reading is generic, the moves still come
from the teacher and the simulator's reward. :func:`copy_accuracy` scores greedy answers on fresh
documents (the exact answer, every value to its last digit).

Measured (2026-12-04, one CPU thread, the default tiny Qwen3, batch 16, lr 2e-3): the answer loss
stays near 1.2 (the keys guessed, the digits not) for about 1,250 steps, then falls (0.71 at 2,000
steps, 0.26 at 3,000): the copying circuit forming; about 0.24 s a step. After 5,000 steps and the
bench's 600-step SFT on a quoting teacher's episodes (``HeuristicHydrologist(quote=True)``), the
student quoted the first evaluation's ``peak_ratio`` exactly on 36 of 48 held-out basins and its
move followed it (``bench.blind.reading`` 0.83; the same SFT from the random base: 0 of 48, 0.48).
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from hydroagent_hpc.env.observations import DIAGNOSTIC_KEYS, PAPER_EVAL_KEYS

__all__ = ["COPY_KEYS", "copy_document", "copy_accuracy", "pretrain_copy", "CopyResult"]

log = logging.getLogger(__name__)

#: The keys of the observations (released evaluate, paper evaluate and diagnostics), each once.
COPY_KEYS: tuple[str, ...] = tuple(dict.fromkeys(
    ("NSE", "CC", "KGE", "sim_peak", "obs_peak", "peak_ratio", "lag_hours_sim_minus_obs", "num_points",
     *PAPER_EVAL_KEYS, *DIAGNOSTIC_KEYS, "peak_error_pct", "peak_lag_h")))

_PROMPT = "<tool_response>\n{obj}\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
_END = "<|im_end|>"


def _value(rng: np.random.Generator) -> float:
    """A value the way observations spell them: a score in [-1, 1], a ratio, whole hours, a size."""
    kind = int(rng.integers(4))
    if kind == 0:
        return round(float(rng.uniform(-1.0, 1.0)), 4)
    if kind == 1:
        return round(float(rng.lognormal(0.0, 0.6)), 4)
    if kind == 2:
        return float(rng.integers(-6, 7))
    return round(float(rng.uniform(0.0, 40.0)), 4)


def copy_document(rng: np.random.Generator, keys: Sequence[str] = COPY_KEYS) -> tuple[str, str]:
    """``(prompt, answer)``: a reply of 3-8 keys with drawn values, then 1-3 of them quoted as
    ``key=value`` (space-separated, the value as ``json.dumps`` spells it), then the end token."""
    chosen = [str(k) for k in rng.choice(list(keys), size=int(rng.integers(3, 9)), replace=False)]
    obj = {"status": "ok", **{k: _value(rng) for k in chosen}}
    asked = [str(k) for k in rng.choice(chosen, size=min(len(chosen), int(rng.integers(1, 4))), replace=False)]
    prompt = _PROMPT.format(obj=json.dumps(obj, separators=(",", ":")))
    return prompt, " ".join(f"{k}={json.dumps(obj[k])}" for k in asked) + _END


def _batch(tokenizer: PreTrainedTokenizerBase, docs: Sequence[tuple[str, str]]
           ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids, labels on the answer tokens only (-100 elsewhere), attention mask."""
    rows = [(tokenizer(p, add_special_tokens=False)["input_ids"], tokenizer(a, add_special_tokens=False)["input_ids"])
            for p, a in docs]
    width = max(len(p) + len(a) for p, a in rows)
    pad = tokenizer.pad_token_id
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    labels = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (p, a) in enumerate(rows):
        n = len(p) + len(a)
        ids[i, :n] = torch.tensor(p + a)
        labels[i, len(p):n] = torch.tensor(a)
        mask[i, :n] = 1
    return ids, labels, mask


@torch.no_grad()
def copy_accuracy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, n: int = 32, seed: int = 12345) -> float:
    """The share of ``n`` fresh documents whose greedy answer is exactly right (every key and digit)."""
    rng = np.random.default_rng(seed)
    was_training = model.training
    model.eval()
    right = 0
    for _ in range(n):
        prompt, answer = copy_document(rng)
        ids = tokenizer(prompt, add_special_tokens=False, return_tensors="pt")["input_ids"]
        want = tokenizer(answer, add_special_tokens=False)["input_ids"]
        out = cast(Any, model).generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=len(want),
                                        do_sample=False, pad_token_id=tokenizer.pad_token_id)
        right += out[0, ids.shape[1]:].tolist() == want
    model.train(was_training)
    return right / n


@dataclass(frozen=True)
class CopyResult:
    """What :func:`pretrain_copy` did: the answer loss every ``log_every`` steps, the accuracy at the end."""

    steps: int
    losses: tuple[tuple[int, float], ...]
    accuracy: float
    wall_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"steps": self.steps, "losses": [list(x) for x in self.losses], "accuracy": self.accuracy,
                "wall_s": self.wall_s}


def pretrain_copy(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, steps: int, *, batch_size: int = 16,
                  lr: float = 2e-3, warmup: int = 50, seed: int = 0, log_every: int = 250,
                  accuracy_docs: int = 32) -> CopyResult:
    """Train ``model`` in place on ``steps`` batches of :func:`copy_document` (AdamW, linear warm-up
    to ``lr`` over ``warmup`` steps, then constant; gradient norm clipped at 1; no weight decay).

    The documents come from ``numpy.random.default_rng(seed)`` and the global torch RNG is left as
    it was, so a seed gives the same model on the same machine. Returns the loss curve and the
    exact-copy accuracy on ``accuracy_docs`` fresh documents; the model is left in eval mode."""
    if steps < 0 or batch_size < 1 or not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"pretrain_copy: steps >= 0, batch_size >= 1 and a finite lr > 0, got steps={steps}, "
                         f"batch_size={batch_size}, lr={lr}")
    rng = np.random.default_rng(seed)
    start = time.perf_counter()
    losses: list[tuple[int, float]] = []
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        for step in range(1, steps + 1):
            for group in opt.param_groups:
                group["lr"] = lr * min(1.0, step / max(warmup, 1))
            ids, labels, mask = _batch(tokenizer, [copy_document(rng) for _ in range(batch_size)])
            loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            if step % log_every == 0 or step == steps:
                losses.append((step, float(loss.detach())))
                log.info("copy pretraining: step %d/%d, answer loss %.3f", step, steps, losses[-1][1])
    accuracy = copy_accuracy(model, tokenizer, n=accuracy_docs) if steps and accuracy_docs else 0.0
    model.eval()
    return CopyResult(steps, tuple(losses), accuracy, time.perf_counter() - start)
