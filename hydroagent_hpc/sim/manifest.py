"""A basin folder's data manifest: every input file with its size and SHA-256, and where it came from.

``manifest.json`` (written last by the synthetic generator and by ``basin from-camels``)::

    {"format": "hydroagent-manifest/1", "basin": "<folder name>",
     "source": {...}, "command": "hydroagent basin ...",
     "files": [{"path": "basic/dem.asc", "bytes": 1234, "sha256": "..."}, ...],
     "file_count": N, "total_bytes": B}

Paths are relative, with ``/``. There is no time stamp: the same data give the same bytes
(the synthetic generator promises byte-identical folders for a seed). Listed: every regular file under the folder except
``manifest.json`` itself, the run outputs (``output/``) and hidden files. ``verify_manifest``
re-hashes them (SHA-256, FIPS 180-4) and reports, one message each: a file listed but missing, a
size or hash that changed, an unlisted file in a listed folder (a forcing file added later
would silently change a run), and a manifest that cannot be read. A campaign calls it before
it starts, so a basin altered after it was prepared is caught before hours of compute.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

__all__ = ["MANIFEST_NAME", "FORMAT", "file_sha256", "list_files", "write_manifest", "read_manifest",
           "verify_manifest"]

MANIFEST_NAME = "manifest.json"
FORMAT = "hydroagent-manifest/1"
_SKIP_DIRS = {"output"}


def file_sha256(path: str | Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def list_files(folder: str | Path) -> list[str]:
    """Relative paths (``/``-separated, sorted) of the files a manifest covers."""
    root = Path(folder)
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        rel_dir = Path(dirpath).relative_to(root)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and
                             not (rel_dir == Path(".") and d in _SKIP_DIRS))
        for name in filenames:
            if name.startswith(".") or (rel_dir == Path(".") and name == MANIFEST_NAME):
                continue
            p = Path(dirpath) / name
            if p.is_file() and not p.is_symlink():
                out.append((rel_dir / name).as_posix())
    return sorted(out)


def write_manifest(folder: str | Path, source: Mapping[str, Any] | None = None, command: str | None = None,
                   basin: str | None = None) -> Path:
    """Hash every file of ``folder`` and write ``manifest.json`` there (atomically).

    ``basin`` names the basin (default: the folder's name; writers that build in a temporary
    folder pass the final name).
    """
    root = Path(folder)
    files = []
    total = 0
    for rel in list_files(root):
        p = root / rel
        size = p.stat().st_size
        total += size
        files.append({"path": rel, "bytes": size, "sha256": file_sha256(p)})
    data = {"format": FORMAT, "basin": basin or root.name, "source": dict(source or {}), "command": command or "",
            "file_count": len(files), "total_bytes": total, "files": files}
    path = root / MANIFEST_NAME
    tmp = path.with_name(f".{MANIFEST_NAME}.{os.getpid()}.part")
    tmp.write_text(json.dumps(data, indent=1) + "\n")
    os.replace(tmp, path)
    log.info("manifest of %s: %d files, %d bytes", root, len(files), total)
    return path


def read_manifest(folder: str | Path) -> dict:
    """The parsed ``manifest.json`` of a basin folder (ValueError with the fix if unusable)."""
    path = Path(folder) / MANIFEST_NAME
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ValueError(f"{path}: no manifest; write one with `hydroagent data verify --write {folder}`") from None
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not readable JSON ({exc}); rewrite it with `hydroagent data verify --write "
                         f"{folder}` after checking the data") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("files"), list):
        raise ValueError(f"{path}: not a {FORMAT} manifest; rewrite it with `hydroagent data verify --write {folder}`")
    return data


def verify_manifest(basin_dir: str | Path, *, required: bool = False) -> list[str]:
    """Problems of a basin folder against its manifest, one message each (empty list: all good).

    Without ``manifest.json`` the answer is ``[]`` (folders prepared before manifests existed,
    hand-made EF5 cases) unless ``required`` is set, when the missing manifest is the problem.
    """
    root = Path(basin_dir)
    if not root.is_dir():
        return [f"{root}: not a folder"]
    if not (root / MANIFEST_NAME).exists():
        if required:
            return [f"{root}: no {MANIFEST_NAME} (prepare the basin with `hydroagent basin from-camels` or "
                    f"`basin synth`, or record the current files with `hydroagent data verify --write {root}`)"]
        log.info("%s has no %s; not checked", root, MANIFEST_NAME)
        return []
    try:
        data = read_manifest(root)
    except ValueError as exc:
        return [str(exc)]
    problems = []
    listed = set()
    for entry in data["files"]:
        rel = str(entry.get("path", ""))
        listed.add(rel)
        p = root / rel
        if not rel or Path(rel).is_absolute() or ".." in Path(rel).parts:
            problems.append(f"{root / MANIFEST_NAME}: bad path {rel!r} in the file list")
            continue
        if not p.is_file():
            problems.append(f"{p}: listed in the manifest but missing (restore it or prepare the basin again)")
            continue
        size = p.stat().st_size
        if size != entry.get("bytes"):
            problems.append(f"{p}: {size} bytes, the manifest says {entry.get('bytes')} (the file changed after the "
                            "basin was prepared)")
        elif file_sha256(p) != entry.get("sha256"):
            problems.append(f"{p}: SHA-256 differs from the manifest (the file changed after the basin was prepared)")
    folders = {str(Path(r).parent.as_posix()) for r in listed if "/" in r}
    for rel in list_files(root):
        if rel not in listed and str(Path(rel).parent.as_posix()) in folders:
            problems.append(f"{root / rel}: not in the manifest (remove it, or prepare the basin again)")
    return problems
