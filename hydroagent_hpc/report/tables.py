"""The report's tables, computed with vectorised pandas from a :class:`CampaignResults`.

Every function returns a DataFrame with sorted rows and full-precision numbers (the CSV files);
rounding happens only when the Markdown is written. ``best NSE`` is each episode's own record
(``Episode.best_nse``); statistics over seeds are the mean and the sample standard deviation.
"""

from __future__ import annotations

import warnings

import numpy as np
import pandas as pd

from hydroagent_hpc.metrics import nse_band
from hydroagent_hpc.report.results import CampaignResults

__all__ = ["summary_table", "panel_table", "running_best", "curve_table", "checkpoint_table", "best_runs",
           "comparison_table", "COMPARE_METRICS", "CELL"]

CELL = ["agent", "basin_id"]

#: (column, label, higher is better) of the agent comparison; values are the best run's.
COMPARE_METRICS = (
    ("NSE", "NSE", True),
    ("r", "correlation r", True),
    ("peak_ratio_error", "peak-ratio error |Qs/Qo - 1|", False),
    ("abs_lag_h", "|peak lag| h", False),
)


def _first_present(df: pd.DataFrame, names: tuple[str, ...]) -> pd.Series:
    for name in names:
        if name in df.columns:
            return pd.to_numeric(df[name], errors="coerce").astype(float)
    return pd.Series(np.nan, index=df.index)


def _tokens(eps: pd.DataFrame) -> pd.Series:
    total = _first_present(eps, ("usage.total_tokens",))
    parts = _first_present(eps, ("usage.prompt_tokens",)) + _first_present(eps, ("usage.completion_tokens",))
    return total.fillna(parts)


def _stop_reasons(eps: pd.DataFrame) -> pd.Series:
    """``"reason: count, ..."`` per cell, most frequent first, then by name."""
    counts = eps.groupby(CELL + ["stop_reason"], sort=True).size().rename("n").reset_index()
    counts = counts.sort_values(CELL + ["n", "stop_reason"], ascending=[True, True, False, True], kind="stable")
    counts["text"] = counts["stop_reason"].astype(str).replace("", "(none)") + ": " + counts["n"].astype(str)
    return counts.groupby(CELL, sort=True)["text"].agg(", ".join)


def summary_table(res: CampaignResults) -> pd.DataFrame:
    """One row per agent and basin (sorted by basin, then agent): the paper's Table 1 and Figure 2.

    Columns: ``basin_id, agent, episodes, seeds, best_nse_mean, best_nse_std, best_nse_min,
    best_nse_max, no_nse`` (episodes without a scored run), ``band`` (Moriasi 2015 band of the
    mean), ``target_nse, target_hits``, ``sims_mean, turns_mean, rounds_mean,
    parse_failures_mean, parse_failures_total, wall_time_s_mean, wall_time_s_total,
    tokens_mean, cost_usd_mean, cost_usd_total`` (NaN where not recorded), ``stop_reasons``.
    """
    eps = res.episodes
    work = pd.DataFrame({
        "agent": eps["agent"].astype(str), "basin_id": eps["basin_id"].astype(str), "seed": eps["seed"],
        "best_nse": pd.to_numeric(eps["best_nse"], errors="coerce").astype(float),
        "sims": _first_present(eps, ("counters.simulations", "n_sims")).fillna(eps["n_sims"].astype(float)),
        "turns": _first_present(eps, ("counters.turns",)).fillna(eps["n_turns"].astype(float)),
        "rounds": _first_present(eps, ("counters.rounds",)),
        "parse_failures": _first_present(eps, ("counters.parse_failures",)),
        "wall_time_s": eps["wall_time_s"].astype(float),
        "tokens": _tokens(eps), "cost_usd": _first_present(eps, ("usage.cost_usd",)),
    })
    targets = res.basins.set_index("basin_id")["target_nse"] if "target_nse" in res.basins.columns else None
    work["target_nse"] = (work["basin_id"].map(targets).astype(float) if targets is not None
                          else pd.Series(np.nan, index=work.index))
    work["hit"] = (work["best_nse"] >= work["target_nse"]).astype(int)
    g = work.groupby(CELL, sort=True)
    out = g.agg(episodes=("seed", "size"), seeds=("seed", "nunique"), best_nse_mean=("best_nse", "mean"),
                best_nse_std=("best_nse", "std"), best_nse_min=("best_nse", "min"), best_nse_max=("best_nse", "max"),
                target_nse=("target_nse", "first"), target_hits=("hit", "sum"), sims_mean=("sims", "mean"),
                turns_mean=("turns", "mean"), rounds_mean=("rounds", "mean"),
                parse_failures_mean=("parse_failures", "mean"), parse_failures_total=("parse_failures", "sum"),
                wall_time_s_mean=("wall_time_s", "mean"), wall_time_s_total=("wall_time_s", "sum"),
                tokens_mean=("tokens", "mean"), cost_usd_mean=("cost_usd", "mean"),
                cost_usd_total=("cost_usd", lambda s: s.sum(min_count=1)))
    out.insert(6, "no_nse", g["best_nse"].apply(lambda s: int(s.isna().sum())))
    out.insert(7, "band", [nse_band(v) for v in out["best_nse_mean"].tolist()])
    out["parse_failures_total"] = g["parse_failures"].sum(min_count=1)
    out["stop_reasons"] = _stop_reasons(work.assign(stop_reason=eps["stop_reason"].fillna("").astype(str)))
    out = out.reset_index()
    first = ["basin_id", "agent"]
    out = out[first + [c for c in out.columns if c not in first]]
    return out.sort_values(["basin_id", "agent"], kind="stable").reset_index(drop=True)


def panel_table(summary: pd.DataFrame) -> pd.DataFrame:
    """Per agent, over basins: mean and median of the per-basin mean best NSE (the paper's panel
    statistics), the number of basins, and the mean simulations and parse failures per episode."""
    g = summary.groupby("agent", sort=True)
    out = g.agg(basins=("basin_id", "nunique"), panel_mean_nse=("best_nse_mean", "mean"),
                panel_median_nse=("best_nse_mean", "median"), sims_mean=("sims_mean", "mean"),
                parse_failures_mean=("parse_failures_mean", "mean"), cost_usd_total=("cost_usd_total",
                                                                                     lambda s: s.sum(min_count=1)))
    out["band"] = [nse_band(v) for v in out["panel_mean_nse"].tolist()]
    return out.reset_index()


def running_best(res: CampaignResults) -> pd.DataFrame:
    """Running-best NSE per simulation: ``episode_id, agent, basin_id, seed, n, best`` where ``n``
    counts the episode's simulations (1-based, in run order) and ``best`` is the best NSE among the
    first ``n`` (``-inf`` until one is scored)."""
    s = res.sims
    nse = s["NSE"].to_numpy(float)
    nse = np.where(np.isfinite(nse), nse, -np.inf)
    ep = s["episode_id"]
    best = pd.Series(nse, index=s.index).groupby(ep, sort=False).cummax()
    n = ep.groupby(ep, sort=False).cumcount() + 1
    meta = res.episodes.set_index("episode_id")[["agent", "basin_id", "seed"]]
    out = pd.DataFrame({"episode_id": ep, "n": n.to_numpy(np.int64), "best": best.to_numpy(float)})
    return out.join(meta, on="episode_id")[["episode_id", "agent", "basin_id", "seed", "n", "best"]]


def curve_table(curves: pd.DataFrame) -> pd.DataFrame:
    """Running best over seeds per agent, basin and ``n``: ``seeds, median, q25, q75, min, max``.

    An episode that stopped before ``n`` simulations keeps its final best (a budget it did not
    need); one without a scored run yet is left out at that ``n`` (``seeds`` counts the rest).
    """
    parts = []
    for (agent, basin), cell in curves.groupby(CELL, sort=True):
        wide = cell.pivot(index="episode_id", columns="n", values="best").sort_index(axis=1).ffill(axis=1)
        arr = wide.to_numpy(float, copy=True)
        arr[~np.isfinite(arr)] = np.nan
        valid = np.isfinite(arr)
        counts = valid.sum(axis=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN columns: no seed scored by then
            median = np.nanmedian(arr, axis=0)
            q = np.nanpercentile(arr, [25, 75, 0, 100], axis=0)
        parts.append(pd.DataFrame({"agent": agent, "basin_id": basin, "n": wide.columns.to_numpy(np.int64),
                                   "seeds": counts, "median": median, "q25": q[0], "q75": q[1],
                                   "min": q[2], "max": q[3]}))
    if not parts:
        return pd.DataFrame(columns=["agent", "basin_id", "n", "seeds", "median", "q25", "q75", "min", "max"])
    return pd.concat(parts, ignore_index=True)


def checkpoint_table(curve: pd.DataFrame, checkpoints: tuple[int, ...] | None = None) -> pd.DataFrame:
    """Median running best after chosen numbers of simulations, one row per basin and agent.

    Default checkpoints: those of 10, 25, 50, 100, 200, 500, 1000, 2000 up to the largest budget,
    plus the largest budget itself.
    """
    if curve.empty:
        return pd.DataFrame(columns=["basin_id", "agent"])
    n_max = int(curve["n"].max())
    if checkpoints is None:
        checkpoints = tuple(sorted({c for c in (10, 25, 50, 100, 200, 500, 1000, 2000) if c < n_max} | {n_max}))
    rows = curve[curve["n"].isin(checkpoints)]
    wide = rows.pivot_table(index=["basin_id", "agent"], columns="n", values="median", aggfunc="first", dropna=False)
    wide = wide.reindex(columns=list(checkpoints))
    wide.columns = [f"NSE@{c}" for c in wide.columns]
    return wide.reset_index().sort_values(["basin_id", "agent"], kind="stable").reset_index(drop=True)


def best_runs(res: CampaignResults) -> pd.DataFrame:
    """Each episode's best run with its metrics: the episode columns ``episode_id, agent,
    basin_id, seed, best_nse, best_run``, the sims columns of that run (metrics and parameters),
    and ``r`` (KGE's correlation), ``peak_ratio_error`` = |peak_ratio - 1| and ``abs_lag_h``.
    Episodes without a best run have NaN metrics."""
    eps = res.episodes[["episode_id", "agent", "basin_id", "seed", "best_nse", "best_run"]].copy()
    eps["best_run"] = eps["best_run"].astype("Int64")
    sims = res.sims.drop(columns=["ok"]).rename(columns={"run_id": "best_run"})
    sims["best_run"] = sims["best_run"].astype("Int64")
    out = eps.merge(sims, on=["episode_id", "best_run"], how="left", validate="one_to_one")
    out["r"] = out["KGE_r"]
    out["peak_ratio_error"] = (out["peak_ratio"] - 1.0).abs()
    out["abs_lag_h"] = out["peak_lag_h"].abs()
    return out


def comparison_table(best: pd.DataFrame, base: str, other: str) -> pd.DataFrame:
    """Relative change of the best run's metrics from agent ``base`` to agent ``other``.

    One row per basin both agents ran, and a ``panel mean`` row (mean over those basins), each
    metric of :data:`COMPARE_METRICS` as ``<m>.base``, ``<m>.other`` (means over seeds) and
    ``<m>.change_pct`` = 100 (other - base) / |base| (NaN when base is 0), and ``<m>.better``:
    the agent whose value is better ("=" when equal, "" when undefined).
    """
    keys = [m for m, _, _ in COMPARE_METRICS]
    cell = best[best["agent"].isin([base, other])].groupby(CELL, sort=True)[keys].mean()
    a_all, b_all = (cell.xs(agent, level="agent") if agent in cell.index.get_level_values("agent")
                    else cell.iloc[:0].droplevel("agent") for agent in (base, other))
    basins = sorted(set(a_all.index) & set(b_all.index))
    a, b = a_all.reindex(basins), b_all.reindex(basins)
    a.loc["panel mean"], b.loc["panel mean"] = a.mean(), b.mean()
    out = pd.DataFrame(index=a.index)
    out.index.name = "basin_id"
    for key, _, higher in COMPARE_METRICS:
        va, vb = a[key].to_numpy(float), b[key].to_numpy(float)
        with np.errstate(all="ignore"):
            change = np.where(va != 0, 100.0 * (vb - va) / np.abs(va), np.nan)
        good = (vb > va) if higher else (vb < va)
        worse = (vb < va) if higher else (vb > va)
        better = np.where(good, other, np.where(worse, base, np.where(va == vb, "=", "")))
        better = np.where(np.isfinite(va) & np.isfinite(vb), better, "")
        out[f"{key}.base"], out[f"{key}.other"], out[f"{key}.change_pct"], out[f"{key}.better"] = va, vb, change, better
    return out.reset_index()
