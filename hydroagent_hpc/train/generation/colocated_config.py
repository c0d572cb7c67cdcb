"""The ``colocated`` section of a GRPO config (``generator: colocated``): an engine inside every trainer process.

Light on purpose (no torch, no engine package): the GRPO config, the memory plan and the docs read it
without loading an engine. :mod:`hydroagent_hpc.train.generation.colocated` is the layout itself;
``docs/colocated.md`` the walk-through.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hydroagent_hpc.settings import Settings, setting

__all__ = ["ColocatedSettings", "COLOCATED_BACKENDS", "DEFAULT_BUCKET_MB"]

#: The engines a trainer process can hold: SGLang's ``Engine`` and vLLM's ``LLM`` through their Python
#: APIs (the ``colocated-sglang`` / ``colocated-vllm`` extras pin the versions read), and ``standin``:
#: an in-process CPU engine over our own sampler that enforces the real APIs' call order (tests, laptops).
COLOCATED_BACKENDS = ("sglang", "vllm", "standin")
#: Weights are handed to the engine in buckets of about this many MiB (one tensor larger than it goes alone).
DEFAULT_BUCKET_MB = 512


@dataclass(frozen=True)
class ColocatedSettings(Settings):
    """The ``colocated`` mapping of a GRPO config (``generator: colocated``)."""

    section: ClassVar[str] = "colocated"

    backend: str = setting("sglang", choices=COLOCATED_BACKENDS,
                           help="the engine in every trainer process: sglang, vllm or standin (CPU, tests)")
    memory_fraction: float | None = setting(
        None, gt=0, lt=1, help="the share of its GPU the engine takes while awake (null: what the memory plan "
                               "leaves beside the trainer's resident state, or with awake_while_training beside "
                               "the trainer's training peak)",
        fix="give a share between 0 and 1 (e.g. 0.5), or null to take it from the memory plan")
    bucket_mb: int = setting(DEFAULT_BUCKET_MB, ge=1, le=65536,
                             help="MiB of weights gathered from the shards and handed to the engine at a time")
    awake_while_training: bool = setting(
        False, source="ours",
        help="keep the engines awake (their weights and KV pool resident) beside the trainer while it optimises, "
             "instead of asleep; needed by max_staleness 1, whose next rollouts decode during training; the "
             "memory plan then counts engine and trainer together (docs/colocated.md, Overlap)")
