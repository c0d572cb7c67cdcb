"""What both trainers do with their run folder: refuse or resume, record the config, keep metrics.

- :func:`prepare_run_dir`: the checkpoint to resume from (or None); refuses a folder that holds a
  run unless resuming, and a resumed run whose config differs from the recorded one (naming the keys).
- :func:`write_run_config`: ``RUN_DIR/config.yaml`` (atomically): the resolved config, the caller's
  extras, provenance (git commit) and package versions.
- :class:`MetricsCSV`: ``RUN_DIR/metrics.csv``, one row per optimizer step; on resume the rows after
  the checkpoint are dropped, so a replayed step is never counted twice.
"""

from __future__ import annotations

import csv
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.train.checkpoint import latest_checkpoint

__all__ = ["prepare_run_dir", "field_defaults", "write_run_config", "package_version", "MetricsCSV"]


def prepare_run_dir(run_dir: Path, config: Mapping[str, Any], resume: bool,
                    error: type[ConfigError] = ConfigError, defaults: Mapping[str, Any] | None = None) -> Path | None:
    """The checkpoint to resume from (or None); ``config`` is the run's config as a dict.

    A resumed run must have the config it started with. ``defaults`` (the config class's field
    defaults, :func:`field_defaults`) lets a run started before a key existed resume: a key missing
    from the stored config counts as unchanged while the new config holds its default.
    """
    latest = latest_checkpoint(run_dir)
    if latest is not None and not resume:
        raise error(f"--out {run_dir}: holds checkpoints of a run (latest {latest.name})",
                    "pass --resume to continue it, or choose a new --out folder")
    saved = run_dir / "config.yaml"
    if latest is not None and saved.is_file():
        old = dict((yaml.safe_load(saved.read_text()) or {}).get("config") or {})
        for key, value in (defaults or {}).items():
            if key not in old and key in config:  # a key added since the run started, at its default
                old[key] = value
        if old != dict(config):
            changed = sorted(k for k in config if old.get(k) != config[k])
            raise error(f"--out {run_dir}: was started with another config (differs in {', '.join(changed)}); "
                        f"a resumed run must use the same one",
                        f"resume with the config in {saved}, or choose a new --out folder")
    return latest


def field_defaults(cls: type) -> dict[str, Any]:
    """The defaults of a config dataclass's fields, as its ``to_dict`` writes them (fields without one left out)."""
    import dataclasses

    out: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def package_version(name: str) -> str:
    from importlib import metadata

    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return "absent"


def write_run_config(run_dir: Path, config: Mapping[str, Any], extra: Mapping[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    record = {"config": dict(config), **extra, "provenance": provenance(),
              "versions": {n: package_version(n) for n in ("torch", "transformers", "accelerate", "h5py")}}
    tmp = run_dir / "config.yaml.tmp"
    tmp.write_text(yaml.safe_dump(record, sort_keys=False))
    os.replace(tmp, run_dir / "config.yaml")


class MetricsCSV:
    """``metrics.csv`` with ``columns`` (the first is the step); ``rows`` are those kept on resume."""

    def __init__(self, path: Path, columns: Sequence[str], resumed_step: int | None) -> None:
        self.path, self.columns = path, tuple(columns)
        self.rows: list[list[str]] = []
        if resumed_step is not None and path.is_file():
            with open(path, newline="") as fh:
                self.rows = [r for r in list(csv.reader(fh))[1:] if r and int(r[0]) <= resumed_step]
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(self.columns)
            w.writerows(self.rows)
        os.replace(tmp, path)

    def write(self, row: Mapping[str, Any]) -> None:
        with open(self.path, "a", newline="") as fh:
            csv.writer(fh).writerow([f"{row.get(c):.8g}" if isinstance(row.get(c), float) else row.get(c, "")
                                     for c in self.columns])
