"""The SFT run configuration: one strict YAML file -> a frozen :class:`SFTConfig`.

Example (every key but ``data`` has a default)::

    data: ../results/teacher/sft.h5   # `hydroagent train sft-data` output, relative to this file
    model: tiny                       # or a save_pretrained folder (relative to this file, or absolute)
    lr: 1.0e-5
    weight_decay: 0.0
    warmup_steps: 10
    max_steps: 200                    # or epochs: 3 (exactly one of the two)
    micro_batch_size: 1
    grad_accum: 8
    max_grad_norm: 1.0
    seed: 0
    dtype: auto                       # bf16 compute on CUDA, fp32 on CPU; or bf16 / fp32
    fsdp: auto                        # FSDP2 when more than one process; true / false
    activation_checkpointing: false
    collective_timeout_s: 10800       # how long a rank waits in a collective (NCCL's default is 10 min)
    save_every: 50                    # steps; 0 = only on SIGUSR1 / SIGTERM and at the end
    log_every: 1
    bucket_by_length: true

Unknown keys, wrong types and out-of-range values are refused with the file and line of the key
(:func:`hydroagent_hpc.yamlio.load_strict`), so a typo never silently falls back to a default.
Relative paths are resolved against the config file's folder, as campaign files do.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydroagent_hpc.settings import KeyPath, Settings, Where, dump, from_mapping, invalid, load_file, setting

__all__ = ["SFTConfig", "load_sft_config", "config_from_mapping", "DTYPES"]

DTYPES = ("auto", "bf16", "fp32")


@dataclass(frozen=True)
class SFTConfig(Settings):
    """Everything that decides an SFT run (written, resolved, into ``RUN_DIR/config.yaml``)."""

    data: str = setting(path=True, nonempty=True, help="the SFT data file (`hydroagent train sft-data` output)",
                        fix="name the file `hydroagent train sft-data` wrote")
    model: str = setting("tiny", path=True, keep=("tiny",), nonempty=True,
                         help="the model to train: tiny (built here) or a save_pretrained folder")
    lr: float = setting(1e-5, gt=0, help="peak learning rate (AdamW)")
    min_lr_ratio: float = setting(0.0, ge=0, le=1, help="the cosine schedule's floor as a share of lr")
    weight_decay: float = setting(0.0, ge=0, help="AdamW weight decay")
    warmup_steps: int = setting(0, ge=0, help="optimizer steps of linear warm-up")
    max_steps: int | None = setting(None, ge=1, help="optimizer steps (or epochs; exactly one of the two)")
    epochs: int | None = setting(None, ge=1, help="passes over the data (or max_steps; exactly one of the two)")
    micro_batch_size: int = setting(1, ge=1, help="sequences per forward pass")
    grad_accum: int = setting(1, ge=1, help="micro-batches per optimizer step (per process)")
    max_grad_norm: float = setting(1.0, gt=0, help="gradient clip (global L2 norm)")
    seed: int = setting(0, ge=0, help="seed of the data order and the tiny model")
    dtype: str = setting("auto", choices=DTYPES, help="auto: bf16 compute on CUDA, fp32 on CPU; or bf16 / fp32",
                         source="paper")
    fsdp: bool | str = setting("auto", choices=(True, False, "auto"),
                               help="FSDP2 sharding: auto (with more than one process), true or false (DDP)",
                               source="paper")
    activation_checkpointing: bool = setting(False, help="recompute each decoder layer's activations in the backward "
                                                         "pass")
    save_every: int = setting(0, ge=0, help="checkpoint every N steps (0: only on SIGUSR1/SIGTERM and at the end)")
    keep_checkpoints: int = setting(2, ge=0, help="checkpoints kept (older ones are deleted)")
    log_every: int = setting(1, ge=1, help="steps between metric rows")
    bucket_by_length: bool = setting(True, help="batch sequences of similar length together (less padding)")
    max_seq_len: int | None = setting(None, ge=1, help="refuse data with longer sequences (null: no limit)")
    collective_timeout_s: float = setting(10800.0, gt=0, help="how long a rank waits in a collective (NCCL's own "
                                                              "default of 10 min is too short; gpu-audit F4)")

    def check(self) -> None:
        if (self.max_steps is None) == (self.epochs is None):
            raise invalid("max_steps" if self.max_steps is not None else "epochs",
                          "give exactly one of max_steps and epochs", "set max_steps: N (optimizer steps) or epochs: N")

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dump(self)
        return out


def config_from_mapping(data: Any, *, at: KeyPath = (), where: Where | None = None, base_dir: Path | None = None,
                        source: str = "<config>") -> SFTConfig:
    """An :class:`SFTConfig` from a parsed mapping (``at``: its key path in the document, ``where``: the
    document's FILE:LINE finder); relative ``data``/``model`` paths join ``base_dir``."""
    return from_mapping(SFTConfig, data, at=at, where=where, base_dir=base_dir, source=source)


def load_sft_config(path: str | Path, overrides: dict[str, Any] | None = None) -> SFTConfig:
    """Read an SFT config file strictly (unknown keys, bad types and values name the file:line);
    ``overrides``: command-line values by key (:func:`hydroagent_hpc.settings.load_file`)."""
    return load_file(SFTConfig, path, what="SFT config", overrides=overrides)

