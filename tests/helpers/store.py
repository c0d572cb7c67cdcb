"""A deterministic episode factory for the store tests (``make_episode(i)``), shared by the store
tests and the child processes they start, so a child can write episodes and the test can rebuild
exactly what it wrote."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.types import Basin, Episode, SimRecord, Turn

CRASH_SIZES = {"n_sims": 4, "n_steps": 1440, "n_turns": 9}

# ---------------------------------------------------------------------------------------------
# A deterministic episode factory.

N_BASINS = 3
UNICODE = "débit ≈ 3,5 m³/s — 流量 🌊 \u200b\t\"quoted\" \\ back"


def episode_id(i: int) -> str:
    return f"ep-{i:05d}"


def basin_of(i: int) -> Basin:
    k = i % N_BASINS
    return Basin(basin_id=f"0233866{k}", name=f"Creek {k}", control=f"/data/b{k}/control.txt", area_km2=100.0 + k,
                 lat=30.0 + k, lon=-84.0 - k, timestep="1h", window_start="2020-01-11 00:00",
                 window_end="2020-03-01 00:00", warmup_start="2020-01-01 00:00", target_nse=0.7,
                 paper_gauge_id=None if k else "02338660", synthetic=bool(k), notes=UNICODE if k == 1 else "")


def basin_series(k: int, n_steps: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    times = np.datetime64("2020-01-01T01:00", "m") + np.arange(n_steps).astype("timedelta64[h]")
    rng = np.random.default_rng(1000 + k)
    observed = rng.gamma(2.0, 10.0, n_steps)
    observed[rng.integers(0, n_steps, 20)] = np.nan
    observed[rng.integers(0, n_steps, 5)] = -999.0
    warmup = np.arange(n_steps) < 240
    return times, observed, warmup


def make_episode(i: int, n_sims: int = 3, n_steps: int = 1440, n_turns: int | None = None) -> Episode:
    """Episode ``i``: everything derived from ``i`` (and the sizes), so it can be rebuilt."""
    rng = np.random.default_rng(i)
    k = i % N_BASINS
    times, observed, warmup = basin_series(k, n_steps)
    sims = []
    for j in range(n_sims):
        failed = j == 1 and i % 4 == 1
        names = [p for p in PARAM_NAMES if rng.random() < 0.8]
        params: dict[str, object] = {p: float(rng.uniform(0.1, 3.0)) for p in names}
        if j == 2:
            params["custom_knob"] = 3  # a name outside the 13
        nse = float(rng.uniform(-1, 0.9))
        metrics: dict[str, object] = {
            "NSE": nse, "KGE": float(rng.uniform(-1, 0.9)), "logNSE": math.nan if j == 0 else nse / 2,
            "n_points": int(n_steps - 240), "peak_timing_n": int(rng.integers(0, 9)),
            "nse_band": ["unsatisfactory", "satisfactory", "good"][j % 3], "bfi_passes": 3,
            "flagged": bool(j % 2), "missing": None, "reasons": {"logNSE": "too few points"} if j == 0 else {},
        }
        discharge = None if failed else rng.gamma(2.0, 9.0, n_steps).astype(np.float32)
        sims.append(SimRecord(run_id=j, params=params, ok=not failed, error="EF5 exited with 139" if failed else None,
                              metrics={} if failed else metrics, wall_time_s=float(rng.uniform(0.1, 2)),
                              evaluated=j % 2 == 0, round=None if j == 0 else j // 2, discharge=discharge))
    n_turns = 2 * n_sims + 1 if n_turns is None else n_turns
    turns = []
    for t in range(n_turns):
        parse_failure = t % 5 == 4
        turns.append(Turn(
            index=t, message_index=t // 2, kind="parse_failure" if parse_failure else "tool",
            tool=None if parse_failure else ["run_simulation", "evaluate", "finish"][t % 3],
            arguments=None if parse_failure else {"params": {"wm": 1.0 + t, "b": 0.5}, "note": UNICODE},
            observation={"ok": True, "nse": float(rng.uniform(-1, 1)), "series": [1.5, math.nan, 3],
                         "nested": {"list": [[1, 2], {"a": None}]}},
            reward=float(rng.normal()), reward_terms={"format": 0.1, "improvement": float(t)}, ok=not parse_failure,
            error="could not parse <tool_call>" if parse_failure else None,
            run_id=t // 2 if t % 2 == 0 and t // 2 < n_sims else None,
            text=(f"turn {t} of {episode_id(i)}: {UNICODE}" if t % 2 == 0 else ""),
            started_s=float(t), duration_s=0.25 * t))
    best = None if i % 7 == 3 or not sims else 0
    return Episode(
        episode_id=episode_id(i), basin_id=f"0233866{k}", agent=["heuristic", "gpt-x", "qwen"][i % 3],
        preset="paper", protocol="budget-20", seed=i * 7,
        config={"budget": 20, "tools": ["run_simulation", "evaluate"], "nested": {"a": [1, 2.5, None]},
                "unicode": UNICODE},
        turns=turns, sims=sims, best_nse=None if best is None else float(sims[0].metrics["NSE"]), best_run=best,
        best_params=None if best is None else dict(sims[0].params), stop_reason=["budget", "finish", "target"][i % 3],
        terminal_reward=float(rng.normal()), terminal_terms={"best_nse": 0.5, "budget_left": -0.1},
        counters={"turns": n_turns, "parse_failures": sum(t.kind == "parse_failure" for t in turns),
                  "simulations": n_sims, "failed_simulations": int(i % 4 == 1 and n_sims > 1)},
        wall_time_s=float(rng.uniform(1, 100)), started_utc=f"2026-01-01T00:{i % 60:02d}:00+00:00",
        provenance={"git_commit": "abc123", "host": "node01"},
        usage={"model": "m", "tokens": {"prompt": 1000 + i, "completion": 200}, "cost_usd": 0.01 * i},
        times=times, observed=observed, warmup=warmup)


# ---------------------------------------------------------------------------------------------
# Comparison.


def _same(a: object, b: object, where: str) -> None:
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        assert isinstance(a, np.ndarray) and isinstance(b, np.ndarray), where
        assert a.dtype == b.dtype and a.shape == b.shape, f"{where}: {a.dtype}{a.shape} vs {b.dtype}{b.shape}"
        assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), where
    elif isinstance(a, dict) or isinstance(b, dict):
        assert isinstance(a, dict) and isinstance(b, dict), f"{where}: {a!r} vs {b!r}"
        assert list(a) == list(b), f"{where}: keys {list(a)} vs {list(b)}"
        for key in a:
            _same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: {a!r} vs {b!r}"
        for n, (x, y) in enumerate(zip(a, b)):
            _same(x, y, f"{where}[{n}]")
    elif isinstance(a, float) and math.isnan(a):
        assert isinstance(b, float) and math.isnan(b), f"{where}: {a!r} vs {b!r}"
    else:
        assert type(a) is type(b) and a == b, f"{where}: {a!r} ({type(a).__name__}) vs {b!r} ({type(b).__name__})"


def assert_episode_equal(want: Episode, got: Episode) -> None:
    """Field by field; sim params compare as dicts (stored in PARAM_NAMES order, extras last)."""
    for f in dataclasses.fields(Episode):  # every field, so a field added later must round-trip too
        if f.name not in ("turns", "sims"):
            _same(getattr(want, f.name), getattr(got, f.name), f"{want.episode_id}.{f.name}")
    assert len(want.turns) == len(got.turns) and len(want.sims) == len(got.sims)
    for t, (a, b) in enumerate(zip(want.turns, got.turns)):
        for name in vars(a):
            _same(getattr(a, name), getattr(b, name), f"{want.episode_id}.turns[{t}].{name}")
    for j, (a, b) in enumerate(zip(want.sims, got.sims)):
        for name in vars(a):
            x, y = getattr(a, name), getattr(b, name)
            if name == "params":
                assert x == y, f"{want.episode_id}.sims[{j}].params"
                continue
            _same(x, y, f"{want.episode_id}.sims[{j}].{name}")
    assert got.total_reward == pytest.approx(want.total_reward)


# ---------------------------------------------------------------------------------------------
# Round trips and readers.
