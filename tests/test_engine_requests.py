"""Engine requests as the engines read them (issue 29 item 6; audit F6, F7, F13).

Against the loopback stand-in engine (``train/generation/engine_server.py``: the tiny offline Qwen3 behind the
SGLang and vLLM request shapes), which follows each engine's documented stop and log-prob
semantics:

- F6: SGLang's ``ignore_eos: true`` switches off ``stop_token_ids`` too, so a request that sends it
  decodes every row to ``max_new_tokens``; the client sends ``ignore_eos: false`` and the engine
  stops at the stop id. vLLM's ``ignore_eos`` leaves the stop ids working.
- F7: with an engine, each rollout turn is its own request, sent at once: a short turn returns while
  a long one is still decoding (the batching server made it wait for the long one's batch).
- F13: SGLang's log-probs are of ``softmax(logits / T)`` unless ``SGLANG_RETURN_ORIGINAL_LOGPROB``;
  for a server the trainer did not launch, the client warns once.
"""

from __future__ import annotations

import logging
import threading
import time

import pytest
import torch

from hydroagent_hpc.train.generation.engine import (
    EngineRequests,
    EngineSampler,
    EngineSettings,
    make_api,
    serve_rollouts,
)
from hydroagent_hpc.train.generation.engine_server import EngineServer
from hydroagent_hpc.train.generation.sampler import BatchedSampler, GenerationServer, Sampling


@pytest.fixture(autouse=True)
def _no_original_logprob(monkeypatch):
    monkeypatch.delenv("SGLANG_RETURN_ORIGINAL_LOGPROB", raising=False)


def _prompt(tok, text: str) -> list[int]:
    return tok(f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)["input_ids"]


def test_sglang_requests_stop_at_the_stop_ids_instead_of_decoding_max_new_tokens(model_dir, tiny, stops):
    """F6: the engine decodes up to the first stop id, not ``max_new_tokens`` ids that the client
    then throws away (counted by the stand-in: the ids it decoded)."""
    model, tok = tiny
    _, pad = stops
    prompt = _prompt(tok, "Calibrate the CREST model.")
    greedy = Sampling(max_new_tokens=24, greedy=True)
    free = BatchedSampler(model, (), pad, greedy).sample([prompt], [None])[0].ids
    assert len(free) == 24
    cut = free[2]
    expected = free[:free.index(cut) + 1]
    assert len(expected) < 24
    with EngineServer(str(model_dir)) as server:
        for api in ("sglang", "vllm"):
            client = make_api(EngineSettings(api=api, url=server.url))
            before = server.info()["generated_tokens"]
            got = EngineSampler(client, (cut,), greedy).sample([prompt], [None])[0]
            assert got.ids == expected
            decoded = server.info()["generated_tokens"] - before
            assert decoded == len(expected), f"{api}: the engine decoded {decoded} ids for a {len(expected)}-id turn"
        # the stand-in keeps SGLang's rule: ignore_eos also switches off stop_token_ids (the old request) ...
        sglang = make_api(EngineSettings(api="sglang", url=server.url))
        params = {"temperature": 0.0, "max_new_tokens": 24, "stop_token_ids": [cut], "ignore_eos": True}
        answer = sglang._request("POST", "/generate", {"input_ids": [prompt], "sampling_params": [params]})
        assert answer[0]["meta_info"]["completion_tokens"] == 24
        assert answer[0]["meta_info"]["finish_reason"]["type"] == "length"
        # ... and vLLM's: ignore_eos leaves the stop ids working
        body = {"model": server.served_name, "prompt": prompt, "max_tokens": 24, "temperature": 0.0,
                "stop_token_ids": [cut], "ignore_eos": True}
        choice = sglang._request("POST", "/v1/completions", body)["choices"][0]
        assert choice["finish_reason"] == "stop" and choice["stop_reason"] == cut


def _long_and_short(model, pad, sampling: Sampling, prompt: list[int]) -> tuple[int, int, int]:
    """Seeds of a long row (no stop in ``max_new_tokens`` ids) and a short one (its first id is the
    stop id), and that stop id, found with the in-process sampler (the stand-in samples the same)."""
    local = BatchedSampler(model, (), pad, sampling)
    long_ids = local.sample([prompt], [101])[0].ids
    for seed in range(200, 260):
        first = local.sample([prompt], [seed])[0].ids[0]
        if first not in long_ids:
            return 101, seed, first
    raise AssertionError("no short row found")


def _race(server_factory, prompt: list[int], long_seed: int, short_seed: int, engine: EngineServer
          ) -> tuple[float, float, dict]:
    """Start the long turn, send the short one while the engine decodes it; both finishing times."""
    done: dict[str, float] = {}
    with server_factory() as gen:
        def long_turn() -> None:
            gen.generate(prompt, long_seed)
            done["long"] = time.perf_counter()

        thread = threading.Thread(target=long_turn)
        thread.start()
        deadline = time.monotonic() + 30
        while engine.active < 1 and time.monotonic() < deadline:  # until the engine decodes the long turn
            time.sleep(0.01)
        time.sleep(0.2)
        gen.generate(prompt, short_seed)
        done["short"] = time.perf_counter()
        thread.join()
        stats = dict(gen.stats)
    return done["short"], done["long"], stats


def test_a_short_turn_does_not_wait_for_a_long_one(model_dir, tiny, stops):
    """F7: each rollout turn is its own engine request; the engine (here: the stand-in, slowed to
    0.05 s per forward pass: 3 s for the long turn) runs them side by side, so the short turn is
    back long before the long one ends. With the batching server it waited for the long turn's
    batch."""
    model, tok = tiny
    _, pad = stops
    prompt = _prompt(tok, "The simulated peaks are too low.")
    sampling = Sampling(max_new_tokens=60)
    long_seed, short_seed, stop = _long_and_short(model, pad, sampling, prompt)
    with EngineServer(str(model_dir), token_delay_s=0.05) as server:
        api = make_api(EngineSettings(api="vllm", url=server.url))
        sampler = EngineSampler(api, (stop,), sampling, max_batch=8)
        assert isinstance(serve_rollouts(sampler), EngineRequests)
        assert type(serve_rollouts(BatchedSampler(model, (stop,), pad, sampling))) is GenerationServer
        short_t, long_t, stats = _race(lambda: serve_rollouts(sampler), prompt, long_seed, short_seed, server)
        assert short_t < long_t - 1.0, f"the short turn ended {long_t - short_t:.2f} s before the long one"
        assert server.info()["peak_concurrent"] == 2
        assert stats["batches"] == stats["rows"] == 2 and stats["max_batch"] == 2
        assert stats["tokens"] == 61 and 0 < stats["busy_s"] < stats["request_s"]
        # the bound holds: with one request in flight at most, the short turn waits for a free slot
        short_t, long_t, stats = _race(lambda: EngineRequests(EngineSampler(api, (stop,), sampling, max_batch=1)),
                                       prompt, long_seed, short_seed, server)
        assert short_t > long_t and stats["max_batch"] == 1


def test_engine_requests_refuse_what_an_engine_cannot_do(model_dir, tiny, stops):
    _, tok = tiny
    stop, _ = stops
    with EngineServer(str(model_dir)) as server:
        sampler = EngineSampler(make_api(EngineSettings(api="sglang", url=server.url)), stop,
                                Sampling(max_new_tokens=4, greedy=True))
        gen = EngineRequests(sampler)
        with pytest.raises(RuntimeError, match="context manager"):
            gen.generate(_prompt(tok, "hello"), None)
        with gen:
            with pytest.raises(ValueError, match="forced ids are not supported"):
                gen.generate(_prompt(tok, "hello"), None, forced=[5])
            with pytest.raises(ValueError, match="empty prompt"):
                gen.generate([], None)
            assert len(gen.generate(_prompt(tok, "hello"), None).ids) >= 1


def _trainer_logprobs(model, prompt: list[int], ids: list[int], temperature: float = 1.0) -> torch.Tensor:
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(seq).logits[0, len(prompt) - 1:-1].float() / temperature
    return torch.log_softmax(logits, -1).gather(-1, torch.tensor(ids)[:, None])[:, 0]


def test_sglang_logprobs_at_a_temperature_are_scaled_and_the_client_says_so_once(model_dir, tiny, stops, caplog):
    """F13: a server the trainer did not launch returns log-probs of softmax(logits / T) at T != 1
    (SGLang without SGLANG_RETURN_ORIGINAL_LOGPROB); the client logs one warning that the mismatch
    and TIS numbers are biased. vLLM's are the model's own; so are SGLang's at T = 1 (no warning)."""
    model, tok = tiny
    stop, _ = stops
    prompt = _prompt(tok, "Lower the soil capacity.")
    warm = Sampling(temperature=0.7, max_new_tokens=12)
    caplog.set_level(logging.WARNING, logger="hydroagent_hpc.train.generation.engine")
    with EngineServer(str(model_dir)) as server:
        assert server.info()["original_logprob"] is False
        sglang = make_api(EngineSettings(api="sglang", url=server.url))
        rows = EngineSampler(sglang, stop, warm).sample([prompt, prompt], [3, 4])
        rows += EngineSampler(sglang, stop, warm).sample([prompt], [5])
        for row in rows:
            got = torch.tensor(row.logprobs)
            assert torch.allclose(got, _trainer_logprobs(model, prompt, row.ids, 0.7), atol=1e-5)
            assert not torch.allclose(got, _trainer_logprobs(model, prompt, row.ids), atol=1e-3)
        warnings = [r for r in caplog.records if "softmax(logits / 0.7)" in r.getMessage()]
        assert len(warnings) == 1 and "SGLANG_RETURN_ORIGINAL_LOGPROB=1" in warnings[0].getMessage()
        caplog.clear()
        vllm = make_api(EngineSettings(api="vllm", url=server.url))
        row = EngineSampler(vllm, stop, warm).sample([prompt], [3])[0]
        assert torch.allclose(torch.tensor(row.logprobs), _trainer_logprobs(model, prompt, row.ids), atol=1e-5)
        row = EngineSampler(make_api(EngineSettings(api="sglang", url=server.url)), stop,
                            Sampling(max_new_tokens=12)).sample([prompt], [3])[0]
        assert torch.allclose(torch.tensor(row.logprobs), _trainer_logprobs(model, prompt, row.ids), atol=1e-5)
        assert not [r for r in caplog.records if "softmax(logits" in r.getMessage()]
