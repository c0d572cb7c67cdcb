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
import math
import os
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim.manifest import file_sha256

__all__ = ["PipelineError", "PipelineStateError", "file_sha256", "output_record", "verify_output", "input_digest",
           "read_record", "check_record", "read_submit_record", "write_record", "record_path", "utc_now",
           "write_json_atomic", "STATUSES"]


class PipelineError(HydroAgentError):
    """A run folder that cannot be used now (not a pipeline run, another run or Slurm jobs working in it,
    an unknown stage); a bad pipeline file is a :class:`~hydroagent_hpc.errors.ConfigError`."""


class PipelineStateError(PipelineError):
    """A state file of a run folder (``<stage>/stage.json``, ``submit.json``) that is damaged: the message
    names the file and the field, and the fix says how to go on."""


RECORD = "stage.json"
STATUSES = ("running", "done", "failed")
_HEX64 = frozenset("0123456789abcdef")


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


def _load_json(path: Path, fix: str) -> Any:
    """The JSON in ``path`` (None when there is no such file); damage is a :class:`PipelineStateError`."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise PipelineStateError(f"{path}: cannot be read ({exc.strerror or exc})", fix) from None
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError as exc:
        raise PipelineStateError(f"{path}: not UTF-8 text (byte {exc.start})", fix) from None
    except ValueError as exc:
        where = f"line {exc.lineno}, column {exc.colno}: {exc.msg}" if isinstance(exc, json.JSONDecodeError) \
            else str(exc)
        raise PipelineStateError(f"{path}: not JSON ({where})", fix) from None
    except RecursionError:
        raise PipelineStateError(f"{path}: not JSON (nested too deep)", fix) from None


def _is_hex64(value: Any) -> bool:
    return isinstance(value, str) and len(value) == 64 and set(value) <= _HEX64


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_record(path: Path, stage: str, data: Any) -> str | None:
    """What is wrong with the stage record ``data`` read from ``path`` (a field and its problem), or None."""
    if not isinstance(data, dict):
        return f"is a JSON {type(data).__name__}, not an object"
    if data.get("stage") != stage:
        return f"field 'stage': {data.get('stage')!r}, the record is {stage}'s"
    if data.get("status") not in STATUSES:
        return f"field 'status': {data.get('status')!r} is not one of {', '.join(STATUSES)}"
    if not _is_hex64(data.get("inputs")):
        return f"field 'inputs': {str(data.get('inputs'))[:40]!r} is not a SHA-256 (64 hex digits)"
    for key, kind in (("input_parts", dict), ("input_files", dict), ("summary", dict), ("outputs", dict)):
        if data.get(key) is not None and not isinstance(data[key], kind):
            return f"field '{key}': a {type(data[key]).__name__}, not an object"
    attempts = data.get("attempts")
    if attempts is not None and (not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1):
        return f"field 'attempts': {attempts!r} is not a whole number >= 1"
    for key in ("wall_s", "wall_s_before"):
        if data.get(key) is not None and not (_number(data[key]) and data[key] >= 0):
            return f"field '{key}': {data[key]!r} is not a number of seconds >= 0"
    for key in ("started_utc", "finished_utc", "first_started_utc", "failed_utc", "error", "why", "action"):
        if data.get(key) is not None and not isinstance(data[key], str):
            return f"field '{key}': {data[key]!r} is not text"
    if data.get("job") is not None and not isinstance(data["job"], (str, int)):
        return f"field 'job': {data['job']!r} is not a job id"
    if data["status"] == "done" and not isinstance(data.get("outputs"), dict):
        return "field 'outputs': missing from a done stage"
    for name, out in (data.get("outputs") or {}).items():
        at = f"outputs.{name}"
        if not isinstance(out, dict):
            return f"field '{at}': not an object"
        if not isinstance(out.get("path"), str) or not out["path"]:
            return f"field '{at}.path': {out.get('path')!r} is not a path"
        if not _is_hex64(out.get("sha256")):
            return f"field '{at}.sha256': {str(out.get('sha256'))[:40]!r} is not a SHA-256"
        files = out.get("files")
        if not isinstance(files, dict):
            return f"field '{at}.files': not an object"
        for rel, entry in files.items():
            if not (isinstance(entry, list) and len(entry) == 3 and all(isinstance(v, int) and not isinstance(v, bool)
                                                                        for v in entry[:2])
                    and entry[0] >= 0 and _is_hex64(entry[2])):
                return f"field '{at}.files.{rel}': {str(entry)[:60]} is not [size, mtime_ns, sha256]"
    return None


def read_record(run_dir: Path, stage: str) -> dict[str, Any] | None:
    """``RUN/<stage>/stage.json``, checked field by field; None when there is none. A damaged one is a
    :class:`PipelineStateError` naming the file and the field: nothing decides on a record it cannot read
    (a stage whose record is lost would start afresh and clear its folder)."""
    path = record_path(run_dir, stage)
    fix = (f"restore {path} from a copy, or delete it to run stage {stage} again from its start "
           f"(its folder {path.parent} is cleared then)")
    data = _load_json(path, fix)
    if data is None and not path.exists():
        return None
    problem = check_record(path, stage, data)
    if problem:
        raise PipelineStateError(f"{path}: {problem}", fix)
    return dict(data)


def read_submit_record(run_dir: Path) -> dict[str, Any]:
    """``RUN/submit.json`` (what ``pipeline submit`` recorded: ``cluster`` and ``jobs`` per stage), checked; {}
    when there is none. A damaged one is a :class:`PipelineStateError` naming the file and the field."""
    path = run_dir / "submit.json"
    fix = f"restore {path} from a copy, or delete it once no job of the submission runs (squeue)"
    data = _load_json(path, fix)
    if data is None and not path.exists():
        return {}
    if not isinstance(data, dict):
        raise PipelineStateError(f"{path}: is a JSON {type(data).__name__}, not an object", fix)
    if data.get("cluster") is not None and not isinstance(data["cluster"], str):
        raise PipelineStateError(f"{path}: field 'cluster': {data['cluster']!r} is not text", fix)
    jobs = data.get("jobs")
    if jobs is not None:
        if not isinstance(jobs, dict):
            raise PipelineStateError(f"{path}: field 'jobs': not an object", fix)
        for stage, ids in jobs.items():
            if not isinstance(ids, list) or not all(isinstance(j, str) for j in ids):
                raise PipelineStateError(f"{path}: field 'jobs.{stage}': {str(ids)[:60]} is not a list of job ids",
                                         fix)
    return dict(data)


def write_json_atomic(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=False, default=str) + "\n")
    os.replace(tmp, path)


def write_record(run_dir: Path, stage: str, record: Mapping[str, Any]) -> None:
    write_json_atomic(record_path(run_dir, stage), dict(record))
