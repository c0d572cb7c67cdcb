"""What a run folder remembers about each stage: input checksums, outputs, status; written atomically.

``RUN/<stage>/stage.json`` (one per stage)::

    {"stage": "sft", "status": "done",            # running | done | failed
     "inputs": "sha256 of the canonical JSON of (the stage's section of the pipeline file, the
                upstream outputs it reads)",
     "input_parts": {...},                        # what went into it, for `pipeline status` and humans
     "outputs": {"final": {"path": "sft/final", "sha256": ..., "files": {...}}},
     "attempts": 2, "resumed": true, "started_utc": ..., "finished_utc": ..., "wall_s": ..., "summary": {...}}

An output is a file or a folder. Its checksum is the SHA-256 of the file, or of the sorted
``relative path, file checksum`` lines of every file in the folder. Each file's size and
modification time are kept beside its checksum, so verifying an unchanged output re-reads nothing
(a multi-GB model folder is hashed once, when the stage writes it); a file whose size or time
changed is hashed again and must give the same checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim.manifest import file_sha256

__all__ = ["PipelineError", "file_sha256", "output_record", "verify_output", "input_digest", "read_record",
           "write_record", "record_path", "utc_now", "write_json_atomic"]


class PipelineError(HydroAgentError):
    """A run folder that cannot be used now (not a pipeline run, another run or Slurm jobs working in it,
    an unknown stage); a bad pipeline file is a :class:`~hydroagent_hpc.errors.ConfigError`."""


RECORD = "stage.json"


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _files(path: Path) -> list[Path]:
    if path.is_file():
        return [path]
    return sorted(p for p in path.rglob("*") if p.is_file() and not p.name.endswith((".tmp", ".part")))


def output_record(run_dir: Path, path: Path, known: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """``{"path", "sha256", "files": {rel: [size, mtime_ns, sha256]}}`` of a file or folder.

    ``known`` (an earlier record of the same path): files whose size and mtime are unchanged keep their checksum.
    """
    if not path.exists():
        raise FileNotFoundError(f"{path}: the stage's output is missing")
    old = dict((known or {}).get("files") or {})
    files: dict[str, list[Any]] = {}
    lines = []
    for f in _files(path):
        rel = "." if f == path else f.relative_to(path).as_posix()
        st = f.stat()
        prev = old.get(rel)
        sha = prev[2] if prev and prev[0] == st.st_size and prev[1] == st.st_mtime_ns else file_sha256(f)
        files[rel] = [st.st_size, st.st_mtime_ns, sha]
        lines.append(f"{rel}\t{sha}\n")
    digest = hashlib.sha256("".join(lines).encode()).hexdigest()
    try:
        shown = path.resolve().relative_to(run_dir.resolve()).as_posix()
    except ValueError:
        shown = str(path.resolve())
    return {"path": shown, "sha256": digest, "files": files}


def verify_output(run_dir: Path, record: Mapping[str, Any]) -> str | None:
    """Why the output recorded in ``record`` is no longer what the stage wrote, or None when it still is."""
    path = Path(record["path"])
    path = path if path.is_absolute() else run_dir / path
    if not path.exists():
        return f"{path} is missing"
    try:
        now = output_record(run_dir, path, record)
    except OSError as exc:
        return f"{path}: {exc}"
    if now["sha256"] != record["sha256"]:
        old = record["files"]
        changed = sorted(set(now["files"]) ^ set(old) |
                         {k for k in now["files"] if k in old and now["files"][k][2] != old[k][2]})
        return f"{path} changed since the stage wrote it ({', '.join(changed[:3])}{' ...' if len(changed) > 3 else ''})"
    return None


def input_digest(parts: Mapping[str, Any]) -> str:
    """SHA-256 of the canonical JSON of ``parts`` (keys sorted, no spaces)."""
    text = json.dumps(parts, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def record_path(run_dir: Path, stage: str) -> Path:
    return run_dir / stage / RECORD


def read_record(run_dir: Path, stage: str) -> dict[str, Any] | None:
    path = record_path(run_dir, stage)
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # a damaged record is no record: the stage runs again
        return None
    return data if isinstance(data, dict) else None


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_record(run_dir: Path, stage: str, record: Mapping[str, Any]) -> None:
    write_json_atomic(record_path(run_dir, stage), dict(record))
