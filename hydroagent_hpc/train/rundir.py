"""What both trainers do with their run folder: refuse or resume, record the config, keep metrics.

- :func:`prepare_run_dir`: the checkpoint to resume from (or None); refuses a folder that holds a
  run unless resuming, and a resumed run whose config differs from the recorded one (naming the keys).
- :func:`write_run_config`: ``RUN_DIR/config.yaml`` (atomically): the resolved config, the caller's
  extras, provenance (git commit) and package versions.
- :class:`MetricsCSV`: ``RUN_DIR/metrics.csv``, one row per optimizer step; on resume the rows after
  the checkpoint are dropped, so a replayed step is never counted twice. Each row also goes to the
  run's live metrics (:mod:`hydroagent_hpc.train.live`: TensorBoard, W&B, the progress display).
"""

from __future__ import annotations

import csv
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.train.checkpoint import config_changes, has_checkpoints, resume_point
from hydroagent_hpc.train.live import Live, require_installed

log = logging.getLogger(__name__)

__all__ = ["prepare_run_dir", "field_defaults", "write_run_config", "package_version", "MetricsCSV"]


def prepare_run_dir(run_dir: Path, config: Mapping[str, Any], resume: bool,
                    error: type[ConfigError] = ConfigError, defaults: Mapping[str, Any] | None = None,
                    model: Any = None) -> Path | None:
    """The checkpoint to resume from (or None); ``config`` is the run's config as a dict.

    A resumed run must have the config it started with. ``defaults`` (the config class's field
    defaults, :func:`field_defaults`) lets a run started before a key existed resume: a key missing
    from the stored config counts as unchanged while the new config holds its default.

    The checkpoint is the newest intact one (:func:`~hydroagent_hpc.train.checkpoint.resume_point`:
    checksums, and the tensor shapes of ``model``, the unwrapped model about to load it, when given);
    a damaged newer one is named in a warning, and when none is intact
    :class:`~hydroagent_hpc.train.checkpoint.CheckpointError` says how to go on.
    """
    require_installed(tuple(config.get("report_to") or ()))  # before anything is written
    if not has_checkpoints(run_dir):
        return None
    if not resume:
        raise error(f"--out {run_dir}: holds checkpoints of a run ({run_dir / 'checkpoints'})",
                    "pass --resume to continue it, or choose a new --out folder")
    saved = run_dir / "config.yaml"
    if saved.is_file():
        old = dict((yaml.safe_load(saved.read_text()) or {}).get("config") or {})
        changed = config_changes(old, config, defaults)
        if changed:
            raise error(f"--out {run_dir}: was started with another config (differs in {', '.join(changed)}); "
                        f"a resumed run must use the same one",
                        f"resume with the config in {saved}, or choose a new --out folder")
    return resume_point(run_dir, config=config, defaults=defaults, model=model)


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
    try:
        tmp.write_text(yaml.safe_dump(record, sort_keys=False))
    except OSError:  # a full disk: no half-written file is left beside the config.yaml that stays
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, run_dir / "config.yaml")


class MetricsCSV:
    """``metrics.csv`` with ``columns`` (the first is the step); ``rows`` are those kept on resume.

    ``live`` (:func:`hydroagent_hpc.train.live.open_live`): where each row also goes as it is written;
    :meth:`close` (or leaving a ``with`` block) closes it.
    """

    def __init__(self, path: Path, columns: Sequence[str], resumed_step: int | None, live: Live | None = None) -> None:
        self.path, self.columns = path, tuple(columns)
        self.live = live
        self.rows: list[list[str]] = []
        if resumed_step is not None and path.is_file():
            self.rows = self._kept_rows(resumed_step)
        tmp = path.with_suffix(".csv.tmp")
        with open(tmp, "w", newline="") as fh:
            w = csv.writer(fh)
            w.writerow(self.columns)
            w.writerows(self.rows)
        os.replace(tmp, path)

    def _kept_rows(self, resumed_step: int) -> list[list[str]]:
        """The rows of steps 1 .. ``resumed_step`` (those the checkpoint holds), each once. A row that is
        not whole (a write cut off by a kill or a full disk) is dropped with a warning, as is a step
        after the checkpoint (it runs again)."""
        with open(self.path, newline="", errors="replace") as fh:
            rows = list(csv.reader(fh))[1:]
        kept: dict[int, list[str]] = {}
        for i, r in enumerate(rows, 2):
            try:
                step = int(r[0]) if len(r) == len(self.columns) else None
            except ValueError:
                step = None
            if step is None:
                if r:
                    log.warning("%s:%d: an incomplete row (%d of %d fields), dropped", self.path, i, len(r),
                                len(self.columns))
                continue
            if 1 <= step <= resumed_step:
                kept[step] = r
        missing = [s for s in range(1, resumed_step + 1) if s not in kept]
        if missing:
            log.warning("%s: no row for step(s) %s of the %d the checkpoint holds", self.path,
                        ", ".join(map(str, missing[:10])), resumed_step)
        return [kept[s] for s in sorted(kept)]

    def write(self, row: Mapping[str, Any]) -> None:
        with open(self.path, "a", newline="") as fh:
            csv.writer(fh).writerow([f"{row.get(c):.8g}" if isinstance(row.get(c), float) else row.get(c, "")
                                     for c in self.columns])
        if self.live is not None:
            self.live.row({c: row.get(c) for c in self.columns})

    def log(self, step: int, values: Mapping[str, float]) -> None:
        """Values in no row (tagged already) to the live metrics only."""
        if self.live is not None:
            self.live.log(step, values)

    def close(self, failed: bool = False) -> None:
        if self.live is not None:
            self.live.close(failed)
            self.live = None

    def __enter__(self) -> MetricsCSV:
        return self

    def __exit__(self, kind: type[BaseException] | None, *_: object) -> None:
        self.close(failed=kind is not None)
