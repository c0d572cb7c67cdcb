"""Every agent kind a campaign can name builds and runs an episode within the budget."""

from __future__ import annotations

import pytest

from hydroagent_hpc.agents.factory import make_agent
from hydroagent_hpc.campaign import AgentSpec
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.sim.basin import load_basin


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


CFG = preset("paper", max_simulations=12, max_turns=None, patience=None, target_nse=0.999, wall_clock_s=None)


@pytest.mark.parametrize("kind,options", [("heuristic", {}), ("dds", {}), ("sceua", {}), ("lhs", {}), ("random", {}),
                                          ("dream", {}), ("hybrid", {"warm_simulations": 6})])
def test_kinds_run_within_budget(basin, small_sim, kind, options):
    ep = run_episode(make_agent(AgentSpec(kind, kind, options), 0, CFG),
                     CalibrationEnv(basin, small_sim, CFG, agent=kind))
    assert 1 <= ep.counters["simulations"] <= 12 and ep.counters["parse_failures"] == 0
    assert ep.best_nse is not None and ep.best_nse > ep.sims[0].metrics["NSE"] - 1e-12


def test_hybrid_hands_the_heuristic_best_to_dds(basin, small_sim):
    cfg = preset("paper", max_simulations=16, max_turns=None, patience=None, target_nse=0.999, wall_clock_s=None)
    ep = run_episode(make_agent(AgentSpec("hyb", "hybrid", {"warm_simulations": 8}), 0, cfg),
                     CalibrationEnv(basin, small_sim, cfg, agent="hyb"))
    texts = [t for t in ep.turns if t.text]  # the heuristic's messages (DDS uses the direct tools)
    assert texts and ep.counters["simulations"] == 16
    warm_best = max(s.metrics["NSE"] for s in ep.sims[:8])
    assert ep.best_nse >= warm_best


@pytest.mark.parametrize("kind,options,msg", [("heuristic", {"colour": 1}, "takes no option 'colour'"),
                                              ("hf_local", {}, "needs option path"),
                                              ("scripted", {}, "needs option script")])
def test_bad_options(kind, options, msg):
    with pytest.raises(ValueError, match=msg):
        make_agent(AgentSpec(kind, kind, options), 0, CFG)
