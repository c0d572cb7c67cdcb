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

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.yamlio import brief, load_strict

__all__ = ["SFTConfig", "SFTConfigError", "load_sft_config", "config_from_mapping", "DTYPES"]

DTYPES = ("auto", "bf16", "fp32")


class SFTConfigError(ConfigError):
    """An SFT config, data file or model that cannot be used (names the file:line or path and the fix)."""


@dataclass(frozen=True)
class SFTConfig:
    """Everything that decides an SFT run (written, resolved, into ``RUN_DIR/config.yaml``)."""

    data: str
    model: str = "tiny"
    lr: float = 1e-5
    min_lr_ratio: float = 0.0
    weight_decay: float = 0.0
    warmup_steps: int = 0
    max_steps: int | None = None
    epochs: int | None = None
    micro_batch_size: int = 1
    grad_accum: int = 1
    max_grad_norm: float = 1.0
    seed: int = 0
    dtype: str = "auto"
    fsdp: bool | str = "auto"
    activation_checkpointing: bool = False
    save_every: int = 0
    keep_checkpoints: int = 2
    log_every: int = 1
    bucket_by_length: bool = True
    max_seq_len: int | None = None
    collective_timeout_s: float = 10800.0

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_INT = ("warmup_steps", "max_steps", "epochs", "micro_batch_size", "grad_accum", "seed", "save_every",
        "keep_checkpoints", "log_every", "max_seq_len")
_FLOAT = ("lr", "min_lr_ratio", "weight_decay", "max_grad_norm", "collective_timeout_s")
_BOOL = ("activation_checkpointing", "bucket_by_length")
_POSITIVE = ("micro_batch_size", "grad_accum", "log_every", "max_steps", "epochs", "max_seq_len")
_NON_NEGATIVE = ("warmup_steps", "save_every", "keep_checkpoints", "weight_decay", "min_lr_ratio")


def _check(data: dict[str, Any], where: Any) -> dict[str, Any]:
    """Type- and range-check ``data`` (``where(key)`` -> "file:line"); returns the typed values."""
    fields = {f.name for f in dataclasses.fields(SFTConfig)}
    out: dict[str, Any] = {}
    for key, value in data.items():
        at = where(key)
        if key not in fields:
            raise SFTConfigError(f"{at}: {key}: unknown key", f"use one of {', '.join(sorted(fields))}")
        if key in ("data", "model"):
            if not isinstance(value, str) or not value:
                raise SFTConfigError(f"{at}: {key}: expected a path, got {brief(value)}")
        elif key in _INT:
            if value is None and key in ("max_steps", "epochs", "max_seq_len"):
                pass
            elif isinstance(value, bool) or not isinstance(value, int):
                raise SFTConfigError(f"{at}: {key}: expected a whole number, got {brief(value)}")
            elif key in _POSITIVE and value < 1:
                raise SFTConfigError(f"{at}: {key}: must be at least 1, got {value}")
            elif key in _NON_NEGATIVE and value < 0:
                raise SFTConfigError(f"{at}: {key}: must not be negative, got {value}")
        elif key in _FLOAT:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise SFTConfigError(f"{at}: {key}: expected a number, got {brief(value)}",
                                     "write numbers like 1.0e-5 (PyYAML reads 1e-5 without a dot as text)")
            value = float(value)
            if value != value or value in (float("inf"), float("-inf")):
                raise SFTConfigError(f"{at}: {key}: must be finite, got {value}")
            if key == "lr" and value <= 0:
                raise SFTConfigError(f"{at}: lr: must be positive, got {value}")
            if key in ("max_grad_norm", "collective_timeout_s") and value <= 0:
                raise SFTConfigError(f"{at}: {key}: must be positive, got {value}")
            if key in _NON_NEGATIVE and value < 0:
                raise SFTConfigError(f"{at}: {key}: must not be negative, got {value}")
        elif key in _BOOL:
            if not isinstance(value, bool):
                raise SFTConfigError(f"{at}: {key}: expected true or false, got {brief(value)}")
        elif key == "dtype":
            if value not in DTYPES:
                raise SFTConfigError(f"{at}: dtype: {brief(value)} is not one of {', '.join(DTYPES)}")
        elif key == "fsdp":
            if not (isinstance(value, bool) or value == "auto"):
                raise SFTConfigError(f"{at}: fsdp: expected true, false or auto, got {brief(value)}")
        out[key] = value
    if "data" not in out:
        raise SFTConfigError(f"{where(None)}: data: missing", "name the file `hydroagent train sft-data` wrote")
    steps, epochs = out.get("max_steps"), out.get("epochs")
    if (steps is None) == (epochs is None):
        raise SFTConfigError(f"{where('max_steps' if steps is not None else 'epochs')}: give exactly one of "
                             f"max_steps and epochs", "set max_steps: N (optimizer steps) or epochs: N")
    return out


def config_from_mapping(data: Any, *, source: str = "<config>", base_dir: Path | None = None,
                        where: Any = None) -> SFTConfig:
    """An :class:`SFTConfig` from a parsed mapping; relative ``data``/``model`` paths join ``base_dir``."""
    if not isinstance(data, dict):
        raise SFTConfigError(f"{source}: expected a mapping of settings, got {brief(data)}")
    where = where or (lambda key: source)
    values = _check(data, where)
    if base_dir is not None:
        for key in ("data", "model"):
            v = values.get(key)
            if v is not None and not (key == "model" and v == "tiny") and not Path(v).is_absolute():
                values[key] = str((base_dir / v).resolve())
    return SFTConfig(**values)


def load_sft_config(path: str | Path) -> SFTConfig:
    """Read an SFT config file strictly (unknown keys, bad types and values name the file:line)."""
    doc = load_strict(path, error=SFTConfigError, what="SFT config")
    p = Path(path)
    return config_from_mapping(doc.data, source=doc.source, base_dir=p.resolve().parent,
                               where=lambda key: doc.where([key]) if key else doc.source)
