"""Our SFT and GRPO losses beside TRL's on the same batch (``python -m hydroagent_hpc.bench.trl``).

Both sides get the same token ids, the same assistant masks and the same starting weights of the
tiny Qwen3 (:mod:`hydroagent_hpc.train.tiny`), in float32 on the CPU. What is compared, exactly:

**SFT.** Ours: the trainer's own functions (:func:`~hydroagent_hpc.train.sft.trainer.collate`, the forward
with :func:`~hydroagent_hpc.train.sft.trainer.targets_only_head`,
:func:`~hydroagent_hpc.train.sft.trainer.weighted_token_loss` over
:func:`~hydroagent_hpc.train.sft.trainer.loss_denominator`, backward, ``clip_grad_norm_``), or the
whole trainer (:func:`~hydroagent_hpc.train.sft.trainer.train_sft`, its ``metrics.csv``). TRL: one
optimizer step of ``trl.SFTTrainer.train()`` on a pre-tokenised dataset (``input_ids`` and
``assistant_masks``, from which TRL builds its ``-100`` labels), its logged ``loss`` and
``grad_norm``. Every example has weight 1 (TRL has no per-example weights). With one micro-batch
holding the whole batch both are the **token mean over the batch**::

    loss = sum_i sum_{t>=1} m_i[t] * CE(logits_i[t-1], ids_i[t]) / sum_i sum_{t>=1} m_i[t]

(TRL: ``sum(-log p) / num_items_in_batch``, the count of labels other than -100 after the shift,
over all micro-batches of the step; ours: the same denominator over the step). ``grad_norm`` is the
2-norm of all gradients before clipping, as both trainers log it. TRL's ``SFTConfig`` defaults to
``bf16=True`` (autocast, on the CPU too) and ``gradient_checkpointing=True``; both are turned off here
(ours computes in fp32 on the CPU); with bf16 on, the loss differs in the 5th digit.

**GRPO.** One loss on a fixed batch: one prompt, K completions (multi-turn: assistant turns and
tool responses), fixed advantages, ``old_logp`` = the policy's log-probs plus seeded noise (so some
ratios clip), reference log-probs from another tiny model (seed 1). Ours:
:func:`~hydroagent_hpc.train.grpo.loss.token_logprobs` and
:func:`~hydroagent_hpc.train.grpo.loss.grpo_loss`; TRL: ``GRPOTrainer.compute_loss`` on the same
inputs, the tool-response tokens masked by TRL's ``tool_mask``. Aggregations: ours ``token-mean`` =
TRL ``bnpo``, ``seq-mean-token-mean`` = ``grpo``. TRL's ``use_bias_correction_kl`` (default True)
multiplies the k3 KL by the importance ratio, which ours does not: it is set False here (with it on,
the gradient differs even where the ratio is 1).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import csv
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from transformers import TrainerCallback

from hydroagent_hpc.agents.llm.trajectory import Trajectory, TrajectoryBuilder
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response, tool_schemas
from hydroagent_hpc.train.grpo.loss import grpo_loss, token_logprobs
from hydroagent_hpc.train.sft.config import config_from_mapping
from hydroagent_hpc.train.sft.data import DATA_SCHEMA, DATA_VERSION, SFTDataset
from hydroagent_hpc.train.sft.trainer import (
    collate,
    loss_denominator,
    targets_only_head,
    train_sft,
    weighted_token_loss,
)
from hydroagent_hpc.train.tiny import build_tiny, build_tiny_qwen3, build_tiny_tokenizer, save_tiny
from hydroagent_hpc.types import ToolCall

__all__ = ["SFT_VARIANTS", "GRPO_PAIRS", "calibration_trajectories", "unit_items", "dataset_items", "our_sft_step",
           "write_unit_data", "trl_sft_run", "our_sft_run", "GRPOBatch", "grpo_batch", "our_grpo_loss", "trl_grpo_loss",
           "peak_rss_mb", "current_rss_mb", "RTOL", "DRIFT_RTOL", "measure", "markdown", "main"]

log = logging.getLogger(__name__)

#: Our SFT loss as the trainer computes it, and two deliberate changes that must not match TRL.
SFT_VARIANTS = ("trainer", "per-sequence", "no-mask")
#: Our aggregation -> TRL's ``loss_type`` of the same formula.
GRPO_PAIRS = {"token-mean": "bnpo", "seq-mean-token-mean": "grpo"}

_TEXT = ("The simulated peaks are too low, so I lower wm.", "The peaks arrive late; I raise alpha.",
         "Baseflow is too small, so I lower fc.", "NSE improved; one more change to under.")


def calibration_trajectories(tokenizer: Any, n: int, seed: int = 0, *, tools: bool = False,
                             same_prompt: bool = False) -> list[Trajectory]:
    """``n`` calibration conversations (system, user, 1-3 rounds of a Hermes ``set_parameters`` call and its
    tool response, a closing assistant turn) tokenised by the trajectory builder that builds our SFT data.

    ``tools``: the three tool schemas in the system turn (as stored episodes have them: ~1k more tokens,
    all masked). ``same_prompt``: one user message for all (a GRPO group)."""
    rng = np.random.default_rng(seed)
    builder = TrajectoryBuilder(tokenizer, tools=tool_schemas() if tools else None)
    out = []
    for i in range(n):
        basin = 0 if same_prompt else i
        msgs: list[dict[str, Any]] = [{"role": "system", "content": "You calibrate the CREST model."},
                                      {"role": "user", "content": f"Calibrate the CREST model for basin {basin}."}]
        for _ in range(int(rng.integers(1, 4))):
            call = ToolCall("set_parameters", {"wm": round(float(rng.uniform(50, 300)), 1),
                                               "b": round(float(rng.uniform(1, 20)), 2)})
            msgs.append({"role": "assistant", "content": f"{rng.choice(_TEXT)}\n{render_hermes(call)}"})
            msgs.append({"role": "tool", "content": render_tool_response(
                {"status": "ok", "NSE": round(float(rng.normal(0.5, 0.2)), 3)})})
        msgs.append({"role": "assistant", "content": str(rng.choice(_TEXT))})
        out.append(builder.build(msgs))
    return out


def unit_items(trajs: Sequence[Trajectory]) -> list[dict[str, torch.Tensor]]:
    """Items shaped as :class:`~hydroagent_hpc.train.sft.data.SFTDataset` returns them, weight 1."""
    return [{"input_ids": torch.tensor(t.input_ids, dtype=torch.long),
             "assistant_mask": torch.tensor(t.assistant_mask, dtype=torch.long),
             "weight": torch.tensor(1.0)} for t in trajs]


def dataset_items(dataset: SFTDataset) -> list[dict[str, torch.Tensor]]:
    """Every example of an SFT data file, its weight replaced by 1 (TRL has no per-example weights)."""
    return [{"input_ids": it["input_ids"], "assistant_mask": it["assistant_mask"], "weight": torch.tensor(1.0)}
            for it in (dataset[i] for i in range(len(dataset)))]


def write_unit_data(path: Path, items: Sequence[dict[str, torch.Tensor]]) -> Path:
    """An SFT data file (the schema :class:`~hydroagent_hpc.train.sft.data.SFTDataset` reads and checks) of
    ``items``, every weight 1: what :func:`our_sft_run` trains on."""
    import h5py

    lengths = np.array([int(it["input_ids"].numel()) for it in items], dtype=np.int64)
    string = h5py.string_dtype("utf-8")
    with h5py.File(path, "w") as f:
        f.attrs.update({"schema": DATA_SCHEMA, "schema_version": DATA_VERSION, "preset": "trl-compare",
                        "tokenizer": "tiny", "max_tokens": int(lengths.max()), "sources": "[]", "counts": "{}"})
        f["input_ids"] = np.concatenate([it["input_ids"].numpy() for it in items]).astype(np.int32)
        f["assistant_mask"] = np.concatenate([it["assistant_mask"].numpy() for it in items]).astype(np.uint8)
        f["offsets"] = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        f["spans"] = np.zeros((0, 2), dtype=np.int64)
        f["span_offsets"] = np.zeros(len(items) + 1, dtype=np.int64)
        f["weight"] = np.ones(len(items), dtype=np.float64)
        f["best_nse"] = np.full(len(items), np.nan)
        f["source"] = np.zeros(len(items), dtype=np.int32)
        for name in ("episode_id", "basin_id", "agent"):
            f.create_dataset(name, data=[f"{name}-{i}" for i in range(len(items))], dtype=string)
    SFTDataset(path)  # the file is checked as the trainer checks it
    return path


def _grad_norm(model: torch.nn.Module, max_norm: float = 1.0) -> float:
    """The norm ``clip_grad_norm_`` returns (before clipping), as both trainers log it."""
    return float(torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm))


def our_sft_step(model: torch.nn.Module, items: Sequence[dict[str, torch.Tensor]], pad_id: int,
                 variant: str = "trainer") -> tuple[float, float]:
    """(loss, grad_norm) of one forward/backward of a copy of ``model`` on ``items`` as one micro-batch.

    ``variant``: ``trainer`` (the SFT trainer's functions: the token mean over the batch), or a deliberate
    change: ``per-sequence`` (each sequence's token mean, averaged over sequences) or ``no-mask`` (every
    token after the first is a target, prompts and tool responses too)."""
    if variant not in SFT_VARIANTS:
        raise ValueError(f"variant must be one of {', '.join(SFT_VARIANTS)}, got {variant!r}")
    work = copy.deepcopy(model).float().train()
    batch = collate(items, pad_id)
    if variant == "no-mask":
        batch["loss_mask"] = batch["attention_mask"].float()
    head = targets_only_head(work, batch) if variant == "trainer" else contextlib.nullcontext()
    with head:  # the trainer's forward: the head on the assistant targets only
        logits = work(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    if variant == "per-sequence":
        rows = [weighted_token_loss(logits[i:i + 1], {k: v[i:i + 1] for k, v in batch.items()})
                / loss_denominator({k: v[i:i + 1] for k, v in batch.items()}) for i in range(len(items))]
        loss = torch.stack(rows).mean()
    else:
        loss = weighted_token_loss(logits, batch) / loss_denominator(batch)
    loss.backward()
    return float(loss.detach()), _grad_norm(work)


class _StepTimer(TrainerCallback):
    """Wall time of each optimizer step of a transformers ``Trainer``."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._t0)


def trl_sft_run(model: torch.nn.Module, items: Sequence[dict[str, torch.Tensor]], tokenizer: Any, workdir: Path,
                steps: int = 1, lr: float = 1e-3) -> dict[str, Any]:
    """``trl.SFTTrainer.train()`` on a copy of ``model``: ``steps`` optimizer steps, each on all of ``items``
    (one micro-batch), constant ``lr``, AdamW betas (0.9, 0.95), no weight decay, clipping at 1.0, fp32.

    Returns per step ``loss``, ``grad_norm``, ``seconds`` and ``tokens`` (non-pad tokens of the batch)."""
    from datasets import Dataset
    from trl import SFTConfig as TRLConfig
    from trl import SFTTrainer

    data = Dataset.from_dict({"input_ids": [it["input_ids"].tolist() for it in items],
                              "assistant_masks": [it["assistant_mask"].tolist() for it in items]})
    args = TRLConfig(output_dir=str(workdir), max_steps=steps, per_device_train_batch_size=len(items),
                     gradient_accumulation_steps=1, learning_rate=lr, lr_scheduler_type="constant", warmup_steps=0,
                     adam_beta1=0.9, adam_beta2=0.95, adam_epsilon=1e-8, weight_decay=0.0, max_grad_norm=1.0,
                     logging_steps=1, report_to="none", save_strategy="no", use_cpu=True, bf16=False,
                     gradient_checkpointing=False, max_length=None, disable_tqdm=True, dataloader_num_workers=0,
                     seed=0)
    timer = _StepTimer()
    trainer = SFTTrainer(model=copy.deepcopy(model).float(), args=args, train_dataset=data,
                         processing_class=tokenizer, callbacks=[timer])
    trainer.train()
    logged = [h for h in trainer.state.log_history if "loss" in h and "grad_norm" in h]
    tokens = sum(int(it["input_ids"].numel()) for it in items)
    return {"loss": [float(h["loss"]) for h in logged], "grad_norm": [float(h["grad_norm"]) for h in logged],
            "seconds": timer.seconds, "tokens": [tokens] * len(timer.seconds)}


def our_sft_run(data: Path, workdir: Path, examples: int, steps: int = 1, lr: float = 1e-3) -> dict[str, Any]:
    """Our trainer (:func:`~hydroagent_hpc.train.sft.trainer.train_sft`, model ``tiny`` seed 0) on the SFT data
    file ``data`` (weights 1), with the settings of :func:`trl_sft_run`: micro-batch = all ``examples``,
    ``steps`` steps, constant ``lr`` (no warm-up, cosine floor 1), no weight decay, fp32. Per step from its
    ``metrics.csv``: ``loss``, ``grad_norm``, ``seconds`` and ``tokens``."""
    config = config_from_mapping({
        "data": str(data), "model": "tiny", "lr": lr, "weight_decay": 0.0, "warmup_steps": 0, "min_lr_ratio": 1.0,
        "max_steps": steps, "micro_batch_size": examples, "grad_accum": 1, "max_grad_norm": 1.0, "seed": 0,
        "dtype": "fp32", "fsdp": False, "activation_checkpointing": False, "save_every": 0, "log_every": 10**6,
        "bucket_by_length": False}, source="trl_compare")
    run = workdir / "ours"
    train_sft(config, run, resume=False)
    with open(run / "metrics.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    return {"loss": [float(r["loss"]) for r in rows], "grad_norm": [float(r["grad_norm"]) for r in rows],
            "seconds": [float(r["tokens"]) / float(r["tokens_per_s"]) for r in rows],
            "tokens": [int(float(r["tokens"])) for r in rows]}


@dataclass
class GRPOBatch:
    """One prompt (``P`` tokens) and K completions (right-padded to ``C``), with everything the loss needs."""

    prompt_ids: torch.Tensor       # [K, P]
    completion_ids: torch.Tensor   # [K, C]
    completion_mask: torch.Tensor  # [K, C] 1 on completion tokens (not padding)
    tool_mask: torch.Tensor        # [K, C] 1 on tokens the policy wrote (0 on tool responses, role headers)
    advantages: torch.Tensor       # [K]
    old_logp: torch.Tensor         # [K, C]
    ref_logp: torch.Tensor         # [K, C]

    @property
    def input_ids(self) -> torch.Tensor:
        return torch.cat([self.prompt_ids, self.completion_ids], dim=1)

    @property
    def attention_mask(self) -> torch.Tensor:
        return torch.cat([torch.ones_like(self.prompt_ids), self.completion_mask], dim=1)

    @property
    def loss_mask(self) -> torch.Tensor:
        return torch.cat([torch.zeros_like(self.prompt_ids), self.tool_mask], dim=1).float()


def grpo_batch(model: Any, tokenizer: Any, k: int = 4, seed: int = 2, noise: float = 0.3) -> GRPOBatch:
    """A fixed GRPO batch: K multi-turn completions of one prompt, advantages from seeded rewards (group mean
    0, std 1), ``old_logp`` = ``model``'s log-probs + ``noise`` x N(0, 1), ``ref_logp`` from tiny seed 1."""
    trajs = calibration_trajectories(tokenizer, k, seed, same_prompt=True)
    prompt_len = min(t.assistant_mask.index(1) for t in trajs)
    width = max(len(t) - prompt_len for t in trajs)
    completion = torch.full((k, width), int(tokenizer.pad_token_id), dtype=torch.long)
    cmask = torch.zeros((k, width), dtype=torch.long)
    tmask = torch.zeros((k, width), dtype=torch.long)
    for i, t in enumerate(trajs):
        n = len(t) - prompt_len
        completion[i, :n] = torch.tensor(t.input_ids[prompt_len:])
        cmask[i, :n] = 1
        tmask[i, :n] = torch.tensor(t.assistant_mask[prompt_len:])
    prompt = torch.tensor([trajs[0].input_ids[:prompt_len]] * k, dtype=torch.long)
    rng = np.random.default_rng(seed)
    rewards = rng.normal(size=k)
    adv = torch.tensor((rewards - rewards.mean()) / (rewards.std() + 1e-6), dtype=torch.float32)
    ids = torch.cat([prompt, completion], dim=1)
    att = torch.cat([torch.ones_like(prompt), cmask], dim=1)
    with torch.no_grad():
        logp, _ = token_logprobs(model, ids, att, with_entropy=False)
        ref, _ = token_logprobs(build_tiny_qwen3(tokenizer, seed=1), ids, att, with_entropy=False)
    old = logp + noise * torch.from_numpy(rng.standard_normal(tuple(logp.shape))).float()
    return GRPOBatch(prompt, completion, cmask, tmask, adv, old[:, prompt_len:], ref[:, prompt_len:])


def _pad_left(values: torch.Tensor, prompt_len: int) -> torch.Tensor:
    return torch.cat([values.new_zeros((values.shape[0], prompt_len)), values], dim=1)


def our_grpo_loss(model: Any, batch: GRPOBatch, aggregation: str, *, kl_coef: float = 0.04,
                  clip_low: float = 0.2, clip_high: float = 0.28) -> tuple[float, float]:
    """(loss, grad_norm) of :func:`~hydroagent_hpc.train.grpo.loss.grpo_loss` on a copy of ``model``."""
    work = copy.deepcopy(model).float().train()
    p = batch.prompt_ids.shape[1]
    logp, _ = token_logprobs(work, batch.input_ids, batch.attention_mask, with_entropy=False)
    mask = batch.loss_mask
    parts = grpo_loss(logp, _pad_left(batch.old_logp, p), _pad_left(batch.ref_logp, p), None,
                      batch.advantages[:, None].expand_as(logp), mask, clip_low=clip_low, clip_high=clip_high,
                      kl_coef=kl_coef, aggregation=aggregation)
    parts.loss.backward()
    return float(parts.loss.detach()), _grad_norm(work, math.inf)


def trl_grpo_loss(model: Any, tokenizer: Any, batch: GRPOBatch, loss_type: str, workdir: Path, *,
                  kl_coef: float = 0.04, clip_low: float = 0.2, clip_high: float = 0.28) -> tuple[float, float]:
    """(loss, grad_norm) of ``trl.GRPOTrainer.compute_loss`` on ``batch`` (a policy loaded from a save of
    ``model``: TRL builds its reference model from the policy's folder; the batch carries its own
    reference log-probs, which are the ones used)."""
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    k, width = batch.completion_ids.shape
    folder = save_tiny(workdir / "policy", model=model, tokenizer=tokenizer)
    args = GRPOConfig(output_dir=str(workdir / "trl-grpo"), use_cpu=True, bf16=False, gradient_checkpointing=False,
                      beta=kl_coef, epsilon=clip_low, epsilon_high=clip_high, loss_type=loss_type, num_generations=k,
                      per_device_train_batch_size=k, max_completion_length=width, temperature=1.0,
                      use_bias_correction_kl=False, report_to="none", disable_tqdm=True)

    def unused_reward(completions: list[Any], **kwargs: Any) -> list[float | None]:
        return [0.0] * len(completions)  # the batch's advantages are given; no rollout runs

    trainer = GRPOTrainer(model=str(folder), reward_funcs=unused_reward, args=args,
                          train_dataset=Dataset.from_dict({"prompt": ["-"] * k}), processing_class=tokenizer)
    policy: Any = trainer.model
    policy.train()
    trainer.current_gradient_accumulation_steps = 1
    inputs = {"prompt_ids": batch.prompt_ids, "prompt_mask": torch.ones_like(batch.prompt_ids),
              "completion_ids": batch.completion_ids, "completion_mask": batch.completion_mask,
              "tool_mask": batch.tool_mask, "advantages": batch.advantages, "old_per_token_logps": batch.old_logp,
              "ref_per_token_logps": batch.ref_logp, "num_items_in_batch": batch.tool_mask.sum().float()}
    loss = trainer.compute_loss(policy, inputs)
    loss.backward()
    return float(loss.detach()), _grad_norm(policy, math.inf)


def current_rss_mb() -> float:
    """This process's resident memory now (``/proc/self/statm``; 0 where there is no /proc)."""
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[1])
    except (OSError, IndexError, ValueError):
        return 0.0
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def peak_rss_mb() -> float:
    """This process's peak resident memory (``getrusage``; KiB on Linux)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


COMMAND_DOC = """Side by side with TRL: ``python -m hydroagent_hpc.bench.trl [--steps N] [--examples N] [--data FILE]``.

On the tiny Qwen3 (seed 0, fp32, CPU), the same token ids and assistant masks (weights 1: TRL has none):

1. **SFT, equality.** Our SFT trainer (``train_sft``) and ``trl.SFTTrainer`` each run ``--steps``
   optimizer steps, every step on the whole batch (one micro-batch of ``--examples`` sequences), constant
   learning rate, the same AdamW; the table lists both trainers' logged loss and gradient norm per step.
   Below it, our loss function on the batch as the trainer computes it and two deliberate changes
   (per-sequence normalisation, no assistant mask) beside TRL's step-1 numbers: only the first matches.
2. **SFT, speed and memory.** Each trainer runs in its own process (so each has its own peak RSS), ours
   and TRL's alternately ``--repeats`` times: tokens per second over the steps after the first (non-pad
   tokens / wall time of the optimizer steps), peak RSS (``getrusage``) and RSS before training (after
   imports and data), the ratio ours / TRL of each (the baseline, TRL, measured in the same run).
3. **GRPO.** One loss and gradient norm on a fixed multi-turn batch (one prompt, K completions with tool
   responses, fixed advantages, clipped ratios, k3 KL against another model) by our ``grpo_loss`` and by
   ``trl.GRPOTrainer.compute_loss`` (tool responses masked by TRL's ``tool_mask``), for each pair of
   aggregations that are the same formula.

What is compared and how each side normalises: :mod:`hydroagent_hpc.train.measure.trl_compare` and
docs/trl.md. The data: ``--examples`` calibration conversations built by our trajectory builder (with the
tool schemas in the system turn unless ``--no-tools``) written as an SFT data file, or ``--data FILE``
(a ``hydroagent train sft-data`` file, its weights replaced by 1). Exit status 1 when a trainer's loss
or gradient norm differs from the other's beyond the tolerance.
"""

#: Relative tolerance of "the same": float32 rounding of a sum in another order (metrics.csv keeps 7 digits).
RTOL = 2e-5
#: After the first step the weights themselves differ by rounding, which AdamW (each element divided by its
#: own RMS) amplifies a little per step: later steps are held to this looser tolerance.
DRIFT_RTOL = 1e-3


def _same(a: float, b: float, rtol: float = RTOL) -> bool:
    return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-7)


def _side(side: str, data: Path, steps: int, work: Path) -> dict[str, Any]:
    """One trainer's run in this process: per-step numbers, RSS before training and the peak."""

    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    model, tokenizer = build_tiny(seed=0)
    items = dataset_items(SFTDataset(data))
    if side == "trl":
        import trl  # noqa: F401  (its import is not training: loaded before the RSS baseline, as ours is)
    before = current_rss_mb()
    if side == "ours":
        run = our_sft_run(data, work, len(items), steps)
    else:
        run = trl_sft_run(model, items, tokenizer, work / "trl", steps)
    run.update(rss_before_mb=before, peak_rss_mb=peak_rss_mb())
    return run


def _spawn(side: str, data: Path, steps: int, work: Path, threads: int) -> dict[str, Any]:
    work.mkdir(parents=True, exist_ok=True)
    out = work / f"{side}.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1", "TRL_EXPERIMENTAL_SILENCE": "1"}
    cmd = [sys.executable, "-m", "hydroagent_hpc.bench.trl", "--side", side, "--data", str(data),
           "--steps", str(steps), "--side-out", str(out)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    if proc.returncode != 0:
        raise SystemExit(f"bench.trl: the {side} run failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text())
    return result


def _rate(run: dict[str, Any]) -> float:
    """Tokens per second over the steps after the first (the first warms up)."""
    tokens, seconds = run["tokens"][1:] or run["tokens"], run["seconds"][1:] or run["seconds"]
    return float(sum(tokens) / sum(seconds))


def _data(args: argparse.Namespace, work: Path) -> Path:

    if args.data:
        items = dataset_items(SFTDataset(args.data))[: args.examples]
    else:
        items = unit_items(calibration_trajectories(build_tiny_tokenizer(), args.examples, seed=1,
                                                          tools=not args.no_tools))
    return write_unit_data(work / "data.h5", items)


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Everything the command prints, as one dictionary."""

    data = _data(args, work)
    runs: dict[str, list[dict[str, Any]]] = {"ours": [], "trl": []}
    for r in range(args.repeats):
        for side in ("ours", "trl"):
            runs[side].append(_spawn(side, data, args.steps, work / f"{side}-{r}", args.threads))
    torch.set_num_threads(args.threads)
    model, tokenizer = build_tiny(seed=0)
    items = dataset_items(SFTDataset(data))
    variants = {v: our_sft_step(model, items, int(tokenizer.pad_token_id), v) for v in SFT_VARIANTS}
    batch = grpo_batch(model, tokenizer, k=args.k)
    grpo = {agg: {"ours": our_grpo_loss(model, batch, agg),
                  "trl": trl_grpo_loss(model, tokenizer, batch, loss_type, work / f"grpo-{loss_type}"),
                  "loss_type": loss_type}
            for agg, loss_type in GRPO_PAIRS.items()}
    lengths = [int(it["input_ids"].numel()) for it in items]
    masked = [int(it["assistant_mask"][1:].sum()) for it in items]
    return {"examples": len(items), "tokens": sum(lengths), "assistant_tokens": sum(masked),
            "lengths": [min(lengths), max(lengths)], "steps": args.steps, "threads": args.threads,
            "runs": runs, "variants": variants, "grpo": grpo, "grpo_k": args.k,
            "grpo_tokens": int(batch.tool_mask.sum())}


def markdown(m: dict[str, Any]) -> tuple[str, bool]:
    """The tables, and whether every comparison that must hold held."""
    ok = True
    ours, trl = m["runs"]["ours"][0], m["runs"]["trl"][0]
    out = [f"Data: {m['examples']} sequences of {m['lengths'][0]}-{m['lengths'][1]} tokens ({m['tokens']} tokens, "
           f"{m['assistant_tokens']} assistant targets), weights 1; one micro-batch per step; tiny Qwen3, fp32, "
           f"{m['threads']} thread(s).\n",
           "### SFT: the two trainers, step by step (loss = token mean over the batch)\n",
           ("| step | ours loss | TRL loss | ours grad norm | TRL grad norm | same (rel. 2e-5 at step 1, then 1e-3) |"),
           "|---|---|---|---|---|---|"]
    for s, (lo, lt, go, gt) in enumerate(zip(ours["loss"], trl["loss"], ours["grad_norm"], trl["grad_norm"],
                                             strict=False), start=1):
        tol = RTOL if s == 1 else DRIFT_RTOL
        same = _same(lo, lt, tol) and _same(go, gt, tol)
        ok &= same
        out.append(f"| {s} | {lo:.7f} | {lt:.7f} | {go:.6f} | {gt:.6f} | {'yes' if same else 'NO'} |")
    out += ["", "### SFT: our loss function on the batch, and deliberate changes, beside TRL's step 1\n",
            "| ours | loss | grad norm | TRL loss | TRL grad norm | same |", "|---|---|---|---|---|---|"]
    for v, (lo, go) in m["variants"].items():
        same = _same(lo, trl["loss"][0]) and _same(go, trl["grad_norm"][0])
        ok &= same == (v == "trainer")
        out.append(f"| {v} | {lo:.7f} | {go:.6f} | {trl['loss'][0]:.7f} | {trl['grad_norm'][0]:.6f} | "
                   f"{'yes' if same else 'no'} |")
    out += ["", f"### SFT: speed and memory ({m['steps']} steps, each side in its own process, "
                f"{len(m['runs']['ours'])} run(s) each, alternating; rate over steps 2..{m['steps']})\n",
            "| trainer | tokens/s | peak RSS MB | RSS before training MB | peak - before MB |", "|---|---|---|---|---|"]
    best = {}
    for side, name in (("ours", "ours (train_sft)"), ("trl", "TRL SFTTrainer")):
        runs = m["runs"][side]
        rate = max(_rate(r) for r in runs)
        peak = min(r["peak_rss_mb"] for r in runs)
        before = min(r["rss_before_mb"] for r in runs)
        best[side] = (rate, peak, peak - before)
        out.append(f"| {name} | {rate:.0f} | {peak:.0f} | {before:.0f} | {peak - before:.0f} |")
    (ro, po, go_), (rt, pt, gt_) = best["ours"], best["trl"]
    out.append(f"| ours / TRL | {ro / rt:.2f} | {po / pt:.2f} | | {go_ / gt_ if gt_ > 0 else float('nan'):.2f} |")
    out += ["", f"### GRPO: one loss on a fixed multi-turn batch (K={m['grpo_k']}, {m['grpo_tokens']} policy tokens, "
                "clip 0.2/0.28, k3 KL coefficient 0.04)\n",
            "| ours aggregation | TRL loss_type | ours loss | TRL loss | ours grad norm | TRL grad norm | same |",
            "|---|---|---|---|---|---|---|"]
    for agg, g in m["grpo"].items():
        (lo, go), (lt, gt) = g["ours"], g["trl"]
        same = _same(lo, lt) and _same(go, gt)
        ok &= same
        out.append(f"| {agg} | {g['loss_type']} | {lo:.8f} | {lt:.8f} | {go:.6f} | {gt:.6f} | "
                   f"{'yes' if same else 'NO'} |")
    return "\n".join(out) + "\n", ok


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hydroagent_hpc.bench.trl", description=COMMAND_DOC.splitlines()[0])
    ap.add_argument("--steps", type=int, default=10, help="optimizer steps of each trainer")
    ap.add_argument("--examples", type=int, default=8, help="sequences in the batch")
    ap.add_argument("--no-tools", action="store_true", help="no tool schemas in the system turn (short sequences)")
    ap.add_argument("--data", type=Path, help="an SFT data file to take the first --examples sequences from")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each trainer (alternating); best of each")
    ap.add_argument("--threads", type=int, default=1, help="torch threads of every run")
    ap.add_argument("--k", type=int, default=4, help="completions in the GRPO batch")
    ap.add_argument("--json", type=Path, help="also write the measurements here")
    ap.add_argument("--side", choices=("ours", "trl"), help=argparse.SUPPRESS)
    ap.add_argument("--side-out", type=Path, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    for name in ("steps", "examples", "repeats", "threads", "k"):
        if getattr(args, name) < 1:
            ap.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if args.side:
        with tempfile.TemporaryDirectory(prefix=f"hydroagent-bench-trl-{args.side}-") as tmp:
            args.side_out.write_text(json.dumps(_side(args.side, args.data, args.steps, Path(tmp))))
        return 0
    with tempfile.TemporaryDirectory(prefix="hydroagent-bench-trl-") as tmp:
        m = measure(args, Path(tmp))
    if args.json:
        args.json.write_text(json.dumps(m, indent=1) + "\n")
    text, ok = markdown(m)
    sys.stdout.write(text)
    return 0 if ok else 1


