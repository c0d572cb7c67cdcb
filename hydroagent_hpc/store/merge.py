"""``merge``: combine shard stores (one per MPI rank or array task) into one, each episode once;
``salvage``: copy the intact episodes of a damaged store into a new one.

Every source is verified first (:func:`~hydroagent_hpc.store.verify.check_stores`): only an intact
copy of an episode counts, a damaged copy is left behind when another source holds the episode
intact, and an episode stored only damaged stops the merge (it is named). The ids are checked
before anything is written; the result is built under a temporary name and renamed into place,
so ``dest`` either holds every episode or does not exist, and a killed merge is simply run again.
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
from hydroagent_hpc.store.verify import Holdings, StoreHealth, check_stores, explain, salvage_fix, verify_store
from hydroagent_hpc.store.view import StoreView, open_read, open_store
from hydroagent_hpc.store.writer import (
    Appender,
    WriterLock,
    install_file,
    new_store_file,
    remove_stale_temps,
    temp_name,
)

__all__ = ["merge", "merge_held", "salvage"]

logger = logging.getLogger(__name__)
_T = TypeVar("_T")


def _copy_taken(take: dict[str, Path], sources: list[Path], dest: h5py.File, dest_path: Path) -> int:
    """Append to ``dest`` each episode ``take`` assigns to a source, source after source in order, each
    source's episodes in commit order. They checked out; they are checked again while read (strict)."""
    app = Appender(dest, dest_path)
    n = 0
    for src in sources:
        if src not in take.values():
            continue
        try:
            with open_store(src) as f:
                v = StoreView(f, src, strict=False)
                positions = [i for i, eid in enumerate(v.ids) if take.get(eid) == src and eid not in app.ids]
                v.strict = True  # any change since the check is an error
                for episode, info in v.episodes(positions):
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
          overwrite: bool = False, skip_damaged: bool = False) -> int:
    """Copy the intact committed episodes of ``sources`` into a new store ``dest``; return how many.

    Every episode must be present exactly once across the sources: an id intact in two sources (or
    twice) raises :class:`MergeError` unless ``allow_duplicates`` (then the first source wins).
    With ``expected``, an expected id that no source holds intact, or a stored id that is not
    expected, also raises. Only intact copies count: a damaged copy (any part failing its
    checksum) is left behind when another source holds the episode intact; an episode stored only
    damaged, or damage no episode can be named for (a damaged record, when ``expected`` does not
    settle what must be there), raises :class:`MergeError` naming it, unless ``skip_damaged`` (left
    out with a warning). Nothing is written when a check fails.
    """
    srcs = [Path(s) for s in sources]
    out = Path(dest)
    if any(s.resolve() == out.resolve() for s in srcs if out.exists()):
        raise MergeError(f"{out}: merge destination is also a source")
    if out.exists() and not overwrite:
        raise MergeError(f"{out}: exists; merge into a new path or pass overwrite=True")
    return merge_held(check_stores(srcs), out, expected=expected, allow_duplicates=allow_duplicates,
                      skip_damaged=skip_damaged)


def merge_held(held: Holdings, dest: str | os.PathLike[str], *, expected: Iterable[str] | None = None,
               allow_duplicates: bool = False, skip_damaged: bool = False) -> int:
    """:func:`merge` of the stores ``held`` describes (:func:`check_stores` of the sources, in order), for a
    caller that has checked them already; ``dest`` is replaced when it exists."""
    srcs = list(held.health)
    out = Path(dest)
    where = held.intact
    dups = sorted(eid for eid, places in where.items() if len(places) > 1)
    problems = []
    if dups and not allow_duplicates:
        first = dups[0]
        counts = Counter(str(p) for p in where[first])
        problems.append(f"{len(dups)} episodes are stored more than once ({_listing(dups)}; {first!r} in "
                        f"{dict(counts)}); pass allow_duplicates=True to keep the first copy")
    lost = held.damaged_only()
    unnamed = held.unnamed()
    damaged_files = sorted({p for places in lost.values() for p, _ in places} | set(unnamed), key=srcs.index)
    if lost and not skip_damaged:
        problems.append(f"{len(lost)} episodes are stored only damaged ({held.describe(lost)}) and would be lost")
    if unnamed and expected is None and not skip_damaged:
        problems.append("damage no episode can be named for: " + "; ".join(
            f"{p}: {', '.join(d)[:200]}" for p, d in unnamed.items()))
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
        fix = "; ".join(salvage_fix(p, bool(held.health[p].intact)) for p in damaged_files[:2]) if damaged_files else ""
        raise MergeError(f"merge into {out} of {len(srcs)} shards: " + "; ".join(problems), fix)
    left = {eid: places for eid, places in held.damaged.items() if eid in where}
    if left:
        logger.warning("merge into %s: %d damaged copies left behind, their episodes copied from intact ones: %s",
                       out, len(left), held.describe(left))
    if lost or unnamed:
        logger.warning("merge into %s: left out what is damaged: %s%s", out, held.describe(lost) if lost else "",
                       "; ".join(f"{p}: {', '.join(d)[:200]}" for p, d in unnamed.items()))
    take = {eid: places[0] for eid, places in where.items()}
    t0 = time.perf_counter()
    n = _build_atomically(out, lambda f, tmp: _copy_taken(take, srcs, f, tmp))
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
