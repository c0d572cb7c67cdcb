"""A campaign's results as the report reads them: episodes, simulations and basins of one store.

:func:`load_results` reads the store once (three bulk reads, no per-episode HDF5 calls), checks
that it can be reported on and keeps only the simulation columns the report uses. The errors
are the store's own (:mod:`hydroagent_hpc.store.errors`); each names the file and the fix.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.store import (
    StoreError,
    StoreHealth,
    StoreInfo,
    inspect_store,
    read_basins,
    read_episodes,
    read_sims,
    verify_store,
)

__all__ = ["CampaignResults", "load_results", "SIM_METRICS", "is_true"]

log = logging.getLogger(__name__)

#: Metric columns of ``read_sims`` the report uses (absent ones are added as NaN).
SIM_METRICS = ("NSE", "KGE", "KGE_r", "PBIAS", "peak_ratio", "peak_error_pct", "peak_lag_h", "peak_timing_mae_h")


@dataclass(frozen=True)
class CampaignResults:
    """Committed episodes of one store, sorted for deterministic reports.

    ``episodes``: one row per episode (``read_episodes`` columns), sorted by agent, basin, seed and
    id. ``sims``: ``episode_id, run_id, ok``, :data:`SIM_METRICS` and the 13 parameters, sorted by
    episode id and run id. ``basins``: ``read_basins`` with ``basin_id`` unique (the first record
    of a basin written with several windows). ``info``: what :func:`inspect_store` found.
    ``health``: what :func:`verify_store` found (see :attr:`damage`).
    """

    path: Path
    episodes: pd.DataFrame
    sims: pd.DataFrame
    basins: pd.DataFrame
    info: StoreInfo
    health: StoreHealth | None = None

    @property
    def damage(self) -> str | None:
        """One line naming the store's damaged episodes (and other damage), or None when it is intact.

        The report's tables read only parts that checked out (a damaged part they need stops the
        report), but an episode with any damaged part is not a finished episode, so the report says so.
        """
        if self.health is None or self.health.ok:
            return None
        h = self.health
        parts = list(h.problems)
        if h.damaged:
            shown = [f"{k} ({v})" for k, v in list(h.damaged.items())[:10]]
            more = f" and {len(h.damaged) - 10} more" if len(h.damaged) > 10 else ""
            parts.append(f"{len(h.damaged)} episode(s) with damaged parts: {', '.join(shown)}{more}")
        return "; ".join(parts)

    @property
    def agents(self) -> list[str]:
        """Agent names, sorted."""
        return sorted(self.episodes["agent"].unique().tolist())

    @property
    def basin_ids(self) -> list[str]:
        """Basin ids, sorted."""
        return sorted(self.episodes["basin_id"].unique().tolist())

    def controls(self) -> dict[str, Path]:
        """Control file of each basin whose record names one (``Basin.control``); a relative path
        is taken against the working directory if it exists there, else against the store's folder."""
        out: dict[str, Path] = {}
        if "control" not in self.basins.columns:
            return out
        for basin_id, control in zip(self.basins["basin_id"].tolist(), self.basins["control"].tolist()):
            if isinstance(control, str) and control:
                path = Path(control)
                if not path.is_absolute() and not path.exists():
                    path = self.path.parent / path
                out[str(basin_id)] = path
        return out

    @property
    def partial(self) -> bool:
        """True when a writer has the file open or was killed (the campaign may not be complete)."""
        return not self.info.closed_cleanly


def is_true(value: object) -> bool:
    """A Basin flag as read back from the store's basins table: True, a numpy bool, None or NaN."""
    return value is not None and value is not pd.NA and not (isinstance(value, float) and np.isnan(value)) \
        and bool(value)


def _check_reportable(info: StoreInfo, allow_partial: bool) -> None:
    path = info.path
    if not info.closed_cleanly and not allow_partial:
        raise StoreError(
            f"{path}: partial store: a writer has it open or was killed before closing it "
            f"({info.episodes} episodes committed so far); wait for the campaign to finish or rerun it "
            f"to complete the file (`hydroagent campaign run ... --out {path}` resumes), or pass --partial "
            f"(allow_partial=True) to report the committed episodes")
    if info.episodes == 0:
        state = "still being written or left by a killed writer" if not info.closed_cleanly else "closed"
        raise StoreError(f"{path}: no committed episodes (the store is {state}); run a campaign into it first "
                         f"(`hydroagent campaign run CAMPAIGN.yaml --out {path}`)")


def load_results(path: str | os.PathLike[str], allow_partial: bool = False) -> CampaignResults:
    """Read a store for a report.

    Raises ``FileNotFoundError`` for a missing file, ``SchemaError`` for a file that is not a
    store of this schema version (not HDF5, foreign, older or newer), and ``StoreError`` for a
    store without committed episodes, or for a partial one (a writer holds it or was killed)
    unless ``allow_partial``.
    """
    p = Path(path)
    if p.is_dir():
        raise StoreError(f"{p}: is a folder, not an episode store; pass the campaign's .h5 file")
    info = inspect_store(p)
    _check_reportable(info, allow_partial)
    health = verify_store(p)  # every checksum, also of the parts no table reads
    episodes = (read_episodes(p).sort_values(["agent", "basin_id", "seed", "episode_id"], kind="stable")
                .reset_index(drop=True))
    sims = _sim_columns(read_sims(p))
    basins = read_basins(p).drop_duplicates("basin_id", keep="first").sort_values("basin_id", kind="stable")
    log.debug("%s: %d episodes, %d simulations, %d basins", p, len(episodes), len(sims), len(basins))
    res = CampaignResults(p, episodes, sims, basins.reset_index(drop=True), info, health)
    if res.damage:
        log.warning("%s: damaged store: %s; the report shows what checks out. `hydroagent store verify %s` lists "
                    "the damage; `hydroagent store salvage %s NEW.h5` copies the intact episodes", p, res.damage, p,
                    p)
    return res


def _sim_columns(sims: pd.DataFrame) -> pd.DataFrame:
    """The columns the report uses, floats as float64 (NaN for missing), sorted by episode and run."""
    out = pd.DataFrame({"episode_id": sims["episode_id"].astype(str), "run_id": sims["run_id"].astype(np.int64),
                        "ok": sims["ok"].astype(bool)})
    n = len(sims)
    for name in (*SIM_METRICS, *PARAM_NAMES):
        col = sims[name] if name in sims.columns else None
        out[name] = np.full(n, np.nan) if col is None else pd.to_numeric(col, errors="coerce").astype(float).to_numpy()
    return out.sort_values(["episode_id", "run_id"], kind="stable").reset_index(drop=True)
