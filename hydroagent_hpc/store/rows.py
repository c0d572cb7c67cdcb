"""Episodes to table columns and back: the mapping between ``types`` records and store rows.

Writing: :func:`basin_record`, :func:`turn_columns`, :func:`sim_columns`, :func:`metric_columns`
and :func:`episode_columns` turn one Episode into ``{column: values}`` per table. Reading:
:func:`build_turns`, :func:`build_sims` and :func:`build_episode` rebuild the records from
decoded columns. What changes on the way (float32 discharge, JSON lists) is listed in
``store_schema.md``.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.store.codec import decode_metric, encode_metric, from_json, to_json
from hydroagent_hpc.types import Basin, Episode, SimRecord, Turn

__all__ = ["BasinRecord", "basin_record", "basin_digest", "basin_info", "turn_columns", "sim_columns", "metric_columns",
           "episode_columns", "build_turns", "build_sims", "decode_metrics", "build_episode", "PARAM_INDEX"]

PARAM_INDEX: dict[str, int] = {name: i for i, name in enumerate(PARAM_NAMES)}


@dataclass(frozen=True)
class BasinRecord:
    """A basin's id, series and Basin fields as stored once per basin (``digest`` identifies it)."""

    basin_id: str
    info: str | None  # JSON of the Basin's fields
    times: np.ndarray | None  # int64 view of the time stamps
    times_unit: str | None  # numpy dtype string of the time stamps, e.g. "<M8[m]"
    observed: np.ndarray | None  # float64
    warmup: np.ndarray | None  # uint8
    digest: str


def basin_info(basin: Basin | None, episode_id: str) -> str | None:
    """The Basin's fields as JSON text (``None`` without a Basin)."""
    if basin is None:
        return None
    if not isinstance(basin, Basin):
        raise TypeError(f"episode {episode_id}: basin must be a Basin, got {type(basin).__name__}")
    return to_json(dataclasses.asdict(basin), f"episode {episode_id}: basin")


def basin_record(episode: Episode, info: str | None) -> BasinRecord:
    """The basin part of ``episode`` (``times``, ``observed``, ``warmup``) plus Basin JSON ``info``."""
    what = f"episode {episode.episode_id}"
    times = unit = None
    if episode.times is not None:
        t = np.asarray(episode.times)
        if t.ndim != 1 or t.dtype.kind not in "Mi":
            raise TypeError(f"{what}: times must be a 1-D datetime64 (or integer) array, got {t.dtype} {t.shape}")
        unit = t.dtype.str
        times = np.ascontiguousarray(t).view(np.int64) if t.dtype.kind == "M" else t.astype(np.int64)
    observed = None if episode.observed is None else _vector(episode.observed, np.float64, f"{what}: observed")
    warmup = None if episode.warmup is None else _vector(episode.warmup, np.bool_, f"{what}: warmup").view(np.uint8)
    digest = basin_digest(episode.basin_id, info, unit, (times, observed, warmup))
    return BasinRecord(episode.basin_id, info, times, unit, observed, warmup, digest)


def basin_digest(basin_id: str, info: str | None, unit: str | None,
                 series: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]) -> str:
    """SHA-1 (hex) of a basin record: id, Basin JSON, time unit, then ``times`` (int64), ``observed``
    (float64) and ``warmup`` (uint8) as stored. It identifies the record (episodes with the same
    digest share it) and seals its series: a reader recomputes it from what it read."""
    h = hashlib.sha1()
    for part in (basin_id, info, unit):
        h.update(b"\x00" if part is None else b"\x01" + part.encode("utf-8", "surrogatepass") + b"\x00")
    for arr in series:
        h.update(b"\x00" if arr is None else b"\x01" + len(arr).to_bytes(8, "little") + arr.tobytes())
    return h.hexdigest()


def _vector(values: Any, dtype: Any, what: str) -> np.ndarray:
    arr = np.asarray(values)
    if arr.ndim != 1:
        raise ValueError(f"{what}: expected a 1-D array, got shape {arr.shape}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _opt_json(value: object, what: str) -> str | None:
    return None if value is None else to_json(value, what)


def _opt_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int or None, got {value!r}")
    return int(value)


def turn_columns(episode_row: int, episode: Episode) -> dict[str, list[Any]]:
    """Columns of the ``turns`` table for the episode's turns."""
    cols: dict[str, list[Any]] = {k: [] for k in (
        "episode_row", "index", "message_index", "kind", "tool", "arguments", "observation", "reward",
        "reward_terms", "ok", "error", "run_id", "text", "started_s", "duration_s")}
    for i, t in enumerate(episode.turns):
        what = f"episode {episode.episode_id} turn {i}"
        if not isinstance(t, Turn):
            raise TypeError(f"{what}: expected a Turn, got {type(t).__name__}")
        cols["episode_row"].append(episode_row)
        cols["index"].append(_opt_int(t.index, f"{what}: index"))
        cols["message_index"].append(_opt_int(t.message_index, f"{what}: message_index"))
        cols["kind"].append(str(t.kind))
        cols["tool"].append(None if t.tool is None else str(t.tool))
        cols["arguments"].append(_opt_json(t.arguments, f"{what}: arguments"))
        cols["observation"].append(_opt_json(t.observation, f"{what}: observation"))
        cols["reward"].append(float(t.reward))
        cols["reward_terms"].append(_opt_json(t.reward_terms, f"{what}: reward_terms"))
        cols["ok"].append(bool(t.ok))
        cols["error"].append(None if t.error is None else str(t.error))
        cols["run_id"].append(_opt_int(t.run_id, f"{what}: run_id"))
        cols["text"].append(str(t.text))
        cols["started_s"].append(float(t.started_s))
        cols["duration_s"].append(float(t.duration_s))
    return cols


def sim_columns(episode_row: int, episode: Episode, discharge_base: int) -> tuple[dict[str, list[Any]], np.ndarray]:
    """Columns of the ``sims`` table and the concatenated float32 discharge of the episode's sims."""
    names = ["episode_row", "run_id", "ok", "error", "wall_time_s", "evaluated", "round",
             *(f"param.{p}" for p in PARAM_NAMES), "params_set", "extra_params", "discharge_start",
             "discharge_len"]
    cols: dict[str, list[Any]] = {k: [] for k in names}
    series: list[np.ndarray] = []
    pos = discharge_base
    for j, s in enumerate(episode.sims):
        what = f"episode {episode.episode_id} sim {j}"
        if not isinstance(s, SimRecord):
            raise TypeError(f"{what}: expected a SimRecord, got {type(s).__name__}")
        values = [math.nan] * len(PARAM_NAMES)
        mask = 0
        extra: dict[str, Any] = {}
        for name, v in (s.params or {}).items():
            i = PARAM_INDEX.get(name) if isinstance(name, str) else None
            if i is None:
                extra[str(name)] = v
                continue
            try:
                values[i] = float(v)
            except (TypeError, ValueError):
                raise TypeError(f"{what}: parameter {name} must be a number, got {v!r}") from None
            mask |= 1 << i
        cols["episode_row"].append(episode_row)
        cols["run_id"].append(_opt_int(s.run_id, f"{what}: run_id"))
        cols["ok"].append(bool(s.ok))
        cols["error"].append(None if s.error is None else str(s.error))
        cols["wall_time_s"].append(float(s.wall_time_s))
        cols["evaluated"].append(bool(s.evaluated))
        cols["round"].append(_opt_int(s.round, f"{what}: round"))
        for name, v in zip(PARAM_NAMES, values):
            cols[f"param.{name}"].append(v)
        cols["params_set"].append(mask)
        cols["extra_params"].append(to_json(extra, f"{what}: params") if extra else None)
        if s.discharge is None:
            cols["discharge_start"].append(pos)
            cols["discharge_len"].append(None)
        else:
            q = _vector(s.discharge, np.float32, f"{what}: discharge")
            series.append(q)
            cols["discharge_start"].append(pos)
            cols["discharge_len"].append(len(q))
            pos += len(q)
    q_all = np.concatenate(series) if series else np.zeros(0, np.float32)
    return cols, q_all


def metric_columns(sim_base: int, episode: Episode, key_id: Callable[[str], int]) -> dict[str, list[Any]]:
    """Columns of the ``metrics`` table: one row per (sim, metric); ``key_id`` interns names."""
    cols: dict[str, list[Any]] = {k: [] for k in ("sim_row", "key", "kind", "num", "inum", "text")}
    for j, s in enumerate(episode.sims):
        for name, value in (s.metrics or {}).items():
            what = f"episode {episode.episode_id} sim {j} metric {name!r}"
            if not isinstance(name, str):
                raise TypeError(f"{what}: metric names must be str")
            kind, num, inum, text = encode_metric(value, what)
            cols["sim_row"].append(sim_base + j)
            cols["key"].append(key_id(name))
            cols["kind"].append(kind)
            cols["num"].append(num)
            cols["inum"].append(inum)
            cols["text"].append(text)
    return cols


def episode_columns(episode: Episode, basin_key: int, ranges: Mapping[str, int]) -> dict[str, list[Any]]:
    """The one-row ``episodes`` columns; ``ranges`` holds the *_start/*_count fields and keys_end."""
    e = episode
    what = f"episode {e.episode_id}"
    best_nse = None if e.best_nse is None else float(e.best_nse)
    row: dict[str, Any] = {
        "episode_id": e.episode_id, "basin_id": str(e.basin_id), "agent": str(e.agent), "preset": str(e.preset),
        "protocol": str(e.protocol), "seed": _opt_int(e.seed, f"{what}: seed"), "basin_key": basin_key,
        "best_nse": best_nse, "best_run": _opt_int(e.best_run, f"{what}: best_run"),
        "best_params": _opt_json(e.best_params, f"{what}: best_params"),
        "stop_reason": str(e.stop_reason), "terminal_reward": float(e.terminal_reward),
        "total_reward": float(e.total_reward), "wall_time_s": float(e.wall_time_s),
        "started_utc": str(e.started_utc),
        **{k: to_json(getattr(e, k), f"{what}: {k}") for k in
           ("config", "terminal_terms", "counters", "provenance", "usage")},
        **ranges,
    }
    if row["seed"] is None:
        raise TypeError(f"{what}: seed must be an int")
    return {k: [v] for k, v in row.items()}


def build_turns(lists: Mapping[str, list[Any]], lo: int, hi: int) -> list[Turn]:
    """Turns from decoded ``turns`` rows ``lo:hi`` (``lists``: column -> Python list, None at nulls)."""
    L = lists
    return [Turn(index=L["index"][i], message_index=L["message_index"][i], kind=L["kind"][i], tool=L["tool"][i],
                 arguments=from_json(L["arguments"][i]), observation=from_json(L["observation"][i]),
                 reward=L["reward"][i], reward_terms=from_json(L["reward_terms"][i]), ok=L["ok"][i],
                 error=L["error"][i], run_id=L["run_id"][i], text=L["text"][i], started_s=L["started_s"][i],
                 duration_s=L["duration_s"][i])
            for i in range(lo, hi)]


def build_sims(lists: Mapping[str, list[Any]], lo: int, hi: int, metrics: Sequence[dict[str, object]],
               discharge: Callable[[int], np.ndarray | None]) -> list[SimRecord]:
    """SimRecords from decoded ``sims`` rows ``lo:hi``; ``metrics[i - lo]`` and ``discharge(i)`` per row."""
    L = lists
    out = []
    for i in range(lo, hi):
        mask = L["params_set"][i]
        # Extra names hold whatever JSON value was written (SimRecord's annotation says float).
        params: dict[str, Any] = {p: L[f"param.{p}"][i] for k, p in enumerate(PARAM_NAMES) if mask >> k & 1}
        extra = from_json(L["extra_params"][i])
        if extra:
            params.update(extra)
        out.append(SimRecord(run_id=L["run_id"][i], params=params, ok=L["ok"][i], error=L["error"][i],
                             metrics=metrics[i - lo], wall_time_s=L["wall_time_s"][i],
                             evaluated=L["evaluated"][i], round=L["round"][i], discharge=discharge(i)))
    return out


def decode_metrics(lists: Mapping[str, list[Any]], lo: int, hi: int, names: Sequence[str | None]) -> dict[str, object]:
    """One simulation's metrics dict from decoded ``metrics`` rows ``lo:hi`` (in stored order)."""
    K, kinds, num, inum, text = lists["key"], lists["kind"], lists["num"], lists["inum"], lists["text"]
    return {names[K[i]]: decode_metric(kinds[i], num[i], inum[i], text[i]) for i in range(lo, hi)}


def build_episode(ep: Mapping[str, Any], turns: list[Turn], sims: list[SimRecord],
                  series: tuple[np.ndarray | None, np.ndarray | None, np.ndarray | None]) -> Episode:
    """An Episode from one decoded ``episodes`` row (as a dict of Python values) and its parts."""
    times, observed, warmup = series
    return Episode(
        episode_id=ep["episode_id"], basin_id=ep["basin_id"], agent=ep["agent"], preset=ep["preset"],
        protocol=ep["protocol"], seed=ep["seed"], config=from_json(ep["config"]), turns=turns, sims=sims,
        best_nse=ep["best_nse"], best_run=ep["best_run"], best_params=from_json(ep["best_params"]),
        stop_reason=ep["stop_reason"], terminal_reward=ep["terminal_reward"],
        terminal_terms=from_json(ep["terminal_terms"]), counters=from_json(ep["counters"]),
        wall_time_s=ep["wall_time_s"], started_utc=ep["started_utc"], provenance=from_json(ep["provenance"]),
        usage=from_json(ep["usage"]), times=times, observed=observed, warmup=warmup)
