"""The model card of ``final/`` (train/model_card.py, written by train/finite.py save_final for SFT and GRPO),
and that a real tiny SFT run's ``final/`` loads offline with transformers and renders the chat template with tools.
"""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.sft import short_trajectories, write_sft_data  # noqa: E402
from hydroagent_hpc import __version__  # noqa: E402
from hydroagent_hpc.env.toolcalls import tool_schemas  # noqa: E402
from hydroagent_hpc.provenance import git_commit  # noqa: E402
from hydroagent_hpc.sim.manifest import file_sha256  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.train.model_card import model_card  # noqa: E402
from hydroagent_hpc.train.sft.trainer import load_sft_config, train_sft  # noqa: E402


@pytest.fixture(scope="module")
def sft_run(tmp_path_factory):
    """A real two-step SFT run of the tiny Qwen3 on four short conversations."""
    tmp = tmp_path_factory.mktemp("card")
    data = write_sft_data(tmp / "data.h5", short_trajectories(tiny.build_tiny_tokenizer(), 4, seed=1),
                          [1.0, 0.5, 0.8, 0.3])
    cfg = tmp / "sft.yaml"
    cfg.write_text(f"data: {data}\nmodel: tiny\nlr: 0.003\nwarmup_steps: 1\nmax_steps: 2\nmicro_batch_size: 2\n"
                   "grad_accum: 1\nseed: 0\n")
    summary = train_sft(load_sft_config(cfg), tmp / "run", resume=False)
    assert summary["steps"] == 2
    return {"run": tmp / "run", "data": data}


def test_the_final_folder_of_an_sft_run_has_its_card(sft_run):
    card = (sft_run["run"] / "final" / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: transformers\n")
    assert "- recipe: sft" in card and "data preset `test`" in card
    assert f"- data SHA-256: `{file_sha256(sft_run['data'])}`" in card
    assert f"- data file: `{sft_run['data']}`" in card
    assert (sft_run["run"] / "config.yaml").read_text().rstrip("\n") in card  # the whole config
    assert f"hydroagent-hpc {__version__}, git commit `{git_commit()}`" in card
    assert "the built-in tiny Qwen3" in card and "base_model:" not in card  # no hub id to point at
    assert "None recorded by this run" in card
    assert not (sft_run["run"] / "final.tmp").exists()


def test_the_final_folder_loads_offline_and_renders_the_chat_template_with_tools(sft_run):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = sft_run["run"] / "final"
    model = AutoModelForCausalLM.from_pretrained(final)
    tokenizer = AutoTokenizer.from_pretrained(final)
    tools = tool_schemas()
    messages = [{"role": "system", "content": "You calibrate the CREST model."},
                {"role": "user", "content": "Calibrate basin 0."}]
    text = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>assistant\n") and "<tools>" in text and '"name": "evaluate"' in text
    ids = tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, return_dict=True,
                                        return_tensors="pt")["input_ids"]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    assert logits.shape == (1, ids.shape[1], model.config.vocab_size) and torch.isfinite(logits).all()


def test_a_grpo_card_names_the_basins_and_lists_the_validation_rows(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text(
        "config:\n  model: Qwen/Qwen3-4B-Instruct-2507\n  basins: [/b/one, /b/two]\n  validation_basins: [/b/held]\n"
        "  preset: paper\nprovenance: {git_commit: abc123, created_utc: '2026-01-01T00:00:00+00:00'}\n")
    (run / "metrics.csv").write_text("step,reward_mean,val_reward_mean,val_best_nse_mean\n"
                                     "0,0.1,0.25,0.61\n1,0.2,nan,nan\n2,0.3,0.5,0.72\n")
    card = model_card(run)
    assert "base_model: Qwen/Qwen3-4B-Instruct-2507" in card and "- grpo" in card
    assert "environment preset `paper`" in card and "`/b/one`, `/b/two`" in card and "`/b/held`" in card
    assert "| 0 | 0.25 | 0.61 |" in card and "| 2 | 0.5 | 0.72 |" in card and "| 1 |" not in card
    assert "the run started with git commit `abc123`" in card


def test_a_run_folder_without_config_still_gets_a_card(tmp_path):
    card = model_card(tmp_path)
    assert "recipe unknown" in card and "config.yaml could not be read" in card
