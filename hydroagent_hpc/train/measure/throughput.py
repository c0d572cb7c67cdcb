"""Training throughput: timed full-parameter SFT steps, model FLOPs and MFU (for ``bench/train.py``).

One *step* here is what the SFT trainer does per micro-batch and optimizer step, without its data
pipeline: forward of a causal LM over ``batch x seq_len`` tokens, the assistant-only loss with
per-example weights (every token counted as assistant-written here, weight 1), backward, gradient
clipping at 1.0 and one AdamW update. The numbers measure the model math on the device, the upper
bound the trainer approaches.

Model FLOPs per trained token (PaLM, Chowdhery et al. 2022, appendix B; the torchtitan/Megatron
convention; activation-checkpoint recomputation is NOT counted, so this is MFU, not HFU)::

    flops_per_token = 6 * N_matmul + 12 * L * (n_heads * head_dim) * S

* ``N_matmul``: parameters that take part in a matrix product: every parameter but the input
  embedding table, plus the LM head (with tied embeddings the shared table is counted once, as the
  head). 6 = 2 (multiply-add) x 3 (forward, backward for activations, backward for weights).
* ``12 * L * (n_heads * head_dim) * S``: the attention scores ``Q K^T`` and ``softmax(.) V``,
  ``2 * 2 * S * n_heads * head_dim`` FLOPs per token and layer forward, times 3 for training,
  over ``L`` layers at sequence length ``S`` (the non-causal count, as in PaLM and torchtitan).

``MFU = flops_per_token * tokens_per_second_per_device / peak_flops_per_device``; the peak for
dense BF16 on an H100 SXM or H200 is 989 TFLOP/s (NVIDIA's datasheets, without sparsity).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, cast

import torch
from transformers import PreTrainedModel, Qwen3Config, Qwen3ForCausalLM

__all__ = ["QWEN3_4B_SHAPE", "PEAK_BF16_TFLOPS", "ThroughputResult", "qwen3_config", "matmul_params",
           "flops_per_token", "peak_tflops_for", "weighted_assistant_loss", "measure_sft_steps",
           "build_random_qwen3", "cuda_device_count", "peak_rss_mb"]

#: Qwen3-4B (and Qwen3-4B-Instruct-2507) dimensions, from the model's published config.json on the hub
#: (hidden_size 2560, 36 layers, 32 query heads of 128, 8 key/value heads, intermediate 9728, vocabulary
#: 151936, tied embeddings). The checkpoint itself is not needed: the benchmark uses random weights.
QWEN3_4B_SHAPE: dict[str, Any] = {
    "hidden_size": 2560, "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
    "head_dim": 128, "intermediate_size": 9728, "vocab_size": 151936, "tie_word_embeddings": True,
    "max_position_embeddings": 262144, "rope_theta": 5_000_000.0, "rms_norm_eps": 1e-6,
}

#: Dense BF16 tensor-core peak, TFLOP/s per device (NVIDIA datasheets, without sparsity), by name fragment.
PEAK_BF16_TFLOPS: dict[str, float] = {"H200": 989.0, "H100": 989.0, "A100": 312.0}


def qwen3_config(**overrides: Any) -> Qwen3Config:
    """A :class:`Qwen3Config` with the 4B dimensions (``overrides`` win), SDPA attention."""
    cfg = Qwen3Config(**{**QWEN3_4B_SHAPE, **overrides})
    cfg._attn_implementation = "sdpa"
    return cfg


def matmul_params(model: PreTrainedModel) -> int:
    """``N_matmul`` of the module docstring: all parameters but the input embedding, plus the LM head."""
    total = sum(p.numel() for p in model.parameters())  # a tied table appears once, the untied head too
    embed = cast(torch.Tensor, model.get_input_embeddings().weight)
    head: Any = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    return int(total if tied else total - embed.numel())


def flops_per_token(n_matmul: int, layers: int, heads: int, head_dim: int, seq_len: int) -> float:
    """Training FLOPs per token: ``6 N + 12 L (heads * head_dim) S`` (module docstring)."""
    return 6.0 * n_matmul + 12.0 * layers * heads * head_dim * seq_len


def peak_tflops_for(device_name: str) -> float | None:
    """The dense BF16 peak of a device from its name (``torch.cuda.get_device_name``); None if unknown."""
    for key, value in PEAK_BF16_TFLOPS.items():
        if key in device_name.upper():
            return value
    return None


def weighted_assistant_loss(logits: torch.Tensor, input_ids: torch.Tensor, mask: torch.Tensor,
                            weights: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy on assistant tokens, each example scaled by its weight, divided by
    ``sum(weight x assistant tokens)`` (the SFT trainer's normalisation, here over one micro-batch)."""
    targets = input_ids[:, 1:]
    m = mask[:, 1:].to(torch.float32) * weights[:, None].to(torch.float32)
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), targets.flatten(),
                                            reduction="none").view_as(targets)
    return (nll * m).sum() / m.sum().clamp_min(1e-12)


@dataclass(frozen=True)
class ThroughputResult:
    device: str
    dtype: str
    params: int
    matmul_params: int
    seq_len: int
    batch: int
    steps: int
    seconds: float
    tokens_per_s: float
    flops_per_token: float
    achieved_tflops: float
    peak_tflops: float | None
    mfu: float | None
    peak_memory_mb: float
    activation_checkpointing: bool
    final_loss: float
    compute_dtype: str = ""   # the matmul dtype (autocast's when the weights are fp32 masters)
    optimizer: str = ""       # the optimizer's class and implementation (fused / foreach / for-loop)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def peak_rss_mb() -> float:
    """Peak resident memory of this process in MB (Linux reports KiB, macOS bytes)."""
    import resource
    import sys

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss / (1024 * 1024) if sys.platform == "darwin" else rss / 1024


def _optimizer_name(opt: torch.optim.Optimizer) -> str:
    """``"AdamW (fused)"``, ``(foreach)`` (torch's default when every parameter is on CUDA) or ``(for-loop)``."""
    d = opt.defaults
    on_cuda = all(p.is_cuda for g in opt.param_groups for p in g["params"])
    if d.get("fused"):
        impl = "fused"
    elif d.get("foreach") or (d.get("foreach") is None and on_cuda):
        impl = "foreach"
    else:
        impl = "for-loop"
    return f"{type(opt).__name__} ({impl})"


def measure_sft_steps(model: PreTrainedModel, *, seq_len: int, batch: int = 1, steps: int | None = None,
                      seconds: float | None = None, warmup_steps: int = 1, lr: float = 1e-5,
                      activation_checkpointing: bool = False, peak_tflops: float | None = None,
                      seed: int = 0, compute_dtype: torch.dtype | str | None = None,
                      optimizer: Callable[[PreTrainedModel], torch.optim.Optimizer] | None = None) -> ThroughputResult:
    """Time full-parameter SFT steps of ``model`` on random tokens (module docstring).

    Runs ``warmup_steps`` untimed steps, then timed steps until ``steps`` are done or ``seconds`` have
    passed (at least one). Tokens per second count every position of the batch (no padding here).
    Peak memory: the device's allocator peak on CUDA, the process's peak resident set on the CPU.

    ``compute_dtype`` (e.g. bf16 with fp32 weights): the forward pass and the loss run under
    ``torch.autocast`` in that dtype, as the SFT trainer's one-process path does (fp32 master
    weights, bf16 compute). ``optimizer(model)`` builds the optimizer (default: AdamW, fused on CUDA).
    """
    if steps is None and seconds is None:
        raise ValueError("give steps or seconds")
    device = next(model.parameters()).device
    cuda = device.type == "cuda"
    if activation_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.config.use_cache = False
    model.train()
    gen = torch.Generator(device="cpu").manual_seed(seed)
    vocab = int(model.config.vocab_size)
    ids = torch.randint(0, vocab, (batch, seq_len), generator=gen).to(device)
    mask = torch.ones_like(ids)
    weights = torch.ones(batch, device=device)
    opt = (optimizer(model) if optimizer is not None
           else torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0, fused=cuda))
    loss_value = math.nan
    weight_dtype = next(model.parameters()).dtype
    if isinstance(compute_dtype, str):  # a torch dtype's name, e.g. "bfloat16"
        compute_dtype = getattr(torch, compute_dtype)
        if not isinstance(compute_dtype, torch.dtype):
            raise ValueError(f"compute_dtype={compute_dtype!r}: not a torch dtype name such as 'bfloat16'")
    use_autocast = compute_dtype is not None and compute_dtype != weight_dtype

    def step() -> float:
        with torch.autocast(device.type, dtype=compute_dtype or weight_dtype, enabled=use_autocast):
            logits = model(input_ids=ids).logits
            loss = weighted_assistant_loss(logits, ids, mask, weights)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return float(loss.detach())

    for _ in range(warmup_steps):
        loss_value = step()
    if cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    done, t0 = 0, time.perf_counter()
    while True:
        loss_value = step()  # float() synchronises with the device
        done += 1
        elapsed = time.perf_counter() - t0
        if (steps is not None and done >= steps) or (seconds is not None and elapsed >= seconds):
            break
    if cuda:
        torch.cuda.synchronize(device)
    elapsed = time.perf_counter() - t0
    cfg = model.config
    n_total = sum(p.numel() for p in model.parameters())
    n_mm = matmul_params(model)
    head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
    fpt = flops_per_token(n_mm, int(cfg.num_hidden_layers), int(cfg.num_attention_heads), head_dim, seq_len)
    tps = done * batch * seq_len / elapsed
    achieved = fpt * tps / 1e12
    name = torch.cuda.get_device_name(device) if cuda else "cpu"
    peak = peak_tflops if peak_tflops is not None else (peak_tflops_for(name) if cuda else None)
    mem = torch.cuda.max_memory_allocated(device) / 2**20 if cuda else peak_rss_mb()
    return ThroughputResult(device=name, dtype=str(next(model.parameters()).dtype).removeprefix("torch."),
                            params=n_total, matmul_params=n_mm, seq_len=seq_len, batch=batch, steps=done,
                            seconds=elapsed, tokens_per_s=tps, flops_per_token=fpt, achieved_tflops=achieved,
                            peak_tflops=peak, mfu=achieved / peak if peak else None, peak_memory_mb=mem,
                            activation_checkpointing=activation_checkpointing, final_loss=loss_value,
                            compute_dtype=str(compute_dtype or weight_dtype).removeprefix("torch."),
                            optimizer=_optimizer_name(opt))


def build_random_qwen3(config: Qwen3Config, device: str, dtype: torch.dtype | str,
                       seed: int = 0) -> Qwen3ForCausalLM:
    """A randomly initialised :class:`Qwen3ForCausalLM` built directly on ``device`` in ``dtype``
    (a torch dtype or its name, e.g. ``"bfloat16"``)."""
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype)
        if not isinstance(dtype, torch.dtype):
            raise ValueError(f"dtype={dtype!r}: not a torch dtype name such as 'bfloat16'")
    torch.manual_seed(seed)
    with torch.device(device):
        model: Qwen3ForCausalLM = Qwen3ForCausalLM._from_config(config, dtype=dtype)
    return model


def cuda_device_count() -> int:
    """CUDA devices this process can use (0 without CUDA or without a CUDA build of torch)."""
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
