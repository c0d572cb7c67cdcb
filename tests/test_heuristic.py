"""The heuristic hydrologist: text protocol, determinism, and that it actually calibrates."""

from __future__ import annotations

import pytest

from hydroagent_hpc.agents.heuristic import HeuristicHydrologist
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import parse_message
from hydroagent_hpc.sim.basin import load_basin


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def _episode(basin, sim, seed=0, name="paper", **over):
    cfg = preset(name, max_simulations=over.pop("max_simulations", 60), max_turns=None, patience=None,
                 target_nse=0.999, wall_clock_s=None, **over)
    return run_episode(HeuristicHydrologist(seed=seed), CalibrationEnv(basin, sim, cfg, agent="heuristic", seed=seed))


def test_calibrates_and_speaks_the_tool_format(basin, small_sim):
    ep = _episode(basin, small_sim)
    assert ep.counters["parse_failures"] == 0 and ep.counters["simulations"] >= 10
    first = ep.sims[0].metrics["NSE"]
    assert ep.best_nse > max(first, 0.5) and ep.best_nse > 0.8
    for t in ep.turns:
        if t.text:  # every message: a diagnosis, then exactly one call
            parsed = parse_message(t.text)
            assert len(parsed.calls) == 1 and not parsed.failures and parsed.text.strip()
    assert [t.tool for t in ep.turns[:3]] == ["set_parameters", "run_simulation", "evaluate"]


def test_deterministic_for_a_seed(basin, small_sim):
    a = _episode(basin, small_sim, seed=3, max_simulations=15)
    b = _episode(basin, small_sim, seed=3, max_simulations=15)
    assert [s.params for s in a.sims] == [s.params for s in b.sims]
    assert [t.text for t in a.turns] == [t.text for t in b.turns]


def test_works_with_released_observations(basin, small_sim):
    ep = _episode(basin, small_sim, name="released", max_simulations=25)
    assert ep.counters["parse_failures"] == 0 and ep.best_nse is not None and ep.best_nse > ep.sims[0].metrics["NSE"]
