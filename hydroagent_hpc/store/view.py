"""A read view of a store file: which episodes are committed, and reading their rows in bulk.

An episode is *committed* when its record in ``episodes/rows`` has a matching CRC-32, its
strings lie inside ``episodes/text`` and its row ranges lie inside the other tables. Every other
row (left by a writer killed mid-episode, or by a write that raised) is an orphan and invisible.
The view reads ``episodes`` first and the other datasets after, so a committed episode's rows
are always there even while a SWMR writer appends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import h5py
import numpy as np

from hydroagent_hpc.store.codec import ENCODING, Decoded, decode_rows, row_checksums, text_bounds_ok
from hydroagent_hpc.store.errors import CorruptStoreError, SchemaError
from hydroagent_hpc.store.rows import build_episode, build_sims, build_turns, decode_metrics
from hydroagent_hpc.store.schema import BASINS, EPISODES, METRIC_KEYS, METRICS, SIMS, TURNS, Table, check_schema
from hydroagent_hpc.types import Episode

__all__ = ["open_store", "superblock_dirty", "StoreView", "Gathered", "ranges_index", "LIVE_WRITERS",
           "register_writer"]

logger = logging.getLogger(__name__)

_HDF5_SIGNATURE = b"\x89HDF\r\n\x1a\n"


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


@contextmanager
def open_store(path: str | os.PathLike[str]) -> Iterator[h5py.File]:
    """Open a store for reading: SWMR read mode, no file lock, so it works while a writer appends.

    In the process that writes the file, this yields the writer's own handle instead.
    """
    p = Path(path)
    live = LIVE_WRITERS.get(_real(p))
    if live is not None:
        yield live
        return
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such episode store")
    try:
        f = h5py.File(p, "r", swmr=True, locking=False)
    except OSError as exc:
        msg = str(exc)
        if "signature" in msg:
            raise SchemaError(f"{p}: not an HDF5 file, so not an episode store; pass the path of a store "
                              f"EpisodeWriter created") from None
        if "already open for write" in msg:
            raise SchemaError(f"{p}: open for writing by a process that did not use SWMR (or left by one "
                              f"that crashed); an episode store is only ever written in SWMR mode, so this "
                              f"is not one of ours. ({msg})") from None
        raise
    with f:
        yield f


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
    ``i``, and episode ``j`` owns ``rows[first[j]:first[j] + counts[j]]``.
    """

    index: np.ndarray
    rows: np.ndarray
    owner: np.ndarray
    first: np.ndarray
    counts: np.ndarray


class StoreView:
    """Committed episodes of an open store file, and bulk reads of their rows."""

    def __init__(self, f: h5py.File, path: str | os.PathLike[str]):
        self.f = f
        self.path = Path(path)
        check_schema(f, self.path)
        self._refresh = f.mode == "r"
        self._datasets: dict[str, h5py.Dataset] = {}
        rows = self.dataset("episodes/rows")[()]
        text_ds = self.dataset("episodes/text")
        sizes = {t.name: self.dataset(f"{t.name}/rows").shape[0] for t in (TURNS, SIMS, METRICS, BASINS, METRIC_KEYS)}
        ok = (row_checksums(rows) == rows["crc"]) if len(rows) else np.zeros(0, bool)
        ok &= text_bounds_ok(EPISODES, rows, text_ds.shape[0])
        for name, table in (("turn", TURNS), ("sim", SIMS), ("metric", METRICS)):
            s, c = rows[f"{name}_start"], rows[f"{name}_count"]
            ok &= (s >= 0) & (c >= 0) & (s + c <= sizes[table.name])
        ok &= (rows["basin_key"] >= 0) & (rows["basin_key"] < sizes["basins"])
        ok &= (rows["keys_end"] >= 0) & (rows["keys_end"] <= sizes["metric_keys"])
        numbers = np.flatnonzero(ok)
        rows = rows[numbers]
        text, base = self._text_span(EPISODES, rows)
        cols = decode_rows(EPISODES, rows, text, base)
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
            cols = decode_rows(EPISODES, rows, text, base)
        self.rows = rows
        self.numbers = numbers
        self.cols = cols
        self.ids: list[str] = cols["episode_id"]
        self.index = {eid: i for i, eid in enumerate(self.ids)}
        self.invalid_rows = int(len(ok) - ok.sum())
        self.sizes = sizes

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

    def _text_span(self, table: Table, rows: np.ndarray) -> tuple[bytes, int]:
        """The bytes of ``table``'s text covering every string of ``rows``, and their first offset."""
        lo, hi = None, 0
        for c in table.columns:
            if c.is_text and len(rows):
                n = rows[f"{c.name}.len"]
                live = n >= 0
                if live.any():
                    off = rows[f"{c.name}.off"][live]
                    lo = int(off.min()) if lo is None else min(lo, int(off.min()))
                    hi = max(hi, int((off + n[live]).max()))
        if lo is None or hi <= lo:
            return b"", 0
        ds = self.dataset(f"{table.name}/text")
        if lo < 0 or hi > ds.shape[0]:
            raise CorruptStoreError(f"{self.path}: {table.name} rows of committed episodes point outside "
                                    f"{table.name}/text; the file is damaged.")
        return ds[lo:hi].tobytes(), lo

    def decode(self, table: Table, rows: np.ndarray, names: list[str] | None = None) -> Decoded:
        """Decode ``rows`` of ``table`` (reading only the text they use)."""
        text, base = self._text_span(table, rows)
        return decode_rows(table, rows, text, base, names)

    def gather(self, table: Table, field: str, positions: np.ndarray | None = None) -> Gathered:
        """The ``table`` rows (turns, sims or metrics) of the committed episodes at ``positions``
        (default: all), episode after episode, never an orphan row.

        Raises :class:`CorruptStoreError` when a row's back-reference disagrees with its episode.
        """
        ep = self.rows if positions is None else self.rows[positions]
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
        if table is METRICS:
            local = rows["sim_row"] - ep["sim_start"][owner]
            bad = (local < 0) | (local >= ep["sim_count"][owner])
            same = owner[1:] == owner[:-1]
            bad[1:] |= same & (np.diff(local) < 0)  # grouped by simulation within an episode
        else:
            bad = rows["episode_row"] != self.numbers[pos[owner]]
        if bad.any():
            who = self.ids[int(pos[owner[np.argmax(bad)]])]
            raise CorruptStoreError(f"{self.path}: committed episode {who!r} points at {table.name} rows that "
                                    f"belong to another episode; the file is damaged. Rebuild it from the "
                                    f"shards or rerun the campaign into a new file.")
        return Gathered(idx, rows, owner, np.cumsum(counts) - counts, counts)

    def metric_names(self) -> list[str | None]:
        """Name of each metric key row below the last commit's ``keys_end`` (None if unreadable)."""
        end = int(self.rows["keys_end"].max()) if len(self.rows) else 0
        rows = self.dataset("metric_keys/rows")[:end]
        text = self.dataset("metric_keys/text")[()].tobytes()
        out: list[str | None] = []
        for off, n in zip(rows["name.off"].tolist(), rows["name.len"].tolist()):
            try:
                out.append(None if n < 0 or off < 0 or off + n > len(text) else text[off:off + n].decode(*ENCODING))
            except UnicodeDecodeError:
                out.append(None)
        return out

    def basins(self, keys: np.ndarray) -> dict[int, tuple[dict[str, Any], tuple[Any, Any, Any]]]:
        """For each basin key: its decoded row (Python values) and ``(times, observed, warmup)``."""
        keys = np.unique(np.asarray(keys, dtype=np.int64))
        if len(keys) == 0:
            return {}
        rows = self.dataset("basins/rows")[()][keys]
        cols = self.decode(BASINS, rows)
        lists = {c.name: cols.optional(c.name) for c in BASINS.columns}
        out = {}
        for j, key in enumerate(keys.tolist()):
            row = {name: lists[name][j] for name in lists}
            times = self._series("times", row["times_start"], row["times_len"])
            if times is not None:
                unit = np.dtype(row["times_unit"])
                times = times.view(unit) if unit.kind == "M" else times.astype(unit)
            observed = self._series("observed", row["observed_start"], row["observed_len"])
            warmup = self._series("warmup", row["warmup_start"], row["warmup_len"])
            out[key] = (row, (times, observed, None if warmup is None else warmup.astype(bool)))
        return out

    def _series(self, name: str, start: int, length: int | None) -> np.ndarray | None:
        if length is None:
            return None
        ds = self.dataset(f"series/{name}")
        if start < 0 or start + length > ds.shape[0]:
            raise CorruptStoreError(f"{self.path}: series/{name}[{start}:{start + length}] is outside the "
                                    f"dataset ({ds.shape[0]} values); the file is damaged.")
        return np.array(ds[start:start + length])

    def episodes(self, positions: list[int] | None = None, batch_size: int = 32
                 ) -> Iterator[tuple[Episode, str | None]]:
        """Rebuild committed episodes (all, or those at ``positions``) with their Basin JSON, in batches."""
        positions = list(range(len(self))) if positions is None else list(positions)
        names = self.metric_names()
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
            discharge = self._discharge(sims, s_lists)
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

    def _discharge(self, sims: Gathered, lists: dict[str, list[Any]]) -> Callable[[int], np.ndarray | None]:
        """``f(i)``: the discharge of gathered simulation ``i`` (one read for the whole batch)."""
        live = np.asarray([n is not None for n in lists["discharge_len"]], dtype=bool)
        start, length = sims.rows["discharge_start"][live], sims.rows["discharge_len"][live]
        lo = int(start.min()) if len(start) else 0
        hi = int((start + length).max()) if len(start) else 0
        q = np.array(self.dataset("series/discharge")[lo:hi]) if hi > lo else np.zeros(0, np.float32)
        if len(start) and (lo < 0 or hi > lo + len(q)):
            raise CorruptStoreError(f"{self.path}: simulations point outside series/discharge; the file is damaged.")

        def discharge(i: int) -> np.ndarray | None:
            n = lists["discharge_len"][i]
            if n is None:
                return None
            s = lists["discharge_start"][i] - lo
            return q[s:s + n].copy()

        return discharge


def _lists(cols: Decoded, table: Table) -> dict[str, list[Any]]:
    return {c.name: cols.optional(c.name) for c in table.columns}
