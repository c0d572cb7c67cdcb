"""Weighted, full-parameter SFT of a causal LM on teacher trajectories (``hydroagent train sft``).

``python -m hydroagent_hpc.train.sft CONFIG --out RUN_DIR [--resume]`` (or under
``torchrun``/``accelerate launch`` for several processes) runs :func:`train_sft`, top to bottom:

1. **Check before writing.** The config (:mod:`hydroagent_hpc.train.sft.config`), the data file
   (:class:`~hydroagent_hpc.train.sft.data.SFTDataset`), the model and its tokenizer, and every
   sequence length against ``max_seq_len`` (default: the model's context) are checked first;
   any problem is one :class:`ConfigError` and nothing is written.
2. **Distribute.** An ``accelerate.Accelerator`` sets up the process group (gloo on CPU, NCCL on
   GPUs). With more than one process and ``fsdp`` on (``auto``: whenever there is more than one
   process), every decoder layer and then the root are wrapped with FSDP2 ``fully_shard``
   (bf16 parameters for compute, fp32 reductions and master weights when the dtype is bf16);
   otherwise the model is DDP (``accelerator.prepare``) or a plain module.
3. **Batches.** Each epoch is a seeded permutation of the examples; with ``bucket_by_length``
   windows of ``32 x micro_batch_size`` examples are sorted by length before they are cut into
   micro-batches (whose order is then shuffled). Micro-batches are right-padded with an attention
   mask, so every row attends only to its own tokens (no packing, no cross-sequence attention).
   The plan depends only on the data, the seed and ``micro_batch_size``; optimizer step ``s``
   takes micro-batches ``s*W*A ... (s+1)*W*A - 1`` of it (W processes x A accumulation steps),
   rank ``r`` those at ``a*W + r``. A step at the end of an epoch that lacks micro-batches fills
   them with weight-0 copies so every rank runs the same number of forward/backward passes.
4. **Loss.** For example ``i`` with weight ``w_i`` and assistant mask ``m_i`` (1 on tokens the
   model wrote, from the trajectory builder), over all micro-batches of all ranks in one optimizer
   step::

       loss = sum_i w_i * sum_t m_i[t] * CE(logits_i[t-1], ids_i[t]) / sum_i w_i * sum_t m_i[t]

   The denominator is summed over the whole step (and all-reduced across ranks) *before* any
   backward pass, and each micro-batch's backward uses ``W x`` its share of the numerator over
   it (DDP and FSDP average gradients over ranks), so the gradient is that of the formula above
   whatever the accumulation and the number of ranks: an example of weight 0 changes nothing,
   and doubling every weight changes nothing. A step whose denominator is 0 does not step the
   optimizer.
5. **Optimise.** AdamW (no weight decay on 1-D parameters such as norms), gradient clipping to
   ``max_grad_norm``, learning rate ``lr * f(step)`` with a linear warm-up
   ``f = (step + 1) / warmup_steps`` then a cosine from 1 down to ``min_lr_ratio`` at ``max_steps``.
6. **Record.** ``RUN_DIR/config.yaml`` (the resolved config, versions, git commit),
   ``RUN_DIR/metrics.csv`` (step, loss, tokens, tokens_per_s, lr, grad_norm, peak_mem_mb; one row
   per step; also to TensorBoard / W&B with ``report_to``, :mod:`hydroagent_hpc.train.live`), console
   logging every ``log_every`` steps, and on rank 0 a progress bar (a terminal) or ETA lines (a batch log).
7. **Checkpoints** (:mod:`hydroagent_hpc.train.checkpoint`): every ``save_every`` steps, on
   SIGUSR1 (save at the next step boundary and go on) and on SIGTERM (save and stop; the command
   exits 143), atomically. With ``resume`` a run continues from ``checkpoints/latest``: model,
   optimizer, scheduler, sampler position (epoch, step in epoch) and RNG states, so on a CPU the
   parameters after "kill at step k + resume" equal those of an uninterrupted run.
8. **Final model:** ``RUN_DIR/final/``, a ``save_pretrained`` folder (weights in the compute
   dtype, tokenizer with its chat template, generation config) that ``HFLocalPolicy(path)``,
   ``AutoModelForCausalLM.from_pretrained`` and vLLM/SGLang load as is.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import re
import resource
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F

from hydroagent_hpc.errors import ConfigError, one_line
from hydroagent_hpc.train.checkpoint import (
    TrainerState,
    fault,
    load_checkpoint,
)
from hydroagent_hpc.train.distributed import (
    Signals,
    agree,
    all_reduce_sum,
    grad_sync,
    make_accelerator,
    pretrained_copy,
    process_group_timeout,
    shard,
)
from hydroagent_hpc.train.finite import (
    NonFiniteError,
    check_step,
    check_weights,
    save_final,
    stopped_at,
)
from hydroagent_hpc.train.live import open_live
from hydroagent_hpc.train.memory_plan import require_fits
from hydroagent_hpc.train.rundir import MetricsCSV, field_defaults, prepare_run_dir, write_run_config
from hydroagent_hpc.train.sft.config import SFTConfig, load_sft_config
from hydroagent_hpc.train.sft.data import SFTDataError, SFTDataset
from hydroagent_hpc.train.writes import check_run_dir, save_checkpoint_or_stop

log = logging.getLogger(__name__)

__all__ = ["SFTConfig", "load_sft_config", "train_sft", "plan_epoch", "collate",
           "weighted_token_loss", "targets_only_head", "loss_denominator", "lr_factor", "METRICS_COLUMNS",
           "sft_optimizer"]

METRICS_COLUMNS = ("step", "loss", "tokens", "tokens_per_s", "lr", "grad_norm", "peak_mem_mb")
BUCKET_WINDOW = 32  # micro-batches per length-sorting window


# ---------------------------------------------------------------------------------------------
# Data: epoch plans, collation, the weighted loss


def plan_epoch(lengths: Sequence[int], micro_batch_size: int, seed: int, epoch: int,
               bucket_by_length: bool) -> list[list[int]]:
    """The micro-batches (lists of example indices) of ``epoch``: deterministic in its arguments."""
    n = len(lengths)
    rng = np.random.default_rng([seed, epoch])
    order = [int(i) for i in rng.permutation(n)]
    if bucket_by_length:
        window = micro_batch_size * BUCKET_WINDOW
        order = [j for s in range(0, n, window) for j in sorted(order[s:s + window], key=lambda j: (lengths[j], j))]
    batches = [order[s:s + micro_batch_size] for s in range(0, n, micro_batch_size)]
    if bucket_by_length:
        batches = [batches[int(k)] for k in rng.permutation(len(batches))]
    return batches


def collate(items: Sequence[dict[str, Any]], pad_id: int, weight_scale: float = 1.0) -> dict[str, torch.Tensor]:
    """Right-pad ``items`` into ``input_ids``, ``attention_mask``, ``loss_mask`` and ``weight``.

    ``loss_mask[:, t]`` is the assistant mask of token ``t`` (0 on padding); the loss of token
    ``t`` is predicted at position ``t - 1``. ``weight_scale`` 0 makes a filler micro-batch.
    """
    longest = max(int(it["input_ids"].numel()) for it in items)
    ids = torch.full((len(items), longest), pad_id, dtype=torch.long)
    attention = torch.zeros((len(items), longest), dtype=torch.long)
    mask = torch.zeros((len(items), longest), dtype=torch.float32)
    for row, it in enumerate(items):
        n = int(it["input_ids"].numel())
        ids[row, :n] = it["input_ids"]
        attention[row, :n] = 1
        mask[row, :n] = it["assistant_mask"].to(torch.float32)
    weight = torch.stack([it["weight"].to(torch.float32) for it in items]) * float(weight_scale)
    return {"input_ids": ids, "attention_mask": attention, "loss_mask": mask, "weight": weight}


def weighted_token_loss(logits: torch.Tensor, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sum_i w_i sum_t m_i[t] CE(logits_i[t-1], ids_i[t])`` (a sum: the caller divides by the step's
    ``sum_i w_i sum_t m_i[t]``). Cross-entropy is taken in fp32 on the masked positions only.

    ``logits``: ``[B, T, V]``, or ``[targets, V]`` when the model's head saw only the positions that
    predict a masked token (:func:`targets_only_head`), in the same (row-major) order."""
    mask = batch["loss_mask"][:, 1:]
    selected = mask > 0
    targets = batch["input_ids"][:, 1:][selected]
    token_logits = (logits if logits.dim() == 2 else logits[:, :-1][selected]).float()
    ce = F.cross_entropy(token_logits, targets, reduction="none")
    token_weight = (batch["weight"][:, None] * mask)[selected]
    return (ce * token_weight).sum()


@contextlib.contextmanager
def targets_only_head(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> Iterator[None]:
    """While in force, the model's output head (``get_output_embeddings``; under a DDP wrapper its
    ``module``'s) projects only the hidden states at the positions ``t - 1`` of the masked tokens ``t`` of
    ``batch``, so ``.logits`` is ``[targets, V]`` (what :func:`weighted_token_loss` takes) instead of
    ``[B, T, V]``: the head's matmul, its gradient and the logits tensor shrink to the assistant tokens
    (8% of the tokens of the TRL bench's batch). The loss is the same number; the head's weight gradient
    sums the same products without the zero rows. A model without such a head, or a head called with
    another shape, is left as it is (full logits)."""
    inner: Any = getattr(model, "module", model)
    find = getattr(inner, "get_output_embeddings", None)
    head = find() if callable(find) else None
    if not isinstance(head, torch.nn.Module):
        yield
        return
    selected = batch["loss_mask"][:, 1:] > 0
    shape = tuple(batch["input_ids"].shape)

    def select(_module: torch.nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        hidden = args[0] if args else None
        if not isinstance(hidden, torch.Tensor) or hidden.dim() != 3 or tuple(hidden.shape[:2]) != shape:
            return None
        return (hidden[:, :-1][selected], *args[1:])

    handle = head.register_forward_pre_hook(select)
    try:
        yield
    finally:
        handle.remove()


def loss_denominator(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """``sum_i w_i sum_{t>=1} m_i[t]`` of one micro-batch."""
    return (batch["weight"][:, None] * batch["loss_mask"][:, 1:]).sum()


def lr_factor(step: int, warmup_steps: int, max_steps: int, min_lr_ratio: float) -> float:
    """Multiplier of ``lr`` for optimizer step ``step`` (0-based): linear warm-up, then cosine decay."""
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(1, max_steps - warmup_steps)
    progress = min(1.0, (step - warmup_steps) / span)
    return min_lr_ratio + (1.0 - min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------
# Checks before anything is written


def _open_data(config: SFTConfig) -> SFTDataset:
    try:
        ds = SFTDataset(config.data)
    except SFTDataError as exc:
        raise ConfigError(f"data: {exc.message}", exc.fix) from None
    if len(ds) == 0:
        raise ConfigError(f"data: {config.data} holds no sequence", "rebuild it with `hydroagent train sft-data`")
    return ds


def _load_model(config: SFTConfig) -> tuple[Any, Any]:
    """``(model, tokenizer)``: the offline tiny Qwen3 for ``"tiny"``, else a local save_pretrained folder."""
    if config.model == "tiny":
        from hydroagent_hpc.train.tiny import build_tiny_qwen3, build_tiny_tokenizer

        tokenizer = build_tiny_tokenizer()
        return build_tiny_qwen3(tokenizer, seed=config.seed), tokenizer
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(config.model)
    if not path.is_dir():
        raise ConfigError(f"model: {path}: no such checkpoint folder",
                             "give a save_pretrained folder (config.json, weights, tokenizer) or 'tiny'")
    try:
        hf_tokenizer: Any = AutoTokenizer.from_pretrained(path, local_files_only=True)
        hf_model: Any = AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except (OSError, ValueError) as exc:
        raise ConfigError(f"model: {path}: cannot load ({one_line(exc)})",
                             "give a complete save_pretrained folder") from None
    check_weights(hf_model, f"model: {path}", error=ConfigError,
                  fix="train from a model whose weights are finite (re-export it, or an earlier SFT final/)")
    return hf_model, hf_tokenizer


def _check_data_fits(ds: SFTDataset, config: SFTConfig, model: Any) -> np.ndarray:
    """Sequence lengths; refuses sequences over the budget and token ids outside the vocabulary."""
    lengths: np.ndarray = np.diff(ds.offsets).astype(np.int64)
    budget = config.max_seq_len or int(getattr(model.config, "max_position_embeddings", 0) or 0) or None
    if budget is not None and (lengths > budget).any():
        over = np.flatnonzero(lengths > budget)
        named = ", ".join(f"{ds.episode_ids[i]} ({lengths[i]} tokens)" for i in over[:5])
        more = f" and {len(over) - 5} more" if len(over) > 5 else ""
        raise ConfigError(f"data: {len(over)} of {len(lengths)} sequences are longer than "
                             f"{'max_seq_len' if config.max_seq_len else 'the model context'} {budget}: "
                             f"{named}{more}; sequences are never truncated",
                             f"raise max_seq_len (the model allows "
                             f"{getattr(model.config, 'max_position_embeddings', '?')}), or rebuild the data "
                             f"with a smaller --max-tokens")
    try:
        ds.check_vocabulary(int(model.get_input_embeddings().weight.shape[0]), f"model {config.model!r}")
    except SFTDataError as exc:
        raise ConfigError(f"data: {exc.message}", exc.fix) from None
    return lengths


# ---------------------------------------------------------------------------------------------
# Helpers


def _peak_mem_mb(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # KiB on Linux


def _compute_dtype(config: SFTConfig, device: torch.device) -> torch.dtype:
    if config.dtype == "bf16" or (config.dtype == "auto" and device.type == "cuda"):
        return torch.bfloat16
    return torch.float32


def sft_optimizer(model: torch.nn.Module, config: SFTConfig) -> torch.optim.Optimizer:
    """SFT's AdamW: weight decay on the matrices only, betas (0.9, 0.95); fused on a GPU."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    groups = [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # fused on a GPU: no full-size temporary at the step (the memory plan counts none)
    fused = next(model.parameters()).device.type == "cuda"
    return torch.optim.AdamW(groups, lr=config.lr, betas=(0.9, 0.95), eps=1e-8, fused=fused)


# ---------------------------------------------------------------------------------------------
# The run


def _step_plan(config: SFTConfig, world: int, examples: int) -> tuple[int, int, int]:
    """(micro-batches per optimizer step over all processes, steps per epoch, steps of the run)."""
    micro_per_step = world * config.grad_accum
    steps_per_epoch = math.ceil(math.ceil(examples / config.micro_batch_size) / micro_per_step)
    max_steps = config.max_steps if config.max_steps is not None else int(config.epochs or 1) * steps_per_epoch
    return micro_per_step, steps_per_epoch, max_steps


def _record_step(metrics: MetricsCSV, row: dict[str, Any], log_every: int, max_steps: int) -> None:
    """Rank 0: the step's row of ``metrics.csv`` (and of its live metrics and progress display), a console
    line every ``log_every`` steps."""
    metrics.write(row)
    if row["step"] % log_every == 0 or row["step"] == max_steps:
        log.info("step %d/%d loss %.4f lr %.3g grad_norm %.3f tokens/s %.0f peak %.0f MB", row["step"], max_steps,
                 row["loss"], row["lr"], row["grad_norm"], row["tokens_per_s"], row["peak_mem_mb"])


def _place_model(config: SFTConfig, model: Any, accelerator: Any) -> tuple[Any, Callable[[], Any], torch.dtype, bool]:
    """The model on this process's device, in training mode, sharded with FSDP2 (several processes,
    ``fsdp`` not off) or wrapped by accelerate; (model, its autocast context, compute dtype, FSDP or not)."""
    distributed, device = accelerator.num_processes > 1, accelerator.device
    dtype = _compute_dtype(config, device)
    use_fsdp = distributed and config.fsdp is not False
    if config.fsdp is True and not distributed:
        log.info("fsdp: true with one process: training a plain module")
    torch.manual_seed(config.seed)
    model.config.use_cache = False
    if config.activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()
    model.to(device)
    if use_fsdp:
        shard(model, dtype)
        return model, contextlib.nullcontext, dtype, True
    if distributed:
        model = accelerator.prepare(model)
    use_autocast = dtype != torch.float32

    def autocast() -> Any:
        return torch.autocast(device.type, dtype=dtype, enabled=use_autocast)
    return model, autocast, dtype, False


def _resume(resume_from: Path, model: Any, optimizer: torch.optim.Optimizer, scheduler: Any, micro_per_step: int,
            world: int, grad_accum: int) -> TrainerState:
    """The checkpoint's state loaded into model, optimizer and scheduler; refused when it was saved with
    another number of micro-batches per step (the data position would not match)."""
    state = load_checkpoint(resume_from, model, optimizer, scheduler)
    if state.micro_per_step != micro_per_step:
        raise ConfigError(f"--resume from {resume_from}: it was saved with {state.micro_per_step} micro-batches "
                          f"per step (processes x grad_accum), this run has {world} x {grad_accum}; "
                          f"the data position would not match",
                          "resume with the same number of processes, or start a new --out folder")
    check_weights(model, f"--resume from {resume_from}: the checkpoint's model", distributed=world > 1,
                  device=next(model.parameters()).device,
                  fix="resume from an earlier checkpoint (write its step-N name into checkpoints/latest) or start "
                      "a new --out folder")
    return state


def _micro_batches(dataset: SFTDataset, plan: list[list[int]], first: int, world: int, grad_accum: int, pad_id: int,
                   device: torch.device) -> list[dict[str, torch.Tensor]]:
    """This rank's ``grad_accum`` micro-batches of a step: plan entries ``first``, ``first + world``, ...; past
    the epoch's end, the first micro-batch again with weight 0 (every rank runs as many forwards)."""
    batches = []
    for a in range(grad_accum):
        k = first + a * world
        indices, scale = (plan[k], 1.0) if k < len(plan) else (plan[0], 0.0)
        batches.append({key: v.to(device) for key, v in collate([dataset[i] for i in indices], pad_id, scale).items()})
    return batches


def _optimizer_step(model: Any, batches: list[dict[str, torch.Tensor]], autocast: Callable[[], Any],
                    optimizer: torch.optim.Optimizer, scheduler: Any, config: SFTConfig, world: int,
                    device: torch.device, step: int) -> tuple[float, float, float, float]:
    """Forward and backward of each micro-batch (gradients synchronised on the last), clipping, one
    optimizer step (skipped when no assistant token of any rank carries weight) and one scheduler step;
    (loss, gradient norm, learning rate, tokens) over all ranks."""
    distributed = world > 1
    totals = torch.tensor([sum(float(loss_denominator(b)) for b in batches),
                           sum(float(b["attention_mask"].sum()) for b in batches)],
                          dtype=torch.float64, device=device)
    denominator, tokens = (float(v) for v in all_reduce_sum(totals, distributed))
    loss_sum = torch.zeros((), dtype=torch.float64, device=device)
    for a, b in enumerate(batches):
        with grad_sync(model, a == len(batches) - 1):
            with autocast(), targets_only_head(model, b):  # logits of the assistant targets only
                logits = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
                part = weighted_token_loss(logits, b) / max(denominator, 1e-30)
            (part * world).backward()
            del logits  # [B, T, V]: not kept alive through the next forward or the optimizer step
        loss_sum += part.detach().double()
    loss = float(all_reduce_sum(loss_sum, distributed))
    grad_norm_t = torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
    grad_norm = float(grad_norm_t.full_tensor() if hasattr(grad_norm_t, "full_tensor") else grad_norm_t)
    lr = float(scheduler.get_last_lr()[0])
    check_step(loss, grad_norm, step)  # before the weights move: a NaN never reaches them
    if denominator > 0:
        optimizer.step()
        check_weights(model, f"step {step}: after the optimizer step the model", distributed=distributed,
                      device=device)
    else:
        log.warning("step %d: no assistant token carries weight; the optimizer does not step", step)
    optimizer.zero_grad(set_to_none=True)
    with warnings.catch_warnings():  # a skipped optimizer step still advances the schedule
        warnings.filterwarnings("ignore", message=re.escape("Detected call of `lr_scheduler.step()`"))
        scheduler.step()
    return loss, grad_norm, lr, tokens


@dataclass
class _SFTRun:
    """What the step loop of :func:`train_sft` works with, set up by :func:`_setup` (rank 0 alone holds the
    metrics), and the loop's record so far: the epochs' plans, each step's loss and tokens/s, the step last
    checkpointed (-1: none) and what stopped the loop early (``"SIGTERM"``)."""

    config: SFTConfig
    run_dir: Path
    dataset: SFTDataset
    lengths: np.ndarray
    model: Any
    tokenizer: Any
    autocast: Callable[[], Any]
    dtype: torch.dtype
    use_fsdp: bool
    optimizer: torch.optim.Optimizer
    scheduler: Any
    state: TrainerState
    world: int
    rank: int
    device: torch.device
    micro_per_step: int
    steps_per_epoch: int
    max_steps: int
    pad_id: int
    resumed_at: int | None
    saved_at: int
    started: float
    metrics: MetricsCSV | None = None
    plans: dict[int, list[list[int]]] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    rates: list[float] = field(default_factory=list)
    stopped: str | None = None

    @property
    def distributed(self) -> bool:
        return self.world > 1


def train_sft(config: SFTConfig, run_dir: str | os.PathLike[str], resume: bool = True) -> dict[str, Any]:
    """Run SFT as configured into ``run_dir``; returns a summary (see the module docstring).

    ``summary["stopped"]`` is ``"SIGTERM"`` when a SIGTERM stopped the run after its checkpoint
    (no ``final/`` then), else None.

    In order: :func:`_setup` (every check before anything is written, then the processes, the model on
    them, the plan of steps and the run folder's files), one :func:`_one_step` per optimizer step, and
    :func:`_finish` (the last checkpoint, ``final/``, the summary). The metrics (their progress bar and
    live sinks) are closed when the loop ends, on an error too.
    """
    started = time.perf_counter()
    run = _setup(config, Path(run_dir), resume, started)
    bar = run.metrics if run.metrics is not None else contextlib.nullcontext()  # metrics.close(): the bar and the sinks
    with bar, Signals() as signals:  # the bar is cleared on an error too: its message stays one line
        while run.state.step < run.max_steps:
            if _one_step(run, signals):
                break
    return _finish(run)


def _setup(config: SFTConfig, run_dir: Path, resume: bool, started: float) -> _SFTRun:
    """Everything before the first step. First the checks, before anything is written (:func:`_preflight`,
    the model, the data against it, the run folder against the config); then the processes and the model on
    them (:func:`_place_model`), the optimizer, the plan of steps and the schedule, the (resumed) state, and
    rank 0's ``config.yaml`` and metrics (:func:`_open_files`)."""
    dataset = _preflight(config, run_dir)
    model, tokenizer = _load_model(config)
    lengths = _check_data_fits(dataset, config, model)
    resume_from = prepare_run_dir(run_dir, config.to_dict(), resume, ConfigError, field_defaults(SFTConfig),
                                  model=model)
    accelerator = make_accelerator(config.collective_timeout_s)
    world, rank, device = accelerator.num_processes, accelerator.process_index, accelerator.device
    if world > 1:
        log.info("rank %d of %d: collectives time out after %.0f s", rank, world, process_group_timeout() or 0.0)
    model, autocast, dtype, use_fsdp = _place_model(config, model, accelerator)
    optimizer = sft_optimizer(model, config)
    micro_per_step, steps_per_epoch, max_steps = _step_plan(config, world, len(dataset))
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, config.warmup_steps, max_steps, config.min_lr_ratio))
    state = TrainerState(micro_per_step=micro_per_step)
    if resume_from is not None:
        state = _resume(resume_from, model, optimizer, scheduler, micro_per_step, world, config.grad_accum)
    pad_id = int(tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id)
    run = _SFTRun(config, run_dir, dataset, lengths, model, tokenizer, autocast, dtype, use_fsdp, optimizer, scheduler,
                  state, world, rank, device, micro_per_step, steps_per_epoch, max_steps, pad_id,
                  resumed_at=state.step if resume_from is not None else None,
                  saved_at=state.step if resume_from is not None else -1, started=started)
    if rank == 0:
        run.metrics = _open_files(run)
    if run.distributed:
        dist.barrier()
    log.info("SFT: %d examples, %d steps/epoch, %d steps, %d process(es)%s, %s, micro-batch %d x accumulation %d",
             len(dataset), steps_per_epoch, max_steps, world, " FSDP2" if use_fsdp else "", dtype,
             config.micro_batch_size, config.grad_accum)
    return run


def _open_files(run: _SFTRun) -> MetricsCSV:
    """Rank 0: ``config.yaml`` and the metrics (cut back to the checkpoint's step on a resume; with their
    TensorBoard / W&B sinks and the progress display)."""
    config, state = run.config, run.state
    write_run_config(run.run_dir, config.to_dict(), {"world_size": run.world, "fsdp": run.use_fsdp,
                                                     "compute_dtype": str(run.dtype),
                                                     "steps_per_epoch": run.steps_per_epoch,
                                                     "max_steps": run.max_steps, "examples": len(run.dataset),
                                                     "resumed_from_step": state.step or None})
    return MetricsCSV(run.run_dir / "metrics.csv", METRICS_COLUMNS, run.resumed_at,
                      open_live("sft", config, run.run_dir, run.resumed_at, run.max_steps))  # TensorBoard, W&B, the bar


def _one_step(run: _SFTRun, signals: Signals) -> bool:
    """One optimizer step: this rank's micro-batches of it (the epoch's plan made once), forward and backward
    of each and one optimizer step (:func:`_optimizer_step`; nothing is saved after a non-finite step: the last
    checkpoint stays), the step's row of the metrics, and a checkpoint when due (:func:`_maybe_checkpoint`).
    True when a SIGTERM stops the run."""
    config, state = run.config, run.state
    t0 = time.perf_counter()
    plan = run.plans.get(state.epoch) or run.plans.setdefault(state.epoch, plan_epoch(
        run.lengths.tolist(), config.micro_batch_size, config.seed, state.epoch, config.bucket_by_length))
    batches = _micro_batches(run.dataset, plan, state.index * run.micro_per_step + run.rank, run.world,
                             config.grad_accum, run.pad_id, run.device)
    try:
        loss, grad_norm, lr, tokens = _optimizer_step(run.model, batches, run.autocast, run.optimizer, run.scheduler,
                                                      config, run.world, run.device, state.step + 1)
    except NonFiniteError as exc:  # nothing is saved after a non-finite step: the last checkpoint stays
        raise stopped_at(exc, run.run_dir) from None
    _advance(state, run.steps_per_epoch, int(tokens))
    elapsed = time.perf_counter() - t0
    row = {"step": state.step, "loss": loss, "tokens": int(tokens), "tokens_per_s": tokens / elapsed,
           "lr": lr, "grad_norm": grad_norm, "peak_mem_mb": _peak_mem_mb(run.device)}
    run.losses.append(loss)
    run.rates.append(tokens / elapsed)
    if run.metrics is not None:
        _record_step(run.metrics, row, config.log_every, run.max_steps)
    return _maybe_checkpoint(run, signals)


def _maybe_checkpoint(run: _SFTRun, signals: Signals) -> bool:
    """Checkpoints: every ``save_every`` steps, on SIGUSR1 (save, go on) and on SIGTERM (save, stop; every rank
    agrees on a signal that reached any of them). True on a SIGTERM: the run stops (``run.stopped``) after
    this step's checkpoint."""
    config, state = run.config, run.state
    fault("usr1", state.step)
    fault("term", state.step)
    want_save, want_stop = agree(signals, run.distributed, run.device)
    # a stop always saves this step: a SIGTERM that arrived during the last save had its save flag
    # cleared with that save's
    if (want_save or (want_stop and run.saved_at != state.step)
            or (config.save_every and state.step % config.save_every == 0)):
        save_checkpoint_or_stop(run.run_dir, run.model, run.optimizer, run.scheduler, state,
                                keep=config.keep_checkpoints)
        run.saved_at = state.step
        signals.save = False
    fault("kill", state.step)
    if want_stop:
        run.stopped = "SIGTERM"
        log.warning("SIGTERM: saved checkpoint step-%d and stopping", state.step)
    return want_stop


def _finish(run: _SFTRun) -> dict[str, Any]:
    """After the loop: unless a SIGTERM stopped it, the last step's checkpoint (unless saved already) and
    ``final/`` (:func:`_save_final`, a collective); the summary, logged."""
    state, metrics, losses, rates = run.state, run.metrics, run.losses, run.rates
    final = run.run_dir / "final"
    if run.stopped is None:
        if run.saved_at != state.step:
            save_checkpoint_or_stop(run.run_dir, run.model, run.optimizer, run.scheduler, state,
                                    keep=run.config.keep_checkpoints)
        _save_final(final, run.model, run.tokenizer, run.dtype)
    if run.distributed:
        dist.barrier()
    first_loss = (float(metrics.rows[0][1]) if metrics is not None and metrics.rows
                  else (losses[0] if losses else None))
    summary = {"run_dir": str(run.run_dir), "steps": state.step, "max_steps": run.max_steps, "epoch": state.epoch,
               "first_loss": first_loss, "final_loss": losses[-1] if losses else None, "tokens": state.tokens,
               "tokens_per_s": float(np.mean(rates)) if rates else None, "peak_mem_mb": _peak_mem_mb(run.device),
               "world_size": run.world, "fsdp": run.use_fsdp, "resumed_from_step": run.resumed_at,
               "stopped": run.stopped, "final": str(final) if run.stopped is None else None,
               "wall_s": time.perf_counter() - run.started}
    log.info("SFT done: %s", {k: summary[k] for k in ("steps", "first_loss", "final_loss", "tokens_per_s")})
    return summary


def _preflight(config: SFTConfig, run_dir: Path) -> SFTDataset:
    """What is checked before any weight loads: the run folder can be written, the data is whole
    (:func:`_open_data`), and on a GPU the memory plan fits the free memory (the process group and its
    device come later, from accelerate; ``LOCAL_RANK`` names this rank's device). The opened data."""
    check_run_dir(run_dir)
    dataset = _open_data(config)
    plan_world = int(os.environ.get("WORLD_SIZE", "1"))
    plan_device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
                   if torch.cuda.is_available() else torch.device("cpu"))
    require_fits(config, "sft", plan_world, plan_device)
    return dataset


def _advance(state: TrainerState, steps_per_epoch: int, tokens: int) -> None:
    """Count one optimizer step of ``tokens`` tokens in ``state``, moving to the next epoch at its end."""
    state.step += 1
    state.index += 1
    state.tokens += tokens
    if state.index >= steps_per_epoch:
        state.epoch, state.index = state.epoch + 1, 0


def _save_final(final: Path, model: torch.nn.Module, tokenizer: Any, dtype: torch.dtype) -> None:
    """``final/``: a save_pretrained folder, written beside and renamed into place by rank 0 (never with
    non-finite weights; a failed write leaves no half-written folder)."""
    fresh = pretrained_copy(model, dtype)  # collective
    if fresh is None:
        return
    save_final(final, fresh, tokenizer, note=f" in {dtype}")
    log.info("wrote %s", final)
