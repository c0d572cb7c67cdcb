"""Each basin's best run: which one it is, its series from the store, and the basin's rain.

The store keeps the discharge of every run and the observed series once per basin, but not
the forcing; the basin-mean precipitation is read from the basin's control file (the same
area-weighted mean upstream of the gauge the simulator computes, through the forcing cache).
When the control file is gone the hydrograph is drawn without rain and the report says why.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import HydroAgentError
from hydroagent_hpc.store import read_series

__all__ = ["BestRun", "best_run_per_basin", "basin_precip", "load_best_series", "file_stem"]

log = logging.getLogger(__name__)


def file_stem(name: str) -> str:
    """A file-name-safe form of a basin id."""
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def best_run_per_basin(best: pd.DataFrame) -> pd.DataFrame:
    """Per basin, the episode with the highest best NSE (ties: first by agent, seed, id).

    ``best`` is :func:`~hydroagent_hpc.report.tables.best_runs`; episodes without a best run are
    skipped, so a basin where no episode scored a run has no row.
    """
    ok = best[best["best_run"].notna() & np.isfinite(best["best_nse"].astype(float))]
    ranked = ok.sort_values(["basin_id", "best_nse", "agent", "seed", "episode_id"],
                            ascending=[True, False, True, True, True], kind="stable")
    return ranked.drop_duplicates("basin_id", keep="first").reset_index(drop=True)


def basin_precip(control: Path, times: np.ndarray) -> tuple[np.ndarray | None, str]:
    """Basin-mean precipitation (mm/h) at ``times`` from the control file, or ``(None, why)``.

    Steps the control file does not cover are NaN.
    """
    if not control.is_file():
        return None, f"control file {control} not found"
    try:

        sim = EmbeddedSimulator(control)
    except (HydroAgentError, OSError, ValueError, KeyError) as exc:
        return None, f"could not read the forcing of {control}: {exc}".splitlines()[0]
    gi = list(sim.net.gauge_names).index(sim.primary)
    values = np.asarray(sim.precip_mean[:, gi], dtype=float)
    pos = pd.Index(sim.times.astype("datetime64[m]")).get_indexer(np.asarray(times).astype("datetime64[m]"))
    out = np.where(pos >= 0, values[np.clip(pos, 0, None)], np.nan)
    return out, ""


@dataclass(frozen=True)
class BestRun:
    """The series of one basin's best run."""

    times: np.ndarray
    observed: np.ndarray
    simulated: np.ndarray
    warmup: np.ndarray | None


def load_best_series(store: Path, episode_id: str, run_id: int) -> BestRun | None:
    """The best run's discharge with the basin's series, or None when the store kept no
    discharge for it (or no time stamps)."""
    try:
        s = read_series(store, episode_id, run_id=int(run_id))
    except KeyError as exc:
        log.info("%s: %s", episode_id, exc)
        return None
    if s.times is None or s.observed is None:
        return None
    n = min(len(s.times), len(s.discharge), len(s.observed))
    warm = None if s.warmup is None else np.asarray(s.warmup[:n], dtype=bool)
    return BestRun(np.asarray(s.times[:n]), np.asarray(s.observed[:n], dtype=float),
                   np.asarray(s.discharge[:n], dtype=float), warm)
