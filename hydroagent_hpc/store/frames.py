"""Readers: committed episodes of a store as pandas frames, series, and Episode objects.

Each reader opens the file in SWMR read mode without a lock, so it works on a finished file,
on one a writer is appending to, and on one left by a killed writer (it then shows the committed
episodes only). Tables are read whole and decoded column-wise.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.store.codec import MetricKind, decode_metric, decode_rows, from_json
from hydroagent_hpc.store.errors import CorruptStoreError, EpisodeNotFoundError
from hydroagent_hpc.store.schema import METRICS, SIMS, TURNS, Table
from hydroagent_hpc.store.verify import explain
from hydroagent_hpc.store.view import StoreView, open_store, superblock_dirty
from hydroagent_hpc.types import Basin, Episode

__all__ = ["stored_ids", "read_episodes", "read_turns", "read_sims", "read_basins", "read_series", "Series",
           "load_episode", "iter_episodes", "inspect_store", "StoreInfo"]

_EPISODE_COLUMNS = ["episode_id", "basin_id", "basin_key", "agent", "preset", "protocol", "seed", "best_nse",
                    "best_run", "stop_reason", "terminal_reward", "total_reward", "wall_time_s", "started_utc"]
_BASIN_FIELDS = [f.name for f in dataclasses.fields(Basin) if f.name != "basin_id"]


@contextmanager
def _view(path: str | os.PathLike[str]) -> Iterator[StoreView]:
    """A strict view of the store; damage raises one :class:`CorruptStoreError` that also says
    what is still intact (see :func:`hydroagent_hpc.store.verify.explain`)."""
    p = Path(path)
    try:
        with open_store(p) as f:
            yield StoreView(f, p)
    except CorruptStoreError as exc:
        raise explain(exc, p) from None


def stored_ids(path: str | os.PathLike[str]) -> list[str]:
    """Ids of the committed episodes, in commit order."""
    with _view(path) as v:
        return list(v.ids)


def _nullable_int(values: np.ndarray, nulls: np.ndarray) -> pd.arrays.IntegerArray:
    return pd.arrays.IntegerArray(np.asarray(values, dtype=np.int64), np.asarray(nulls, dtype=bool))


#: pandas 3's ``str`` dtype held in Python objects: with pyarrow installed (datasets and TRL bring it) the
#: default ``str`` is Arrow-backed, which refuses text that is not valid UTF-8, such as a lone surrogate
#: from a model's output that the store keeps as written.
_TEXT = pd.StringDtype(storage="python", na_value=np.nan)


def _str_column(values: list[str | None]) -> pd.Series:
    """Text as pandas' ``str`` dtype, Python storage (missing values NaN), whether or not pyarrow is there."""
    return pd.Series(values, dtype=_TEXT if any(v is not None for v in values) else object)


def _flatten(prefix: str, texts: list[str | None], n: int) -> pd.DataFrame:
    dicts = [from_json(t) or {} for t in texts]
    if not any(dicts):
        return pd.DataFrame(index=range(n))
    flat = pd.json_normalize([d if isinstance(d, dict) else {"value": d} for d in dicts], sep=".")
    flat.columns = [f"{prefix}.{c}" for c in flat.columns]
    return flat


def read_episodes(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per committed episode.

    Columns: ``episode_id, basin_id, basin_key, agent, preset, protocol, seed, best_nse, best_run``
    (Int64, NA when none), ``stop_reason, terminal_reward, total_reward, wall_time_s, started_utc,
    n_turns, n_sims, n_metrics``, then ``counters.<name>``, ``usage.<name>`` (nested keys joined
    with dots) and ``terminal_terms.<name>``, then JSON text ``best_params, config, provenance``.
    """
    with _view(path) as v:
        c = v.cols
        data: dict[str, Any] = {}
        for name in _EPISODE_COLUMNS:
            if name == "best_run":
                data[name] = _nullable_int(c[name], c.nulls[name])
            elif isinstance(c[name], list):
                data[name] = _str_column(c[name])
            else:
                data[name] = c[name]
        data["n_turns"], data["n_sims"], data["n_metrics"] = (v.rows[k] for k in ("turn_count", "sim_count",
                                                                                  "metric_count"))
        df = pd.DataFrame(data)
        n = len(df)
        parts = [df] + [_flatten(k, c[k], n) for k in ("counters", "usage", "terminal_terms")]
        tail = pd.DataFrame({k: _str_column(c[k]) for k in ("best_params", "config", "provenance")})
        return pd.concat(parts + [tail], axis=1)


def _table_frame(v: StoreView, table: Table, field: str, skip: tuple[str, ...]
                 ) -> tuple[pd.DataFrame, np.ndarray, np.ndarray]:
    g = v.gather(table, field)
    idx, rows, owner = g.index, g.rows, g.owner
    cols = v.decode(table, rows)
    data: dict[str, Any] = {"episode_id": _str_column([v.ids[i] for i in owner.tolist()])}
    for col in table.columns:
        if col.name in skip:
            continue
        vals = cols[col.name]
        if isinstance(vals, list):
            data[col.name] = _str_column(vals)
        elif col.nullable and col.kind == "i8":
            data[col.name] = _nullable_int(vals, cols.nulls[col.name])
        elif col.nullable:
            data[col.name] = np.where(cols.nulls[col.name], np.nan, vals)
        else:
            data[col.name] = vals
    return pd.DataFrame(data), idx, rows


def read_turns(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per turn: ``episode_id, index, message_index, kind, tool, arguments`` (JSON text),
    ``observation`` (JSON), ``reward, reward_terms`` (JSON), ``ok, error, run_id`` (Int64),
    ``text, started_s, duration_s``."""
    with _view(path) as v:
        return _table_frame(v, TURNS, "turn", ("episode_row",))[0]


def read_sims(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per simulation: ``episode_id, run_id, ok, error, wall_time_s, evaluated, round`` (Int64),
    the 13 parameters by name (NaN when the run did not set one), ``extra_params`` (JSON of other
    names, or missing), ``n_steps`` (discharge length, NA without discharge), then one column per
    metric: float64, Int64, boolean, string or objects (dicts, mixed kinds) by the values stored
    (a name clashing with a column above gets a ``metric.`` prefix)."""
    with _view(path) as v:
        skip = ("episode_row", "params_set", "discharge_start", "discharge_len", *(f"param.{p}" for p in PARAM_NAMES))
        df, sim_idx, rows = _table_frame(v, SIMS, "sim", skip)
        nulls = decode_rows(SIMS, rows, b"", 0, names=["discharge_len"]).nulls["discharge_len"]
        params = pd.DataFrame({p: rows[f"param.{p}"] for p in PARAM_NAMES})
        df = pd.concat([df.drop(columns="extra_params"), params, df[["extra_params"]]], axis=1)
        df["n_steps"] = _nullable_int(rows["discharge_len"], nulls)
        metrics = _metric_frame(v, sim_idx, set(df.columns))
        return pd.concat([df, metrics], axis=1)


def _metric_frame(v: StoreView, sim_idx: np.ndarray, taken: set[str]) -> pd.DataFrame:
    rows = v.gather(METRICS, "metric").rows
    n = len(sim_idx)
    if len(rows) == 0:
        return pd.DataFrame(index=range(n))
    pos = np.searchsorted(sim_idx, rows["sim_row"])
    names = v.metric_names()
    key, kind = np.ascontiguousarray(rows["key"]), np.ascontiguousarray(rows["kind"])
    if len(key) and (int(key.min()) < 0 or int(key.max()) >= len(names)):
        raise CorruptStoreError(f"{v.path}: metrics use metric names beyond metric_keys; the file is damaged")
    num, inum = np.ascontiguousarray(rows["num"]), np.ascontiguousarray(rows["inum"])
    text_rows = np.flatnonzero((kind == MetricKind.STR) | (kind == MetricKind.JSON))
    texts = dict(zip(text_rows.tolist(), v.decode(METRICS, rows[text_rows], names=["text"])["text"]))
    out: dict[str, Any] = {}
    order = np.argsort(key, kind="stable")
    uniq, first = np.unique(key[order], return_index=True)
    bounds = np.append(first, len(order))
    for j, k in enumerate(uniq.tolist()):
        sel = order[bounds[j]:bounds[j + 1]]
        kinds = set(np.unique(kind[sel]).tolist()) - {MetricKind.NONE}
        name = names[k] if names[k] not in taken else f"metric.{names[k]}"
        if not kinds or (MetricKind.FLOAT in kinds and kinds <= {MetricKind.FLOAT, MetricKind.INT}):
            col = np.full(n, np.nan)
            col[pos[sel]] = np.where(kind[sel] == MetricKind.INT, inum[sel], num[sel])
            out[name] = col
        elif kinds == {MetricKind.INT}:
            vals, miss = np.zeros(n, np.int64), np.ones(n, bool)
            hit = sel[kind[sel] == MetricKind.INT]
            vals[pos[hit]], miss[pos[hit]] = inum[hit], False
            out[name] = _nullable_int(vals, miss)
        elif kinds == {MetricKind.BOOL}:
            vals, miss = np.zeros(n, bool), np.ones(n, bool)
            hit = sel[kind[sel] == MetricKind.BOOL]
            vals[pos[hit]], miss[pos[hit]] = inum[hit] != 0, False
            out[name] = pd.arrays.BooleanArray(vals, miss)
        elif kinds == {MetricKind.STR}:
            col = np.full(n, None, dtype=object)
            hit = sel[kind[sel] == MetricKind.STR]
            col[pos[hit]] = [texts[i] for i in hit.tolist()]
            out[name] = _str_column(col.tolist())
        else:  # JSON or mixed kinds: Python objects
            col = np.full(n, None, dtype=object)
            for i in sel.tolist():
                col[pos[i]] = decode_metric(int(kind[i]), float(num[i]), int(inum[i]), texts.get(i))
            out[name] = col
    return pd.DataFrame(out)


def read_basins(path: str | os.PathLike[str]) -> pd.DataFrame:
    """One row per basin record the committed episodes use.

    Columns: ``basin_key, basin_id, n_episodes, n_steps, start, end`` (first/last time stamp),
    ``n_warmup, n_observed`` (finite, not -999, after warm-up), then the Basin fields
    (``name, control, area_km2, ...``; missing when written without a Basin).
    """
    with _view(path) as v:
        keys, counts = np.unique(v.rows["basin_key"], return_counts=True)
        basins = v.basins(keys)
        records = []
        for key, count in zip(keys.tolist(), counts.tolist()):
            row, (times, obs, warm) = basins[key]
            info = from_json(row["info"]) or {}
            valid = None if obs is None else np.isfinite(obs) & (obs > -998.0)
            if valid is not None and warm is not None and len(warm) == len(valid):
                valid &= ~warm
            records.append({
                "basin_key": key, "basin_id": row["basin_id"], "n_episodes": count,
                "n_steps": None if times is None else len(times),
                "start": None if times is None or not len(times) else times[0],
                "end": None if times is None or not len(times) else times[-1],
                "n_warmup": None if warm is None else int(warm.sum()),
                "n_observed": None if valid is None else int(valid.sum()),
                **{f: info.get(f) for f in _BASIN_FIELDS}})
        columns = ["basin_key", "basin_id", "n_episodes", "n_steps", "start", "end", "n_warmup", "n_observed",
                   *_BASIN_FIELDS]
        df = pd.DataFrame.from_records(records, columns=columns)
        for name in ("n_steps", "n_warmup", "n_observed"):
            df[name] = df[name].astype("Int64")
        return df


class Series(NamedTuple):
    """An episode's basin series and simulated discharge (float32), rows in ``run_ids`` order."""

    times: np.ndarray | None
    observed: np.ndarray | None
    discharge: np.ndarray
    warmup: np.ndarray | None
    run_ids: tuple[int, ...]


def _position(v: StoreView, episode_id: str) -> int:
    pos = v.index.get(episode_id)
    if pos is None:
        raise EpisodeNotFoundError(f"{v.path}: no committed episode {episode_id!r} ({len(v)} stored; "
                                   f"see stored_ids())")
    return pos


def read_series(path: str | os.PathLike[str], episode_id: str, run_id: int | None = None) -> Series:
    """``times, observed, discharge, warmup, run_ids`` of one episode.

    ``discharge`` is 1-D for ``run_id``, else 2-D (one row per simulation that kept its
    discharge, NaN-padded if lengths differ).
    """
    with _view(path) as v:
        pos = _position(v, episode_id)
        row = v.rows[pos]
        _, (times, observed, warmup) = v.basins(np.asarray([row["basin_key"]]))[int(row["basin_key"])]
        gathered = v.gather(SIMS, "sim", [pos])
        q_all, q_lo, _ = v.check_discharge(gathered, np.asarray([pos], dtype=np.int64))
        sims = gathered.rows
        has = ~decode_rows(SIMS, sims, b"", 0, names=["discharge_len"]).nulls["discharge_len"]
        if run_id is not None:
            hit = np.flatnonzero((sims["run_id"] == run_id) & has)
            if not len(hit):
                raise KeyError(f"{v.path}: episode {episode_id!r} has no simulation {run_id} with discharge "
                               f"(runs with discharge: {sims['run_id'][has].tolist()})")
            sims = sims[hit[:1]]
        else:
            sims = sims[has]
        if len(sims):
            lo, q = q_lo, q_all
            width = int(sims["discharge_len"].max())
            out = np.full((len(sims), width), np.nan, dtype=np.float32)
            for j, (s, n) in enumerate(zip(sims["discharge_start"].tolist(), sims["discharge_len"].tolist())):
                out[j, :n] = q[s - lo:s - lo + n]
        else:
            out = np.zeros((0, 0), dtype=np.float32)
        ids = tuple(sims["run_id"].tolist())
        return Series(times, observed, out[0] if run_id is not None else out, warmup, ids)


def load_episode(path: str | os.PathLike[str], episode_id: str) -> Episode:
    """The committed episode ``episode_id`` as written (see store_schema.md for the exceptions)."""
    with _view(path) as v:
        return next(v.episodes([_position(v, episode_id)]))[0]


def iter_episodes(path: str | os.PathLike[str], batch_size: int = 32) -> Iterator[Episode]:
    """Every committed episode, in commit order, read ``batch_size`` episodes at a time."""
    with _view(path) as v:
        for episode, _ in v.episodes(batch_size=batch_size):
            yield episode


@dataclass(frozen=True)
class StoreInfo:
    """What :func:`inspect_store` finds: committed episodes and rows no committed episode owns."""

    path: Path
    episodes: int
    uncommitted_episode_rows: int
    orphan_rows: dict[str, int]
    closed_cleanly: bool
    size_bytes: int


def inspect_store(path: str | os.PathLike[str]) -> StoreInfo:
    """Count committed episodes and orphan rows; ``closed_cleanly`` is False after a killed writer
    (or while one is writing)."""
    p = Path(path)
    with _view(p) as v:
        orphans = {
            "turns": v.sizes["turns"] - int(v.rows["turn_count"].sum()),
            "sims": v.sizes["sims"] - int(v.rows["sim_count"].sum()),
            "metrics": v.sizes["metrics"] - int(v.rows["metric_count"].sum()),
            "basins": v.sizes["basins"] - len(np.unique(v.rows["basin_key"])),
        }
        info = StoreInfo(p, len(v), v.invalid_rows, orphans, not superblock_dirty(p), p.stat().st_size)
    return info
