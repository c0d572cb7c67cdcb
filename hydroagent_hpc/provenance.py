"""What produced a result: the git commit, package versions, host and time.

Written into every run's output so a table can always be traced to the code that made it.
"""

from __future__ import annotations

import platform
import subprocess
import sys
from datetime import datetime, timezone
from functools import lru_cache
from importlib import metadata
from pathlib import Path

from hydroagent_hpc import __version__

__all__ = ["git_commit", "provenance"]

_ROOT = Path(__file__).resolve().parents[1]


@lru_cache(maxsize=1)
def git_commit() -> str:
    """The repository's HEAD commit, with ``-dirty`` when the work tree has changes; 'unknown' outside git."""
    try:
        head = subprocess.run(["git", "-C", str(_ROOT), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(_ROOT), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("-dirty" if dirty else "")


def _version(pkg: str) -> str:
    try:
        return metadata.version(pkg)
    except metadata.PackageNotFoundError:
        return "absent"


def provenance() -> dict[str, object]:
    """A JSON-ready record of code, environment and time."""
    return {
        "hydroagent_hpc": __version__,
        "git_commit": git_commit(),
        "python": sys.version.split()[0],
        "packages": {p: _version(p) for p in ("numpy", "numba", "scipy", "tifffile", "pyflwdir")},
        "host": platform.node(),
        "created_utc": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
