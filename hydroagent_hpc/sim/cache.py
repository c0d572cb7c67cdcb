"""On-disk cache of forcing arrays, keyed by the content of every file they were read from.

A calibration re-creates the simulator in many processes (array tasks, MPI ranks); parsing
thousands of forcing grids each time would dominate. The key is a BLAKE2 checksum over the
forcing section's unit, frequency and pattern, the content of every file the steps read, the
node locations and the DEM geometry; a changed file changes the key, so the cache never serves
stale forcing. Entries are ``.npz`` files (no pickles), written atomically.

Location: ``$HYDROAGENT_CACHE``, else ``$XDG_CACHE_HOME/hydroagent-hpc``, else
``~/.cache/hydroagent-hpc``. Pass ``cache_dir=False`` to the simulator to bypass it.
"""

from __future__ import annotations

import hashlib
import logging
import os
from datetime import datetime
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.controlfile import Forcing
from hydroagent_hpc.sim.forcing import forcing_checksum

log = logging.getLogger(__name__)

__all__ = ["cache_root", "make_key", "load", "store"]


def cache_root(cache_dir: str | Path | bool | None = None) -> Path:
    """The forcing cache folder: ``cache_dir`` when it is a path; else (None or True, the default place)
    ``$HYDROAGENT_CACHE``, else ``$XDG_CACHE_HOME/hydroagent-hpc``, else ``~/.cache/hydroagent-hpc``."""
    if cache_dir is not None and not isinstance(cache_dir, bool):
        return Path(cache_dir)
    env = os.environ.get("HYDROAGENT_CACHE")
    if env:
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "hydroagent-hpc"


def make_key(f: Forcing, steps: list[datetime], begin: datetime, extra: tuple) -> str:
    """The cache key of one forcing section read at these steps for these nodes."""
    h = hashlib.blake2b(digest_size=20)
    h.update(forcing_checksum(f, steps, begin).encode())
    h.update(f"{begin:%Y%m%d%H%M%S}|{steps[0]:%Y%m%d%H%M%S}|{steps[-1]:%Y%m%d%H%M%S}|{len(steps)}".encode())
    for part in extra:
        h.update(part if isinstance(part, bytes) else str(part).encode())
    return h.hexdigest()


def load(key: str, shape: tuple[int, int], cache_dir=None):
    """``(values, n_missing)`` from the cache, or None."""
    path = cache_root(cache_dir) / f"forcing-{key}.npz"
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            values, missing = z["values"], int(z["missing"])
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring unreadable cache entry %s (%s)", path, exc)
        return None
    if values.shape != shape:
        return None
    log.debug("forcing from cache %s", path)
    return values, missing


def store(key: str, values: np.ndarray, missing: int, cache_dir=None) -> None:
    root = cache_root(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"forcing-{key}.npz"
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, values=values, missing=np.int64(missing))
        os.replace(tmp, path)
    except OSError as exc:  # a read-only or full cache must not fail the run
        log.warning("could not write the forcing cache in %s: %s", root, exc)
