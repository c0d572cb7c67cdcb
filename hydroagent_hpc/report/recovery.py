"""Parameter recovery on synthetic basins: the best run's multipliers against the hidden truth.

A synthetic basin's folder holds ``truth.json`` (the multipliers that made its "observed"
discharge; :func:`hydroagent_hpc.sim.synth.basins.read_truth`). The store records each basin's
control file (``Basin.control``); the folder is its parent. The report reads the truth after the
fact; agents never see it.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pandas as pd

from hydroagent_hpc.params import PARAMS, TUNABLE
from hydroagent_hpc.report.results import is_true
from hydroagent_hpc.sim.synth.basins import read_truth

__all__ = ["recovery_error", "load_truths", "recovery_table", "recovery_summary"]

log = logging.getLogger(__name__)


def _floor(name: str) -> float:
    return 0.01 * (PARAMS[name].upper - PARAMS[name].lower)


def recovery_error(best: dict[str, float], truth: dict[str, float]) -> float:
    """Mean |log10(best/truth)| over the tunable multipliers (0 = perfect; 0.3 = a factor of 2).

    ``alpha0`` and ``im`` may be 0: both sides are floored at 1 % of the parameter's range.
    """
    errs = []
    for k in TUNABLE:
        a, b = max(float(best[k]), _floor(k)), max(float(truth[k]), _floor(k))
        errs.append(abs(math.log10(a / b)))
    return float(np.mean(errs))


def load_truths(controls: dict[str, Path], basins: pd.DataFrame) -> tuple[dict[str, dict[str, float]], list[str]]:
    """``({basin_id: multipliers}, notes)`` for every basin whose folder (that of its control file,
    :meth:`CampaignResults.controls`) has a ``truth.json``.

    Notes name the synthetic basins (``Basin.synthetic``) whose truth could not be read.
    """
    truths: dict[str, dict[str, float]] = {}
    notes: list[str] = []
    synthetic = dict(zip(basins["basin_id"].astype(str), basins["synthetic"])) if "synthetic" in basins.columns else {}
    for basin_id, control in sorted(controls.items()):
        try:
            multipliers = read_truth(control.parent)["multipliers"]
            truths[basin_id] = {k: float(multipliers[k]) for k in TUNABLE}
        except (ValueError, KeyError, TypeError, OSError) as exc:
            if is_true(synthetic.get(basin_id)):
                notes.append(f"{basin_id}: no hidden truth readable in {control.parent} ({type(exc).__name__})")
            log.debug("%s: no truth (%s)", basin_id, exc)
    for basin_id, flag in sorted(synthetic.items()):
        if is_true(flag) and basin_id not in truths and basin_id not in controls:
            notes.append(f"{basin_id}: synthetic, but the store does not name its control file, so no truth")
    return truths, notes


def recovery_table(best: pd.DataFrame, truths: dict[str, dict[str, float]]) -> pd.DataFrame:
    """One row per episode on a basin with a truth: ``agent, basin_id, seed, episode_id,
    recovery_error`` and ``log10.<p>`` = log10(best/truth) of each tunable multiplier (floored as in
    :func:`recovery_error`). Episodes without a best run are left out."""
    rows = best[best["basin_id"].isin(list(truths)) & best["best_run"].notna()]
    cols = ["agent", "basin_id", "seed", "episode_id", "recovery_error", *(f"log10.{k}" for k in TUNABLE)]
    if rows.empty:
        return pd.DataFrame(columns=cols)
    truth = pd.DataFrame([truths[b] for b in rows["basin_id"]], index=rows.index)
    out = rows[["agent", "basin_id", "seed", "episode_id"]].copy()
    logs = {}
    for k in TUNABLE:
        floor = _floor(k)
        est = np.maximum(rows[k].to_numpy(float), floor)
        ref = np.maximum(truth[k].to_numpy(float), floor)
        logs[f"log10.{k}"] = np.log10(est / ref)
    logs_df = pd.DataFrame(logs, index=rows.index)
    out["recovery_error"] = logs_df.abs().mean(axis=1, skipna=False)
    out = pd.concat([out, logs_df], axis=1)
    return out.sort_values(["basin_id", "agent", "seed", "episode_id"], kind="stable").reset_index(drop=True)


def recovery_summary(table: pd.DataFrame) -> pd.DataFrame:
    """Per basin and agent: ``seeds``, median and mean recovery error, and the median log10 ratio
    of each multiplier."""
    if table.empty:
        return pd.DataFrame(columns=["basin_id", "agent", "seeds", "recovery_median", "recovery_mean"])
    g = table.groupby(["basin_id", "agent"], sort=True)
    out = g.agg(seeds=("seed", "size"), recovery_median=("recovery_error", "median"),
                recovery_mean=("recovery_error", "mean"))
    logs = g[[f"log10.{k}" for k in TUNABLE]].median()
    return pd.concat([out, logs], axis=1).reset_index()
