"""The learning bench (bench/learning.py) runs the real recipe end to end at toy sizes, scores every
row on the same held-out basins, and resumes: a rerun runs nothing, a changed recipe is refused, and
more ablation cells extend a finished bench."""

from __future__ import annotations

import dataclasses
import json

import pytest

from hydroagent_hpc.bench.learning import QUICK, run, units

TOY = dataclasses.replace(QUICK, heldout=1, teach=1, max_turns=2, max_simulations=1, sft_steps=2, grpo_steps=1,
                          max_new_tokens=16, ablation=0)


@pytest.mark.slow
def test_the_bench_scores_every_row_and_resumes(tmp_path):
    out = tmp_path / "bench"
    result = run(out, TOY, jobs=2, progress=False)
    rows = {r["row"]: r for r in result["rows"]}
    assert list(rows) == ["Base", "SFT", "SFT+GRPO", "heuristic", "DDS", "random", "DDS (every simulation)",
                          "random (every simulation)"]
    assert rows["random (every simulation)"]["sims"] == TOY.max_simulations  # calls enough for every simulation
    for name in ("SFT", "SFT+GRPO", "Base"):
        assert rows[name]["n"] == 1 and rows[name]["sims"] <= TOY.max_simulations
    assert rows["heuristic"]["valid_calls"] == 1.0 and rows["heuristic"]["sims"] >= 1
    assert result["units_done"] == result["units"] == len(units(TOY))
    curves = (out / "tables" / "curves.csv").read_text().splitlines()
    assert curves[0].startswith("step,reward,reward_sd,valid_calls") and [r.split(",")[0] for r in curves[1:]] == \
        ["0", "1"]  # validated before the first step and after the last
    report = (out / "report.md").read_text()
    assert "| SFT+GRPO | 1 model x data seeds |" in report and "## Goals" in report
    assert "degenerate_share" in (out / "tables" / "signal.csv").read_text()
    stamps = {p: p.stat().st_mtime_ns for p in out.rglob("done.json")}
    run(out, TOY, jobs=2, progress=False)  # everything done: nothing runs again
    assert {p: p.stat().st_mtime_ns for p in out.rglob("done.json")} == stamps
    with pytest.raises(SystemExit, match=r"other settings \(grpo_lr\)"):
        run(out, dataclasses.replace(TOY, grpo_lr=1e-3), jobs=1, progress=False)
    # one ablation cell more: the same SFT, two more GRPO runs (turn, released) and their evaluations
    extended = run(out, dataclasses.replace(TOY, ablation=1), jobs=2, progress=False)
    assert [r["row"] for r in extended["ablation"]] == ["SFT (the same cells)", "GRPO episode", "GRPO turn",
                                                        "GRPO released"]
    assert {p: p.stat().st_mtime_ns for p in stamps} == stamps
    assert json.loads((out / "plan.json").read_text())["ablation"] == 1
