"""GRPO rollouts through an external engine: the SGLang and vLLM request shapes against the loopback
engine server (``train/generation/engine_server.py``, the tiny offline Qwen3 behind our own sampler), the weight
push after each step, the launcher that restarts an engine without live reload, and the errors.

No GPU, SGLang or vLLM runs here: the loopback server speaks the subset of both APIs the client uses,
so these tests check our client, launcher and trainer integration, not the real engines."""

from __future__ import annotations

import copy
import csv
import logging
import socket
import sys
from pathlib import Path

import pytest
import torch

from helpers.paths import pythonpath
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.train.generation.engine import EngineError, EngineSampler, EngineSettings, make_api
from hydroagent_hpc.train.generation.engine_process import EngineWeights
from hydroagent_hpc.train.generation.engine_server import EngineServer, weights_digest
from hydroagent_hpc.train.generation.sampler import BatchedSampler, Sampling
from hydroagent_hpc.train.grpo.config import load_grpo_config
from hydroagent_hpc.train.grpo.trainer import train_grpo
from hydroagent_hpc.train.tiny import build_tiny

ROOT = Path(__file__).resolve().parents[1]
KEY_ENV = "HYDROAGENT_TEST_ENGINE_KEY"
SECRET = "sk-test-3f9c2e71d0a4b8"


@pytest.fixture
def server(model_dir):
    with EngineServer(str(model_dir)) as s:
        yield s


def _prompt(tok, text: str) -> list[int]:
    return tok(text, add_special_tokens=False)["input_ids"]


def _perturbed(model):
    other = copy.deepcopy(model)
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return other


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.parametrize("api", ["sglang", "vllm"])
def test_engine_samples_are_the_in_process_samplers_ids_and_logprobs(server, tiny, stops, api):
    model, tok = tiny
    stop, pad = stops
    client = make_api(EngineSettings(api=api, url=server.url))
    a = _prompt(tok, "<|im_start|>user\nCalibrate the CREST model.<|im_end|>\n<|im_start|>assistant\n")
    b = _prompt(tok, "<|im_start|>user\nThe simulated peaks are too low.<|im_end|>\n<|im_start|>assistant\n")
    greedy = Sampling(max_new_tokens=24, greedy=True)
    local = BatchedSampler(model, stop, pad, greedy).sample([a, b], [None, None])
    remote = EngineSampler(client, stop, greedy).sample([a, b], [None, None])
    assert [r.ids for r in remote] == [x.ids for x in local]
    for r, x in zip(remote, local):
        assert len(r.logprobs) == len(r.ids) > 0
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(x.logprobs), atol=1e-5)
    # a seeded sampled row is the in-process row with the same seed
    sampled = Sampling(max_new_tokens=24)
    assert EngineSampler(client, stop, sampled).sample([a], [11])[0].ids == \
        BatchedSampler(model, stop, pad, sampled).sample([a], [11])[0].ids
    # a stop id ends the row at its first occurrence, and is kept
    ids = local[0].ids
    cut = ids[3]
    expected = ids[:ids.index(cut) + 1]
    got = EngineSampler(client, (cut,), greedy).sample([a], [None])[0]
    assert got.ids == expected and len(got.logprobs) == len(expected)
    assert server.info()["requests"] >= 3


def test_a_bf16_engine_reports_logprobs_that_differ_from_the_trainers(model_dir, tiny, stops):
    model, tok = tiny
    stop, pad = stops
    prompt = _prompt(tok, "<|im_start|>user\nCalibrate the CREST model.<|im_end|>\n<|im_start|>assistant\n")
    greedy = Sampling(max_new_tokens=16, greedy=True)
    with EngineServer(str(model_dir), dtype="bfloat16") as s:
        remote = EngineSampler(make_api(EngineSettings(api="sglang", url=s.url)), stop, greedy).sample([prompt], [None])
    seq = torch.tensor([prompt + remote[0].ids])
    with torch.no_grad():
        lp = torch.log_softmax(model(seq).logits.float(), -1)[0, :-1].gather(-1, seq[0, 1:, None])[:, 0]
    delta = (lp[len(prompt) - 1:] - torch.tensor(remote[0].logprobs)).abs()
    assert 1e-4 < float(delta.max()) < 1.0  # the mismatch truncated importance weights are there for


def test_a_pushed_checkpoint_is_what_the_sglang_engine_serves(server, tiny, stops, tmp_path):
    model, tok = tiny
    stop, pad = stops
    other = _perturbed(model)
    before = server.info()["weights_sha256"]
    assert before == weights_digest(model)
    with EngineWeights(EngineSettings(api="sglang", url=server.url), tmp_path) as weights:
        seconds = weights.push(other, tok, 1)
        assert seconds > 0 and [p.name for p in (tmp_path / "engine-weights").iterdir()] == ["step-000001"]
        after = server.info()
        assert after["weights_sha256"] == weights_digest(other) != before and after["updates"] == 1
        prompt = _prompt(tok, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
        greedy = Sampling(max_new_tokens=16, greedy=True)
        assert EngineSampler(weights.api, stop, greedy).sample([prompt], [None])[0].ids == \
            BatchedSampler(other, stop, pad, greedy).sample([prompt], [None])[0].ids


def test_unreachable_engines_refusals_and_keys_give_clear_errors(model_dir, tiny, stops, tmp_path, monkeypatch):
    _, tok = tiny
    stop, _ = stops
    prompt = _prompt(tok, "hello")
    greedy = Sampling(max_new_tokens=4, greedy=True)
    dead = f"http://127.0.0.1:{_free_port()}"
    for api in ("sglang", "vllm"):
        with pytest.raises(EngineError, match=rf"engine at {dead}/.*cannot connect.*\n  fix: start the engine"):
            EngineSampler(make_api(EngineSettings(api=api, url=dead, model_name="m")), stop, greedy).sample(
                [prompt], [None])
    monkeypatch.setenv(KEY_ENV, SECRET)
    with EngineServer(str(model_dir), api_key_env=KEY_ENV) as s:
        for api in ("sglang", "vllm"):
            keyed = make_api(EngineSettings(api=api, url=s.url, api_key_env=KEY_ENV, model_name="m"))
            # an id outside the vocabulary: the server answers 400, named with its URL
            with pytest.raises(EngineError, match=r"engine at http://127\.0\.0\.1:\d+/(generate|v1/completions): "
                                                  r"HTTP 400: .*prompt ids"):
                EngineSampler(keyed, stop, greedy).sample([[10**7]], [None])
            with pytest.raises(EngineError, match="HTTP 401") as err:  # no key sent
                EngineSampler(make_api(EngineSettings(api=api, url=s.url, model_name="m")), stop, greedy).sample(
                    [prompt], [None])
            assert "engine.api_key_env" in str(err.value) and SECRET not in str(err.value)
        with pytest.raises(EngineError, match="was not loaded"):
            make_api(EngineSettings(api="sglang", url=s.url, api_key_env=KEY_ENV)).load_weights(str(tmp_path))
    monkeypatch.delenv(KEY_ENV)
    with pytest.raises(EngineError, match=f"{KEY_ENV} is not set"):
        make_api(EngineSettings(api="sglang", url=dead, api_key_env=KEY_ENV))


def _config(basins: Path, tmp_path: Path, engine: str, **extra: object) -> Path:
    values: dict[str, object] = {"basins": f"[{basins / 'b1'}, {basins / 'b2'}]", "group_size": 2,
                                 "prompts_per_step": 1, "max_steps": 2, "max_new_tokens": 12, "lr": "1.0e-3",
                                 "generation_batch": 1, "env": "{max_turns: 2}", "generator": "engine",
                                 "engine": engine, **extra}
    path = tmp_path / "grpo.yaml"
    path.write_text("".join(f"{k}: {v}\n" for k, v in values.items()))
    return path


def test_engine_settings_are_checked_strictly(tmp_path):
    basins = tmp_path
    with pytest.raises(ConfigError, match=r"grpo\.yaml:\d+.*vllm cannot reload.*\n  fix: give engine.launch"):
        load_grpo_config(_config(basins, tmp_path, "{api: vllm, url: 'http://127.0.0.1:8000'}"))
    with pytest.raises(ConfigError, match=r"no \{model\} argument"):
        load_grpo_config(_config(basins, tmp_path, "{api: vllm, url: 'http://h:1', launch: [vllm, serve, x]}"))
    with pytest.raises(ConfigError, match=r"engine\.api: 'tgi' is not one of sglang, vllm"):
        load_grpo_config(_config(basins, tmp_path, "{api: tgi, url: 'http://h:1'}"))
    with pytest.raises(ConfigError, match=r"engine\.api_key_env: .* is not a variable name"):
        load_grpo_config(_config(basins, tmp_path, "{api: sglang, url: 'http://h:1', api_key_env: 'sk-abc def'}"))
    with pytest.raises(ConfigError, match=r"engine\.port: unknown key"):
        load_grpo_config(_config(basins, tmp_path, "{api: sglang, url: 'http://h:1', port: 3}"))
    with pytest.raises(ConfigError, match="generator: engine needs an engine mapping"):
        load_grpo_config(_config(basins, tmp_path, "null"))


@pytest.fixture(scope="module")
def basins(grpo_basins: Path) -> Path:
    return grpo_basins  # tests/conftest.py


@pytest.mark.slow
def test_a_grpo_run_generates_through_the_engine_and_keeps_its_weights_in_step(basins, model_dir, tmp_path,
                                                                                monkeypatch, caplog):
    monkeypatch.setenv(KEY_ENV, SECRET)
    caplog.set_level(logging.DEBUG)
    with EngineServer(str(model_dir), api_key_env=KEY_ENV) as server:
        engine = f"{{api: sglang, url: '{server.url}', api_key_env: {KEY_ENV}}}"
        cfg = load_grpo_config(_config(basins, tmp_path, engine, tis_cap="2.0"))
        summary = train_grpo(cfg, tmp_path / "run")
        info = server.info()
    run = tmp_path / "run"
    assert summary["steps"] == 2 and summary["stopped"] is None
    rows = list(csv.DictReader(open(run / "metrics.csv")))
    assert [r["step"] for r in rows] == ["1", "2"]
    for r in rows:
        assert float(r["weight_sync_s"]) > 0
        # the engine served the trainer's weights of that step: its numbers are the trainer's
        assert float(r["logprob_mismatch_max"]) < 1e-4 and abs(float(r["tis_weight_mean"]) - 1) < 1e-3
    import h5py

    with h5py.File(run / "metrics.h5") as f:
        assert f["metrics/weight_sync_s"].shape == (2,)
    # every rollout was generated by the engine (one request per row: generation_batch 1) ...
    assert info["requests"] > 0 and info["updates"] == 3  # before step 1, after steps 1 and 2
    # ... and after the last step it serves exactly the trained policy
    from transformers import AutoModelForCausalLM

    final = AutoModelForCausalLM.from_pretrained(run / "final", local_files_only=True)
    assert info["weights_sha256"] == weights_digest(final) != weights_digest(build_tiny(seed=0)[0])
    assert sorted(p.name for p in (run / "engine-weights").iterdir()) == ["step-000002"]
    # the API key reached the server, and nothing else
    assert SECRET not in caplog.text
    for path in run.rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path


@pytest.mark.slow
def test_the_launcher_restarts_an_engine_without_live_reload_on_each_checkpoint(tiny, stops, tmp_path,
                                                                                  monkeypatch):
    model, tok = tiny
    stop, pad = stops
    monkeypatch.setenv("PYTHONPATH", pythonpath())
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv(KEY_ENV, SECRET)
    port = _free_port()
    settings = EngineSettings(api="vllm", url=f"http://127.0.0.1:{port}", model_name="policy", start_timeout_s=180,
                              api_key_env=KEY_ENV,
                              launch=(sys.executable, "-m", "hydroagent_hpc.train.generation.engine_server",
                                      "--model", "{model}",
                                      "--port", str(port), "--served-model-name", "policy", "--api-key-env", KEY_ENV))
    prompt = _prompt(tok, "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n")
    greedy = Sampling(max_new_tokens=16, greedy=True)
    other = _perturbed(model)
    with EngineWeights(settings, tmp_path) as weights:
        assert weights.process is not None
        weights.push(model, tok, 0)
        first = weights.process.proc
        assert first is not None
        assert EngineSampler(weights.api, stop, greedy).sample([prompt], [None])[0].ids == \
            BatchedSampler(model, stop, pad, greedy).sample([prompt], [None])[0].ids
        weights.push(other, tok, 1)
        assert weights.process.proc is not None and weights.process.proc.pid != first.pid
        assert first.poll() is not None  # the old server is gone
        assert weights.process.starts == 2
        assert EngineSampler(weights.api, stop, greedy).sample([prompt], [None])[0].ids == \
            BatchedSampler(other, stop, pad, greedy).sample([prompt], [None])[0].ids
        second = weights.process.proc
    assert second.poll() is not None and not weights.api.health()
    assert "serving" in (tmp_path / "engine.log").read_text() and SECRET not in (tmp_path / "engine.log").read_text()
