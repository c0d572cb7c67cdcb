"""``merge``: combine shard stores (one per MPI rank or array task) into one, each episode once;
``salvage``: copy the intact episodes of a damaged store into a new one.

The ids are checked before anything is written; the result is built under a temporary name
and renamed into place, so ``dest`` either holds every episode or does not exist, and a killed
merge is simply run again.
"""

from __future__ import annotations

import logging
import os
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import TypeVar

import h5py

from hydroagent_hpc.store.errors import CorruptStoreError, MergeError, StoreError
from hydroagent_hpc.store.frames import stored_ids
from hydroagent_hpc.store.verify import StoreHealth, explain, verify_store
from hydroagent_hpc.store.view import StoreView, open_read, open_store
from hydroagent_hpc.store.writer import (
    Appender,
    WriterLock,
    install_file,
    new_store_file,
    remove_stale_temps,
    temp_name,
)

__all__ = ["merge", "salvage"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _copy_committed(sources: list[Path], dest: h5py.File, dest_path: Path) -> int:
    """Append every committed episode of ``sources`` (in order, first copy of an id) to ``dest``."""
    app = Appender(dest, dest_path)
    n = 0
    for src in sources:
        try:
            with open_store(src) as f:
                for episode, info in StoreView(f, src).episodes():
                    if episode.episode_id in app.ids:
                        continue
                    app.append(episode, info)
                    n += 1
        except CorruptStoreError as exc:
            raise explain(exc, src) from None
    return n


def _listing(ids: Sequence[str], limit: int = 10) -> str:
    shown = ", ".join(repr(i) for i in list(ids)[:limit])
    return shown + (f" and {len(ids) - limit} more" if len(ids) > limit else "")


def merge(sources: Iterable[str | os.PathLike[str]], dest: str | os.PathLike[str], *,
          expected: Iterable[str] | None = None, allow_duplicates: bool = False,
          overwrite: bool = False) -> int:
    """Copy the committed episodes of ``sources`` into a new store ``dest``; return how many.

    Every episode must be present exactly once across the sources: an id in two sources (or
    twice) raises :class:`MergeError` unless ``allow_duplicates`` (then the first source wins).
    With ``expected``, an expected id that no source holds, or a stored id that is not
    expected, also raises. Nothing is written when a check fails.
    """
    srcs = [Path(s) for s in sources]
    out = Path(dest)
    if any(s.resolve() == out.resolve() for s in srcs if out.exists()):
        raise MergeError(f"{out}: merge destination is also a source")
    if out.exists() and not overwrite:
        raise MergeError(f"{out}: exists; merge into a new path or pass overwrite=True")
    per_source = {s: stored_ids(s) for s in srcs}
    where: dict[str, list[Path]] = {}
    for s, ids in per_source.items():
        for eid in ids:
            where.setdefault(eid, []).append(s)
    dups = sorted(eid for eid, places in where.items() if len(places) > 1)
    problems = []
    if dups and not allow_duplicates:
        first = dups[0]
        counts = Counter(str(p) for p in where[first])
        problems.append(f"{len(dups)} episodes are stored more than once ({_listing(dups)}; {first!r} in "
                        f"{dict(counts)}); pass allow_duplicates=True to keep the first copy")
    if expected is not None:
        want = list(expected)
        missing = [eid for eid in want if eid not in where]
        wanted = set(want)
        extra = [eid for eid in where if eid not in wanted]
        if missing:
            problems.append(f"{len(missing)} expected episodes are in no shard ({_listing(missing)}); rerun "
                            f"the campaign to complete them")
        if extra:
            problems.append(f"{len(extra)} stored episodes were not expected ({_listing(extra)})")
    if problems:
        raise MergeError(f"merge into {out} of {len(srcs)} shards: " + "; ".join(problems))
    t0 = time.perf_counter()
    n = _build_atomically(out, lambda f, tmp: _copy_committed(srcs, f, tmp))
    logger.info("merged %d episodes from %d shards into %s in %.2f s", n, len(srcs), out, time.perf_counter() - t0)
    return n


def _build_atomically(out: Path, fill: Callable[[h5py.File, Path], _T]) -> _T:
    """Build the store ``out`` with ``fill(file, temporary path)`` under a temporary name and rename it
    into place, holding ``out``'s writer lock: ``out`` is complete or absent, never half written."""
    lock = WriterLock(out)
    try:
        remove_stale_temps(out)
        tmp = temp_name(out, "merge")
        try:
            with new_store_file(tmp) as f:
                result = fill(f, tmp)
            install_file(tmp, out)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
    finally:
        lock.release()
    return result


def salvage(source: str | os.PathLike[str], dest: str | os.PathLike[str], *, overwrite: bool = False) -> StoreHealth:
    """Copy the intact committed episodes of ``source`` (damaged or not) into a new store ``dest``.

    Returns the health of ``source``; ``dest`` is built under a temporary name and renamed into
    place (complete or absent). Raises :class:`StoreError` when nothing of ``source`` can be read.
    """
    src, out = Path(source), Path(dest)
    if out.exists() and not overwrite:
        raise StoreError(f"{out}: exists; salvage into a new path (or pass overwrite=True)")
    if out.exists() and out.resolve() == src.resolve():
        raise StoreError(f"{out}: salvage destination is the damaged store itself; give a new path")
    health = verify_store(src)
    if not health.intact:
        raise StoreError(f"{health.summary()}; nothing to salvage")
    keep = set(health.intact)
    t0 = time.perf_counter()

    def copy_intact(g: h5py.File, tmp: Path) -> None:
        with open_read(src) as f:
            v = StoreView(f, src, strict=False)
            app = Appender(g, tmp)
            positions = [i for i, eid in enumerate(v.ids) if eid in keep]
            v.strict = True  # the kept episodes checked out; any change since is an error
            for episode, info in v.episodes(positions):
                app.append(episode, info)

    _build_atomically(out, copy_intact)
    logger.info("salvaged %d of %d episodes from %s into %s in %.2f s", len(keep), len(keep) + len(health.damaged),
                src, out, time.perf_counter() - t0)
    return health
