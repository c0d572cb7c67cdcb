"""On-disk cache of forcing arrays, keyed by the content of every file they were read from.

A calibration re-creates the simulator in many processes (array tasks, MPI ranks); parsing
thousands of forcing grids each time would dominate. The key is a BLAKE2 checksum over the
forcing section's unit, frequency and pattern, the content of every file the steps read, the
node locations and the DEM geometry; a changed file changes the key, so the cache never serves
stale forcing. Entries are ``.npz`` files (no pickles), written atomically.

Hashing the content means reading every forcing file (2,160 of them for a 90-day hourly run),
which costs a drop-in ``hydroagent simulate`` process more than the simulation. So the content
checksum is itself remembered under a stat fingerprint of the same files: name, size, inode,
device, modification and change times in nanoseconds (``forcing-stat-<fingerprint>.key``, one line).
Any write to a file, and any ``touch``, renaming or replacement, changes its change time (ctime,
which no user-level tool can set back), so an unchanged fingerprint means unchanged files; a new
fingerprint falls back to hashing the content (and remembers it).

The parameter grids a basin samples are remembered the same way (:func:`file_identity`,
:func:`load_arrays`, :func:`store_arrays`): the sampled values under the grid files' stat identity
and the basin's cell layout, so a drop-in process neither imports the TIFF reader nor parses a
grid it has read before.

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
from hydroagent_hpc.sim.forcing import forcing_checksum, forcing_file_names

log = logging.getLogger(__name__)

# Bumped whenever the cached values change for the same files (2: the unit conversion is a float32 product).
_VALUES_FORMAT = b"values-2|"

__all__ = ["cache_root", "stat_fingerprint", "content_checksum", "make_key", "load", "store", "file_identity",
           "load_arrays", "store_arrays"]


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


def stat_fingerprint(f: Forcing, names: list[str]) -> str:
    """A checksum of the forcing section's settings and of each file's name and ``os.stat`` identity
    (size, inode, device, mtime and ctime in ns); see the module doc."""
    h = hashlib.blake2b(digest_size=16)
    h.update(f"{f.unit}|{f.freq}|{f.pattern}|{f.loc}".encode())
    loc = str(f.loc)
    for name in names:
        h.update(_stat_line(name, os.path.join(loc, name)).encode())
    return h.hexdigest()


def _stat_line(label: str, path: str, missing: type[OSError] = FileNotFoundError) -> str:
    """``label`` and the file's ``os.stat`` identity (size, inode, device, mtime and ctime in ns), one
    line; ``label|<missing>`` when ``os.stat`` raises ``missing``."""
    try:
        st = os.stat(path)
    except missing:
        return f"{label}|<missing>\n"
    return f"{label}|{st.st_size}|{st.st_ino}|{st.st_dev}|{st.st_mtime_ns}|{st.st_ctime_ns}\n"


def content_checksum(f: Forcing, steps: list[datetime], begin: datetime, cache_dir=None) -> str:
    """:func:`~hydroagent_hpc.sim.forcing.forcing_checksum`, remembered under the files' stat fingerprint."""
    names = sorted(set(forcing_file_names(f, steps, begin)))
    index = cache_root(cache_dir) / f"forcing-stat-{stat_fingerprint(f, names)}.key"
    try:
        known = index.read_text().strip()
        if len(known) == 32:
            return known
    except OSError:
        pass
    checksum = forcing_checksum(f, steps, begin)
    try:
        index.parent.mkdir(parents=True, exist_ok=True)
        tmp = index.with_name(f"{index.name}.{os.getpid()}.tmp")
        tmp.write_text(checksum + "\n")
        os.replace(tmp, index)
    except OSError as exc:  # a read-only or full cache must not fail the run
        log.debug("could not remember the forcing checksum in %s: %s", index, exc)
    return checksum


def make_key(f: Forcing, steps: list[datetime], begin: datetime, extra: tuple, cache_dir=None) -> str:
    """The cache key of one forcing section read at these steps for these nodes."""
    h = hashlib.blake2b(digest_size=20)
    h.update(_VALUES_FORMAT)
    h.update(content_checksum(f, steps, begin, cache_dir).encode())
    h.update(f"{begin:%Y%m%d%H%M%S}|{steps[0]:%Y%m%d%H%M%S}|{steps[-1]:%Y%m%d%H%M%S}|{len(steps)}".encode())
    for part in extra:
        h.update(part if isinstance(part, bytes) else str(part).encode())
    return h.hexdigest()


def load(key: str, shape: tuple[int, int], cache_dir=None):
    """``(values, n_missing)`` from the cache, or None."""
    arrays = load_arrays("forcing", key, cache_dir)
    if arrays is None:
        return None
    if "values" not in arrays or "missing" not in arrays:
        log.warning("ignoring cache entry forcing-%s.npz without values and missing", key)
        return None
    if arrays["values"].shape != shape:
        return None
    log.debug("forcing from cache forcing-%s.npz", key)
    return arrays["values"], int(arrays["missing"])


def store(key: str, values: np.ndarray, missing: int, cache_dir=None) -> None:
    store_arrays("forcing", key, {"values": values, "missing": np.int64(missing)}, cache_dir)


def file_identity(paths: list[str | Path], extra: tuple = ()) -> str:
    """A checksum of each file's absolute name and ``os.stat`` identity (size, inode, device, mtime
    and ctime in ns; a missing file counts as such) and of ``extra`` (bytes or anything with a
    ``str``): the key of arrays derived from those files (see the module doc)."""
    h = hashlib.blake2b(digest_size=20)
    for path in paths:
        name = os.path.abspath(path)
        h.update(_stat_line(name, name, missing=OSError).encode())
    for part in extra:
        h.update(part if isinstance(part, bytes) else str(part).encode())
        h.update(b"|")
    return h.hexdigest()


def load_arrays(kind: str, key: str, cache_dir=None) -> dict[str, np.ndarray] | None:
    """The arrays stored under ``kind`` and ``key``, or None (absent or unreadable)."""
    path = cache_root(cache_dir) / f"{kind}-{key}.npz"
    try:
        with np.load(path, allow_pickle=False) as z:
            return {name: z[name] for name in z.files}
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError) as exc:
        log.warning("ignoring unreadable cache entry %s (%s)", path, exc)
        return None


def store_arrays(kind: str, key: str, arrays: dict[str, np.ndarray], cache_dir=None) -> None:
    """Store ``arrays`` under ``kind`` and ``key``, atomically; a cache that cannot be written is
    logged, never an error."""
    root = cache_root(cache_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
        path = root / f"{kind}-{key}.npz"
        tmp = path.with_name(f"{path.stem}.{os.getpid()}.tmp.npz")
        np.savez(tmp, **arrays)  # type: ignore[arg-type]  # numpy's stub types the keywords as allow_pickle
        os.replace(tmp, path)
    except OSError as exc:  # a read-only or full cache must not fail the run
        log.warning("could not write the cache in %s: %s", root, exc)
