"""OpenAIAgent end to end: the real ``openai`` client against the loopback replay server.

No network and no mock of the client: every request goes over HTTP to
:class:`~hydroagent_hpc.agents.llm.replay_server.ReplayServer` on 127.0.0.1, which answers from the
hand-written recordings in ``tests/data/recorded/`` (native function calls, Hermes text, a
malformed call, a 429, a 503, a response that arrives after the client's timeout, a final
message without tool calls).
"""

from __future__ import annotations

import json
import logging
import random
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("openai")

from hydroagent_hpc.agents.base import Policy
from hydroagent_hpc.agents.llm.client import ChatClient, LLMRequestError, RateLimiter, parse_retry_after
from hydroagent_hpc.agents.llm.models_file import MissingAPIKeyError, ModelSpec, get_model, load_models
from hydroagent_hpc.agents.llm.openai_api import OpenAIAgent, make_openai_agent, native_calls_to_text, with_changes
from hydroagent_hpc.agents.llm.replay_server import ReplayServer, check_tool_messages
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import (
    from_openai_tool_calls,
    parse_message,
    render_hermes,
    render_tool_response,
    tool_schemas,
)
from hydroagent_hpc.errors import ConfigError
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.types import ToolCall

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "recorded"
NINE = ("claude-opus-4.6", "claude-opus-4.7", "claude-sonnet-4.6", "gpt-5", "gpt-5.4", "gpt-5.4-pro",
        "gemini-2.5-pro", "gemini-3.1-pro", "gemini-3-flash")
SENTINEL = "sk-test-SENTINEL-7f3a9c2e41b8"
KEY_VAR = "HYDROAGENT_TEST_LLM_KEY"
TIMEOUT_S = 0.5  # the recordings' late answer comes after 3 s


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def make_env(basin, sim, **over):
    over.setdefault("target_nse", 0.999)
    over.setdefault("end_on_no_tool_call", True)
    return CalibrationEnv(basin, sim, preset("paper", **over), agent="llm-test")


def fast_spec(base_url: str, **changes) -> ModelSpec:
    """The models file's ``replay`` entry pointed at a test server, with test-sized limits.

    Tests whose recording provokes a client timeout pass ``timeout_s=TIMEOUT_S``; the others keep
    a generous timeout so a loaded machine cannot turn a slow answer into a spurious retry.
    """
    spec = with_changes(get_model("replay"), base_url=base_url, timeout_s=5.0, max_retries=2, backoff_base_s=0.01,
                        backoff_max_s=0.05)
    return with_changes(spec, **changes) if changes else spec


def script(name: str) -> list[dict]:
    return json.loads((RECORDED / name).read_text())["responses"]


def bodies(name: str) -> list[dict]:
    """The chat-completion bodies of a recording that a client receives (not errors, not late ones)."""
    return [e for e in script(name) if "choices" in e]


def tool_messages(request_body: dict) -> list[tuple[str, str]]:
    return [(m["tool_call_id"], m["content"]) for m in request_body["messages"] if m["role"] == "tool"]


# ---------------------------------------------------------------------------------------------
# The models file


def test_models_file_lists_the_nine_frontier_models():
    models = load_models()
    assert set(NINE) <= set(models)
    providers = {"claude": "anthropic", "gpt": "openai", "gemini": "google"}
    for name in NINE:
        m = models[name]
        assert m.provider == providers[name.split("-")[0]]
        assert m.model and m.base_url.startswith("https://") and m.api_key_env and m.api_key_required
        assert m.tool_mode == "native" and m.prices.assumed and m.prices.as_of
        assert m.prices.input_usd_per_mtok > 0 and m.prices.output_usd_per_mtok > 0
    local = [m for m in models.values() if m.provider in ("vllm", "sglang")]
    assert {m.tool_mode for m in local} == {"native", "hermes"}
    assert all(m.base_url.startswith("http://localhost:") and not m.api_key_required for m in local)
    assert any(m.base_url == "http://localhost:8000/v1" for m in local)
    assert models["gpt-5"].sampling.max_tokens_param == "max_completion_tokens"


@pytest.mark.parametrize("text, where, what", [
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: http://localhost:8000/v1\n"
     "    api_key_required: false\n    temprature: 0.1\n", ":7:", "models.m.temprature: unknown key"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: http://localhost:8000/v1\n"
     "    api_key_required: false\n    sampling: {temperature: 0, topp: 1}\n", ":7:", "models.m.sampling.topp"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    model: y\n", ":5:",
     "model: duplicate key (first given on line 4)"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: http://localhost:8000/v1\n"
     "    api_key_required: false\n    tool_mode: json\n", ":7:", "models.m.tool_mode"),
    ("modles: {}\n", ":1:", "modles: unknown key"),
    ("models:\n  m:\n    provider: openai\n    model: gpt-5\n    base_url: https://api.openai.com/v1\n", ":2:",
     "api_key_env"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: http://localhost:8000/v1\n"
     "    api_key_required: false\n    limits: {max_retries: two}\n", ":7:", "whole number"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: http://localhost:8000/v1\n"
     "    api_key_required: false\n    limits: {max_reply_chars: 10}\n", ":7:",
     "models.m.limits.max_reply_chars: must be at least 1000, got 10"),
    ("defaults:\n  limits: {timeout_s: 0}\nmodels:\n  m:\n    provider: vllm\n    model: x\n"
     "    base_url: http://localhost:8000/v1\n    api_key_required: false\n", ":2:",
     "defaults.limits.timeout_s: must be positive, got 0"),
    ("models:\n  m:\n    name: other\n    provider: vllm\n", ":3:", "models.m.name: is the entry's key"),
    ("models:\n  m:\n    provider: vllm\n    model: x\n    base_url: localhost:8000\n"
     "    api_key_required: false\n", ":5:", "models.m.base_url: 'localhost:8000' must start with http://"),
])
def test_models_file_is_strict(tmp_path, text, where, what):
    path = tmp_path / "models.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_models(path)
    msg = str(err.value)
    assert str(path) + where in msg and what in msg


def test_missing_key_names_the_variable(monkeypatch):
    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    with pytest.raises(MissingAPIKeyError, match="ANTHROPIC_API_KEY"):
        OpenAIAgent("claude-sonnet-4.6")
    monkeypatch.setenv(KEY_VAR, "   ")
    spec = fast_spec("http://127.0.0.1:9/v1", api_key_env=KEY_VAR, api_key_required=True)
    with pytest.raises(MissingAPIKeyError, match=KEY_VAR):
        OpenAIAgent(spec)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    assert OpenAIAgent("vllm-qwen3-4b").name == "vllm-qwen3-4b"  # a local server's key is optional


# ---------------------------------------------------------------------------------------------
# End-to-end episodes


def test_native_episode_end_to_end(basin, small_sim):
    with ReplayServer(RECORDED / "native_episode.json") as srv:
        spec = fast_spec(srv.base_url, timeout_s=TIMEOUT_S, input_usd_per_mtok=3.0, output_usd_per_mtok=15.0,
                         temperature=0.3)
        agent = OpenAIAgent(spec, seed=5)
        assert isinstance(agent, Policy)
        ep = run_episode(agent, make_env(basin, small_sim))
        requests = srv.requests
    # the environment ran exactly the calls the server sent, in order; the malformed one failed to parse
    got = [(t.kind, t.tool, t.error) for t in ep.turns]
    assert got == [("tool", "set_parameters", None), ("tool", "run_simulation", None), ("tool", "evaluate", None),
                   ("parse_failure", None, "bad_arguments"), ("tool", "set_parameters", None),
                   ("tool", "run_simulation", None), ("tool", "evaluate", None),
                   ("parse_failure", None, "no_tool_call")]
    assert ep.turns[0].arguments == {"wm": 1.3, "alpha": 0.9} and ep.turns[4].arguments == {"b": 1.2}
    assert ep.sims[1].params["b"] == 1.2 and ep.sims[1].params["wm"] == 1.3  # the malformed wm=1.5 never applied
    assert ep.stop_reason == "no_tool_call" and len(ep.sims) == 2
    assert "[tool_call]" in ep.turns[3].text and ep.turns[3].text.count("<tool_call>") == 2  # prose tags defused
    # retries: the 429 and the timeout were retried and counted
    u = agent.usage
    assert u["retry_reasons"] == {"rate_limit": 1, "timeout": 1} and u["retries"] == 2
    assert u["requests"] == 6 and u["attempts"] == 8 and u["errors"] == {}
    assert [t["attempts"] for t in u["turns"]] == [1, 1, 2, 1, 2, 1]
    # tokens and cost add up (the late response's usage never arrives)
    received = bodies("native_episode.json")
    received = [b for b in received if b["id"] != "chatcmpl-rec-native-late"]
    pt = sum(b["usage"]["prompt_tokens"] for b in received)
    ct = sum(b["usage"]["completion_tokens"] for b in received)
    assert (u["prompt_tokens"], u["completion_tokens"], u["total_tokens"]) == (pt, ct, pt + ct)
    assert [t["prompt_tokens"] for t in u["turns"]] == [b["usage"]["prompt_tokens"] for b in received]
    assert u["cost_usd"] == pytest.approx(pt * 3.0 / 1e6 + ct * 15.0 / 1e6)
    assert u["cached_prompt_tokens"] == 2048 and u["usage_missing"] == 0 and u["tool_calls"] == 7
    assert json.loads(json.dumps(u)) == u  # JSON-ready for Episode.usage
    # what the client sent: tools, sampling, and tool messages answering the right ids
    assert [r.status for r in requests] == [200, 200, 429, 200, 200, 200, 200, 200]
    names = [t["function"]["name"] for t in tool_schemas()]
    for r in requests:
        assert [t["function"]["name"] for t in r.body["tools"]] == names
        assert r.body["temperature"] == 0.3 and r.body["model"] == "replay" and r.body["seed"] == 5
    assert requests[2].body == requests[3].body  # a retry resends the same request
    assert requests[5].body == requests[6].body
    obs = [render_tool_response(t.observation) for t in ep.turns]
    assert tool_messages(requests[1].body) == [("call_set_1", obs[0])]
    assert tool_messages(requests[7].body) == [
        ("call_set_1", obs[0]), ("call_run_1", obs[1]), ("call_eval_1", obs[2]), ("call_set_2", obs[3]),
        ("call_set_3", obs[4]), ("call_run_2", obs[5]), ("call_eval_2", obs[6])]
    assistant = [m for m in requests[7].body["messages"] if m["role"] == "assistant"]
    assert assistant[3]["tool_calls"][0]["function"]["arguments"] == '{"wm": 1.5, "b": }'  # echoed as sent
    assert assistant[3]["content"].startswith("Peaks are too low")  # the model's own prose, not the defused copy
    # the final message's observation is sent back with the next request only, so it is in the history
    assert agent.history[-1]["role"] == "assistant" and agent.history[-1]["content"].startswith("NSE improved")


@pytest.mark.parametrize("role", ["tool", "user"])
def test_hermes_episode_end_to_end(basin, small_sim, role):
    strict = role == "user"  # plain chat servers accept tool messages without ids; OpenAI's rules do not
    with ReplayServer(RECORDED / "hermes_episode.json", strict=strict) as srv:
        agent = OpenAIAgent(fast_spec(srv.base_url, tool_mode="hermes", observation_role=role, temperature=0.0,
                                      max_tokens=2048))
        # a message whose only call is malformed has no tool call, so end at the 8th turn instead
        ep = run_episode(agent, make_env(basin, small_sim, end_on_no_tool_call=False, max_turns=8))
        requests = [r for r in srv.requests if r.status == 200]
    got = [(t.kind, t.tool, t.error) for t in ep.turns]
    assert got == [("tool", "set_parameters", None), ("tool", "run_simulation", None), ("tool", "evaluate", None),
                   ("parse_failure", None, "malformed_json"), ("tool", "set_parameters", None),
                   ("tool", "run_simulation", None), ("tool", "evaluate", None),
                   ("parse_failure", None, "no_tool_call")]
    texts = [b["choices"][0]["message"]["content"] for b in bodies("hermes_episode.json")]
    assert [t.text for t in ep.turns if t.text] == texts  # the raw model text reached env.step
    u = agent.usage
    assert u["retry_reasons"] == {"server_error": 1, "rate_limit": 1} and u["requests"] == 5
    assert u["prompt_tokens"] == sum(b["usage"]["prompt_tokens"] for b in bodies("hermes_episode.json"))
    assert u["cost_usd"] == 0.0
    for r in requests:
        assert "tools" not in r.body and r.body["temperature"] == 0.0 and r.body["max_tokens"] == 2048
    last = requests[-1].body["messages"]
    obs = [render_tool_response(t.observation) for t in ep.turns[:7]]
    if role == "tool":
        assert [m["content"] for m in last if m["role"] == "tool"] == obs
        assert all("tool_call_id" not in m for m in last)
    else:
        users = [m["content"] for m in last if m["role"] == "user"][1:]
        assert users[1] == f"<tool_response>\n{obs[1]}\n</tool_response>\n<tool_response>\n{obs[2]}\n</tool_response>"
        assert len(users) == 4 and not any(m["role"] == "tool" for m in last)


def test_agent_restarts_usage_and_history_for_a_new_episode(basin, small_sim):
    reply = {"id": "c1", "object": "chat.completion", "model": "replay",
             "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "done"}}],
             "usage": {"prompt_tokens": 10, "completion_tokens": 2, "total_tokens": 12}}
    with ReplayServer([reply, reply]) as srv:
        agent = OpenAIAgent(fast_spec(srv.base_url))
        for _ in range(2):
            ep = run_episode(agent, make_env(basin, small_sim))
            assert ep.stop_reason == "no_tool_call"
            assert agent.usage["requests"] == 1 and agent.usage["prompt_tokens"] == 10
            assert [m["role"] for m in agent.history] == ["system", "user", "assistant"]


def test_tool_calls_are_echoed_with_provider_extras(basin, small_sim):
    """Gemini 3 wants its thought signatures back; ids a server leaves out are made up consistently."""
    calls = [{"id": "g1", "type": "function", "function": {"name": "set_parameters", "arguments": "{\"wm\": 2}"},
              "extra_content": {"google": {"thought_signature": "c2lnbmF0dXJl"}}},
             {"type": "function", "function": {"name": "run_simulation", "arguments": "{}"}}]
    first = {"id": "c1", "object": "chat.completion", "model": "gemini-3-flash-preview",
             "choices": [{"index": 0, "finish_reason": "tool_calls",
                          "message": {"role": "assistant", "content": None, "tool_calls": calls}}]}
    last = {"id": "c2", "object": "chat.completion", "model": "gemini-3-flash-preview",
            "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "ok"}}]}
    with ReplayServer([first, last]) as srv:
        agent = OpenAIAgent(fast_spec(srv.base_url))
        ep = run_episode(agent, make_env(basin, small_sim))
        sent = srv.chat_requests()[1]["messages"]
    assert [t.tool for t in ep.turns] == ["set_parameters", "run_simulation", None]
    echoed = sent[2]["tool_calls"]
    assert echoed[0]["extra_content"] == {"google": {"thought_signature": "c2lnbmF0dXJl"}}
    assert echoed[0]["id"] == "g1" and echoed[1]["id"] == "call_1_1"
    assert [m.get("tool_call_id") for m in sent[3:]] == ["g1", "call_1_1"]
    assert agent.usage["usage_missing"] == 2


def test_retries_run_out_into_a_policy_error(basin, small_sim, caplog):
    err = {"status": 500, "body": {"error": {"message": "internal error", "type": "server_error"}}}
    with ReplayServer([err, err]) as srv:  # the third attempt finds the script exhausted (also a 500)
        agent = OpenAIAgent(fast_spec(srv.base_url, max_retries=2))
        with caplog.at_level(logging.ERROR):
            ep = run_episode(agent, make_env(basin, small_sim))
        statuses = [r.status for r in srv.requests]
    assert ep.stop_reason == "policy_error: LLMRequestError" and ep.turns == []
    assert statuses == [500, 500, 500]
    u = agent.usage
    assert u["attempts"] == 3 and u["requests"] == 0 and u["retry_reasons"] == {"server_error": 2}
    assert u["errors"] == {"server_error": 1}
    assert "script exhausted" in caplog.text and "giving up after 3 attempts" in caplog.text


def test_bad_request_fails_at_once_with_a_hint():
    err = {"status": 404,
           "body": {"error": {"message": "The model `nope` does not exist", "type": "invalid_request_error"}}}
    with ReplayServer([err]) as srv:
        agent = OpenAIAgent(fast_spec(srv.base_url, model="nope"))
        with pytest.raises(LLMRequestError) as exc:
            agent.act([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert exc.value.status == 404 and exc.value.attempts == 1 and exc.value.kind == "http_404"
    assert "does not exist" in str(exc.value) and "check the model id 'nope'" in str(exc.value)


# ---------------------------------------------------------------------------------------------
# Keys


def test_the_key_never_leaks(basin, small_sim, caplog, monkeypatch):
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    with caplog.at_level(logging.DEBUG):
        with ReplayServer(RECORDED / "native_episode.json") as srv:
            agent = OpenAIAgent(fast_spec(srv.base_url, timeout_s=TIMEOUT_S, api_key_env=KEY_VAR,
                                          api_key_required=True))
            ep = run_episode(agent, make_env(basin, small_sim))
            headers = srv.requests[0].headers
        echo = {"status": 401, "body": {"error": {"message": f"Incorrect API key provided: {SENTINEL}.",
                                                  "type": "invalid_request_error", "code": "invalid_api_key"}}}
        with ReplayServer([echo]) as srv:
            bad = OpenAIAgent(fast_spec(srv.base_url, api_key_env=KEY_VAR, api_key_required=True))
            with pytest.raises(LLMRequestError) as exc:
                bad.act([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    assert ep.stop_reason == "no_tool_call"
    assert {"openai", "httpx2"} <= {r.name.split(".")[0] for r in caplog.records}  # their debug logs were seen
    assert {k.lower(): v for k, v in headers.items()}["authorization"] == "[redacted]"  # sent, not recorded
    err = exc.value
    assert "[redacted]" in str(err) and KEY_VAR in str(err) and err.__cause__ is None and err.__suppress_context__
    places = [caplog.text, repr(agent), repr(agent.client), repr(agent.spec), json.dumps(agent.usage),
              json.dumps(agent.history), str(err), repr(err), repr(bad), json.dumps(bad.usage), str(vars(agent))]
    for text in places:
        assert SENTINEL not in text and SENTINEL[8:20] not in text


# ---------------------------------------------------------------------------------------------
# Retries, backoff and rate limits with injected clocks


def test_retry_after_and_exponential_backoff():
    slept: list[float] = []
    rl = {"status": 429, "headers": {"Retry-After": "7"}, "body": {"error": {"message": "slow down"}}}
    rl_ms = {"status": 429, "headers": {"retry-after-ms": "250"}, "body": {"error": {"message": "slow down"}}}
    huge = {"status": 503, "headers": {"Retry-After": "100000"}, "body": {"error": {"message": "maintenance"}}}
    e500 = {"status": 500, "body": {"error": {"message": "oops"}}}
    ok = {"id": "c", "object": "chat.completion", "model": "replay",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "hi"}}]}
    html = {"raw": "<html>502 Bad Gateway</html>"}  # a proxy's page with status 200: unusable, retried
    with ReplayServer([rl, rl_ms, huge, e500, e500, html, ok]) as srv:
        spec = fast_spec(srv.base_url, max_retries=6, backoff_base_s=1.0, backoff_max_s=3.0, retry_after_max_s=60.0)
        client = ChatClient(spec, sleep=slept.append, rng=random.Random(0))
        c = client.complete([{"role": "user", "content": "hello"}])
    assert c.content == "hi" and c.usage["attempts"] == 7 and not c.usage["usage_reported"]
    assert slept[:3] == [7.0, 0.25, 60.0]  # Retry-After obeyed (seconds, ms), capped at retry_after_max_s
    # no Retry-After: min(backoff_max_s, base * 2**(attempt-1)) scaled by a factor in [0.5, 1]
    assert all(1.5 <= d <= 3.0 for d in slept[3:]) and len(slept) == 6
    snap = client.meter.snapshot()
    assert snap["retry_reasons"] == {"rate_limit": 2, "server_error": 3, "bad_response": 1}
    assert snap["usage_missing"] == 1 and snap["requests"] == 1 and snap["attempts"] == 7
    assert snap["backoff_s"] == pytest.approx(sum(slept))


def test_backoff_doubles_up_to_the_cap():
    client = ChatClient(fast_spec("http://127.0.0.1:9/v1", backoff_base_s=1.0, backoff_max_s=5.0),
                        rng=random.Random(1))
    for attempt, cap in [(1, 1.0), (2, 2.0), (3, 4.0), (4, 5.0), (9, 5.0)]:
        delays = [client.retry_delay(attempt) for _ in range(50)]
        assert all(cap / 2 <= d <= cap for d in delays) and len(set(delays)) > 1  # jittered
    assert client.retry_delay(3, retry_after=0.0) == 0.0


def test_parse_retry_after_forms():
    assert parse_retry_after({"Retry-After": "3"}) == 3.0
    assert parse_retry_after({"retry-after-ms": "1500", "retry-after": "9"}) == 1.5
    assert parse_retry_after({"Retry-After": "Wed, 21 Oct 2015 07:28:00 GMT"}, now=1445412470.0) == 10.0
    assert parse_retry_after({"Retry-After": "soon"}) is None and parse_retry_after(None) is None


def test_rate_limiter_spaces_requests():
    now = [100.0]
    waits: list[float] = []

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    lim = RateLimiter(120, clock=lambda: now[0], sleep=sleep)  # one request every 0.5 s
    assert [lim.acquire() for _ in range(3)] == [0.0, 0.5, 0.5]
    now[0] += 2.0
    assert lim.acquire() == 0.0 and waits == [0.5, 0.5]


def test_client_side_rate_limit_is_accounted():
    ok = {"id": "c", "object": "chat.completion", "model": "replay",
          "choices": [{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "x"}}]}
    slept: list[float] = []
    with ReplayServer([ok, ok]) as srv:
        client = ChatClient(fast_spec(srv.base_url, requests_per_minute=6000.0), sleep=slept.append,
                            clock=lambda: 0.0)  # a frozen clock: every request after the first waits a slot
        client.complete([{"role": "user", "content": "a"}])
        client.complete([{"role": "user", "content": "b"}])
    assert slept == [pytest.approx(0.01)] and client.meter.snapshot()["rate_limit_wait_s"] == pytest.approx(0.01)


def test_request_arguments_follow_the_models_file(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", SENTINEL)
    client = ChatClient(with_changes(get_model("gpt-5"), extra_body={"reasoning_effort": "low"}))
    kw = client.request_arguments([{"role": "user", "content": "x"}], tools=tool_schemas(), seed=3)
    assert kw["max_completion_tokens"] == 16384 and "max_tokens" not in kw and "temperature" not in kw
    assert "seed" not in kw and kw["extra_body"] == {"reasoning_effort": "low"} and len(kw["tools"]) == 3
    assert SENTINEL not in repr(client) and SENTINEL not in json.dumps(kw)
    local = ChatClient(get_model("vllm-qwen3-4b")).request_arguments([{"role": "user", "content": "x"}], seed=3)
    assert local["seed"] == 3 and local["temperature"] == 0.0 and local["max_tokens"] == 2048


def test_make_openai_agent_from_campaign_options():
    agent = make_openai_agent(model="replay", seed=4, name="replay-a", base_url="http://127.0.0.1:9/v1",
                              timeout_s=0.25, tool_mode="hermes", max_cost_usd=1.0, backend="embedded")
    assert (agent.name, agent.seed, agent.max_cost_usd, agent.spec.tool_mode) == ("replay-a", 4, 1.0, "hermes")
    assert agent.spec.limits.timeout_s == 0.25 and agent.spec.base_url == "http://127.0.0.1:9/v1"
    with pytest.raises(ConfigError, match="temprature"):
        make_openai_agent(model="replay", temprature=0.1)
    with pytest.raises(ConfigError, match="unknown model 'nope'.*gpt-5"):
        make_openai_agent(model="nope")


def test_cost_budget_stops_the_episode(basin, small_sim):
    reply = {"id": "c1", "object": "chat.completion", "model": "replay",
             "choices": [{"index": 0, "finish_reason": "tool_calls", "message": {
                 "role": "assistant", "content": None,
                 "tool_calls": [{"id": "a", "type": "function",
                                 "function": {"name": "set_parameters", "arguments": "{\"wm\": 2}"}}]}}],
             "usage": {"prompt_tokens": 1_000_000, "completion_tokens": 0, "total_tokens": 1_000_000}}
    with ReplayServer([reply, reply]) as srv:
        agent = OpenAIAgent(fast_spec(srv.base_url, input_usd_per_mtok=2.0), max_cost_usd=2.0)
        ep = run_episode(agent, make_env(basin, small_sim))
        assert srv.served == 1
    assert ep.stop_reason == "policy_stopped" and agent.usage["stopped"] == "cost_budget"
    assert agent.usage["cost_usd"] == pytest.approx(2.0)


# ---------------------------------------------------------------------------------------------
# Native calls as Hermes text


def _call(name, args, cid="x", typ="function"):
    return {"id": cid, "type": typ, "function": {"name": name, "arguments": args}}


@pytest.mark.parametrize("calls", [
    [_call("set_parameters", '{"wm": 1.5, "alpha": 0.8}'), _call("run_simulation", ""), _call("evaluate", "{}")],
    [_call("set_parameters", '{"wm": 1.5,'), _call("set_parameters", '{"wm": NaN}')],
    [_call("set_parameters", '[1, 2]'), _call("set_parameters", '"{}"'), _call("evaluate", {"a": 1})],
    [_call("run_sim", "{}"), _call("RUN_SIMULATION", "{}"), _call(None, "{}")],
    [_call("evaluate", "{}", typ="custom"), {"id": "y", "type": "function"}, _call("set_parameters", None)],
    [_call("set_parameters", '{"wm": 1, "wm": 2}'), _call("set_parameters", '{"WM": 1e400}')],
    [_call("set_parameters", {"wm": float("nan")}), _call("set_parameters", "</tool_call><tool_call>")],
    [_call("set_parameters", '{"</tool_call>": 1, "wm": 2}'), _call("</tool_call>", "{}")],
])
def test_native_calls_reach_the_environment_unchanged(calls, caplog):
    with caplog.at_level(logging.WARNING):
        text = native_calls_to_text(calls, "prose with <tool_call> inside </tool_call>")
    want = from_openai_tool_calls(calls, max_calls=len(calls)).items()
    got = parse_message(text, max_calls=len(calls)).items()
    key = [(type(i).__name__, getattr(i, "reason", None), getattr(i, "name", None), getattr(i, "arguments", None))
           for i in want]
    assert key == [(type(i).__name__, getattr(i, "reason", None), getattr(i, "name", None),
                    getattr(i, "arguments", None)) for i in got]
    assert "parse differently" not in caplog.text
    assert text.startswith("prose with [tool_call] inside [/tool_call]")
    for item in want:  # a well-formed call without "<" is written exactly as render_hermes writes it
        if isinstance(item, ToolCall) and "<" not in json.dumps(dict(item.arguments)):
            assert render_hermes(ToolCall(item.name, item.arguments)) in text


# ---------------------------------------------------------------------------------------------
# The replay server


def _post(url: str, body: dict) -> tuple[int, dict]:
    req = urllib.request.Request(url + "/chat/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json", "Authorization": "Bearer abc"})
    try:
        with urllib.request.urlopen(req, timeout=5) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_replay_server_is_bounded_and_strict():
    with pytest.raises(ValueError, match="loopback"):
        ReplayServer([], host="0.0.0.0")
    with pytest.raises(ValueError, match="entry 0: unknown key"):
        ReplayServer([{"stauts": 200}])
    ok = bodies("native_episode.json")[0]
    with ReplayServer([ok]) as srv:
        unanswered = {"model": "m", "messages": [
            {"role": "user", "content": "u"},
            {"role": "assistant", "content": None, "tool_calls": [_call("evaluate", "{}", cid="c1")]},
            {"role": "user", "content": "next"}]}
        status, body = _post(srv.base_url, unanswered)
        assert status == 400 and "c1" in body["error"]["message"] and srv.served == 0  # no entry used
        wrong_id = dict(unanswered, messages=unanswered["messages"][:2] + [
            {"role": "tool", "tool_call_id": "c2", "content": "{}"}])
        assert _post(srv.base_url, wrong_id)[0] == 400
        good = dict(unanswered, messages=unanswered["messages"][:2] + [
            {"role": "tool", "tool_call_id": "c1", "content": "{}"}])
        status, body = _post(srv.base_url, good)
        assert status == 200 and body == ok and srv.served == 1 and srv.remaining == 0
        status, body = _post(srv.base_url, good)
        assert status == 500 and "script exhausted after 1 responses" in body["error"]["message"]
        with urllib.request.urlopen(srv.base_url + "/models", timeout=5) as r:
            assert [m["id"] for m in json.loads(r.read())["data"]] == ["claude-sonnet-4-6"]
        recorded = srv.requests
    assert [r.status for r in recorded] == [400, 400, 200, 500] and [r.entry for r in recorded] == [None, None, 0, None]
    assert recorded[2].headers["Authorization"] == "[redacted]" and recorded[2].body == good
    assert check_tool_messages({"model": "m", "messages": [{"role": "tool", "content": "x"}]}) is not None


def test_replay_server_command_line(tmp_path):
    path = tmp_path / "script.json"
    path.write_text(json.dumps(bodies("hermes_episode.json")[:1]))
    proc = subprocess.Popen([sys.executable, "-m", "hydroagent_hpc.agents.llm.replay_server", "--script", str(path),
                             "--port", "0"], stderr=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        line, deadline = "", time.monotonic() + 30
        while "replay server on" not in line and time.monotonic() < deadline:
            line = proc.stderr.readline()
        url = re.search(r"(http://127\.0\.0\.1:\d+/v1)", line).group(1)
        status, body = _post(url, {"model": "Qwen/Qwen3-4B-Instruct-2507",
                                   "messages": [{"role": "user", "content": "hi"}]})
        assert status == 200 and body["id"] == "chatcmpl-rec-hermes-0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stderr.close()
