"""Batched greedy evaluation (train/evaluation.py) plays what a campaign's ``hf_local`` agent plays,
and a campaign agent's own ``seeds`` replace the campaign's."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from hydroagent_hpc.campaign import campaign_from_mapping, run_campaign
from hydroagent_hpc.campaign.spec import expand
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.store import read_episodes, read_turns
from hydroagent_hpc.train.evaluation import evaluate_policy

ENV = {"max_turns": 2}  # the prompt calling_policy (tests/test_grpo_train.py) was taught on


def _calls(store: Path, agent: str) -> dict[str, list[tuple[str, str, str]]]:
    eps = read_episodes(store)
    turns = read_turns(store)
    out = {}
    for _, ep in eps[eps.agent == agent].iterrows():
        rows = turns[turns.episode_id == ep.episode_id].sort_values("index")
        out[str(ep.basin_id)] = [(str(r.kind), str(r.tool), str(r.text)) for r in rows.itertuples()]
    return out


@pytest.mark.slow
def test_batched_greedy_evaluation_plays_the_episodes_an_hf_local_agent_plays(caller, grpo_basins, tmp_path):
    basins = [str(grpo_basins / "b1"), str(grpo_basins / "b2")]
    campaign = campaign_from_mapping({"name": "eval", "basins": basins, "seeds": [0],
                                      "env": {"preset": "paper", "protocol": "turns", **ENV},
                                      "agents": [{"name": "policy", "kind": "hf_local", "path": str(caller),
                                                  "greedy": True, "max_new_tokens": 32}]})
    run_campaign(campaign, tmp_path / "campaign.h5", progress=False)
    summary = evaluate_policy(caller, basins, tmp_path / "batched.h5", agent="policy", seeds=(0,), env=ENV,
                              max_new_tokens=32)
    assert summary["played"] == 2
    a, b = read_episodes(tmp_path / "campaign.h5"), read_episodes(tmp_path / "batched.h5")
    assert sorted(b.episode_id) == ["policy/syn_b1/0", "policy/syn_b2/0"]
    assert _calls(tmp_path / "batched.h5", "policy") == _calls(tmp_path / "campaign.h5", "policy")
    # the policy makes a valid simulation on each basin, and both paths score it the same
    assert (a.n_sims > 0).all()
    for col in ("n_sims", "best_nse", "total_reward", "n_turns"):
        assert np.array_equal(a.sort_values("basin_id")[col].to_numpy(float),
                              b.sort_values("basin_id")[col].to_numpy(float), equal_nan=True), col
    # one episode per batch (the learning bench decodes 12 at a time) plays the same turns
    evaluate_policy(caller, basins, tmp_path / "alone.h5", agent="policy", seeds=(0,), env=ENV, max_new_tokens=32,
                    generation_batch=1)
    assert _calls(tmp_path / "alone.h5", "policy") == _calls(tmp_path / "batched.h5", "policy")
    # resumable: stored episodes are not played again
    again = evaluate_policy(caller, basins, tmp_path / "batched.h5", agent="policy", seeds=(0,), env=ENV,
                            max_new_tokens=32)
    assert again["played"] == 0 and len(read_episodes(tmp_path / "batched.h5")) == 2


def test_an_agents_own_seeds_replace_the_campaigns(small_basin_dir):
    spec = campaign_from_mapping({"name": "c", "basins": [str(small_basin_dir)], "seeds": [0, 1, 2],
                                  "agents": [{"name": "dds", "kind": "dds"},
                                             {"name": "once", "kind": "random", "seeds": [5]}]})
    ids = [t.episode_id for t in expand(spec)]
    assert [i for i in ids if "/dds/" in i] == [f"c/syn_small/dds/{s}" for s in (0, 1, 2)]
    assert [i for i in ids if "/once/" in i] == ["c/syn_small/once/5"]
    with pytest.raises(ConfigError, match=r"agents\[0\]\.seeds\[1\]: 3 is listed twice") as err:
        campaign_from_mapping({"name": "c", "basins": [str(small_basin_dir)],
                               "agents": [{"kind": "dds", "seeds": [3, 3]}]})
    assert err.value.at == ("agents", 0, "seeds", 1) and "each listed once" in err.value.fix
    with pytest.raises(ConfigError, match=r"agents\[0\]\.seeds: must not be empty"):
        campaign_from_mapping({"name": "c", "basins": [str(small_basin_dir)], "agents": [{"kind": "dds", "seeds": []}]})
