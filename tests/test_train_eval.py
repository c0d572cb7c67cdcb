"""``hydroagent train eval CHECKPOINT_OR_URL`` (campaign/evaluate.py): a checkpoint folder or an OpenAI-compatible
URL evaluated as a campaign into a store, with the summary table printed.

Real parts: the tiny Qwen3 saved as a checkpoint folder (random weights: it writes garbage the environment
answers with parse failures), the session's synthetic basin and the embedded simulator, the replay server as
the OpenAI-compatible endpoint, the models file of the repository.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("torch")
pytest.importorskip("transformers")

from hydroagent_hpc.agents.llm.replay_server import ReplayServer
from hydroagent_hpc.campaign.evaluate import evaluation_agent
from hydroagent_hpc.cli import main
from hydroagent_hpc.errors import ConfigError, UsageError
from hydroagent_hpc.store import read_episodes, read_turns
from hydroagent_hpc.train import tiny


@pytest.mark.slow  # ~23 s on 2 shared cores: two greedy episodes of the tiny model and a resumed rerun
def test_a_checkpoint_folder_plays_greedy_episodes_into_a_store_and_prints_the_table(tmp_path, small_basin_dir,
                                                                                      capsys):
    ckpt = tiny.save_tiny(tmp_path / "ckpt")
    out = tmp_path / "eval.h5"
    argv = ["train", "eval", str(ckpt), "--basins", str(small_basin_dir), "--budget", "2", "--max-turns", "2",
            "--max-new-tokens", "12", "--seeds", "0", "1", "--out", str(out)]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    assert printed.splitlines()[0].split()[:3] == ["basin", "seed", "best"]
    assert sum(line.startswith("syn_small ") for line in printed.splitlines()) == 2
    assert "2 episodes" in printed and f"stored in {out}" in printed
    eps = read_episodes(out)
    assert sorted(eps["episode_id"]) == ["eval/syn_small/eval/0", "eval/syn_small/eval/1"]
    assert (eps["counters.turns"] <= 2).all()
    config = json.loads(eps["config"].iloc[0])
    assert config["env"]["max_simulations"] == 2 and config["env"]["preset"] == "paper"
    turns = read_turns(out)
    texts = {eid: list(g.sort_values("index")["text"]) for eid, g in turns.groupby("episode_id")}
    assert len(texts) == 2 and texts["eval/syn_small/eval/0"] == texts["eval/syn_small/eval/1"]  # greedy
    assert main(argv + ["--json"]) == 0  # a rerun resumes: nothing is played again
    again = json.loads(capsys.readouterr().out)
    assert again["already_stored"] == 2 and again["ran"] == 0 and len(again["rows"]) == 2


def _reply(text: str) -> dict:
    return {"id": "x", "object": "chat.completion", "created": 0, "model": "hydroagent-4b",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}}


def test_a_url_plays_through_the_openai_agent_at_temperature_0(tmp_path, small_basin_dir, capsys, monkeypatch):
    models = tmp_path / "models.yaml"  # an entry that samples at 0.9: eval must send 0
    models.write_text("models:\n  warm:\n    provider: replay\n    model: warm-1\n    base_url: http://127.0.0.1:9/v1\n"
                      "    api_key_required: false\n    tool_mode: hermes\n    sampling: {temperature: 0.9}\n")
    monkeypatch.setenv("HYDROAGENT_MODELS", str(models))
    call = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>'
    script = [_reply("Run it.\n" + call.format("run_simulation")), _reply("Score it.\n" + call.format("evaluate"))]
    script += [_reply("Done.")] * 4
    out = tmp_path / "url.h5"
    with ReplayServer({"responses": script, "strict": False}) as srv:  # Hermes text: tool replies answer no ids
        assert main(["train", "eval", srv.base_url, "--basins", str(small_basin_dir), "--budget", "1",
                     "--max-turns", "4", "--model-entry", "warm", "--out", str(out)]) == 0
        bodies = [r.body for r in srv.requests]
    assert bodies and all(b["temperature"] == 0.0 for b in bodies)
    eps = read_episodes(out)
    assert len(eps) == 1 and eps["n_sims"].iloc[0] == 1 and eps["best_nse"].iloc[0] == eps["best_nse"].iloc[0]
    row = [line for line in capsys.readouterr().out.splitlines() if line.startswith("syn_small ")]
    assert len(row) == 1 and f"{eps['best_nse'].iloc[0]:.4f}" in row[0]


def test_a_checkpoint_is_a_greedy_hf_local_agent_and_anything_else_one_clear_error(tmp_path):
    ckpt = tiny.save_tiny(tmp_path / "ckpt")
    assert evaluation_agent(str(ckpt), max_new_tokens=7) == {"name": "eval", "kind": "hf_local", "path": str(ckpt),
                                                             "greedy": True, "max_new_tokens": 7}
    with pytest.raises(UsageError) as err:
        evaluation_agent(str(tmp_path))
    assert "a folder without config.json" in err.value.message and "\n" not in err.value.message
    assert evaluation_agent("http://127.0.0.1:9/v1")["kind"] == "openai"


def _scalars(folder) -> dict[str, list[tuple[int, float]]]:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {t: [(e.step, e.value) for e in acc.Scalars(t)] for t in acc.Tags()["scalars"]}


def test_report_to_tensorboard_writes_the_stored_summary_next_to_the_store_once_per_rerun(tmp_path, small_basin_dir,
                                                                                          capsys):
    pytest.importorskip("tensorboard")
    from hydroagent_hpc.campaign.evaluate import summary_rows, summary_values

    call = '<tool_call>\n{{"name": "{}", "arguments": {{}}}}\n</tool_call>'
    script = [_reply("Run it.\n" + call.format("run_simulation")), _reply("not a call <tool_call>{"),
              _reply("Score it.\n" + call.format("evaluate"))] + [_reply("Done.")] * 4
    out = tmp_path / "url.h5"
    argv = ["train", "eval", "", "--basins", str(small_basin_dir), "--budget", "1", "--max-turns", "4",
            "--model-entry", "hydroagent-local", "--out", str(out), "--report-to", "tensorboard", "--json"]
    with ReplayServer({"responses": script, "strict": False}) as srv:
        argv[2] = srv.base_url
        assert main(argv) == 0
        assert main(argv) == 0  # resumed: nothing played, the same summary logged again
    result = json.loads(capsys.readouterr().out.splitlines()[-1])
    stored = summary_values(out, summary_rows(out, agent="eval"))
    assert result["summary"] == stored
    assert stored["episodes"] == 1 and stored["simulations"] == 1 and stored["parse_failures"] >= 1
    assert 0 < stored["valid_calls"] < 1 and stored["best_nse/syn_small"] == stored["best_nse_mean"]
    folder = tmp_path / "url.live" / "tensorboard"
    assert len(list(folder.glob("events.out.tfevents.*"))) == 1  # the rerun replaced the first file
    board = _scalars(folder)
    expected = {f"eval/{k}": v for k, v in stored.items() if v is not None}
    assert {"eval/best_nse_mean", "eval/valid_calls", "eval/simulations", "eval/parse_failures", "eval/reward",
            "eval/best_nse/syn_small"} <= set(expected)
    assert set(board) == set(expected)
    for name, value in expected.items():
        assert len(board[name]) == 1 and board[name][0][0] == 0, name
        assert board[name][0][1] == pytest.approx(value, rel=2e-7, abs=1e-12), name


def test_a_runs_final_logs_into_the_run_folder_at_its_last_step(tmp_path):
    pytest.importorskip("tensorboard")
    from hydroagent_hpc.train.live import EvalLiveSettings, evaluation_live_dir, report_evaluation

    run = tmp_path / "run"
    (run / "final").mkdir(parents=True)
    (run / "metrics.csv").write_text("step,loss\n1,2.5\n2,2.0\n3,1.5\n")
    assert evaluation_live_dir(str(run / "final"), tmp_path / "held.h5") == (run / "eval-held", 3)
    assert evaluation_live_dir(str(tmp_path / "ckpt"), tmp_path / "held.h5") == (tmp_path / "held.live", 0)
    assert evaluation_live_dir("http://x/final", tmp_path / "held.h5") == (tmp_path / "held.live", 0)
    folder = report_evaluation({"eval/best_nse_mean": 0.5}, EvalLiveSettings(report_to=("tensorboard",)),
                               str(run / "final"), tmp_path / "held.h5")
    assert folder == run / "eval-held"
    assert _scalars(folder / "tensorboard") == {"eval/best_nse_mean": [(3, 0.5)]}
    assert report_evaluation({"eval/x": 1.0}, EvalLiveSettings(), str(run / "final"), tmp_path / "h.h5") is None
    (run / "metrics.csv").write_text("step,loss\n1,2.5\nx,2.0\n")
    with pytest.raises(ConfigError, match=r"metrics\.csv:3: step 'x' is not a whole number"):
        evaluation_live_dir(str(run / "final"), tmp_path / "held.h5")
