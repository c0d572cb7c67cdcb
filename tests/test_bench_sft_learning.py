"""The scoring of ``bench.sft_learning`` (valid-call share and recoveries) on a real evaluation store.

A scripted agent writes malformed calls and valid ones in a known order on the session's synthetic
basin; the campaign, environment and store are real.
"""

from __future__ import annotations

import json

import pytest

from hydroagent_hpc.bench.sft_learning import score_policies
from hydroagent_hpc.campaign import load_campaign, run_campaign

BAD = "Trying. <tool_call>\n{\"name\": \"run_simulation\", \"arguments\": {}\n</tool_call>"
RUN = "<tool_call>\n{\"name\": \"run_simulation\", \"arguments\": {}}\n</tool_call>"


def test_recoveries_count_parse_failures_followed_by_a_valid_call(tmp_path, small_basin_dir):
    # messages: 0 bad, 1 run (recovers 0), 2 bad, 3 bad and a run (2 not recovered: 3 failed too),
    # 4 evaluate (recovers 3)
    script = tmp_path / "script.json"
    script.write_text(json.dumps([BAD, {"name": "run_simulation"}, BAD, BAD + "\n" + RUN, {"name": "evaluate"}]))
    spec = tmp_path / "eval.yaml"
    spec.write_text(f"name: eval\nbasins: [{small_basin_dir}]\nagents:\n"
                    f"  - {{name: s, kind: scripted, script: {script}}}\nseeds: [0]\n"
                    "env: {preset: paper, max_simulations: 3, max_turns: null, patience: null}\n")
    run_campaign(load_campaign(spec), tmp_path / "eval.h5", workers=1, progress=False)
    p = score_policies(tmp_path / "eval.h5")["s"]
    assert p["episodes"] == 1 and p["messages"] == 5 and p["parse_failure_messages"] == 3
    assert p["recoveries"] == 2 and p["valid_call_share"] == 2 / 5 and p["scored_episodes"] == 1


@pytest.mark.slow
def test_evaluate_only_scores_the_saved_models_on_more_heldout_basins(tmp_path):
    """``--evaluate-only``: the base and final models already in --out, the run's evaluation on N basins."""

    from hydroagent_hpc.bench.sft_learning import evaluate_again
    from hydroagent_hpc.train.tiny import save_tiny

    with pytest.raises(SystemExit, match="no finished run"):
        evaluate_again(tmp_path, heldout=1)
    save_tiny(tmp_path / "base", seed=0)
    save_tiny(tmp_path / "run" / "final", seed=0)
    r = evaluate_again(tmp_path, heldout=1, sims=1, turns=2)
    assert set(r["policies"]) == {"base", "sft"} and r["heldout_basins"] == 1
    assert all(p["episodes"] == 1 and 1 <= p["messages"] <= 2 for p in r["policies"].values())
    assert json.loads((tmp_path / "result-heldout1.json").read_text())["policies"] == r["policies"]
    assert (tmp_path / "eval-heldout1.h5").is_file() and (tmp_path / "basins" / "syn_heldout").is_dir()
