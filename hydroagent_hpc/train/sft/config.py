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

from hydroagent_hpc.settings import (
    LR_FIX,
    MAX_TIMEOUT_S,
    KeyPath,
    Settings,
    Where,
    dump,
    from_mapping,
    invalid,
    load_file,
    setting,
)
from hydroagent_hpc.train.live import report_to_setting, run_name_setting, wandb_project_setting

__all__ = ["SFTConfig", "load_sft_config", "config_from_mapping", "DTYPES", "MAX_GRAD_ACCUM"]

DTYPES = ("auto", "bf16", "fp32")
#: The most micro-batches one optimizer step may accumulate (per process): beyond it a step never ends.
MAX_GRAD_ACCUM = 4096


@dataclass(frozen=True)
class SFTConfig(Settings):
    """Everything that decides an SFT run (written, resolved, into ``RUN_DIR/config.yaml``)."""

    data: str = setting(path=True, nonempty=True, help="the SFT data file (`hydroagent train sft-data` output)",
                        fix="name the file `hydroagent train sft-data` wrote")
    model: str = setting("tiny", path=True, keep=("tiny",), nonempty=True,
                         help="the model to train: tiny (built here) or a save_pretrained folder")
    lr: float = setting(1e-5, gt=0, le=1, help="peak learning rate (AdamW)", fix=LR_FIX)
    min_lr_ratio: float = setting(0.0, ge=0, le=1, help="the cosine schedule's floor as a share of lr")
    weight_decay: float = setting(0.0, ge=0, le=1, help="AdamW weight decay",
                                  fix="give a decay from 0 to 1 (0.0 is TRL's default; 0.01 to 0.1 are usual)")
    warmup_steps: int = setting(0, ge=0, help="optimizer steps of linear warm-up")
    max_steps: int | None = setting(None, ge=1, help="optimizer steps (or epochs; exactly one of the two)")
    epochs: int | None = setting(None, ge=1, help="passes over the data (or max_steps; exactly one of the two)")
    micro_batch_size: int = setting(1, ge=1, help="sequences per forward pass")
    grad_accum: int = setting(1, ge=1, le=MAX_GRAD_ACCUM, help="micro-batches per optimizer step (per process)")
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
    collective_timeout_s: float = setting(10800.0, gt=0, le=MAX_TIMEOUT_S,
                                          help="how long a rank waits in a collective (NCCL's own default of 10 min "
                                               "is too short; gpu-audit F4)")
    report_to: tuple[str, ...] = report_to_setting()
    wandb_project: str = wandb_project_setting()
    run_name: str | None = run_name_setting()

    def check(self) -> None:
        if (self.max_steps is None) == (self.epochs is None):
            raise invalid("epochs" if self.epochs is not None else "max_steps",
                          "give exactly one of max_steps and epochs", "set max_steps: N (optimizer steps) or epochs: N")
        if self.max_steps is not None and self.warmup_steps > self.max_steps:
            raise invalid("warmup_steps", f"{self.warmup_steps} warm-up steps in a run of max_steps {self.max_steps}: "
                                          f"the learning rate would never reach lr",
                          f"give warmup_steps at most {self.max_steps} (often a few percent of the run)")

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

