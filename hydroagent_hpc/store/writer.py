"""``EpisodeWriter``: append episodes to a store file so that a killed writer loses only its
episode in flight.

How (details and the argument in ``store_schema.md``):

1. The file is created complete (every dataset of the schema) under a temporary name and
   renamed into place, then always opened in HDF5 SWMR-write mode. SWMR orders metadata flushes
   so the file on disk is a valid HDF5 file at every moment, even when the writer dies.
2. An episode's turns, simulations, metrics, series and strings are appended and flushed
   first; the episode's record in ``episodes/rows``, carrying a CRC-32, is appended and flushed
   last. That record is the commit: readers only see episodes whose record checks out, so the
   other rows of an unfinished episode are orphans nobody reads.
3. A writer that finds the file left by a killed writer (superblock status flags set) copies
   the committed episodes to a fresh file and renames it over the old one before appending.
4. A lock file ``<name>.lock`` (``flock``) keeps a second writer out; SWMR releases HDF5's own lock.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import time
from pathlib import Path
from types import TracebackType
from typing import Any

import h5py
import numpy as np
from h5py import h5f, h5p

from hydroagent_hpc.store.codec import block_checksum, encode_rows, series_checksum
from hydroagent_hpc.store.errors import CorruptStoreError, DuplicateEpisodeError, StoreError, StoreLockedError
from hydroagent_hpc.store.rows import (
    BasinRecord,
    basin_info,
    basin_record,
    episode_columns,
    metric_columns,
    sim_columns,
    turn_columns,
)
from hydroagent_hpc.store.schema import (
    BASINS,
    DATASETS,
    EPISODES,
    LIBVER,
    METRIC_KEYS,
    METRICS,
    SIMS,
    TURNS,
    Table,
    check_schema,
    create_layout,
)
from hydroagent_hpc.store.verify import explain
from hydroagent_hpc.store.view import StoreView, open_store, register_writer, superblock_dirty
from hydroagent_hpc.types import Basin, Episode

__all__ = ["EpisodeWriter"]

logger = logging.getLogger(__name__)

_LIBVER_CODES = {"v110": h5f.LIBVER_V110, "latest": h5f.LIBVER_LATEST}


class WriterLock:
    """An exclusive ``flock`` on ``<path>.lock``, removed on release (inode checked on acquire)."""

    def __init__(self, path: Path):
        self.path = path.with_name(path.name + ".lock")
        self.fd: int | None = None
        for _ in range(20):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise StoreLockedError(
                    f"{path}: another writer (pid {holder}) holds {self.path}. One writer per file: give each "
                    f"rank or array task its own shard and merge them afterwards.") from None
            except OSError as exc:  # file system without flock (some Lustre mounts)
                if exc.errno not in (errno.ENOSYS, errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL):
                    os.close(fd)
                    raise
                logger.warning("%s: file locks unsupported here (%s); one writer per file is not enforced",
                               path, exc.strerror)
                self.fd = fd
                return
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file that its holder unlinked while we waited
                os.ftruncate(fd, 0)
                os.pwrite(fd, str(os.getpid()).encode(), 0)
                self.fd = fd
                return
            os.close(fd)
        raise StoreLockedError(f"{path}: could not take the writer lock {self.path}; it keeps being replaced")

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
        os.close(self.fd)
        self.fd = None


def _fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def install_file(tmp: Path, path: Path) -> None:
    """Make the closed file ``tmp`` durable and atomically rename it to ``path``."""
    _fsync_path(tmp)
    os.replace(tmp, path)
    _fsync_path(path.parent)


_PURPOSES = ("create", "recover", "merge")


def temp_name(path: Path, purpose: str) -> Path:
    """A temporary file beside ``path`` for ``purpose`` (create, recover, merge)."""
    if purpose not in _PURPOSES:
        raise ValueError(f"unknown purpose {purpose!r}")
    return path.with_name(f".{path.name}.{purpose}-{os.getpid()}.tmp")


def remove_stale_temps(path: Path) -> None:
    """Delete temporary files a killed writer or merge left beside ``path`` (call with the lock held)."""
    for purpose in _PURPOSES:
        for stale in path.parent.glob(f".{path.name}.{purpose}-*.tmp"):
            if stale.name[len(path.name) + len(purpose) + 3:-4].isdigit():
                logger.info("%s: removing %s left by an earlier run", path, stale.name)
                stale.unlink(missing_ok=True)


def new_store_file(path: Path) -> h5py.File:
    """Create an empty store at ``path`` (truncating) and return it open for writing (not SWMR)."""
    f = h5py.File(path, "w", libver=LIBVER)
    create_layout(f)
    f.flush()
    return f


def _open_swmr_write(path: Path, wait_s: float = 5.0) -> h5py.File:
    """Open an existing store for SWMR writing (no window in which it is open non-SWMR)."""
    fapl = h5p.create(h5p.FILE_ACCESS)
    fapl.set_libver_bounds(*(_LIBVER_CODES[v] for v in LIBVER))
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fid = h5f.open(os.fsencode(path), h5f.ACC_RDWR | h5f.ACC_SWMR_WRITE, fapl=fapl)
            return h5py.File(fid)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise StoreLockedError(
                    f"{path}: another process has the file open with HDF5 file locking (a reader that did not "
                    f"use SWMR?). Read stores with hydroagent_hpc.store's readers, or h5py.File(path, 'r', "
                    f"swmr=True, locking=False).") from None
            time.sleep(0.1)


class Appender:
    """Appends whole episodes to an open store file; the caller owns the file and any lock."""

    def __init__(self, f: h5py.File, path: Path, durable: bool = False):
        self.f = f
        self.path = path
        self.durable = durable
        view = StoreView(f, path)
        self.ids: dict[str, None] = dict.fromkeys(view.ids)
        self.basin_keys: dict[str, int] = {}
        for key, (row, _) in view.basins(view.rows["basin_key"]).items():
            self.basin_keys[row["digest"]] = key
        keys_end = int(view.rows["keys_end"].max()) if len(view) else 0
        self.key_ids: dict[str, int] = {}
        for i, name in enumerate(view.metric_names()[:keys_end]):
            if name is not None:
                self.key_ids.setdefault(name, i)
        self.ds = {name: f[name] for name in DATASETS}
        if view.invalid_rows:
            logger.info("%s: %d episode rows are not committed (writes that did not finish)", path, view.invalid_rows)

    def _len(self, name: str) -> int:
        return int(self.ds[name].shape[0])

    def _append(self, name: str, data: np.ndarray | bytes, expect_at: int | None = None) -> None:
        arr = np.frombuffer(data, dtype=np.uint8) if isinstance(data, bytes) else data
        ds = self.ds[name]
        n = ds.shape[0]
        if expect_at is not None and n != expect_at:
            raise StoreError(f"{self.path}: {name} has {n} rows, expected {expect_at} (a second writer?)")
        if len(arr) == 0:
            return
        ds.resize((n + len(arr),))
        ds[n:n + len(arr)] = arr

    def _encode(self, table: Table, cols: dict[str, Any], n: int, eid: str) -> tuple[np.ndarray, bytes]:
        try:
            return encode_rows(table, cols, n, self._len(f"{table.name}/text"), self._len(f"{table.name}/rows"))
        except (TypeError, ValueError) as exc:
            raise type(exc)(f"{self.path}: episode {eid}: {exc}") from exc

    def append(self, episode: Episode, info: str | None = None) -> None:
        """Write one episode and commit it; ``info`` is its Basin as JSON (or None)."""
        if not isinstance(episode, Episode):
            raise TypeError(f"{self.path}: expected an Episode, got {type(episode).__name__}")
        eid = episode.episode_id
        if not isinstance(eid, str) or not eid:
            raise ValueError(f"{self.path}: episode_id must be a non-empty str, got {eid!r}")
        if eid in self.ids:
            raise DuplicateEpisodeError(f"{self.path}: episode {eid!r} is already stored; resume a campaign by "
                                        f"skipping ids for which writer.has(id) is true")
        # 1. Encode everything (any error is raised before the file is touched).
        row = self._len("episodes/rows")
        basin = basin_record(episode, info)
        known = self.basin_keys.get(basin.digest)
        new_basin = known is None
        basin_key = self._len("basins/rows") if known is None else known
        if new_basin:
            b_rows, b_text = self._encode(BASINS, self._basin_columns(basin), 1, eid)
        sim_start = self._len("sims/rows")
        q_base = self._len("series/discharge")
        s_cols, q = sim_columns(row, episode, q_base)
        s_rows, s_text = self._encode(SIMS, s_cols, len(episode.sims), eid)
        keys_base = self._len("metric_keys/rows")
        new_keys: dict[str, int] = {}

        def key_id(name: str) -> int:
            k = self.key_ids.get(name)
            if k is None:
                k = new_keys.setdefault(name, keys_base + len(new_keys))
            return k

        m_cols = metric_columns(sim_start, episode, key_id)
        m_rows, m_text = self._encode(METRICS, m_cols, len(m_cols["key"]), eid)
        k_rows, k_text = self._encode(METRIC_KEYS, {"name": list(new_keys)}, len(new_keys), eid)
        t_rows, t_text = self._encode(TURNS, turn_columns(row, episode), len(episode.turns), eid)
        ranges = {"turn_start": self._len("turns/rows"), "turn_count": len(episode.turns),
                  "sim_start": sim_start, "sim_count": len(episode.sims),
                  "metric_start": self._len("metrics/rows"), "metric_count": len(m_rows),
                  "keys_end": keys_base + len(new_keys),
                  # The seals of the episode's blocks: rows then their strings (codec.block_checksum).
                  "turns_crc": block_checksum(t_rows, t_text), "sims_crc": block_checksum(s_rows, s_text),
                  "metrics_crc": block_checksum(m_rows, m_text), "discharge_crc": series_checksum(q)}
        e_rows, e_text = self._encode(EPISODES, episode_columns(episode, basin_key, ranges), 1, eid)
        # 2. Write every part of the episode, then flush.
        if new_basin:
            self._append("series/times", basin.times if basin.times is not None else np.zeros(0, np.int64))
            self._append("series/observed", basin.observed if basin.observed is not None else np.zeros(0))
            self._append("series/warmup", basin.warmup if basin.warmup is not None else np.zeros(0, np.uint8))
            self._append("basins/text", b_text)
            self._append("basins/rows", b_rows, basin_key)
        self._append("series/discharge", q, q_base)
        self._append("sims/text", s_text)
        self._append("sims/rows", s_rows, sim_start)
        self._append("metric_keys/text", k_text)
        self._append("metric_keys/rows", k_rows, keys_base)
        self._append("metrics/text", m_text)
        self._append("metrics/rows", m_rows, ranges["metric_start"])
        self._append("turns/text", t_text)
        self._append("turns/rows", t_rows, ranges["turn_start"])
        self._append("episodes/text", e_text)
        self.f.flush()
        # 3. Commit: the episode's record, flushed.
        self._append("episodes/rows", e_rows, row)
        self.f.flush()
        if self.durable:
            os.fsync(self.f.id.get_vfd_handle())
        self.ids[eid] = None
        if new_basin:
            self.basin_keys[basin.digest] = basin_key
        self.key_ids.update(new_keys)

    def _basin_columns(self, b: BasinRecord) -> dict[str, list[Any]]:
        starts = {name: self._len(f"series/{name}") for name in ("times", "observed", "warmup")}
        return {"basin_id": [b.basin_id], "digest": [b.digest], "info": [b.info], "times_unit": [b.times_unit],
                "times_start": [starts["times"]], "times_len": [None if b.times is None else len(b.times)],
                "observed_start": [starts["observed"]],
                "observed_len": [None if b.observed is None else len(b.observed)],
                "warmup_start": [starts["warmup"]], "warmup_len": [None if b.warmup is None else len(b.warmup)]}


_COPY_BLOCK_BYTES = 64 * 1024 * 1024


def _recover(path: Path) -> None:
    """Replace a file left by a killed writer with a clean copy (see store_schema.md, Guarantees 3).

    Every dataset is copied byte for byte up to its length on disk, so row numbers and text
    offsets stay valid; rows of the episode in flight stay orphans that readers ignore. The copy
    must show the same committed episodes as the original before it replaces it.
    """
    tmp = temp_name(path, "recover")
    t0 = time.perf_counter()
    try:
        with open_store(path) as src, new_store_file(tmp) as dst:
            for name in DATASETS:
                s, d = src[name], dst[name]
                n = int(s.shape[0])
                d.resize((n,))
                step = max(1, _COPY_BLOCK_BYTES // s.dtype.itemsize)
                for a in range(0, n, step):
                    d[a:a + step] = s[a:a + step]
            dst.flush()
            before, after = StoreView(src, path).ids, StoreView(dst, tmp).ids
            if before != after:
                raise StoreError(f"{path}: the recovery copy shows {len(after)} episodes, the file {len(before)}; "
                                 f"left the file as it is")
        install_file(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    logger.warning("%s: the last writer did not close the file (killed?); copied it with its %d committed "
                   "episodes into a clean file in %.2f s", path, len(after), time.perf_counter() - t0)


class EpisodeWriter:
    """Append episodes to the store at ``path`` (created if missing), crash-safely.

    >>> with EpisodeWriter("campaign.h5") as w:          # doctest: +SKIP
    ...     for ep in episodes:
    ...         if not w.has(ep.episode_id):
    ...             w.write(ep, basin)

    ``write`` returns once the episode is committed: after a kill the file holds it entirely,
    and it never holds part of an episode. ``durable=True`` also fsyncs after each commit (for
    machine crashes, not only process kills). Writing an id already stored raises
    :class:`DuplicateEpisodeError`.
    """

    def __init__(self, path: str | os.PathLike[str], *, durable: bool = False):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = WriterLock(self.path)
        self._file: h5py.File | None = None
        try:
            remove_stale_temps(self.path)
            if not self.path.exists():
                tmp = temp_name(self.path, "create")
                new_store_file(tmp).close()
                install_file(tmp, self.path)
                logger.info("%s: created an empty episode store", self.path)
            else:
                with open_store(self.path) as f:
                    check_schema(f, self.path)
                if superblock_dirty(self.path):
                    _recover(self.path)
            self._file = _open_swmr_write(self.path)
            self._app = Appender(self._file, self.path, durable)
            register_writer(self.path, self._file)
        except CorruptStoreError as exc:  # never append to a damaged store: say what is damaged and intact
            self.close()
            raise explain(exc, self.path) from None
        except BaseException:
            self.close()
            raise

    def write(self, episode: Episode, basin: Basin | None = None) -> None:
        """Store ``episode`` (and, the first time its series appear, ``basin``'s fields) and commit it."""
        if self._file is None:
            raise StoreError(f"{self.path}: the writer is closed")
        if basin is not None and basin.basin_id != episode.basin_id:
            raise ValueError(f"episode {episode.episode_id}: basin {basin.basin_id!r} is not the episode's "
                             f"basin {episode.basin_id!r}")
        self._app.append(episode, basin_info(basin, episode.episode_id))

    def has(self, episode_id: str) -> bool:
        """Whether ``episode_id`` is committed in the file."""
        return episode_id in self._app.ids

    __contains__ = has

    def __len__(self) -> int:
        return len(self._app.ids)

    @property
    def stored_ids(self) -> list[str]:
        """Committed episode ids in commit order."""
        return list(self._app.ids)

    def close(self) -> None:
        """Close the file (clearing its SWMR flags) and release the writer lock."""
        try:
            if self._file is not None:
                register_writer(self.path, None)
                self._file.close()
        finally:
            self._file = None
            self._lock.release()

    def __enter__(self) -> EpisodeWriter:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()
