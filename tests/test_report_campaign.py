"""A report over a real (small) campaign on a synthetic basin: rain, truth and the best hydrograph."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from hydroagent_hpc.campaign import load_campaign, run_campaign
from hydroagent_hpc.metrics import nse
from hydroagent_hpc.report import write_report
from hydroagent_hpc.report.recovery import recovery_error
from hydroagent_hpc.sim.synth.basins import read_truth
from hydroagent_hpc.store import read_episodes, read_series, read_sims


@pytest.fixture(scope="module")
def campaign(tmp_path_factory, small_basin_dir) -> Path:
    root = tmp_path_factory.mktemp("report_campaign")
    spec = root / "c.yaml"
    spec.write_text(f"name: t\nbasins: [{small_basin_dir}]\nagents:\n  - {{name: heuristic, kind: heuristic}}\n"
                    "  - {name: random, kind: random}\nseeds: [0, 1]\n"
                    "env: {preset: paper, max_simulations: 8, max_turns: null, patience: null, target_nse: 0.99}\n")
    summary = run_campaign(load_campaign(spec), root / "c.h5", workers=1, progress=False)
    assert summary["ran"] == 4 and not summary["failed"]
    return root / "c.h5"


def test_report_of_a_real_campaign(campaign, small_basin_dir, tmp_path):
    rep = write_report(campaign, tmp_path / "r")
    assert rep.notes == []  # rain read from the basin's forcing, truth from its folder
    eps = read_episodes(campaign)
    top = eps.sort_values("best_nse", ascending=False).iloc[0]
    hyd = pd.read_csv(rep.out / "tables" / "hydrographs.csv").iloc[0]
    assert (hyd["episode_id"], hyd["run_id"], hyd["precipitation"]) == (top["episode_id"], top["best_run"], "shown")
    s = read_series(campaign, top["episode_id"], run_id=int(top["best_run"]))
    mask = ~s.warmup & np.isfinite(s.observed) & (s.observed > -998)
    assert hyd["NSE"] == pytest.approx(nse(s.observed[mask], s.discharge[mask].astype(float)), abs=1e-6)
    assert (rep.out / "figures" / "hydrograph_syn_small.png").stat().st_size > 10_000
    truth = read_truth(small_basin_dir)["multipliers"]
    sims = read_sims(campaign)
    rec = pd.read_csv(rep.out / "tables" / "recovery.csv").set_index("episode_id")
    for ep in eps.itertuples():
        best = sims[(sims.episode_id == ep.episode_id) & (sims.run_id == ep.best_run)].iloc[0]
        assert rec.loc[ep.episode_id, "recovery_error"] == pytest.approx(recovery_error(best.to_dict(), truth))
    md = rep.markdown.read_text()
    assert "| syn_small | heuristic | 2 |" in md and "max_simulations: 2" in md
    assert "Agent **" in md and "No basin of this store is one of the paper's gauges" in md
