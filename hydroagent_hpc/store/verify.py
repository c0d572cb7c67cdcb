"""Checking a whole store: which committed episodes are intact and which are damaged, and saving
the intact ones.

:func:`verify_store` reads every byte a result depends on and checks it against its seal (see
``store_schema.md``, "Damage"); it never raises for damage, it lists it. :func:`explain` turns a
reader's :class:`CorruptStoreError` into the one-line message readers raise: what is damaged and
what is still intact. :func:`hydroagent_hpc.store.merge.salvage` copies the intact episodes into a
new store.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Collection, Iterable
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

from hydroagent_hpc.store.errors import CorruptStoreError, StoreError
from hydroagent_hpc.store.schema import DATASETS, METRICS, SIMS, TURNS
from hydroagent_hpc.store.view import LIVE_WRITERS, FileCheck, StoreView, check_file, open_read

__all__ = ["StoreHealth", "verify_store", "explain", "Holdings", "check_stores", "done_ids", "damage_error",
           "salvage_fix"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoreHealth:
    """What :func:`verify_store` found.

    ``problems``: damage to the file as a whole (truncation, HDF5 structures, metric names);
    ``intact``: ids of committed episodes whose every row checks out; ``damaged``: episode id (or
    ``record N`` when the record itself is damaged) -> reason; ``uncommitted_rows``: records never
    written (a writer killed before its commit; not damage); ``records``: the keys of ``damaged``
    that are damaged records (``record N ...``, whose episode id cannot be trusted).
    """

    path: Path
    size_bytes: int
    problems: tuple[str, ...]
    intact: tuple[str, ...]
    damaged: dict[str, str]
    uncommitted_rows: int
    records: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.problems and not self.damaged

    @property
    def damaged_ids(self) -> dict[str, str]:
        """Committed episodes (by id) with a damaged part -> reason; damaged records left out."""
        return {k: v for k, v in self.damaged.items() if k not in self.records}

    @property
    def unnamed(self) -> tuple[str, ...]:
        """Damage no episode id can be given to: the file's problems and its damaged records."""
        return self.problems + tuple(f"{k} ({self.damaged[k]})" for k in self.records)

    def summary(self, limit: int = 5) -> str:
        """One line: the damage and what is intact."""
        if self.ok:
            return f"{self.path}: intact ({len(self.intact)} committed episodes check out)"
        parts = list(self.problems)
        if self.damaged:
            shown = [f"{k!r} ({v})" if not k.startswith("record ") else f"{k} ({v})"
                     for k, v in list(self.damaged.items())[:limit]]
            more = f" and {len(self.damaged) - limit} more" if len(self.damaged) > limit else ""
            parts.append(f"{len(self.damaged)} episode(s) damaged: {', '.join(shown)}{more}")
        ids = [repr(i) for i in self.intact[:limit]]
        more = f" and {len(self.intact) - limit} more" if len(self.intact) > limit else ""
        intact = (f"{len(self.intact)} committed episode(s) intact ({', '.join(ids)}{more})" if self.intact
                  else "no committed episode can be read intact")
        return f"{self.path}: damaged store: {'; '.join(parts)}; {intact}"


def _lost_chunks(f: h5py.File, size: int) -> list[str]:
    """Datasets with chunks that lie (partly) beyond ``size`` bytes, and from which row they are lost."""
    out = []
    for name in DATASETS:
        try:
            ds = f[name]
            first_lost = None
            for i in range(ds.id.get_num_chunks()):
                info = ds.id.get_chunk_info(i)
                if info.byte_offset + info.size > size:
                    row = int(info.chunk_offset[0])
                    first_lost = row if first_lost is None else min(first_lost, row)
            if first_lost is not None and first_lost < ds.shape[0]:
                out.append(f"{name} from row {first_lost} of {ds.shape[0]}")
        except (OSError, RuntimeError, KeyError, ValueError) as exc:
            out.append(f"{name} (unreadable: {exc})")
    return out


def _check_batch(v: StoreView, batch: np.ndarray, names: list[str | None]) -> dict[int, str]:
    """View position -> reason for each damaged episode of ``batch`` (its rows, discharge, basin, names)."""
    bad: dict[int, str] = {}
    gathered = {}
    for table, field in ((TURNS, "turn"), (SIMS, "sim"), (METRICS, "metric")):
        g = v.gather(table, field, batch)
        gathered[table.name] = g
        for p, why in g.bad.items():
            bad.setdefault(p, why)
    for p, why in v.check_discharge(gathered[SIMS.name], batch)[2].items():
        bad.setdefault(p, why)
    metrics = gathered[METRICS.name]
    for j, p in enumerate(batch.tolist()):
        if p in bad:
            continue
        keys = metrics.rows["key"][int(metrics.first[j]):int(metrics.first[j] + metrics.counts[j])].tolist()
        lost = sorted({k for k in keys if not 0 <= k < len(names) or names[k] is None})
        if lost:
            bad[p] = f"the metric names it uses (metric_keys rows {lost[:5]}) are damaged"
    v.basins(v.rows["basin_key"][batch])
    for p in batch.tolist():
        key = int(v.rows["basin_key"][p])
        if p not in bad and key in v.bad_basins:
            bad[p] = v.bad_basins[key]
    return bad


#: What reading damaged rows can raise (HDF5 errors, and numpy on nonsense offsets or lengths).
_READ_ERRORS = (OSError, RuntimeError, KeyError, CorruptStoreError, ValueError, IndexError, OverflowError,
                MemoryError, UnicodeDecodeError)


def verify_store(path: str | os.PathLike[str], batch_size: int = 64) -> StoreHealth:
    """Check every committed episode of the store at ``path`` against its seals; never hangs.

    Raises :class:`~hydroagent_hpc.store.SchemaError` only when the file is not an episode store
    (or one of another version), and ``FileNotFoundError`` when it is missing; any damage is
    listed in the result.
    """
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"{p}: no such episode store")
    check: FileCheck = check_file(p)
    problems: list[str] = []
    if check.truncated:
        problems.append(f"the file is {check.describe()}")
        if check.short:
            return StoreHealth(p, check.size, tuple(problems), (), {}, 0)
    live = LIVE_WRITERS.get(os.path.realpath(p))  # in the writer's process: its own handle
    try:
        f = live if live is not None else open_read(p)
    except CorruptStoreError as exc:
        problems.append(str(exc).split(": ", 1)[-1])
        return StoreHealth(p, check.size, tuple(problems), (), {}, 0)
    damaged: dict[str, str] = {}
    intact: list[str] = []
    uncommitted = 0
    with nullcontext(f) if live is not None else f:
        try:
            v = StoreView(f, p, strict=False)
        except CorruptStoreError as exc:
            problems.append(str(exc).split(": ", 1)[-1])
            return StoreHealth(p, check.size, tuple(problems), (), {}, 0)
        except (OSError, RuntimeError, KeyError) as exc:
            problems.append(f"HDF5 cannot read the episode records ({exc})")
            return StoreHealth(p, check.size, tuple(problems), (), {}, 0)
        if check.truncated:
            lost = _lost_chunks(f, check.size)
            if lost:
                problems.append("rows lost past the end: " + "; ".join(lost))
        damaged.update(v.damaged)
        records = tuple(v.damaged)
        uncommitted = v.uncommitted_rows
        try:
            names = v.metric_names()
        except (OSError, RuntimeError, KeyError) as exc:
            problems.append(f"HDF5 cannot read the metric names ({exc})")
            names = []
        if v.bad_keys:
            problems.append(f"{len(v.bad_keys)} metric name row(s) damaged ({sorted(v.bad_keys)[:5]})")
        bad: dict[int, str] = {}
        for b in range(0, len(v), batch_size):
            batch = np.arange(b, min(b + batch_size, len(v)), dtype=np.int64)
            try:
                bad.update(_check_batch(v, batch, names))
            except _READ_ERRORS as exc:
                for one in batch.tolist():  # find which episodes of the batch cannot be read
                    try:
                        bad.update(_check_batch(v, np.asarray([one], dtype=np.int64), names))
                    except _READ_ERRORS as exc1:
                        bad[one] = f"its rows cannot be read ({str(exc1).splitlines()[0][:160]})"
                logger.debug("%s: batch at %d: %s", p, b, exc)
        for pos, eid in enumerate(v.ids):
            if pos in bad:
                damaged[eid] = bad[pos]
            else:
                intact.append(eid)
    return StoreHealth(p, check.size, tuple(problems), tuple(intact), damaged, uncommitted, records)


def explain(exc: CorruptStoreError, path: Path) -> CorruptStoreError:
    """``exc`` as one line that also lists what is damaged and what is intact (from :func:`verify_store`)."""
    if exc.summarized:
        return exc
    first = str(exc).split("\n")[0]
    try:
        health = verify_store(path)
    except (StoreError, OSError, RuntimeError, ValueError, KeyError) as again:  # the check itself failed: say so
        return CorruptStoreError(f"{first}; checking the rest failed too ({str(again).splitlines()[0]}). "
                                 f"Rebuild the store from its shards or rerun the campaign into a new file.",
                                 damaged=exc.damaged, summarized=True)
    detail = health.summary() if not health.ok else f"{path}: {first}"
    return CorruptStoreError(
        f"{detail}. `hydroagent store verify {path}` lists every episode; `hydroagent store salvage {path} NEW.h5` "
        f"copies the intact ones into a new store (rerun the campaign into NEW.h5 to redo the rest).",
        damaged=tuple(health.damaged) + (exc.damaged if not health.damaged else ()), intact=health.intact,
        summarized=True)


def salvage_fix(path: Path, intact: bool = True) -> str:
    """The fix for a damaged store at ``path``: set it aside, copy its intact episodes back, run again."""
    aside = path.with_name(f"{path.stem}.damaged{path.suffix}")
    p, a = shlex.quote(str(path)), shlex.quote(str(aside))
    if not intact:
        return (f"no episode of it is intact: move it aside (`mv {p} {a}`) and run again; every episode it held "
                f"runs again")
    return (f"`hydroagent store verify {p}` lists the damage; move the file aside and copy its intact episodes "
            f"back (`mv {p} {a} && hydroagent store salvage {a} {p}`), then run again: the damaged episodes run "
            f"again")


def damage_error(health: StoreHealth, what: str) -> CorruptStoreError:
    """The one-line error for the damaged store of ``health`` that ``what`` will not use as it is."""
    return CorruptStoreError(f"{health.summary()}; {what}", salvage_fix(health.path, bool(health.intact)),
                             damaged=tuple(health.damaged), intact=health.intact, summarized=True)


@dataclass(frozen=True)
class Holdings:
    """What several stores hold together: each episode intact where, and the damaged copies.

    An episode counts as stored ("done") only where every part of it checks out: ``intact`` maps
    each id to the stores that hold it intact (in the order given), ``damaged`` each id to the
    stores that hold a damaged copy and why. ``health`` is each store's :class:`StoreHealth`.
    """

    health: dict[Path, StoreHealth]
    intact: dict[str, list[Path]]
    damaged: dict[str, list[tuple[Path, str]]]

    def damaged_only(self, ids: Collection[str] | None = None) -> dict[str, list[tuple[Path, str]]]:
        """Episodes (of ``ids``, default all) stored damaged somewhere and intact nowhere."""
        return {eid: where for eid, where in self.damaged.items()
                if eid not in self.intact and (ids is None or eid in ids)}

    def unnamed(self) -> dict[Path, tuple[str, ...]]:
        """Per store, damage no episode id can be given to (file problems, damaged records)."""
        return {p: h.unnamed for p, h in self.health.items() if h.unnamed}

    @staticmethod
    def describe(found: dict[str, list[tuple[Path, str]]], limit: int = 5) -> str:
        """``'id' (why, in FILE), ...`` for :meth:`damaged_only`'s answer."""
        shown = [f"{eid!r} ({why}, in {path})" for eid, where in list(found.items())[:limit] for path, why in where[:1]]
        return ", ".join(shown) + (f" and {len(found) - limit} more" if len(found) > limit else "")


def check_stores(paths: Iterable[str | os.PathLike[str]]) -> Holdings:
    """:func:`verify_store` of every store in ``paths`` (each read once), combined into :class:`Holdings`."""
    health: dict[Path, StoreHealth] = {}
    intact: dict[str, list[Path]] = {}
    damaged: dict[str, list[tuple[Path, str]]] = {}
    for path in paths:
        p = Path(path)
        if p in health:
            continue
        h = health[p] = verify_store(p)
        for eid in h.intact:
            intact.setdefault(eid, []).append(p)
        for eid, why in h.damaged_ids.items():
            damaged.setdefault(eid, []).append((p, why))
    return Holdings(health, intact, damaged)


def done_ids(out: str | os.PathLike[str], others: Iterable[str | os.PathLike[str]] = (),
             wanted: Collection[str] | None = None) -> set[str]:
    """The episodes a run writing into ``out`` may skip: those that ``out`` or one of ``others`` holds intact.

    A damaged ``out`` raises :class:`CorruptStoreError` (nothing is ever appended to a damaged
    store; the message names the damage and the fix, ``hydroagent store salvage``). An episode (of
    ``wanted``) that another store holds damaged and no store holds intact is not done: it is
    named in a warning and runs again. Missing stores hold nothing.
    """
    target = Path(out)
    paths = [p for p in (target, *(Path(o) for o in others)) if p.exists()]
    held = check_stores(paths)
    if target in held.health and not held.health[target].ok:
        raise damage_error(held.health[target], "a run never appends to a damaged store nor counts a damaged "
                                                "episode as done")
    again = held.damaged_only(wanted)
    if again:
        logger.warning("%d episode(s) are stored only damaged and run again: %s", len(again), held.describe(again))
    for p, damage in held.unnamed().items():
        logger.warning("%s: damaged (%s); an episode it held that no store holds intact runs again", p,
                       "; ".join(damage)[:300])
    return set(held.intact)
