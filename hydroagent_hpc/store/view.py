"""A read view of a store file: which episodes are committed, and reading their rows in bulk,
checking every byte a result depends on.

An episode is *committed* when its record in ``episodes/rows`` has a matching CRC-32 (over the
record and its strings), its strings lie inside ``episodes/text`` and its row ranges lie inside
the other tables. A record that is all zeros was never written (a writer killed before the
commit, or a write that raised): it and the rows written before it are orphans and invisible. Any
other record that fails these checks is *damaged*. The committed episode's blocks in ``turns``,
``sims`` and ``metrics`` (rows and strings), its discharge, its basin record and the metric names
it uses are checked against their seals when they are read; a mismatch is damage too.

A strict view (the default, used by every reader and writer) raises :class:`CorruptStoreError` on
damage; a lenient one (``strict=False``, used by ``verify_store`` and ``salvage``) records it in
``damaged`` and goes on. The view reads ``episodes`` first and the other datasets after, so a
committed episode's rows are always there even while a SWMR writer appends.

Opening never waits on a damaged file: :func:`check_file` compares the file's size with the end
of file the superblock records (a truncated file is refused before HDF5 sees it), and HDF5's SWMR
metadata retries, 100 by default with a doubling back-off that in practice never ends, are capped
at :data:`SWMR_READ_ATTEMPTS` (about 0.3 s per unreadable object).
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import field as dc_field
from functools import lru_cache
from pathlib import Path
from typing import Any

import h5py
import numpy as np
from h5py import h5f, h5p

from hydroagent_hpc.store.codec import (
    ENCODING,
    Decoded,
    block_checksum,
    decode_rows,
    is_blank,
    row_checksums,
    series_checksum,
    text_bounds_ok,
    text_span,
)
from hydroagent_hpc.store.errors import CorruptStoreError, SchemaError, StoreError
from hydroagent_hpc.store.rows import basin_digest, build_episode, build_sims, build_turns, decode_metrics
from hydroagent_hpc.store.schema import BASINS, EPISODES, METRIC_KEYS, METRICS, SIMS, TURNS, Table, check_schema
from hydroagent_hpc.types import Episode

__all__ = ["open_store", "open_read", "check_file", "FileCheck", "superblock_dirty", "StoreView", "Gathered",
           "ranges_index", "LIVE_WRITERS", "register_writer", "SWMR_READ_ATTEMPTS"]

logger = logging.getLogger(__name__)

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"

#: Metadata read attempts of a SWMR reader. HDF5 retries a metadata object whose checksum fails
#: (it may be mid-write) with a back-off that doubles each time, so 100 attempts (its default)
#: never end on a damaged file; 28 end after about 0.3 s, far longer than a writer takes to
#: rewrite one object.
SWMR_READ_ATTEMPTS = 28


#: Files open by an EpisodeWriter in this process, by real path. HDF5 cannot open a file a second
#: time in the process that writes it (other flags), so readers here use the writer's handle.
LIVE_WRITERS: dict[str, h5py.File] = {}


def _real(path: Path) -> str:
    return os.path.realpath(path)


def register_writer(path: Path, f: h5py.File | None) -> None:
    """Record (or with ``None`` forget) the writer's open file for readers in this process."""
    if f is None:
        LIVE_WRITERS.pop(_real(path), None)
    else:
        LIVE_WRITERS[_real(path)] = f


def superblock_dirty(path: Path) -> bool:
    """True when the superblock's status flags say a writer did not close the file (it crashed).

    Superblock versions 2 and 3 keep the flags in byte 11 (HDF5 file format specification,
    section II.A); our files have no user block, so the superblock is at offset 0.
    """
    with open(path, "rb") as fh:
        head = fh.read(12)
    return len(head) == 12 and head[:8] == _HDF5_SIGNATURE and head[8] >= 2 and head[11] != 0


@dataclass(frozen=True)
class FileCheck:
    """What the superblock says before HDF5 opens the file.

    ``size``: bytes on disk; ``needed``: the end-of-file address the superblock records (None for
    superblocks other than versions 2 and 3, which stores never have); ``dirty``: status flags set.
    """

    path: Path
    size: int
    needed: int | None
    dirty: bool
    short: bool = False  # cut inside the superblock itself

    @property
    def truncated(self) -> bool:
        return self.short or (self.needed is not None and self.size < self.needed)

    def describe(self) -> str:
        """One phrase: how much of the file is missing."""
        if self.short or self.needed is None:
            return f"truncated to {self.size:,} bytes, inside its HDF5 superblock"
        return (f"truncated: {self.size:,} of its {self.needed:,} bytes are on disk "
                f"({self.needed - self.size:,} missing from the end)")


def _superblock(path: Path) -> tuple[int, int | None, bool, str]:
    """``(size, needed, dirty, kind)`` read from the first bytes of the file (no HDF5 call).

    Superblock versions 2 and 3 (HDF5 file format specification, II.A): signature (8 bytes),
    version, size of offsets ``O``, size of lengths, status flags, then base address, superblock
    extension address, end-of-file address and root object header address (``O`` bytes each) and
    a checksum. ``needed`` is base + end of file. ``kind``: "foreign" (no HDF5 signature at 0),
    "short" (cut inside the superblock), "other" (another superblock version) or "ok".
    """
    with open(path, "rb") as fh:
        size = os.fstat(fh.fileno()).st_size
        head = fh.read(64)
    if not _HDF5_SIGNATURE.startswith(head[:8]):
        return size, None, False, "foreign"
    if len(head) < 12:
        return size, None, False, "short"
    version, width = head[8], head[9]
    if version not in (2, 3) or width not in (2, 4, 8):
        return size, None, False, "other"
    if len(head) < 12 + 4 * width + 4:
        return size, None, head[11] != 0, "short"
    base = int.from_bytes(head[12:12 + width], "little")
    eof = int.from_bytes(head[12 + 2 * width:12 + 3 * width], "little")
    return size, base + eof, head[11] != 0, "ok"


def check_file(path: str | os.PathLike[str], settle_s: float = 1.0) -> FileCheck:
    """Size and superblock of ``path``; raises :class:`SchemaError` when it is not an HDF5 file.

    A file a writer holds open can be shorter than its recorded end of file for an instant (HDF5
    records the end before it extends the file); such a file is re-read for up to ``settle_s``.
    A file cut inside its superblock gets ``needed=None`` and counts as truncated.
    """
    p = Path(path)
    deadline = time.monotonic() + settle_s
    while True:
        size, needed, dirty, kind = _superblock(p)
        if kind == "foreign":
            raise SchemaError(f"{p}: not an HDF5 file, so not an episode store; pass the path of a store "
                              f"EpisodeWriter created")
        check = FileCheck(p, size, needed, dirty, short=kind == "short")
        if not (check.truncated and dirty) or time.monotonic() > deadline:
            return check
        time.sleep(0.05)


@lru_cache(maxsize=1)
def _set_read_attempts() -> Callable[[int, int], int] | None:
    """``H5Pset_metadata_read_attempts`` of the HDF5 library h5py loaded (h5py does not wrap it)."""
    candidates: list[str] = []
    try:
        with open("/proc/self/maps") as maps:  # Linux: the library file h5py's extensions loaded
            found = {line.split()[-1] for line in maps if "/libhdf5" in line}
        candidates = sorted(name for name in found if not os.path.basename(name).startswith("libhdf5_hl"))
    except OSError:
        pass
    libs = Path(h5py.__file__).resolve().parent
    candidates += [str(p) for d in (libs.parent / "h5py.libs", libs / ".dylibs") if d.is_dir()
                   for p in sorted(d.glob("libhdf5*")) if not p.name.startswith("libhdf5_hl")]
    for name in candidates:
        try:
            fn = ctypes.CDLL(name).H5Pset_metadata_read_attempts
        except (OSError, AttributeError):
            continue
        fn.argtypes = [ctypes.c_int64, ctypes.c_uint]
        fn.restype = ctypes.c_int
        return fn
    logger.warning("cannot find H5Pset_metadata_read_attempts in the HDF5 library; a damaged store may make "
                   "HDF5 retry for a long time")
    return None


def open_read(path: Path) -> h5py.File:
    """Open ``path`` SWMR-read without a lock, with bounded metadata retries (no size check).

    HDF5 errors become :class:`SchemaError` (not HDF5, or not written in SWMR mode) or
    :class:`CorruptStoreError` (anything else: the file is damaged).
    """
    fapl = h5p.create(h5p.FILE_ACCESS)
    setter = _set_read_attempts()
    if setter is not None:
        setter(fapl.id, SWMR_READ_ATTEMPTS)
    try:
        fapl.set_file_locking(False, True)
    except AttributeError:  # h5py without file-locking control
        pass
    try:
        fid = h5f.open(os.fsencode(path), h5f.ACC_RDONLY | h5f.ACC_SWMR_READ, fapl=fapl)
    except OSError as exc:
        msg = str(exc)
        if "signature" in msg:
            raise SchemaError(f"{path}: not an HDF5 file, so not an episode store; pass the path of a store "
                              f"EpisodeWriter created") from None
        if "already open for write" in msg:
            raise SchemaError(f"{path}: open for writing by a process that did not use SWMR (or left by one "
                              f"that crashed); an episode store is only ever written in SWMR mode, so this "
                              f"is not one of ours. ({msg})") from None
        raise CorruptStoreError(f"{path}: HDF5 cannot open the file ({msg}); its HDF5 structures are "
                                f"damaged") from None
    return h5py.File(fid)


@contextmanager
def open_store(path: str | os.PathLike[str]) -> Iterator[h5py.File]:
    """Open a store for reading: SWMR read mode, no file lock, so it works while a writer appends.

    In the process that writes the file, this yields the writer's own handle instead. A file
    shorter than its superblock says raises :class:`CorruptStoreError` at once; so does an HDF5
    structure that cannot be read, here or while reading (never an endless SWMR retry).
    """
    p = Path(path)
    live = LIVE_WRITERS.get(_real(p))
    if live is not None:
        yield live
        return
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such episode store")
    check = check_file(p)
    if check.truncated:
        raise CorruptStoreError(f"{p}: the file is {check.describe()}")
    f = open_read(p)
    with f:
        try:
            yield f
        except (OSError, RuntimeError, KeyError) as exc:
            if isinstance(exc, (FileNotFoundError, StoreError)) or not _is_hdf5_error(exc):
                raise
            raise CorruptStoreError(f"{p}: HDF5 cannot read part of the file ({str(exc).strip(chr(39))}); its "
                                    f"HDF5 structures are damaged") from None


def _is_hdf5_error(exc: BaseException) -> bool:
    """Whether ``exc`` is h5py reporting an HDF5 failure (its messages start "Unable to" / "Can't")."""
    if not isinstance(exc, KeyError):
        return True
    text = str(exc).strip("'\"")
    return text.startswith(("Unable to", "Can't")) and "doesn't exist" not in text


def ranges_index(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Concatenated ``arange(s, s + c)`` for every pair, without a Python loop."""
    counts = np.asarray(counts, dtype=np.int64)
    total = int(counts.sum())
    if total == 0:
        return np.zeros(0, dtype=np.int64)
    base = np.asarray(starts, dtype=np.int64) - (np.cumsum(counts) - counts)
    return np.repeat(base, counts) + np.arange(total, dtype=np.int64)


@dataclass(frozen=True)
class Gathered:
    """Rows of one table for some committed episodes, episode after episode.

    ``index`` are their row numbers, ``owner[i]`` the episode (position in the request) of row
    ``i``, and episode ``j`` owns ``rows[first[j]:first[j] + counts[j]]``. ``bad`` maps the view
    position of each episode whose block fails its checks to the reason (always empty in a strict
    view, which raises instead).
    """

    index: np.ndarray
    rows: np.ndarray
    owner: np.ndarray
    first: np.ndarray
    counts: np.ndarray
    bad: dict[int, str] = dc_field(default_factory=dict)


_SEALS = {TURNS.name: "turns_crc", SIMS.name: "sims_crc", METRICS.name: "metrics_crc"}


def _short(items: list[str], limit: int = 5) -> str:
    shown = ", ".join(items[:limit])
    return shown + (f" and {len(items) - limit} more" if len(items) > limit else "")


class StoreView:
    """Committed episodes of an open store file, and bulk reads of their rows, checked.

    ``strict`` (default): damage raises :class:`CorruptStoreError`. Otherwise damaged episode
    records are left out of the view and listed in ``damaged`` (``record N`` -> reason), and the
    block readers report damaged episodes in ``Gathered.bad`` / ``bad_basins`` / ``bad_keys``.
    """

    def __init__(self, f: h5py.File, path: str | os.PathLike[str], *, strict: bool = True):
        self.f = f
        self.path = Path(path)
        self.strict = strict
        check_schema(f, self.path)
        self._refresh = f.mode == "r"
        self._datasets: dict[str, h5py.Dataset] = {}
        self.bad_basins: dict[int, str] = {}
        self.bad_keys: dict[int, str] = {}
        rows = self.dataset("episodes/rows")[()]
        text_ds = self.dataset("episodes/text")
        sizes = {t.name: int(self.dataset(f"{t.name}/rows").shape[0])
                 for t in (TURNS, SIMS, METRICS, BASINS, METRIC_KEYS)}
        text_len = int(text_ds.shape[0])
        all_text = np.asarray(text_ds[()]).tobytes() if text_len else b""
        in_text = text_bounds_ok(EPISODES, rows, text_len)
        if len(rows):
            sealed = row_checksums(EPISODES, rows, all_text, 0, np.arange(len(rows))) == rows["crc"]
        else:
            sealed = np.zeros(0, bool)
        in_tables = np.ones(len(rows), dtype=bool)
        for name, table in (("turn", TURNS), ("sim", SIMS), ("metric", METRICS)):
            s, c = rows[f"{name}_start"], rows[f"{name}_count"]
            in_tables &= (s >= 0) & (c >= 0) & (s + c <= sizes[table.name])
        in_tables &= (rows["basin_key"] >= 0) & (rows["basin_key"] < sizes["basins"])
        in_tables &= (rows["keys_end"] >= 0) & (rows["keys_end"] <= sizes["metric_keys"])
        ok = sealed & in_text & in_tables
        blank = is_blank(rows)
        self.damaged: dict[str, str] = {}
        for r in np.flatnonzero(~ok & ~blank).tolist():
            why = ("its record fails its checksum" if not sealed[r] else
                   "its record points outside the tables")
            label = f"record {r}"
            if in_text[r]:
                claimed = decode_rows(EPISODES, rows[r:r + 1], all_text, 0, names=["episode_id"])["episode_id"][0]
                label += f" (id {claimed!r}, unverified)"
            self.damaged[label] = why
        numbers = np.flatnonzero(ok)
        rows = rows[numbers]
        cols = decode_rows(EPISODES, rows, all_text, 0)
        seen: dict[str, int] = {}
        keep = []
        for i, eid in enumerate(cols["episode_id"]):
            if eid in seen:
                logger.warning("%s: episode %r is committed twice (rows %d and %d); reading the first",
                               self.path, eid, numbers[seen[eid]], numbers[i])
                continue
            seen[eid] = i
            keep.append(i)
        if len(keep) < len(rows):
            keep_a = np.asarray(keep, dtype=np.int64)
            rows, numbers = rows[keep_a], numbers[keep_a]
            cols = decode_rows(EPISODES, rows, all_text, 0)
        self.rows = rows
        self.numbers = numbers
        self.cols = cols
        self.ids: list[str] = cols["episode_id"]
        self.index = {eid: i for i, eid in enumerate(self.ids)}
        self.invalid_rows = int((~ok).sum())
        self.uncommitted_rows = int((~ok & blank).sum())
        self.sizes = sizes
        if self.damaged and strict:
            first = next(iter(self.damaged))
            raise CorruptStoreError(
                f"{self.path}: {len(self.damaged)} episode record(s) are damaged ({first}: {self.damaged[first]})",
                damaged=tuple(self.damaged))

    def __len__(self) -> int:
        return len(self.ids)

    def dataset(self, name: str) -> h5py.Dataset:
        """The dataset ``name``, refreshed once (SWMR readers see the writer's latest flush)."""
        ds = self._datasets.get(name)
        if ds is None:
            ds = self.f[name]
            if self._refresh:
                ds.refresh()
            self._datasets[name] = ds
        return ds

    def _fail(self, what: str, bad: dict[int, str]) -> CorruptStoreError:
        """The error for damaged episodes at view positions ``bad`` (position -> reason)."""
        names = [f"{self.ids[p]!r} ({why})" for p, why in sorted(bad.items())]
        return CorruptStoreError(f"{self.path}: {len(bad)} committed episode(s) have damaged {what}: {_short(names)}",
                                 damaged=tuple(self.ids[p] for p in sorted(bad)))

    def _text_span(self, table: Table, rows: np.ndarray) -> tuple[bytes, int]:
        """The bytes of ``table``'s text covering every string of ``rows``, and their first offset."""
        lo, hi = text_span(table, rows)
        if hi <= lo:
            return b"", 0
        ds = self.dataset(f"{table.name}/text")
        if lo < 0 or hi > ds.shape[0]:
            raise CorruptStoreError(f"{self.path}: {table.name} rows of committed episodes point outside "
                                    f"{table.name}/text; the file is damaged.")
        return np.asarray(ds[lo:hi]).tobytes(), lo

    def decode(self, table: Table, rows: np.ndarray, names: list[str] | None = None) -> Decoded:
        """Decode ``rows`` of ``table`` (reading only the text they use)."""
        text, base = self._text_span(table, rows)
        return decode_rows(table, rows, text, base, names)

    def gather(self, table: Table, field: str, positions: np.ndarray | list[int] | None = None) -> Gathered:
        """The ``table`` rows (turns, sims or metrics) of the committed episodes at ``positions``
        (default: all), episode after episode, never an orphan row.

        Each episode's block (rows and strings) must match its seal in the episode record, and
        each row's back-reference its episode; otherwise :class:`CorruptStoreError` (strict view)
        or an entry in ``Gathered.bad``.
        """
        ep = self.rows if positions is None else self.rows[np.asarray(positions, dtype=np.int64)]
        pos = np.arange(len(self.rows)) if positions is None else np.asarray(positions, dtype=np.int64)
        starts, counts = ep[f"{field}_start"].astype(np.int64), ep[f"{field}_count"].astype(np.int64)
        idx = ranges_index(starts, counts)
        owner = np.repeat(np.arange(len(ep), dtype=np.int64), counts)
        if len(idx):
            lo, hi = int(idx.min()), int(idx.max()) + 1
            rows = self.dataset(f"{table.name}/rows")[lo:hi]
            if len(idx) < hi - lo:  # orphan rows in between (idx is increasing)
                rows = rows[idx - lo]
        else:
            rows = np.zeros(0, dtype=table.dtype)
        first = np.cumsum(counts) - counts
        bad = self._check_blocks(table, ep, pos, rows, owner, first, counts)
        if bad and self.strict:
            raise self._fail(f"{table.name} rows", bad)
        return Gathered(idx, rows, owner, first, counts, bad)

    def _check_blocks(self, table: Table, ep: np.ndarray, pos: np.ndarray, rows: np.ndarray, owner: np.ndarray,
                      first: np.ndarray, counts: np.ndarray) -> dict[int, str]:
        """View position -> reason, for each requested episode whose block fails its checks."""
        bad: dict[int, str] = {}
        if table is METRICS:
            local = rows["sim_row"] - ep["sim_start"][owner]
            wrong = (local < 0) | (local >= ep["sim_count"][owner])
            same = owner[1:] == owner[:-1]
            wrong[1:] |= same & (np.diff(local) < 0)  # grouped by simulation within an episode
        else:
            wrong = rows["episode_row"] != self.numbers[pos[owner]]
        text_ds = self.dataset(f"{table.name}/text")
        n_text = int(text_ds.shape[0])
        spans = []
        for j in range(len(ep)):
            block = rows[int(first[j]):int(first[j] + counts[j])]
            spans.append(text_span(table, block))
        live = [sp for sp in spans if sp[1] > sp[0] and sp[0] >= 0 and sp[1] <= n_text]
        t_lo = min((sp[0] for sp in live), default=0)
        t_hi = max((sp[1] for sp in live), default=0)
        text = np.asarray(text_ds[t_lo:t_hi]).tobytes() if t_hi > t_lo else b""
        seals = ep[_SEALS[table.name]].tolist()
        wrong_by = np.zeros(len(ep), dtype=bool)
        if wrong.any():
            wrong_by[np.unique(owner[wrong])] = True
        for j in range(len(ep)):
            lo, hi = spans[j]
            block = rows[int(first[j]):int(first[j] + counts[j])]
            if hi > lo and (lo < 0 or hi > n_text):
                bad[int(pos[j])] = f"its {table.name} rows point outside {table.name}/text"
            elif block_checksum(block, text[lo - t_lo:hi - t_lo] if hi > lo else b"") != seals[j]:
                bad[int(pos[j])] = f"its {table.name} rows fail their checksum"
            elif wrong_by[j]:
                bad[int(pos[j])] = f"its {table.name} rows belong to another episode"
        return bad

    def metric_names(self) -> list[str | None]:
        """Name of each metric key row below the last commit's ``keys_end``; each row is checked
        against its CRC (a damaged one raises in a strict view, else is None and in ``bad_keys``)."""
        end = int(self.rows["keys_end"].max()) if len(self.rows) else 0
        rows = self.dataset("metric_keys/rows")[:end]
        text = np.asarray(self.dataset("metric_keys/text")[()]).tobytes()
        sealed = row_checksums(METRIC_KEYS, rows, text, 0, np.arange(len(rows))) == rows["crc"]
        out: list[str | None] = []
        for k, (off, n) in enumerate(zip(rows["name.off"].tolist(), rows["name.len"].tolist())):
            name: str | None = None
            if sealed[k] and 0 <= n and 0 <= off and off + n <= len(text):
                try:
                    name = text[off:off + n].decode(*ENCODING)
                except UnicodeDecodeError:
                    name = None
            if name is None:
                self.bad_keys[k] = "fails its checksum"
            out.append(name)
        if self.bad_keys and self.strict:
            raise CorruptStoreError(f"{self.path}: metric_keys rows {_short([str(k) for k in self.bad_keys])} are "
                                    f"damaged, so the metric names of the episodes using them are unknown",
                                    damaged=tuple(f"metric key {k}" for k in self.bad_keys))
        return out

    def basins(self, keys: np.ndarray) -> dict[int, tuple[dict[str, Any], tuple[Any, Any, Any]]]:
        """For each basin key: its decoded row (Python values) and ``(times, observed, warmup)``.

        The row must match its CRC and the series its digest; a damaged basin raises in a strict
        view, else is left out and listed in ``bad_basins``.
        """
        keys = np.unique(np.asarray(keys, dtype=np.int64))
        if len(keys) == 0:
            return {}
        rows = self.dataset("basins/rows")[()][keys]
        text_ds = self.dataset("basins/text")
        text = np.asarray(text_ds[()]).tobytes()
        sealed = (row_checksums(BASINS, rows, text, 0, keys) == rows["crc"]) & text_bounds_ok(BASINS, rows, len(text))
        out = {}
        for j, key in enumerate(keys.tolist()):
            if not sealed[j]:
                self.bad_basins[key] = "its basin record fails its checksum"
                continue
            cols = decode_rows(BASINS, rows[j:j + 1], text, 0)
            row = {c.name: cols.optional(c.name)[0] for c in BASINS.columns}
            try:
                raw = (self._series("times", row["times_start"], row["times_len"]),
                       self._series("observed", row["observed_start"], row["observed_len"]),
                       self._series("warmup", row["warmup_start"], row["warmup_len"]))
            except CorruptStoreError as exc:
                self.bad_basins[key] = str(exc).split(": ", 1)[-1]
                continue
            if basin_digest(row["basin_id"], row["info"], row["times_unit"], raw) != row["digest"]:
                self.bad_basins[key] = "its basin series (times, observed, warm-up) fail their digest"
                continue
            times, observed, warmup = raw
            if times is not None:
                unit = np.dtype(row["times_unit"])
                times = times.view(unit) if unit.kind == "M" else times.astype(unit)
            out[key] = (row, (times, observed, None if warmup is None else warmup.astype(bool)))
        if self.bad_basins and self.strict:
            users = [p for p, k in enumerate(self.rows["basin_key"].tolist()) if k in self.bad_basins]
            raise self._fail("basin series", {p: self.bad_basins[int(self.rows["basin_key"][p])] for p in users})
        return out

    def _series(self, name: str, start: int, length: int | None) -> np.ndarray | None:
        if length is None:
            return None
        ds = self.dataset(f"series/{name}")
        if start < 0 or length < 0 or start + length > ds.shape[0]:
            raise CorruptStoreError(f"{self.path}: series/{name}[{start}:{start + length}] is outside the "
                                    f"dataset ({ds.shape[0]} values); the file is damaged.")
        return np.array(ds[start:start + length])

    def episodes(self, positions: list[int] | None = None, batch_size: int = 32
                 ) -> Iterator[tuple[Episode, str | None]]:
        """Rebuild committed episodes (all, or those at ``positions``) with their Basin JSON, in batches."""
        positions = list(range(len(self))) if positions is None else list(positions)
        strict, self.strict = self.strict, False
        try:  # a damaged name matters only to the episodes that use one: each batch is checked below
            names = self.metric_names()
        finally:
            self.strict = strict
        basin_cache: dict[int, tuple[dict[str, Any], tuple[Any, Any, Any]]] = {}
        ep_lists = {c.name: self.cols.optional(c.name) for c in EPISODES.columns}
        for b in range(0, len(positions), batch_size):
            batch = np.asarray(positions[b:b + batch_size], dtype=np.int64)
            need = [k for k in np.unique(self.rows["basin_key"][batch]).tolist() if k not in basin_cache]
            basin_cache.update(self.basins(np.asarray(need, dtype=np.int64)))
            turns, sims, metrics = (self.gather(TURNS, "turn", batch), self.gather(SIMS, "sim", batch),
                                    self.gather(METRICS, "metric", batch))
            t_lists, s_lists, m_lists = (_lists(self.decode(t, g.rows), t)
                                         for t, g in ((TURNS, turns), (SIMS, sims), (METRICS, metrics)))
            discharge = self._discharge(sims, s_lists, batch)
            m_local = (metrics.rows["sim_row"] - self.rows["sim_start"][batch][metrics.owner]).astype(np.int64)
            bad_keys = [k for k in np.unique(metrics.rows["key"]).tolist()
                        if not 0 <= k < len(names) or names[k] is None]
            if bad_keys:
                raise CorruptStoreError(f"{self.path}: metrics use unreadable metric names {bad_keys[:5]}; "
                                        f"the file is damaged.")
            for j, i in enumerate(batch.tolist()):
                ep = {name: ep_lists[name][i] for name in ep_lists}
                t0, s0, m0 = int(turns.first[j]), int(sims.first[j]), int(metrics.first[j])
                n_sims = int(sims.counts[j])
                bounds = np.searchsorted(m_local[m0:m0 + int(metrics.counts[j])], np.arange(n_sims + 1)) + m0
                sim_metrics = [decode_metrics(m_lists, int(bounds[k]), int(bounds[k + 1]), names)
                               for k in range(n_sims)]
                records = build_sims(s_lists, s0, s0 + n_sims, sim_metrics, discharge)
                info, series = basin_cache[int(self.rows["basin_key"][i])]
                yield (build_episode(ep, build_turns(t_lists, t0, t0 + int(turns.counts[j])), records, series),
                       info["info"])

    def check_discharge(self, sims: Gathered, positions: np.ndarray) -> tuple[np.ndarray, int, dict[int, str]]:
        """Read the discharge of the gathered simulations (episodes at ``positions``) in one go and
        check each episode's span against its ``discharge_crc``: ``(values, first index, bad)``."""
        live = sims.rows["discharge_len"] >= 0
        if SIMS.nullable:
            live &= (sims.rows["nulls"] & np.uint32(1 << SIMS.nullable.index("discharge_len"))) == 0
        start, length = sims.rows["discharge_start"][live], sims.rows["discharge_len"][live]
        ds = self.dataset("series/discharge")
        n = int(ds.shape[0])
        lo = int(start.min()) if len(start) else 0
        hi = int((start + length).max()) if len(start) else 0
        bad: dict[int, str] = {}
        if len(start) and (lo < 0 or hi > n):
            lo, hi = max(lo, 0), min(hi, n)
        q = np.array(ds[lo:hi]) if hi > lo else np.zeros(0, np.float32)
        seals = self.rows["discharge_crc"][positions].tolist()
        owner = sims.owner[live]
        for j, p in enumerate(positions.tolist()):
            mine = owner == j
            if not mine.any():
                span = q[0:0]
            else:
                s0, s1 = int(start[mine].min()), int((start[mine] + length[mine]).max())
                if s0 < lo or s1 > hi or s0 < 0:
                    bad[int(p)] = "its simulations point outside series/discharge"
                    continue
                span = q[s0 - lo:s1 - lo]
            if series_checksum(span) != seals[j]:
                bad[int(p)] = "its discharge fails its checksum"
        if bad and self.strict:
            raise self._fail("discharge", bad)
        return q, lo, bad

    def _discharge(self, sims: Gathered, lists: dict[str, list[Any]], positions: np.ndarray
                   ) -> Callable[[int], np.ndarray | None]:
        """``f(i)``: the discharge of gathered simulation ``i`` (one checked read for the whole batch)."""
        q, lo, _ = self.check_discharge(sims, positions)

        def discharge(i: int) -> np.ndarray | None:
            n = lists["discharge_len"][i]
            if n is None:
                return None
            s = lists["discharge_start"][i] - lo
            return np.array(q[s:s + n])

        return discharge


def _lists(cols: Decoded, table: Table) -> dict[str, list[Any]]:
    return {c.name: cols.optional(c.name) for c in table.columns}
