"""bench/blind.py: the ceiling of a policy that never reads its observations, and the count of distinct
move sequences that says whether a trained policy's moves depended on the basin."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hydroagent_hpc.bench.blind import blind_ceiling, moves, nse_table, reading
from hydroagent_hpc.campaign import campaign_from_mapping, run_campaign
from hydroagent_hpc.sim.synth.basins import synthesize_basin
from hydroagent_hpc.store import read_episodes


@pytest.fixture(scope="module")
def basins(tmp_path_factory):
    root = tmp_path_factory.mktemp("blind-basins")
    for i in range(2):
        synthesize_basin(root / f"b{i}", name=f"syn_b{i}", area_km2=80.0, window_days=10, warmup_days=3,
                         seed=(1001, 1006)[i], start="2021-07-01")
    return sorted(root.iterdir())


def test_the_ceiling_of_a_hand_made_table():
    """Two values each best on one basin: the pair reaches both, a single value neither; the oracle is the
    per-basin best (a pair scored by the worse of its two, or the oracle by the mean, fails this)."""
    table = {1.0: np.array([0.9, 0.1]), 2.0: np.array([0.1, 0.9]), 3.0: np.array([0.5, 0.6])}
    c = blind_ceiling(table)
    assert c["best_single"] == 3.0 and c["best_single_nse"] == pytest.approx(0.55)
    assert sorted(c["best_pair"]) == [1.0, 2.0] and c["best_pair_nse"] == pytest.approx(0.9)
    assert c["oracle_nse"] == pytest.approx(0.9) and c["basins"] == 2
    with pytest.raises(ValueError, match="empty"):
        blind_ceiling({})


def test_the_table_is_the_environments_nse_and_moves_count_what_depends_on_the_basin(basins, tmp_path):
    table = nse_table(basins, "alpha0", [0.2, 0.5, 1.0])
    assert list(table) == [0.2, 0.5, 1.0] and all(v.shape == (2,) for v in table.values())
    c = blind_ceiling(table)
    assert c["best_single_nse"] <= c["best_pair_nse"] <= c["oracle_nse"]
    # the heuristic's first simulation is alpha0 = 0.5 with every other multiplier at its default
    script = tmp_path / "blind.json"
    script.write_text(json.dumps([{"name": "set_parameters", "arguments": {"alpha0": 0.5}},
                                  {"name": "run_simulation"}, {"name": "evaluate"},
                                  {"name": "set_parameters", "arguments": {"alpha0": 1.0}},
                                  {"name": "run_simulation"}, {"name": "evaluate"}]))
    spec = campaign_from_mapping({
        "name": "blind", "basins": [str(b) for b in basins], "seeds": [0],
        "env": {"preset": "paper", "protocol": "turns", "max_turns": 6, "max_simulations": 2, "patience": None,
                "stop_at_target": False, "observation": "released"},  # the bench's: peak ratio, no volume
        "agents": [{"name": "heuristic", "kind": "heuristic"},
                   {"name": "scripted", "kind": "scripted", "script": str(script)}]})
    store = tmp_path / "c.h5"
    run_campaign(spec, store, progress=False)
    blind, teacher = moves(store, "scripted"), moves(store, "heuristic")
    assert blind["episodes"] == teacher["episodes"] == 2
    assert blind["distinct_sequences"] == 1 and teacher["distinct_sequences"] == 2
    ids = list(read_episodes(store).query("agent == 'heuristic'").episode_id)
    assert moves(store, episode_ids=ids)["distinct_sequences"] == 2  # the bench's score passes its own ids
    with pytest.raises(ValueError, match="not both"):
        moves(store, "heuristic", episode_ids=ids)
    firsts = [seq[0] for seq in teacher["sequences"].values()]
    assert firsts[0] == firsts[1]  # the same first guess on both basins; the second move read the basin
    eps = read_episodes(store).set_index("agent")
    assert eps.loc["scripted"].best_nse.to_numpy() == pytest.approx(np.maximum(table[0.5], table[1.0]))
    # reading: the teacher follows its own rule on a high-peak and a low-peak basin; the script raises on both
    follows = reading(store, ids)
    assert (follows["high"], follows["low"]) == (1, 1) and follows["reads"] == 1.0, follows
    blind_ids = list(read_episodes(store).query("agent == 'scripted'").episode_id)
    assert reading(store, blind_ids) == {"high": 1, "raised": 1, "low": 1, "lowered": 0, "reads": 0.5}
