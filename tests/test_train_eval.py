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
from hydroagent_hpc.errors import UsageError
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
