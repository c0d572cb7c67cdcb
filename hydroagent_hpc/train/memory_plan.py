"""How much GPU memory a training run needs, worked out before a weight is loaded.

:func:`plan_sft` and :func:`plan_grpo` compute, from the model's shape (:class:`ModelShape`, read
from the model folder's ``config.json`` alone) and the run's config, the bytes every trainer GPU
holds in each phase of a step, the peak of each phase and whether it fits the device
(:data:`GPUS`, or the free memory the trainer finds: :func:`require_fits`). :func:`check_plan`
refuses a plan that does not fit with one message: the phase, its peak against the capacity, the
largest term and the settings that would make it fit, each checked by planning again.
``hydroagent train plan CONFIG --gpu H100-80GB`` prints the table without a GPU.

Everything here is arithmetic on what the trainers' code holds (``train/sft/trainer.py``,
``train/grpo/trainer.py``, ``train/grpo/loss.py``, ``train/distributed.py``, ``train/generation/sampler.py``,
with the installed torch and transformers);
each term names its formula. Notation: ``N`` parameters, ``N_mm`` the parameters of matrix
products (every linear layer and the LM head; not the norms), ``P_l`` one decoder layer's, ``W``
trainer processes, ``T`` tokens of the longest sequence, ``V`` vocabulary, ``h`` hidden size,
``I`` intermediate size, ``q = heads x head_dim``, ``kv = kv_heads x head_dim``, ``L`` layers.

**Precision** (the F1 fix: fp32 master weights, bf16 compute). With several processes and FSDP2
(``fsdp`` not false), every rank holds ``1/W`` of the fp32 weights, gradients and AdamW ``m, v``
and all-gathers bf16 copies of the units it computes (``MixedPrecisionPolicy(param_dtype=bf16)``);
activations are then bf16 (mode ``bf16``). In one process (or DDP) the weights are fp32 and the
forward runs under ``torch.autocast(bf16)`` (mode ``autocast``): the residual stream stays fp32,
and autocast keeps a bf16 copy of every matmul weight (``2 N_mm``) until the autocast region ends
(and, without checkpointing, until the backward pass has used it).

**Saved activations** per token of one Qwen3 decoder layer (what autograd keeps for the backward
pass; counted with ``saved_tensors_hooks`` in ``tests/test_memory_plan.py`` and equal to it)::

    mode       hidden   q-heads  kv-heads  MLP   (q/k norm terms: Qwen3; without them q 4 / kv 4)
    bf16       16 h     10 q     10 kv     8 I   + 8 + 4 heads (SDPA log-sum-exp) + 4 (heads + kv_heads)
    autocast   26 h     10 q     10 kv     8 I
    fp32       24 h     16 q     16 kv     16 I

With activation checkpointing a layer keeps only its input (``2 h`` in bf16, ``4 h`` with an fp32
residual stream); during the backward pass one layer at a time is recomputed in full. Per model:
the token ids (8 bytes), the final norm (``6 h + 4`` bf16, ``8 h + 4`` otherwise) and, without
checkpointing, RoPE's cos/sin (``2 head_dim x`` the residual width). For Qwen3-4B in bf16 that is
170,280 bytes (166 KiB) per token per layer, 36 x 5,120 + 15,372 bytes (195 KiB) per token with
checkpointing. The GPU audit's probe measured ~190 KiB for one layer: the same count plus the
final norm and RoPE of its one-layer model, and the ``o_proj`` input counted a second time (a
view of the attention output; the probe keyed tensors by pointer, shape and dtype, not by
storage); its ~20 KiB with checkpointing is one layer input plus the final norm.

**Logits.** SFT (``weighted_token_loss``) materialises ``[B, T, V]`` bf16 logits, copies the ``n``
loss positions to fp32 and takes ``cross_entropy``: ``2 B T V + 8 n V`` bytes in the forward pass,
``2 B T V + 12 n V`` during its backward (log-softmax output, its gradient, the gradient of its
input), at most ``6 B T V`` while the gradient is scattered back (measured on the CPU: ``14 T V``
with every position a loss position). ``n`` is every position unless told (``loss_tokens``). The
``logits`` variable keeps ``2 B T V`` alive until the optimizer step. GRPO (``token_logprobs``)
scores ``logprob_chunk`` = ``c`` positions at a time under checkpointing: ``16 c V`` in the forward
pass, ``20 c V`` in a chunk's backward, ``8 c V`` for the reference (no gradient).

**Optimizer.** ``torch.optim.AdamW`` defaults to its foreach implementation on CUDA, whose step
makes one full-size temporary (``_foreach_sqrt`` of ``v``): ``4 N / W`` bytes at the step.

**FSDP2 accumulation.** When a rank runs more than one forward/backward pass per optimizer step
(SFT ``grad_accum`` > 1, GRPO more sequences than ranks), ``set_requires_gradient_sync(False)``
makes FSDP2 keep an *unsharded* fp32 gradient of every parameter until the last pass
(``_fsdp_param.py: to_accumulated_grad_if_needed``): ``4 N`` on every rank.

**Generation** (GRPO, ``generator: local``: :class:`~hydroagent_hpc.train.generation.sampler.BatchedSampler`
on the trainer's GPU, one process). Resident: the fp32 policy, the bf16 reference, AdamW ``m, v``
(gradients are freed by ``zero_grad(set_to_none=True)``) and the bf16 weights the forward uses.
Keys and values per token: ``L x kv_heads x head_dim x (key + value bytes)``; bf16 is 144 KiB for
Qwen3-4B, but under autocast over fp32 weights Qwen3's fp32 ``k_norm`` weight promotes the keys to
fp32 (216 KiB; checked in the tests). ``n = min(generation_batch, prompts_per_step x group_size)``
rows decode together, each up to ``M = max_context_tokens``. Without the prefix cache the batch's
cache is ``n M``; with it every other live rollout keeps its cache (``(R - n) M``) and the batch in
flight holds four copies of its rows (the per-row prefixes taken, the left-padded batch copy, the
growing cache and the per-row clones kept for the next turn: ``4 n M``). Every decode step grows
the cache by ``torch.cat`` (one layer's copy at a time). A prefill of ``P`` new tokens on ``C``
cached ones with left padding builds a boolean ``[n, 1, P, C + P]`` mask that SDPA turns into a
bf16 additive mask (3 bytes per element, measured), repeats the keys and values to every head
(one layer at a time) and holds one layer's intermediates (:func:`prefill_layer_bytes`, about
90 KiB per token for Qwen3-4B): without the prefix cache every turn prefills the whole history.
``generator: engine`` puts no cache on the trainers: the engine's GPU holds bf16 weights and a
paged KV pool, planned as a warning (an engine preempts and queues; it does not fail).
``generator: colocated`` puts an engine on every trainer GPU, asleep while the trainer trains (the
training phase is the trainer's alone) and awake during the rollouts: then the GPU holds the trainer's
master weights, AdamW state and reference (its gradients are freed) beside the engine's bf16 weights,
workspace and KV pool (phase ``colocated generation``); the engine's share of the GPU is what that
resident state leaves (:func:`colocated_memory_fraction`). With ``colocated.awake_while_training``
(``max_staleness: 1``: the next step decodes while this one trains) the engine never sleeps: phase
``training beside the awake engine`` is the training phase with the engine's bf16 weights, its KV pool
(``memory_fraction x total - 2 N``, at least one rollout at full context, ``M kv``) and its workspace
resident throughout, and the engine's share, when ``memory_fraction`` is null, is what the training
*peak* leaves (:func:`colocated_memory_fraction`). Planned against free memory (the trainer's own check)
the GPU's total is taken as the free bytes plus :data:`CONTEXT_RESERVE`.

Peaks: each phase has terms resident throughout and *moments* (the forward pass, the loss's
backward, a checkpointed layer's backward, the optimizer step, a decode step, a prefill) whose
transient terms do not coexist; the phase peak is ``resident + max(moments)``, plus
:data:`SLACK` of it for the caching allocator's fragmentation. Gradients count as resident in
training (they are from a step's second pass on; a single pass allocates them as it goes).
Checked on the CPU against the allocator's peak of real SFT and GRPO steps and sampler turns of a
reduced Qwen3 (``tests/test_memory_plan.py``): the plan is an upper bound within 20 % of them.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.generation.engine_config import EngineSettings

log = logging.getLogger(__name__)

__all__ = ["ModelShape", "GPU", "GPUS", "QWEN3_4B_INSTRUCT_2507", "SHAPES", "Term", "Moment", "Phase", "MemoryPlan",
           "MemoryPlanError", "plan_sft", "plan_grpo", "check_plan", "free_device_memory", "require_fits",
           "shape_for_model", "decoder_saved_bytes", "layer_saved_bytes", "layer_backward_bytes",
           "prefill_layer_bytes", "kv_bytes_per_token", "gpu_named", "engine_memory_fraction",
           "colocated_memory_fraction", "awake_while_training",
           "GiB", "SLACK", "CONTEXT_RESERVE", "PREFIX_NEW_TOKENS", "ENGINE_MEMORY_FRACTION", "TRAINER_ADAMW",
           "LOCAL_GENERATION_MODE"]

GiB = 2**30
MiB = 2**20

#: What the CUDA context (torch's kernels, cuBLAS workspaces) and NCCL's communicators take before
#: the first tensor: an estimate (about 0.5 GiB of context on an H100 with lazy module loading,
#: about 1 GiB of NCCL buffers with several ranks).
CONTEXT_RESERVE = int(1.5 * GiB)
#: The caching allocator's fragmentation: a phase needs this fraction more than its tensors.
SLACK = 0.05
#: With the prefix cache, the new ids of one turn (the first prompt, or a tool reply with the
#: template glue); the paper's shape has a 1,500-token prompt and 250-token tool replies.
PREFIX_NEW_TOKENS = 2048
#: The fraction of an engine GPU that vLLM (``--gpu-memory-utilization`` 0.9) and SGLang
#: (``--mem-fraction-static`` about 0.88) take for weights and KV pool.
ENGINE_MEMORY_FRACTION = 0.88
#: A stand-in engine for plans that ask "would an engine on a GPU of its own fit?" (its address is never used).
_ANY_ENGINE = EngineSettings(api="sglang", url="http://engine:30000")
#: An engine's activation and CUDA-graph workspace outside its KV pool (estimate).
ENGINE_WORKSPACE = 3 * GiB
#: The trainers' AdamW on CUDA: ``"fused"`` (what both trainers use there: no temporary at the step)
#: or ``"foreach"`` (torch's default: one full-size temporary). It follows the trainers' ``fused=``.
TRAINER_ADAMW = "fused"
#: How ``generator: local`` samples: ``"autocast"`` over the fp32 policy (keys fp32 in the cache, the
#: autocast cache of bf16 weights) or ``"bf16"`` from a bf16 copy of the policy (``2 N`` more).
LOCAL_GENERATION_MODE = "autocast"


class MemoryPlanError(ConfigError):
    """A run whose memory plan does not fit its GPU (names the phase, the largest term and the fix)."""


# ---------------------------------------------------------------------------------------------
# The model


@dataclass(frozen=True)
class ModelShape:
    """The dimensions of a Qwen3/Llama-style decoder (all a memory plan needs of a model).

    ``qk_norm``: RMS norms on the query and key heads (Qwen3); ``attention_bias``: biases on the
    q/k/v/o projections (Qwen2). Parameter counts (:attr:`params`) follow from the shape.
    """

    name: str
    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied_embeddings: bool = True
    max_positions: int = 0
    qk_norm: bool = True
    attention_bias: bool = False

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_matmul_params(self) -> int:
        """``h q + 2 h kv + q h + 3 h I``: q/k/v/o projections and the gated MLP of one layer."""
        h, q, kv = self.hidden, self.q_width, self.kv_width
        return h * q + 2 * h * kv + q * h + 3 * h * self.intermediate

    @property
    def layer_params(self) -> int:
        """``P_l``: the matmul weights, two RMS norms (``2 h``), the q/k norms (``2 head_dim``)
        and the projection biases (``q + 2 kv + h``) where the model has them."""
        extra = 2 * self.hidden + (2 * self.head_dim if self.qk_norm else 0)
        if self.attention_bias:
            extra += self.q_width + 2 * self.kv_width + self.hidden
        return self.layer_matmul_params + extra

    @property
    def root_params(self) -> int:
        """What FSDP2's root unit holds: the embedding (``V h``), the final norm and an untied head."""
        return self.vocab * self.hidden * (1 if self.tied_embeddings else 2) + self.hidden

    @property
    def params(self) -> int:
        """``N = L P_l + V h (x 2 untied) + h``."""
        return self.layers * self.layer_params + self.root_params

    @property
    def matmul_params(self) -> int:
        """``N_mm``: the weights autocast casts to bf16 (the layers' linears and the LM head; an
        untied input embedding is looked up, not multiplied)."""
        return self.layers * self.layer_matmul_params + self.vocab * self.hidden

    @classmethod
    def from_config(cls, config: Any, name: str | None = None) -> ModelShape:
        """The shape of a Hugging Face ``PretrainedConfig`` (or anything with its attribute names)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = int(text.num_attention_heads)
        hidden = int(text.hidden_size)
        head_dim = int(getattr(text, "head_dim", None) or hidden // heads)
        model_type = str(getattr(text, "model_type", "") or "")
        return cls(name=name or str(getattr(text, "_name_or_path", "") or model_type or "model"),
                   layers=int(text.num_hidden_layers), hidden=hidden, intermediate=int(text.intermediate_size),
                   heads=heads, kv_heads=int(getattr(text, "num_key_value_heads", None) or heads),
                   head_dim=head_dim, vocab=int(text.vocab_size),
                   tied_embeddings=bool(getattr(text, "tie_word_embeddings", False)),
                   max_positions=int(getattr(text, "max_position_embeddings", 0) or 0),
                   qk_norm=model_type.startswith("qwen3"),
                   attention_bias=bool(getattr(text, "attention_bias", False)))

    @classmethod
    def from_folder(cls, path: str | Path) -> ModelShape:
        """The shape from a model folder's ``config.json`` alone (no weight is read; offline)."""
        from transformers import AutoConfig

        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise MemoryPlanError(f"model: {folder}: no config.json to plan with",
                                  "point model at a save_pretrained folder, or give the shape (--shape qwen3-4b)")
        try:
            config = AutoConfig.from_pretrained(folder, local_files_only=True)
        except (OSError, ValueError) as exc:
            raise MemoryPlanError(f"model: {folder}/config.json cannot be read ({exc})",
                                  "give a complete save_pretrained folder") from None
        return cls.from_config(config, name=folder.name)

    @classmethod
    def tiny(cls) -> ModelShape:
        """``model: tiny``: :func:`hydroagent_hpc.train.tiny.build_tiny_qwen3`'s sizes, its vocabulary
        from the tokenizer it trains (about 0.2 s)."""
        from hydroagent_hpc.train.tiny import TINY_QWEN3_SIZES, build_tiny_tokenizer

        s = TINY_QWEN3_SIZES
        return cls(name="tiny", layers=s["num_hidden_layers"], hidden=s["hidden_size"],
                   intermediate=s["intermediate_size"], heads=s["num_attention_heads"],
                   kv_heads=s["num_key_value_heads"], head_dim=s["head_dim"], vocab=len(build_tiny_tokenizer()),
                   tied_embeddings=True, max_positions=s["max_position_embeddings"], qk_norm=True)


#: Qwen3-4B-Instruct-2507 as published (its model card and config.json on the Hugging Face hub:
#: 36 layers, hidden 2,560, intermediate 9,728, 32 query and 8 key/value heads of 128, vocabulary
#: 151,936, tied embeddings, 262,144 positions): 4,022,468,096 parameters.
QWEN3_4B_INSTRUCT_2507 = ModelShape(name="Qwen3-4B-Instruct-2507 (published shape)", layers=36, hidden=2560,
                                    intermediate=9728, heads=32, kv_heads=8, head_dim=128, vocab=151936,
                                    tied_embeddings=True, max_positions=262144, qk_norm=True)

#: Built-in shapes for ``--shape`` (a model folder that is not here yet).
SHAPES: dict[str, ModelShape] = {"qwen3-4b": QWEN3_4B_INSTRUCT_2507}


def shape_for_model(model: str) -> tuple[ModelShape, str | None]:
    """``(shape, notice)`` for a config's ``model``: ``tiny``, a folder with ``config.json``, or, when
    the folder is missing and its name says Qwen3-4B, the published Qwen3-4B-Instruct-2507 shape
    (the notice says so). Anything else is a :class:`MemoryPlanError`."""
    if model == "tiny":
        return ModelShape.tiny(), None
    folder = Path(model)
    if (folder / "config.json").is_file():
        return ModelShape.from_folder(folder), None
    if "qwen3-4b" in model.lower():
        return QWEN3_4B_INSTRUCT_2507, (f"model {model} is not here: planning with the published "
                                        f"Qwen3-4B-Instruct-2507 shape (36 layers, hidden 2560, vocabulary 151936)")
    raise MemoryPlanError(f"model: {model}: no config.json to plan with",
                          "run where the model folder is, or give its shape with --shape qwen3-4b")


# ---------------------------------------------------------------------------------------------
# The GPUs


@dataclass(frozen=True)
class GPU:
    """A device kind: ``total`` bytes as nvidia-smi reports them, ``usable`` = total minus
    :data:`CONTEXT_RESERVE`; ``source`` says where the total comes from."""

    name: str
    total: int
    source: str

    @property
    def usable(self) -> int:
        return self.total - CONTEXT_RESERVE


def _mib(n: int) -> int:
    return n * MiB


#: Device kinds by name. Totals are nvidia-smi's "Memory-Usage" total of each card, as printed in
#: public logs (MiB); the source of each is in its entry.
GPUS: dict[str, GPU] = {g.name: g for g in (
    GPU("H100-80GB", _mib(81559), "nvidia-smi 'NVIDIA H100 80GB HBM3': 81559MiB (NVIDIA/nccl#1264, "
                                  "modal-labs/modal-client#2797)"),
    GPU("H100-94GB", _mib(95830), "nvidia-smi 'NVIDIA H100 NVL': 95830MiB (public nvidia-smi logs)"),
    GPU("H200", _mib(143771), "nvidia-smi 'NVIDIA H200': 143771MiB (public nvidia-smi logs)"),
    GPU("A100-40GB", _mib(40960), "nvidia-smi A100 40GB: 40960MiB (modal-labs/modal-client#2797)"),
    GPU("A100-80GB", _mib(81920), "nvidia-smi A100 80GB: 81920MiB (modal-labs/modal-client#2797)"),
    GPU("L40S", _mib(46068), "nvidia-smi L40S: 46068MiB (modal-labs/modal-client#2797)"),
    GPU("GH200", _mib(97871), "nvidia-smi 'NVIDIA GH200 480GB' (96 GB HBM3): 97871MiB (public nvidia-smi logs)"),
    GPU("B200", _mib(183359), "nvidia-smi 'NVIDIA B200': 183359MiB (public nvidia-smi logs)"),
)}


def gpu_named(name: str) -> GPU:
    """The :data:`GPUS` entry for ``name`` (case and ``-``/``_`` insensitive); unknown names are a
    :class:`MemoryPlanError` listing the known ones."""
    def norm(s: str) -> str:
        return s.upper().replace("_", "-").replace(" ", "")

    for key, gpu in GPUS.items():
        if norm(key) == norm(name):
            return gpu
    raise MemoryPlanError(f"--gpu {name}: not a GPU this plan knows",
                          f"use one of {', '.join(GPUS)}, or plan against free memory in bytes (--free-bytes)")


# ---------------------------------------------------------------------------------------------
# Per-token arithmetic (pure)

#: Saved-for-backward bytes per token of one decoder layer: coefficients of h, q, kv, I (with the
#: q/k norms; without them q and kv take ``_NO_QK``), the residual stream's bytes per element and
#: the final norm's coefficient of h. Counted from the installed transformers' Qwen3/Llama code and
#: checked with saved_tensors_hooks (tests/test_memory_plan.py).
_MODES: dict[str, dict[str, int]] = {
    "bf16": {"h": 16, "q": 10, "kv": 10, "i": 8, "res": 2, "final": 6},
    "autocast": {"h": 26, "q": 10, "kv": 10, "i": 8, "res": 4, "final": 8},
    "fp32": {"h": 24, "q": 16, "kv": 16, "i": 16, "res": 4, "final": 8},
}
_NO_QK = {"bf16": 4, "autocast": 4, "fp32": 8}


def layer_saved_bytes(shape: ModelShape, mode: str) -> int:
    """Bytes per token one decoder layer saves for its backward pass without checkpointing.

    ``c_h h + c_q q + c_kv kv + c_I I + 8 + 4 heads (+ 4 (heads + kv_heads) with q/k norms)``,
    the coefficients of the module doc's table for ``mode`` (``bf16``, ``autocast``, ``fp32``):
    the two RMS norms' fp32 inputs and normalised values and the linears' inputs (``c_h``), the
    q/k norms, the rotated q/k and the attention output SDPA keeps (``c_q``, ``c_kv``), the gated
    MLP's four intermediates (``c_I``), the norms' ``rsqrt`` and SDPA's fp32 log-sum-exp.
    """
    c = _MODES[mode]
    cq = c["q"] if shape.qk_norm else _NO_QK[mode]
    ckv = c["kv"] if shape.qk_norm else _NO_QK[mode]
    small = 8 + 4 * shape.heads + (4 * (shape.heads + shape.kv_heads) if shape.qk_norm else 0)
    return (c["h"] * shape.hidden + cq * shape.q_width + ckv * shape.kv_width + c["i"] * shape.intermediate
            + small)


def decoder_saved_bytes(shape: ModelShape, tokens: int, mode: str, checkpointing: bool) -> int:
    """Bytes the decoder body (``model.model``, without the head) saves for the backward pass of
    ``tokens`` tokens::

        no checkpointing:  T (L layer_saved + 2 head_dim res + 8 + final h + 4)
        checkpointing:     T (L res h + 8 + final h + 4)

    (``res``: bytes per element of the residual stream, 2 in bf16, 4 under autocast or fp32; the
    ``2 head_dim res`` is RoPE's cos/sin; 8 the token ids the embedding keeps; ``final h + 4`` the
    final norm.)
    """
    c = _MODES[mode]
    per_model = 8 + c["final"] * shape.hidden + 4
    if checkpointing:
        return tokens * (shape.layers * c["res"] * shape.hidden + per_model)
    return tokens * (shape.layers * layer_saved_bytes(shape, mode) + 2 * shape.head_dim * c["res"] + per_model)


def layer_backward_bytes(shape: ModelShape, tokens: int, mode: str) -> int:
    """The transient of one decoder layer's backward pass beyond its saved activations:
    ``T 3 I g + 6 h I`` with ``g`` the bytes of a gradient element (2 in bf16 and under autocast,
    4 in fp32): the MLP's intermediate gradients while its saved intermediates are being freed
    (about three of the ``I``-wide tensors at once; measured on the CPU), and one MLP weight's
    gradient in bf16 and its fp32 copy."""
    g = 4 if mode == "fp32" else 2
    return tokens * 3 * shape.intermediate * g + 6 * shape.hidden * shape.intermediate


def prefill_layer_bytes(shape: ModelShape, mode: str) -> tuple[int, str]:
    """Bytes per token a decoder layer holds at once in a forward pass without gradient (a prefill),
    beyond the cache: the larger of its MLP (``6 I`` of gate/up/product plus the hidden states) and
    its attention (q and k through their norms and RoPE), measured on the CPU::

        autocast  max(6 I + 12 h, 16 q + 6 kv + 8 h)
        bf16      max(6 I + 6 h, 10 q + 3 kv + 4 h)
        fp32      max(12 I + 12 h, 16 q + 8 kv + 8 h)
    """
    h, i, q, kv = shape.hidden, shape.intermediate, shape.q_width, shape.kv_width
    if mode == "bf16":
        return max(6 * i + 6 * h, 10 * q + 3 * kv + 4 * h), "max(6 I + 6 h, 10 q + 3 kv + 4 h)"
    if mode == "fp32":
        return max(12 * i + 12 * h, 16 * q + 8 * kv + 8 * h), "max(12 I + 12 h, 16 q + 8 kv + 8 h)"
    return max(6 * i + 12 * h, 16 * q + 6 * kv + 8 * h), "max(6 I + 12 h, 16 q + 6 kv + 8 h)"


def kv_bytes_per_token(shape: ModelShape, key_bytes: int = 2, value_bytes: int = 2) -> int:
    """Keys and values of one token in every layer: ``L kv_heads head_dim (key_bytes + value_bytes)``
    (147,456 bytes = 144 KiB for Qwen3-4B in bf16)."""
    return shape.layers * shape.kv_heads * shape.head_dim * (key_bytes + value_bytes)


# ---------------------------------------------------------------------------------------------
# The plan


@dataclass(frozen=True)
class Term:
    """``bytes`` of one named thing on the GPU, with the formula that gave it."""

    name: str
    bytes: int
    formula: str = ""


@dataclass(frozen=True)
class Moment:
    """One moment of a phase: its transient terms (on top of the phase's resident ones)."""

    name: str
    terms: tuple[Term, ...]

    @property
    def bytes(self) -> int:
        return sum(t.bytes for t in self.terms)


@dataclass(frozen=True)
class Phase:
    """A phase of a step on one GPU: ``peak = (resident + max over moments) x (1 + SLACK)``."""

    name: str
    resident: tuple[Term, ...]
    moments: tuple[Moment, ...]
    capacity: int
    device: str = ""

    @property
    def peak_moment(self) -> Moment:
        return max(self.moments, key=lambda m: m.bytes) if self.moments else Moment("", ())

    @property
    def tensors(self) -> int:
        return sum(t.bytes for t in self.resident) + self.peak_moment.bytes

    @property
    def slack(self) -> int:
        return int(self.tensors * SLACK)

    @property
    def peak(self) -> int:
        return self.tensors + self.slack

    @property
    def fits(self) -> bool:
        return self.peak <= self.capacity

    @property
    def largest(self) -> Term:
        """The largest term at the peak (resident or of the peak moment)."""
        terms = list(self.resident) + list(self.peak_moment.terms)
        return max(terms, key=lambda t: t.bytes) if terms else Term("nothing", 0)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "capacity": self.capacity, "peak": self.peak,
                "fits": self.fits, "peak_moment": self.peak_moment.name, "slack": self.slack,
                "largest": dataclasses.asdict(self.largest),
                "resident": [dataclasses.asdict(t) for t in self.resident],
                "moments": [{"name": m.name, "bytes": m.bytes, "terms": [dataclasses.asdict(t) for t in m.terms]}
                            for m in self.moments]}


@dataclass(frozen=True)
class MemoryPlan:
    """The memory of a run's step on each trainer GPU (and an engine's GPU, as a warning).

    ``phases``: the phases on a trainer GPU (``training``; GRPO with ``generator: local`` also
    ``generation``); ``engine``: the engine GPU's phase (GRPO with ``generator: engine``), which
    never makes the plan fail; ``settings``: what the plan assumed; ``suggestions``: settings that
    make a plan that does not fit fit (each checked by planning again).
    """

    kind: str
    shape: ModelShape
    world: int
    device: str
    capacity: int
    phases: tuple[Phase, ...]
    engine: Phase | None = None
    settings: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()
    suggestions: tuple[str, ...] = ()
    activations_without_checkpointing: int = 0
    checkpointing: bool = True

    def phase(self, name: str) -> Phase | None:
        return next((p for p in self.phases if p.name == name), None)

    @property
    def training(self) -> Phase:
        p = self.phase("training")
        assert p is not None
        return p

    @property
    def generation(self) -> Phase | None:
        return self.phase("generation")

    @property
    def worst(self) -> Phase:
        """The trainer phase with the highest peak."""
        return max(self.phases, key=lambda p: p.peak)

    @property
    def peak(self) -> int:
        return self.worst.peak

    @property
    def fits(self) -> bool:
        return all(p.fits for p in self.phases)

    @property
    def largest(self) -> Term:
        """The largest term of the phase that decides the plan (the first that does not fit, else the
        highest peak)."""
        failing = [p for p in self.phases if not p.fits]
        return (failing[0] if failing else self.worst).largest

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "shape": dataclasses.asdict(self.shape), "params": self.shape.params,
                "world": self.world, "device": self.device, "capacity": self.capacity, "peak": self.peak,
                "fits": self.fits, "largest": dataclasses.asdict(self.largest),
                "phases": [p.to_dict() for p in self.phases],
                "engine": self.engine.to_dict() if self.engine is not None else None,
                "settings": dict(self.settings), "notes": list(self.notes), "suggestions": list(self.suggestions),
                "activations_without_checkpointing": self.activations_without_checkpointing,
                "checkpointing": self.checkpointing}

    def format(self) -> str:
        """A human-readable table (GiB = 2^30 bytes)."""
        s = self.settings
        lines = [f"Memory plan: {self.kind.upper()}, {self.shape.name}, {self.shape.params / 1e9:.2f} B parameters, "
                 f"{self.world} x {self.device} ({_g(self.capacity)} GiB usable per GPU)",
                 f"  {s.get('layout', '')}; activation checkpointing {'on' if self.checkpointing else 'off'}; "
                 f"longest sequence {s.get('tokens', 0):,} tokens"]
        lines += [f"  note: {n}" for n in self.notes]
        for phase in self.phases + ((self.engine,) if self.engine is not None else ()):
            lines += _format_phase(phase)
        verdict = "fits" if self.fits else "DOES NOT FIT"
        lines.append(f"verdict: {verdict}: peak {_g(self.peak)} GiB ({self.worst.name}) of {_g(self.capacity)} GiB; "
                     f"largest term: {self.largest.name} {_g(self.largest.bytes)} GiB")
        if not self.fits and self.suggestions:
            lines.append("would fit with: " + "; ".join(self.suggestions))
        return "\n".join(lines)


def _g(n: int) -> str:
    return f"{n / GiB:,.1f}"


def _format_phase(phase: Phase) -> list[str]:
    head = "engine GPU (a warning only: an engine pages and preempts)" if phase.name == "engine" else phase.name
    out = [f"{head} phase, {phase.device}" if phase.device else f"{head} phase", f"  {'resident':<58s} {'GiB':>7s}"]
    out += [f"    {t.name:<56s} {_g(t.bytes):>7s}  {t.formula}" for t in phase.resident]
    peak = phase.peak_moment
    for m in phase.moments:
        mark = "  <- peak" if m is peak else ""
        out.append(f"  moment: {m.name:<50s} {_g(m.bytes):>7s}{mark}")
        out += [f"    {t.name:<56s} {_g(t.bytes):>7s}  {t.formula}" for t in m.terms]
    out.append(f"  {'allocator slack (' + format(SLACK, '.0%') + ')':<58s} {_g(phase.slack):>7s}")
    state = "fits" if phase.fits else "DOES NOT FIT"
    if phase.name == "engine":
        state = "the pool holds it" if phase.fits else "more than the pool: the engine queues or preempts"
    out.append(f"  {'peak':<58s} {_g(phase.peak):>7s}  of {_g(phase.capacity)} GiB: {state}")
    return out


# ---------------------------------------------------------------------------------------------
# Building the phases


@dataclass(frozen=True)
class _Layout:
    """How the trainer holds the model on each GPU."""

    world: int
    fsdp: bool
    ddp: bool
    compute: str  # "bf16" or "fp32"

    @property
    def act_mode(self) -> str:
        if self.compute == "fp32":
            return "fp32"
        return "bf16" if self.fsdp else "autocast"

    @property
    def shards(self) -> int:
        return self.world if self.fsdp else 1

    def describe(self) -> str:
        if self.fsdp:
            return (f"FSDP2 over {self.world} GPUs: fp32 master shards, bf16 all-gathered for compute"
                    if self.compute == "bf16" else f"FSDP2 over {self.world} GPUs in fp32")
        where = f"DDP over {self.world} GPUs" if self.ddp else "one process"
        return f"{where}: fp32 weights" + (" under bf16 autocast" if self.compute == "bf16" else " in fp32")


def _layout(dtype: str, fsdp: bool | str, world: int) -> _Layout:
    compute = "fp32" if dtype == "fp32" else "bf16"  # auto is bf16 on CUDA
    sharded = world > 1 and fsdp is not False
    return _Layout(world=world, fsdp=sharded, ddp=world > 1 and not sharded, compute=compute)


def _t(name: str, value: float, formula: str = "") -> Term:
    return Term(name, int(value), formula)


def _static_terms(shape: ModelShape, lay: _Layout, *, reference: bool) -> list[Term]:
    """Weights, gradients and AdamW state of one GPU (and the frozen reference)."""
    n, w = shape.params, lay.shards
    per = f" / {w}" if w > 1 else ""
    out = [_t("policy weights (fp32 master" + (" shard)" if w > 1 else ")"), 4 * n / w, f"4 N{per}"),
           _t("gradients (fp32" + (" shard)" if w > 1 else ")"), 4 * n / w, f"4 N{per}"),
           _t("AdamW m and v (fp32)", 8 * n / w, f"8 N{per}")]
    if reference:
        rb = 2 if lay.compute == "bf16" else 4
        out.append(_t("frozen reference (" + ("bf16" if rb == 2 else "fp32") + (" shard)" if w > 1 else ")"),
                      rb * n / w, f"{rb} N{per}"))
    if lay.ddp:
        out.append(_t("DDP gradient buckets (fp32)", 4 * n, "4 N (gradient_as_bucket_view off)"))
    return out


def _fsdp_terms(shape: ModelShape, lay: _Layout, passes: int) -> list[Term]:
    if not lay.fsdp:
        return []
    pb = 2 if lay.compute == "bf16" else 4
    out = [_t("all-gathered root (embedding, norm, head)", pb * shape.root_params, f"{pb} (V h + h)"),
           _t("all-gathered decoder layers (current + prefetched)", 2 * pb * shape.layer_params, f"2 x {pb} P_l"),
           _t("reduce-scatter buffers (one layer's bf16 and fp32 grads)", (pb + 4) * shape.layer_params,
              f"({pb} + 4) P_l")]
    if passes > 1:
        out.append(_t("unsharded fp32 gradients accumulated over passes", 4 * shape.params,
                      f"4 N ({passes} passes per step, set_requires_gradient_sync(False))"))
    return out


def _autocast_weights(shape: ModelShape, lay: _Layout) -> Term | None:
    if lay.fsdp or lay.compute != "bf16":
        return None
    return _t("bf16 copies of the matmul weights (autocast cache)", 2 * shape.matmul_params, "2 N_mm")


def _adamw_temporary(n: int, lay: _Layout) -> list[Term]:
    """The foreach AdamW step's full-size temporary, ``4 N / W`` (none for fused AdamW)."""
    if TRAINER_ADAMW == "fused":
        return []
    return [_t("foreach AdamW temporary (sqrt of v)", 4 * n / lay.shards,
               "4 N" + (f" / {lay.shards}" if lay.shards > 1 else ""))]


@dataclass(frozen=True)
class _Train:
    """What one forward/backward pass on the trainer sees."""

    tokens: int           # T: tokens of the pass (B x longest sequence)
    rows: int             # B
    loss_tokens: int      # n: positions the loss reads (SFT); T for GRPO
    checkpointing: bool
    passes: int           # forward/backward passes per optimizer step on this rank
    chunk: int = 0        # GRPO: logprob_chunk
    reference: bool = False


def _training_phase(kind: str, shape: ModelShape, lay: _Layout, tr: _Train, capacity: int,
                    device: str) -> tuple[Phase, int]:
    """The training phase and the saved activations without checkpointing (for the F2 rule)."""
    mode, n, v, h = lay.act_mode, shape.params, shape.vocab, shape.hidden
    t, nl = tr.tokens, tr.loss_tokens
    resident = _static_terms(shape, lay, reference=tr.reference) + _fsdp_terms(shape, lay, tr.passes)
    saved = decoder_saved_bytes(shape, t, mode, tr.checkpointing)
    saved_no_ac = decoder_saved_bytes(shape, t, mode, False)
    res = _MODES[mode]["res"]
    act = _t("saved activations" + (" (checkpointed: layer inputs)" if tr.checkpointing else ""), saved,
             f"T x {saved // max(t, 1):,} B (T = {t:,})")
    auto = _autocast_weights(shape, lay)
    # what the backward keeps of the bf16 weights: all of them without checkpointing, else the head's
    kept = (auto if not tr.checkpointing else
            (_t("bf16 head weight kept for its backward", 2 * v * h, "2 V h") if auto is not None else None))
    recompute = [_t("one layer recomputed (checkpointing)", t * layer_saved_bytes(shape, mode),
                    f"T x {layer_saved_bytes(shape, mode):,} B")] if tr.checkpointing else []
    if auto is not None and tr.checkpointing:
        recompute.append(_t("its bf16 weights (autocast in the recompute)", 2 * shape.layer_matmul_params,
                            "2 P_l"))
    backward = _t("layer backward transient", layer_backward_bytes(shape, t, mode), "T 3 I 2 + 6 h I")
    # by the time the decoder layers run backward, the final norm's and the head's tensors are freed
    layers_only = saved - t * (8 + _MODES[mode]["final"] * h + 4)
    body = _t("saved activations of the layers" + (" (their inputs)" if tr.checkpointing else ""), layers_only,
              f"T x {layers_only // max(t, 1):,} B")
    moments: list[Moment] = []
    if kind == "sft":
        head_in = _t("final hidden kept for the head", t * (4 if mode == "fp32" else 2) * h, "T 2 h")
        fwd = [act, head_in, _t("logits and fp32 loss (forward)", 2 * t * v + 8 * nl * v, "2 B T V + 8 n V")]
        if auto is not None:
            fwd.append(auto)
        moments.append(Moment("forward end (loss)", tuple(fwd)))
        lb = [act, head_in, _t("logits and fp32 loss (backward)", max(2 * t * v + 12 * nl * v, 6 * t * v),
                               "max(2 B T V + 12 n V, 6 B T V)")]
        if kept is not None:
            lb.append(kept)
        moments.append(Moment("loss backward", tuple(lb)))
        # the trainer drops its logits right after each backward pass (``del logits`` in train_sft)
        moments.append(Moment("decoder backward", (body, *recompute, backward)))
        moments.append(Moment("optimizer step", tuple(_adamw_temporary(n, lay))))
    else:
        c = max(1, min(tr.chunk, t - 1))
        hidden = _t("final hidden kept for the chunked head", t * res * h, f"T {res} h")
        fwd = [act, hidden, _t("one logits chunk (forward)", 16 * c * v, f"16 c V (c = {c:,})")]
        if auto is not None:
            fwd.append(auto)
        moments.append(Moment("policy forward end", tuple(fwd)))
        if tr.reference:
            rb = 2 if lay.compute == "bf16" else 4
            ref = [act, hidden, _t("reference forward, one layer (no gradient)", t * (6 * shape.intermediate + 8 * h)
                                   * rb // 2, "T (6 I + 8 h)"),
                   _t("reference logits chunk", 8 * c * v, "8 c V")]
            if lay.fsdp:
                gathered = 2 * (shape.root_params + 2 * shape.layer_params)
                ref.append(_t("reference's all-gathered root and layers", gathered, "2 (V h + h + 2 P_l)"))
            moments.append(Moment("reference forward", tuple(ref)))
        lb = [act, hidden, _t("one logits chunk (backward)", 20 * c * v, "20 c V")]
        if kept is not None:
            lb.append(kept)
        moments.append(Moment("loss backward (chunks)", tuple(lb)))
        moments.append(Moment("decoder backward", (body, *recompute, backward)))
        moments.append(Moment("optimizer step", tuple(_adamw_temporary(n, lay))))
    phase = Phase("training", tuple(resident), tuple(moments), capacity, device)
    return phase, saved_no_ac


def _setup_phase(shape: ModelShape, lay: _Layout, reference: bool, capacity: int, device: str) -> Phase | None:
    """FSDP2 only: the SFT and GRPO trainers move the whole fp32 model to the device before
    ``fully_shard`` (and GRPO copies it for the reference): ``4 N`` (``+ 4 N``) for a moment."""
    if not lay.fsdp:
        return None
    terms = [_t("the full fp32 model before sharding", 4 * shape.params, "4 N")]
    if reference:
        terms.append(_t("its reference copy before sharding", 4 * shape.params, "4 N (copy.deepcopy)"))
    return Phase("setup", tuple(terms), (), capacity, device)


def _generation_phase(shape: ModelShape, config: Any, capacity: int, device: str, mode: str,
                      prefill_tokens: int = PREFIX_NEW_TOKENS) -> Phase:
    """``generator: local`` on the one trainer GPU (see the module doc, "Generation")."""
    n_par = shape.params
    r = config.prompts_per_step * config.group_size
    n = min(config.generation_batch, r)
    m = config.max_context_tokens
    key_b, val_b = (4, 2) if mode == "autocast" else ((4, 4) if mode == "fp32" else (2, 2))
    kvt = kv_bytes_per_token(shape, key_b, val_b)
    resident = [_t("policy weights (fp32 master)", 4 * n_par, "4 N"),
                _t("AdamW m and v (fp32)", 8 * n_par, "8 N")]
    if config.kl_coef > 0:
        resident.append(_t("frozen reference (bf16)", 2 * n_par, "2 N"))
    if mode == "autocast":
        resident.append(_t("bf16 copies of the matmul weights (autocast cache)", 2 * shape.matmul_params, "2 N_mm"))
    elif mode == "bf16":
        resident.append(_t("bf16 copy of the policy for sampling", 2 * n_par, "2 N"))
    kv_name = f"KV cache ({kvt:,} B/token: keys {key_b} B, values {val_b} B)"
    p_full = max(1, m - config.max_new_tokens)
    if config.prefix_cache:
        others = (r - n) * m * kvt
        batch = 4 * n * m * kvt
        kv = [_t(kv_name + ", other live rollouts", others, f"(R - n) M kv = ({r} - {n}) x {m:,} x kv"),
              _t("KV of the batch: prefixes taken, padded copy, cache, clones", batch,
                 f"4 n M kv = 4 x {n} x {m:,} x kv")]
        p_new = min(prefill_tokens, p_full)
        cached = max(0, m - config.max_new_tokens - p_new)
        pre_kv = [kv[0], _t("KV of the batch during its prefill", n * (3 * cached + p_new) * kvt,
                            f"n (3 C + P) kv, C = {cached:,}, P = {p_new:,}")]
    else:
        kv = [_t(kv_name + ", the batch", n * m * kvt, f"n M kv = {n} x {m:,} x kv")]
        p_new, cached = p_full, 0
        pre_kv = [_t("KV of the batch during its prefill", n * p_new * kvt, f"n P kv, P = {p_new:,}")]
    grow = _t("cache growth by torch.cat (one layer's copy)", n * m * kvt // shape.layers, "n M kv / L")
    sample = _t("sampling temporaries (logits, softmax, top-p sort)", n * shape.vocab * 40, "40 n V")
    span = cached + p_new
    rep = 4 if mode == "bf16" else 8
    per_tok, per_formula = prefill_layer_bytes(shape, mode)
    prefill = [_t("prefill attention mask (bool + SDPA's bf16 copy)", 3 * n * p_new * span,
                  f"3 n P (C + P) = 3 x {n} x {p_new:,} x {span:,}"),
               _t("prefill keys/values repeated to every head (one layer)", rep * n * span * shape.q_width,
                  f"{rep} n (C + P) q"),
               _t("prefill layer intermediates (one layer)", n * p_new * per_tok, f"n P x {per_formula}")]
    moments = [Moment("decode at the context limit", (*kv, grow, sample)),
               Moment("prefill of a batch", (*pre_kv, *prefill))]
    return Phase("generation", tuple(resident), tuple(moments), capacity, device)


def _engine_phase(shape: ModelShape, config: Any, capacity: int, device: str) -> tuple[Phase, list[str]]:
    """An engine GPU: bf16 weights, its KV pool, and the demand of every live rollout at full context."""
    r = config.prompts_per_step * config.group_size
    m = config.max_context_tokens
    kvt = kv_bytes_per_token(shape)
    weights = 2 * shape.params
    fraction = engine_memory_fraction(config.engine)
    pool = int(fraction * capacity) - weights - ENGINE_WORKSPACE
    demand = r * m * kvt
    resident = (_t("engine weights (bf16)", weights, "2 N"),
                _t("engine workspace (activations, CUDA graphs)", ENGINE_WORKSPACE, "estimate"))
    moment = Moment("every live rollout at full context",
                    (_t("KV demand (bf16)", demand, f"R M kv = {r} x {m:,} x kv"),))
    notes = []
    if pool <= 0:
        notes.append(f"engine: {device} cannot hold the bf16 weights ({_g(weights)} GiB) and a KV pool")
    elif demand > pool:
        fit = pool // (m * kvt)
        notes.append(f"engine: the KV demand of {r} rollouts x {m:,} tokens is {_g(demand)} GiB, the pool of one "
                     f"{device} about {_g(pool)} GiB ({pool // kvt:,} tokens: {fit} rollouts at full context); the "
                     f"engine will queue or preempt the rest (slower steps, not a failure); more engine GPUs or a "
                     f"smaller max_context_tokens avoid it")
    cap = int(fraction * capacity)
    return Phase("engine", resident, (moment,), cap, f"{device} x {fraction:g}"), notes


def engine_memory_fraction(engine: Any) -> float:
    """The fraction of its GPU an engine takes: ``--mem-fraction-static`` (SGLang) or
    ``--gpu-memory-utilization`` (vLLM) in ``engine.launch``, else :data:`ENGINE_MEMORY_FRACTION`."""
    launch = engine.get("launch") if isinstance(engine, dict) else getattr(engine, "launch", None)
    args = list(launch or [])
    for i, arg in enumerate(args[:-1]):
        if arg in ("--mem-fraction-static", "--gpu-memory-utilization"):
            try:
                value = float(args[i + 1])
            except ValueError:
                break
            if 0 < value <= 1:
                return value
    return ENGINE_MEMORY_FRACTION


def _colocated_resident(shape: ModelShape, config: Any, lay: _Layout) -> list[Term]:
    """What a colocated trainer keeps on its GPU while its engine is awake: its master weights and AdamW
    state (gradients are freed by ``zero_grad(set_to_none=True)``), the reference, and one bucket of
    gathered weights during a sync."""
    out = [t for t in _static_terms(shape, lay, reference=config.kl_coef > 0) if not t.name.startswith("gradients")]
    bucket_mb = getattr(getattr(config, "colocated", None), "bucket_mb", None) or 512
    out.append(_t("one bucket of gathered weights during a sync", bucket_mb * MiB, "colocated.bucket_mb"))
    return out


def awake_while_training(config: Any) -> bool:
    """``generator: colocated`` with ``colocated.awake_while_training``: the engines stay awake beside the trainer."""
    colocated = getattr(config, "colocated", None)
    return config.generator == "colocated" and bool(getattr(colocated, "awake_while_training", False))


def _grpo_train(config: Any, world: int) -> _Train:
    """One GRPO pass: one sequence of up to ``max_context_tokens``, ``ceil(R / W)`` passes per rank."""
    r = config.prompts_per_step * config.group_size
    t = config.max_context_tokens
    return _Train(tokens=t, rows=1, loss_tokens=t, checkpointing=config.activation_checkpointing,
                  passes=-(-r // world), chunk=config.logprob_chunk, reference=config.kl_coef > 0)


def _awake_share(shape: ModelShape, config: Any, lay: _Layout, total: int) -> float:
    """With ``awake_while_training``: the largest share of ``total`` an engine may take (weights and KV pool)
    beside the trainer's training peak, its workspace (:data:`ENGINE_WORKSPACE`), the CUDA context and
    :data:`SLACK` (less one MiB for rounding), at most :data:`ENGINE_MEMORY_FRACTION` and at least 0.01."""
    capacity = total - CONTEXT_RESERVE
    training, _ = _training_phase("grpo", shape, lay, _grpo_train(config, lay.world), capacity, "")
    engine = capacity / (1 + SLACK) - training.tensors - ENGINE_WORKSPACE - MiB
    return float(min(ENGINE_MEMORY_FRACTION, max(0.01, engine / total)))


def _awake_engine_terms(shape: ModelShape, config: Any, lay: _Layout, total: int) -> tuple[float, int, list[Term]]:
    """(the engine's share, its KV pool, its resident terms) for an engine awake beside the training: bf16
    weights, the KV pool of ``memory_fraction x total`` less the weights (at least one rollout at full
    context), and its workspace."""
    given = getattr(getattr(config, "colocated", None), "memory_fraction", None)
    share = float(given) if given is not None else _awake_share(shape, config, lay, total)
    weights = 2 * shape.params
    full = config.max_context_tokens * kv_bytes_per_token(shape)
    pool = int(share * total) - weights
    how = "colocated.memory_fraction" if given is not None else "the plan's share"
    terms = [_t("engine weights (bf16, awake)", weights, "2 N"),
             _t("engine KV pool (bf16, awake)", max(pool, full),
                f"{share:.2f} x total - 2 N ({how}), at least M kv = {config.max_context_tokens:,} x kv"),
             _t("engine workspace (activations, CUDA graphs)", ENGINE_WORKSPACE, "estimate")]
    return share, max(pool, full), terms


def _awake_phase(shape: ModelShape, config: Any, lay: _Layout, capacity: int, total: int, device: str
                 ) -> tuple[Phase, list[str]]:
    """The training phase with the awake engine's weights, KV pool and workspace resident beside it."""
    training, _ = _training_phase("grpo", shape, lay, _grpo_train(config, lay.world), capacity, device)
    share, pool, engine = _awake_engine_terms(shape, config, lay, total)
    r = -(-(config.prompts_per_step * config.group_size) // lay.world)
    m = config.max_context_tokens
    kvt = kv_bytes_per_token(shape)
    notes = [f"colocated, awake while training: each engine takes {share:.2f} of its GPU ({_g(int(share * total))} "
             f"GiB: weights and a KV pool of {_g(pool)} GiB, {pool // (m * kvt)} of its {r} rollouts at full "
             f"context) beside the trainer's training peak"]
    if int(share * total) - 2 * shape.params < m * kvt:
        notes.append(f"colocated: a share of {share:.2f} leaves the engine no KV pool for one rollout at full "
                     f"context ({_g(m * kvt)} GiB): planned with that much")
    phase = Phase("training beside the awake engine", (*training.resident, *engine), training.moments, capacity,
                  device)
    return phase, notes


def colocated_memory_fraction(config: Any, *, world: int = 1, device: Any = None, total_bytes: int | None = None,
                              shape: ModelShape | None = None) -> float:
    """The share of its GPU's ``total_bytes`` a colocated engine may take while awake: what the trainer's
    resident state (:func:`_colocated_resident`), the CUDA context (:data:`CONTEXT_RESERVE`) and
    :data:`SLACK` leave, at most :data:`ENGINE_MEMORY_FRACTION` and at least 0.05; with
    ``colocated.awake_while_training``, what the trainer's training *peak* leaves beside the engine's
    workspace (:func:`_awake_share`). ``total_bytes`` defaults to ``device``'s (CUDA); without either
    (a CPU run, the stand-in engine) the share is 0.5, which nothing reads."""
    if total_bytes is None:
        import torch

        dev = torch.device(device) if device is not None else None
        if dev is None or dev.type != "cuda" or not torch.cuda.is_available():
            return 0.5
        total_bytes = int(torch.cuda.get_device_properties(dev).total_memory)
    if shape is None:
        shape, _ = shape_for_model(config.model)
    lay = _layout(config.dtype, config.fsdp, world)
    if awake_while_training(config):
        return _awake_share(shape, config, lay, total_bytes)
    resident = sum(t.bytes for t in _colocated_resident(shape, config, lay)) + CONTEXT_RESERVE
    share = (total_bytes * (1 - SLACK) - resident) / total_bytes
    return float(min(ENGINE_MEMORY_FRACTION, max(0.05, share)))


def _colocated_phase(shape: ModelShape, config: Any, lay: _Layout, capacity: int, device: str,
                     awake_pool: int | None = None) -> tuple[Phase, list[str]]:
    """A colocated trainer GPU while its engine is awake: the trainer's resident state and the engine's
    bf16 weights, workspace and KV pool (the rollouts of the step spread over ``W`` engines).
    ``awake_pool``: the engine's fixed KV pool when it stays awake beside the training."""
    r = -(-(config.prompts_per_step * config.group_size) // lay.world)
    m = config.max_context_tokens
    kvt = kv_bytes_per_token(shape)
    resident = [*_colocated_resident(shape, config, lay),
                _t("engine weights (bf16)", 2 * shape.params, "2 N"),
                _t("engine workspace (activations, CUDA graphs)", ENGINE_WORKSPACE, "estimate")]
    pool = int(capacity / (1 + SLACK)) - sum(t.bytes for t in resident)  # what the engine's KV pool can take
    if awake_pool is not None:
        pool = awake_pool
    demand = r * m * kvt
    notes = []
    if pool <= 0:
        notes.append(f"colocated: {device} cannot hold the trainer's resident state and the engine's weights")
    elif demand > pool:
        notes.append(f"colocated: the KV demand of {r} rollouts per engine x {m:,} tokens is {_g(demand)} GiB, the "
                     f"pool beside the trainer about {_g(pool)} GiB ({pool // (m * kvt)} rollouts at full context); "
                     f"the engine queues or preempts the rest (slower steps, not a failure)")
    kv = min(demand, max(pool, 0))
    moment = Moment("rollouts on the awake engine",
                    (_t("engine KV pool (bf16)", kv, f"min(R/W M kv, pool), R/W = {r}"),))
    return Phase("colocated generation", tuple(resident), (moment,), capacity, device), notes


# ---------------------------------------------------------------------------------------------
# Public planners


def _capacity(gpu: str | GPU | None, free_bytes: int | None) -> tuple[int, str]:
    if free_bytes is not None:
        return int(free_bytes), f"GPU with {_g(int(free_bytes))} GiB free"
    if gpu is None:
        raise MemoryPlanError("no GPU to plan for", f"name one of {', '.join(GPUS)}")
    g = gpu if isinstance(gpu, GPU) else gpu_named(gpu)
    return g.usable, g.name


def plan_sft(config: Any, *, world: int = 1, gpu: str | GPU | None = None, free_bytes: int | None = None,
             shape: ModelShape | None = None, loss_tokens: int | None = None, suggest: bool = True) -> MemoryPlan:
    """The memory plan of an SFT run (:class:`~hydroagent_hpc.train.sft.config.SFTConfig`) on ``world``
    GPUs of kind ``gpu`` (or ``free_bytes`` free on each).

    The longest micro-batch is ``micro_batch_size x max_seq_len`` tokens (the model's context when
    ``max_seq_len`` is unset, which the trainer allows); ``loss_tokens``: the assistant positions
    of that micro-batch (default: all of them, the worst case).
    """
    notes: list[str] = []
    if shape is None:
        shape, notice = shape_for_model(config.model)
        if notice:
            notes.append(notice)
    seq = config.max_seq_len or shape.max_positions
    if not config.max_seq_len:
        notes.append(f"max_seq_len is unset: planning for the model's context, {seq:,} tokens")
    capacity, device = _capacity(gpu, free_bytes)
    lay = _layout(config.dtype, config.fsdp, world)
    b = config.micro_batch_size
    tokens = b * seq
    nl = min(loss_tokens if loss_tokens is not None else b * (seq - 1), b * (seq - 1))
    tr = _Train(tokens=tokens, rows=b, loss_tokens=nl, checkpointing=config.activation_checkpointing,
                passes=config.grad_accum)
    training, no_ac = _training_phase("sft", shape, lay, tr, capacity, device)
    setup = _setup_phase(shape, lay, False, capacity, device)
    plan = MemoryPlan(kind="sft", shape=shape, world=world, device=device, capacity=capacity,
                      phases=(training,) + ((setup,) if setup is not None else ()),
                      settings={"layout": lay.describe(), "tokens": tokens, "micro_batch_size": b, "max_seq_len": seq,
                                "loss_tokens": nl, "grad_accum": config.grad_accum, "mode": lay.act_mode},
                      notes=tuple(notes), activations_without_checkpointing=no_ac,
                      checkpointing=config.activation_checkpointing)
    if suggest and not plan.fits:
        plan = dataclasses.replace(plan, suggestions=tuple(_suggest_sft(config, world, gpu, free_bytes, shape, nl)))
    return plan


def plan_grpo(config: Any, *, world: int = 1, gpu: str | GPU | None = None, free_bytes: int | None = None,
              shape: ModelShape | None = None, generation_mode: str | None = None,
              prefill_tokens: int = PREFIX_NEW_TOKENS, suggest: bool = True) -> MemoryPlan:
    """The memory plan of a GRPO run (:class:`~hydroagent_hpc.train.grpo.config.GRPOConfig`) with
    ``world`` trainer GPUs of kind ``gpu`` (or ``free_bytes`` free on each).

    Training: one sequence per pass of up to ``max_context_tokens`` tokens, ``ceil(R / W)`` passes
    per rank (``R = prompts_per_step x group_size``). Generation: ``generator: local`` samples on
    the trainer GPU (one process; ``generation_mode``: ``autocast`` over the fp32 weights, ``bf16``
    for a bf16 copy, or ``fp32``; default :data:`LOCAL_GENERATION_MODE`; ``prefill_tokens``: the new ids of one turn
    with the prefix cache); ``generator: engine`` plans the engine's GPU (same kind) as a warning;
    ``generator: colocated`` the engine awake beside the trainer's resident state (phase ``colocated
    generation``) and, with ``colocated.awake_while_training``, beside its training (phase ``training
    beside the awake engine``).
    """
    notes: list[str] = []
    if shape is None:
        shape, notice = shape_for_model(config.model)
        if notice:
            notes.append(notice)
    capacity, device = _capacity(gpu, free_bytes)
    lay = _layout(config.dtype, config.fsdp, world)
    r = config.prompts_per_step * config.group_size
    t = config.max_context_tokens
    tr = _grpo_train(config, world)
    training, no_ac = _training_phase("grpo", shape, lay, tr, capacity, device)
    phases = [training]
    setup = _setup_phase(shape, lay, tr.reference, capacity, device)
    if setup is not None:
        phases.append(setup)
    engine = None
    if config.generator == "engine":
        engine, engine_notes = _engine_phase(shape, config, capacity, device)
        notes += engine_notes
    elif config.generator == "colocated":
        awake_pool = None
        if awake_while_training(config):
            if free_bytes is not None or gpu is None:  # the free memory: its total as free + the CUDA context
                total = capacity + CONTEXT_RESERVE
            else:
                total = (gpu if isinstance(gpu, GPU) else gpu_named(gpu)).total
            awake, awake_notes = _awake_phase(shape, config, lay, capacity, total, device)
            phases.append(awake)
            notes += awake_notes
            awake_pool = next(t.bytes for t in awake.resident if t.name.startswith("engine KV pool"))
        colocated, colocated_notes = _colocated_phase(shape, config, lay, capacity, device, awake_pool)
        phases.append(colocated)
        notes += colocated_notes
    else:
        if world > 1:
            notes.append(f"generator: local with {world} trainers is refused by the trainer (generator: engine needed)")
        gmode = generation_mode or ("fp32" if lay.compute == "fp32" else LOCAL_GENERATION_MODE)
        phases.append(_generation_phase(shape, config, capacity, device, gmode, prefill_tokens))
    plan = MemoryPlan(kind="grpo", shape=shape, world=world, device=device, capacity=capacity, phases=tuple(phases),
                      engine=engine,
                      settings={"layout": lay.describe(), "tokens": t, "rollouts": r, "passes_per_rank": tr.passes,
                                "generator": config.generator, "generation_batch": config.generation_batch,
                                "prefix_cache": config.prefix_cache, "logprob_chunk": config.logprob_chunk,
                                "mode": lay.act_mode},
                      notes=tuple(notes), activations_without_checkpointing=no_ac,
                      checkpointing=config.activation_checkpointing)
    if suggest and not plan.fits:
        plan = dataclasses.replace(plan, suggestions=tuple(
            _suggest_grpo(config, world, gpu, free_bytes, shape, generation_mode, prefill_tokens)))
    return plan


# ---------------------------------------------------------------------------------------------
# Suggestions: settings that make a plan fit, each checked by planning again


def _peak_note(plan: MemoryPlan) -> str:
    return f"peak {_g(plan.peak)} GiB"


def _largest_fitting(lo: int, hi: int, fits: Callable[[int], bool]) -> int | None:
    """The largest ``x`` in ``[lo, hi]`` with ``fits(x)`` (``fits`` monotone: true up to some x)."""
    if hi < lo or not fits(lo):
        return None
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    return lo


def _suggest_sft(config: Any, world: int, gpu: str | GPU | None, free_bytes: int | None, shape: ModelShape,
                 loss_tokens: int) -> list[str]:
    """Settings that make an SFT plan fit: each a complete change, checked by planning again."""
    def plan(cfg: Any, w: int = world) -> MemoryPlan:
        return plan_sft(cfg, world=w, gpu=gpu, free_bytes=free_bytes, shape=shape, loss_tokens=loss_tokens,
                        suggest=False)

    out: list[str] = []
    start, pre = config, ""
    if not config.activation_checkpointing:
        start, pre = dataclasses.replace(config, activation_checkpointing=True), "activation_checkpointing: true, "
        p = plan(start)
        out.append(f"activation_checkpointing: true saves {_g(plan(config).peak - p.peak)} GiB"
                   + (f" ({_peak_note(p)})" if p.fits else " (not enough alone)"))
    if config.micro_batch_size > 1 and plan(dataclasses.replace(start, micro_batch_size=1)).fits:
        out.append(f"{pre}micro_batch_size: 1")
    seq = config.max_seq_len or shape.max_positions

    def seq_fits(k: int) -> bool:
        return plan(dataclasses.replace(start, max_seq_len=1024 * k)).fits

    best = _largest_fitting(1, max(1, seq // 1024 - 1), seq_fits)
    if best is not None:
        out.append(f"{pre}max_seq_len: {1024 * best} (longer sequences are refused, not cut)")
    if free_bytes is None:
        sharded = dataclasses.replace(start, fsdp=config.fsdp if config.fsdp is not False else True)
        for w in range(world + 1, 65):
            p = plan(sharded, w)
            if p.fits:
                out.append(f"{pre}more GPUs: {w} with FSDP2 ({_peak_note(p)} per GPU)")
                break
    return out


def _suggest_grpo(config: Any, world: int, gpu: str | GPU | None, free_bytes: int | None, shape: ModelShape,
                  generation_mode: str | None, prefill_tokens: int) -> list[str]:
    """Settings that make a GRPO plan fit: each a complete change, checked by planning again."""
    def plan(cfg: Any, w: int = world) -> MemoryPlan:
        return plan_grpo(cfg, world=w, gpu=gpu, free_bytes=free_bytes, shape=shape, generation_mode=generation_mode,
                         prefill_tokens=prefill_tokens, suggest=False)

    out: list[str] = []
    start, pre = config, ""
    if not config.activation_checkpointing:
        start, pre = dataclasses.replace(config, activation_checkpointing=True), "activation_checkpointing: true, "
        p = plan(start)
        out.append(f"activation_checkpointing: true saves {_g(plan(config).training.peak - p.training.peak)} GiB "
                   f"in training" + (f" ({_peak_note(p)})" if p.fits else " (not enough alone)"))
    if awake_while_training(config):
        out += _suggest_awake(config, world, start, pre, plan)
    if config.generator == "local":
        r = config.prompts_per_step * config.group_size
        for prefix in ((True, False) if config.prefix_cache else (False,)):
            cand = dataclasses.replace(start, prefix_cache=prefix)
            what = pre + ("" if prefix == config.prefix_cache else "prefix_cache: false, ")

            def batch_fits(k: int, c: Any = cand) -> bool:
                return plan(dataclasses.replace(c, generation_batch=k)).fits

            if plan(cand).fits and what != pre:
                out.append(f"{what.rstrip(', ')} ({_peak_note(plan(cand))})")
                break
            g = _largest_fitting(1, min(config.generation_batch, r) - 1, batch_fits)
            if g is not None:
                p = plan(dataclasses.replace(cand, generation_batch=g))
                out.append(f"{what}generation_batch: {g} ({_peak_note(p)})")
                break
        eng = dataclasses.replace(start, generator="engine", engine=config.engine or _ANY_ENGINE, colocated=None)
        if plan(eng).fits:
            out.append(f"{pre}generator: engine on a GPU of its own ({_peak_note(plan(eng))} on the trainer)")

    def context_fits(k: int) -> bool:
        return plan(dataclasses.replace(start, max_context_tokens=1024 * k)).fits

    # a context no longer than one turn's max_new_tokens is not a config (GRPOConfig.check refuses it)
    m = _largest_fitting(config.max_new_tokens // 1024 + 1, config.max_context_tokens // 1024 - 1, context_fits)
    if m is not None:
        out.append(f"{pre}max_context_tokens: {1024 * m} (episodes end at that length)")
    if free_bytes is None:
        eng = dataclasses.replace(start, generator="engine", engine=config.engine or _ANY_ENGINE, colocated=None)
        for w in range(max(2, world + 1), 65):
            p = plan(eng, w)
            if p.fits:
                out.append(f"{pre}more GPUs: {w} trainers with generator: engine on a GPU of its own "
                           f"({_peak_note(p)} per trainer GPU)")
                break
    return out


def _suggest_awake(config: Any, world: int, start: Any, pre: str, plan: Callable[..., MemoryPlan]) -> list[str]:
    """An engine awake beside the training that does not fit: a smaller ``colocated.memory_fraction`` (the
    largest that fits), more GPUs, or the engines asleep while training (each checked by planning again)."""
    out: list[str] = []
    colocated = start.colocated

    def with_fraction(f: float | None) -> Any:
        return dataclasses.replace(start, colocated=dataclasses.replace(colocated, memory_fraction=f))

    if colocated.memory_fraction is not None:
        best = _largest_fitting(1, int(colocated.memory_fraction * 100) - 1,
                                lambda k: plan(with_fraction(k / 100)).fits)
        if best is not None:
            out.append(f"{pre}a smaller colocated.memory_fraction: {best / 100:.2f} (or null: the largest share that "
                       f"fits beside the training peak)")
    auto = with_fraction(None)
    for w in range(world + 1, 65):
        p = plan(dataclasses.replace(auto, fsdp=start.fsdp if start.fsdp is not False else True), w)
        if p.fits:
            out.append(f"{pre}more GPUs: {w} trainers, each with its engine awake ({_peak_note(p)} per GPU)")
            break
    asleep = dataclasses.replace(start, max_staleness=0,
                                 colocated=dataclasses.replace(colocated, awake_while_training=False))
    if plan(asleep).fits:
        out.append(f"{pre}colocated.awake_while_training: false" + (" and max_staleness: 0" if config.max_staleness
                                                                     else "") + " (the engines sleep while training)")
    return out


# ---------------------------------------------------------------------------------------------
# Checks


def check_plan(plan: MemoryPlan) -> MemoryPlan:
    """``plan`` when it fits; otherwise a :class:`MemoryPlanError` naming the phase, its peak against
    the capacity, the largest term and the settings that would make it fit.

    First rule (F2): activations that alone exceed the device without checkpointing, with
    ``activation_checkpointing: false``, are refused with that number.
    """
    tokens = int(plan.settings.get("tokens", 0))
    if not plan.checkpointing and plan.activations_without_checkpointing > plan.capacity:
        raise MemoryPlanError(
            f"activation_checkpointing: false: the saved activations of one {tokens:,}-token sequence without "
            f"checkpointing are {_g(plan.activations_without_checkpointing)} GiB, more than the "
            f"{_g(plan.capacity)} GiB of {plan.device}",
            "; ".join(plan.suggestions) if plan.suggestions else "set activation_checkpointing: true")
    if plan.fits:
        return plan
    phase = next(p for p in plan.phases if not p.fits)
    big = phase.largest
    when = f" ({phase.peak_moment.name})" if phase.moments else ""
    raise MemoryPlanError(
        f"{plan.kind.upper()} does not fit {plan.world} x {plan.device}: the {phase.name} phase peaks at "
        f"{_g(phase.peak)} GiB{when} against {_g(phase.capacity)} GiB; its largest term is "
        f"{big.name}, {_g(big.bytes)} GiB",
        "; ".join(plan.suggestions) if plan.suggestions else "use a GPU with more memory")


def free_device_memory(device: Any) -> int | None:
    """Free bytes on a CUDA ``device`` (``torch.cuda.mem_get_info``); None without CUDA."""
    import torch

    dev = torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return None
    free, _total = torch.cuda.mem_get_info(dev)
    return int(free)


def require_fits(config: Any, kind: str, world: int, device: Any) -> MemoryPlan | None:
    """The trainers' check before any weight is loaded: None off CUDA; on CUDA the plan against the
    device's free memory (logged), or a :class:`MemoryPlanError` when it does not fit.

    ``kind``: ``"sft"`` or ``"grpo"``; ``world``: the number of training processes. A model whose
    shape cannot be read is left to the loader's own error (logged, None).
    """
    if kind not in ("sft", "grpo"):
        raise ValueError(f"kind={kind!r}: expected 'sft' or 'grpo'")
    free = free_device_memory(device)
    if free is None:
        return None
    try:
        shape, notice = shape_for_model(config.model)
    except MemoryPlanError as exc:
        log.warning("memory plan skipped: %s", exc.message)
        return None
    if notice:
        log.info("memory plan: %s", notice)
    planner = plan_sft if kind == "sft" else plan_grpo
    plan = planner(config, world=world, free_bytes=free, shape=shape)
    log.info("memory plan on %s:\n%s", device, plan.format())
    return check_plan(plan)
