"""The hosted-model client under hostile replies: every episode ends, in bounded time, without a leak.

The real ``openai`` client talks over HTTP to the loopback
:class:`~hydroagent_hpc.agents.llm.replay_server.ReplayServer`, which answers with replies made by a
seeded generator over body shapes (issue 13, item 4):

- transient shapes, retried within the retry budget: a truncated JSON body, an HTML page (status
  200, 200 claiming to be JSON, or 5xx), a body that is not JSON or not UTF-8, a JSON body whose
  ``choices`` have the wrong shape, a 200 carrying an ``error``, and an answer dripped one byte at a
  time (body only, or from the status line on) that only a wall-clock deadline ends;
- turn-level shapes, which become parse failures of that turn: a malformed ``tool_calls`` field,
  a ``content`` that is not text, text with lone surrogates, a huge reply text, huge tool-call
  arguments, and a response body beyond ``limits.max_response_bytes``.

Every case asserts: the episode ends (no exception escapes, no hang) within a bound computed from
the limits; it ends as expected (the next good reply is used, or retries run out into a clean
``LLMRequestError``); unusable text is recorded as parse failure turns; no request re-sends more
than the kept size; and the API key never reaches the logs, the usage record or the episode.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import random
import threading
import time
from typing import Any

import pytest

pytest.importorskip("openai")

from hydroagent_hpc.agents.llm.client import ChatClient, LLMRequestError
from hydroagent_hpc.agents.llm.models_file import MAX_REPLY_CHARS, MAX_RESPONSE_BYTES, get_model
from hydroagent_hpc.agents.llm.openai_api import OpenAIAgent, with_changes
from hydroagent_hpc.agents.llm.replay_server import ReplayServer
from hydroagent_hpc.config import preset
from hydroagent_hpc.env.environment import CalibrationEnv
from hydroagent_hpc.env.episode import run_episode
from hydroagent_hpc.env.toolcalls import parse_message, render_hermes
from hydroagent_hpc.sim.basin import load_basin
from hydroagent_hpc.types import ToolCall

SEED = 20261201
SENTINEL = "sk-test-BOUNDS-5d1e8a0c93f7"
KEY_VAR = "HYDROAGENT_TEST_BOUNDS_KEY"
MAX_RETRIES = 3
REPLY_CAP = 20_000  # limits.max_reply_chars for the generated cases (and the env's max_message_chars)
BODY_CAP = 256 * 1024  # limits.max_response_bytes for the generated cases
TIMEOUT_S = 5.0  # generous: a loaded machine must not turn a prompt answer into a retry
DRIP_TIMEOUT_S = 1.5  # the deadline of one attempt in the drip cases
DRIP_S = 0.2  # below the per-read timeout: only a wall-clock deadline stops a drip
SLACK_S = 15.0  # start-up, simulation and a loaded machine

TRANSIENT = {"truncated_json": "bad_response", "html_200": "bad_response", "html_as_json": "bad_response",
             "html_5xx": "server_error", "not_json": "bad_response", "not_utf8": "bad_response",
             "bad_envelope": "bad_response", "error_200": "bad_response", "drip_body": "timeout",
             "drip_headers": "timeout"}
TURN = {"bad_tool_calls": {"malformed_call", "bad_arguments", "unknown_tool", "no_tool_call"},
        "bad_content": {"no_tool_call"},
        "surrogates": {"invalid_text"},
        "huge_content": {"message_too_long"},
        "huge_args": {"bad_arguments", "message_too_long", "unclosed_tag"},
        "huge_body": {"no_tool_call"}}
FINAL_TURNS = [("tool", "set_parameters", None), ("tool", "run_simulation", None), ("tool", "evaluate", None)]


# ---------------------------------------------------------------------------------------------
# The generator


@dataclasses.dataclass(frozen=True)
class Case:
    """One generated episode: hostile entries, then (unless they exhaust the retries) a good reply."""

    ident: str
    shape: str
    mode: str  # "native" or "hermes"
    entries: tuple[Any, ...]
    outcome: str  # "retried", "exhausted" or "parse_failure"

    @property
    def timeout_s(self) -> float:
        return DRIP_TIMEOUT_S if self.shape.startswith("drip") else TIMEOUT_S

    @property
    def bound_s(self) -> float:
        """The longest the episode may take: every attempt up to its deadline, backoff, slack."""
        return (MAX_RETRIES + 1) * (self.timeout_s + 0.05) + SLACK_S


def _completion(message: dict[str, Any], rid: str = "c", finish: str = "stop") -> dict[str, Any]:
    return {"id": rid, "object": "chat.completion", "model": "replay",
            "choices": [{"index": 0, "finish_reason": finish, "message": {"role": "assistant", **message}}],
            "usage": {"prompt_tokens": 100, "completion_tokens": 20, "total_tokens": 120}}


def _native_call(cid: str, name: Any, arguments: Any) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": name, "arguments": arguments}}


def good_reply(mode: str) -> dict[str, Any]:
    """set wm, run, evaluate: with max_simulations=1 the episode then ends as "max_simulations"."""
    calls = [ToolCall("set_parameters", {"wm": 1.3}), ToolCall("run_simulation", {}), ToolCall("evaluate", {})]
    if mode == "hermes":
        text = "Wetter soils next.\n" + "\n".join(render_hermes(c) for c in calls)
        return _completion({"content": text}, "final")
    native = [_native_call(f"f{k}", c.name, json.dumps(c.arguments)) for k, c in enumerate(calls)]
    return _completion({"content": "Wetter soils next.", "tool_calls": native}, "final", "tool_calls")


def _html(rng: random.Random) -> str:
    code = rng.choice([502, 503, 504, 520])
    title = rng.choice(["Bad Gateway", "Service Unavailable", "Gateway Timeout", "Web server is returning an error"])
    filler = "".join(rng.choice("abcdefghij <>/=\"'") for _ in range(rng.randrange(0, 400)))
    return (f"<!DOCTYPE html>\n<html><head><title>{code} {title}</title></head><body><h1>{title}</h1>"
            f"<p>{filler}</p></body></html>\n")


def _with_surrogate(rng: random.Random, text: str) -> str:
    at = rng.randrange(0, len(text) + 1)
    return text[:at] + chr(rng.randrange(0xD800, 0xE000)) + text[at:]


def _bad_tool_calls(rng: random.Random) -> Any:
    broken = [
        lambda: 5, lambda: "x", lambda: None, lambda: [1, 2],
        lambda: {"function": "set_parameters"},
        lambda: {"id": "b", "type": "function"},
        lambda: _native_call("b", 7, "{}"),
        lambda: _native_call("b", ["evaluate"], "{}"),
        lambda: _native_call("b", "evaluate", 5),
        lambda: _native_call("b", "set_parameters", ["wm", 1.2]),
        lambda: _native_call("b", "set_parameters", '{"wm": 1e999}'),
        lambda: _native_call("b", "set_parameters", '{"wm": 1.2'),
        lambda: _native_call("b", None, None),
        lambda: {"id": 5, "type": "custom", "function": {"name": "evaluate", "arguments": "{}"}},
        lambda: _native_call("b", "run_sim", "{}"),
    ]
    whole = [lambda: "call set_parameters", lambda: 42, lambda: True, lambda: {"a": 1},
             lambda: _native_call("w", "set_parameters", '{"wm": 1.1}')]  # an object, not an array
    if rng.random() < 0.3:
        return rng.choice(whole)()
    items = [rng.choice(broken)() for _ in range(rng.randrange(1, 4))]
    if rng.random() < 0.5:  # a valid call among broken ones still runs (it changes no simulation count)
        items.insert(rng.randrange(0, len(items) + 1), _native_call("ok", "set_parameters", '{"alpha": 0.9}'))
    return items


def hostile_entry(rng: random.Random, shape: str, mode: str) -> Any:
    """One replay-script entry of ``shape``."""
    good = good_reply(mode)
    text = json.dumps(good)
    if shape == "truncated_json":
        return {"raw": text[:rng.randrange(0, len(text) - 1)], "content_type": "application/json"}
    if shape == "html_200":
        return {"raw": _html(rng), "content_type": "text/html; charset=utf-8"}
    if shape == "html_as_json":
        return {"raw": _html(rng), "content_type": "application/json"}
    if shape == "html_5xx":
        return {"status": rng.choice([500, 502, 503, 504]), "raw": _html(rng), "content_type": "text/html"}
    if shape == "not_json":
        raw = rng.choice(["", "OK", "upstream connect error or disconnect/reset before headers",
                          "data: {\"choices\": []}\n\n", "".join(rng.choice("{}[]:,\"x1 ") for _ in range(60))])
        return {"raw": raw, "content_type": rng.choice(["application/json", "text/plain"])}
    if shape == "not_utf8":  # a lone surrogate written with surrogatepass: bytes that are not UTF-8
        at = text.index("Wetter") + rng.randrange(0, 6)
        return {"raw": text[:at] + chr(rng.randrange(0xD800, 0xE000)) + text[at:], "content_type": "application/json"}
    if shape == "bad_envelope":
        body = rng.choice([{"choices": "abc"}, {"choices": {}}, {"choices": []}, {"choices": [5]},
                           {"choices": [{"message": "hi"}]}, {"choices": [{"message": None}]},
                           {"choices": [{"message": [1]}]}, {"id": "x", "object": "chat.completion"},
                           [1, 2], "text", 5, {"choices": None}])
        return {"status": 200, "body": body}
    if shape == "error_200":
        return {"status": 200, "body": {"error": {"message": rng.choice(["overloaded", "upstream timeout"]),
                                                  "type": "server_error"}}}
    if shape in ("drip_body", "drip_headers"):
        return {"status": 200, "body": good, "drip_s": DRIP_S, "drip_headers": shape == "drip_headers"}
    if shape == "bad_tool_calls":
        return _completion({"content": rng.choice([None, "", "Let me try."]), "tool_calls": _bad_tool_calls(rng)})
    if shape == "bad_content":
        return _completion({"content": rng.choice([5, 1.5, True, {"text": "hi"}, [1, 2], [{"type": "image"}]])})
    if shape == "surrogates":
        if mode == "hermes":
            block = render_hermes(ToolCall("set_parameters", {"wm": 1.1}))
            return _completion({"content": _with_surrogate(rng, "Trying wm 1.1. ") + block})
        where = rng.choice(["content", "name", "arguments"])
        content = _with_surrogate(rng, "Trying wm 1.1.") if where == "content" else "Trying wm 1.1."
        name = _with_surrogate(rng, "set_parameters") if where == "name" else "set_parameters"
        args = '{"wm": 1.1, "note": "' + _with_surrogate(rng, "wet") + '"}' if where == "arguments" else '{"wm": 1.1}'
        return _completion({"content": content, "tool_calls": [_native_call("s1", name, args)]}, finish="tool_calls")
    if shape == "huge_content":
        n = rng.randrange(REPLY_CAP + 1, 12 * REPLY_CAP)
        filler = "".join(rng.choice("abc def\n") for _ in range(97)) * (n // 97 + 1)
        if mode == "hermes":
            block = render_hermes(ToolCall("set_parameters", {"wm": 1.1}))
            return _completion({"content": block + filler[:n] if rng.random() < 0.5 else filler[:n] + block})
        return _completion({"content": filler[:n], "tool_calls": [_native_call("h1", "set_parameters", '{"wm": 1.1}')]},
                           finish="tool_calls")
    if shape == "huge_args":
        n = rng.randrange(REPLY_CAP + 1, 12 * REPLY_CAP)
        args = '{"wm": 1.1, "note": "' + "w" * n + '"}'
        if mode == "hermes":
            return _completion({"content": f"<tool_call>\n{{\"name\": \"set_parameters\", \"arguments\": {args}}}\n"
                                           "</tool_call>"})
        return _completion({"content": None, "tool_calls": [_native_call("a1", "set_parameters", args)]},
                           finish="tool_calls")
    if shape == "huge_body":
        return _completion({"content": "z" * rng.randrange(BODY_CAP + 1, 4 * BODY_CAP)})
    raise ValueError(shape)


def generate_cases(seed: int = SEED, per_shape: int = 4) -> list[Case]:
    """``per_shape`` cases of every shape, modes alternating; a quarter of the transient ones exhaust the retries."""
    rng = random.Random(seed)
    cases = []
    for s, shape in enumerate([*TRANSIENT, *TURN]):
        for k in range(per_shape):
            mode = ("native", "hermes")[(k + s) % 2]
            if shape in TRANSIENT:
                exhaust = k == per_shape - 1
                n = MAX_RETRIES + 1 if exhaust else rng.randrange(1, MAX_RETRIES + 1)
                if shape.startswith("drip") and not exhaust:
                    n = 1  # keep the suite short: one dripped attempt, then the good reply
                entries = tuple(hostile_entry(rng, shape, mode) for _ in range(n))
                outcome = "exhausted" if exhaust else "retried"
            else:
                entries = (hostile_entry(rng, shape, mode),)
                outcome = "parse_failure"
            cases.append(Case(f"{shape}-{k}-{mode}", shape, mode, entries, outcome))
    return cases


CASES = generate_cases()


# ---------------------------------------------------------------------------------------------
# Running one case


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def make_env(basin, sim, **over):
    cfg = dict(target_nse=0.999, end_on_no_tool_call=False, max_simulations=1, max_turns=80, patience=None,
               max_consecutive_parse_failures=None, max_message_chars=REPLY_CAP)
    cfg.update(over)
    return CalibrationEnv(basin, sim, preset("paper", **cfg), agent="llm-bounds")


def make_spec(base_url: str, mode: str, **changes):
    spec = with_changes(get_model("replay"), base_url=base_url, tool_mode=mode, observation_role="user",
                        api_key_env=KEY_VAR, api_key_required=True, timeout_s=TIMEOUT_S, max_retries=MAX_RETRIES,
                        backoff_base_s=0.01, backoff_max_s=0.05, max_reply_chars=REPLY_CAP,
                        max_response_bytes=BODY_CAP)
    return with_changes(spec, **changes) if changes else spec


def run_bounded(agent, env, srv, bound_s: float):
    """``run_episode`` in a thread; returns (episode or None, exception or None, seconds, finished)."""
    box: dict[str, Any] = {}

    def work():
        try:
            box["episode"] = run_episode(agent, env)
        except BaseException as exc:
            box["error"] = exc

    t0 = time.monotonic()
    t = threading.Thread(target=work, daemon=True)
    t.start()
    t.join(bound_s)
    finished = not t.is_alive()
    elapsed = time.monotonic() - t0
    if not finished:
        srv.stop()  # ends any drip; the worker then fails and returns
        t.join(30)
    return box.get("episode"), box.get("error"), elapsed, finished


def _request_sizes(srv) -> list[int]:
    return [len(json.dumps(r.body)) for r in srv.requests if r.body is not None]


@pytest.mark.parametrize("case", CASES, ids=[c.ident for c in CASES])
def test_hostile_reply_is_bounded(case, basin, small_sim, caplog, monkeypatch):
    monkeypatch.setenv(KEY_VAR, SENTINEL)
    # a retried case gets a spare good reply: a loaded machine may time out the first one
    spare = {"exhausted": 0, "retried": 2, "parse_failure": 1}[case.outcome]
    script = list(case.entries) + [good_reply(case.mode)] * spare
    with caplog.at_level(logging.DEBUG):
        srv = ReplayServer(script).start()
        try:
            agent = OpenAIAgent(make_spec(srv.base_url, case.mode, timeout_s=case.timeout_s))
            ep, error, elapsed, finished = run_bounded(agent, make_env(basin, small_sim), srv, case.bound_s)
            sizes = _request_sizes(srv)
        finally:
            srv.stop()
    assert finished, f"the episode was still running after {case.bound_s:.0f} s"
    assert error is None, f"an exception escaped the episode: {error!r}"
    assert elapsed <= case.bound_s
    usage = agent.usage
    got = [(t.kind, t.tool, t.error) for t in ep.turns]
    if case.outcome == "exhausted":
        assert ep.stop_reason == "policy_error: LLMRequestError" and got == []
        assert usage["errors"] == {TRANSIENT[case.shape]: 1} and usage["attempts"] == MAX_RETRIES + 1
    elif case.outcome == "retried":
        assert ep.stop_reason == "max_simulations", (ep.stop_reason, got)
        assert got == FINAL_TURNS
        assert usage["retry_reasons"].get(TRANSIENT[case.shape], 0) >= len(case.entries)
    else:
        assert ep.stop_reason == "max_simulations", (ep.stop_reason, got)
        hostile, final = got[:-3], got[-3:]
        assert final == FINAL_TURNS  # the conversation went on: the history was re-sendable
        reasons = {e for kind, _, e in hostile if kind == "parse_failure"}
        assert reasons & TURN[case.shape], (case.shape, hostile)
        assert usage["retries"] == 0 and usage["requests"] == 2
        # nothing beyond the kept size is sent again
        assert max(sizes) <= 3 * REPLY_CAP + 30_000, sizes
    texts = [caplog.text, json.dumps(usage), json.dumps(agent.history), repr(agent), repr(agent.client),
             json.dumps([dataclasses.asdict(t) for t in ep.turns], default=str)]
    for text in texts:
        assert SENTINEL not in text and SENTINEL[8:20] not in text


# ---------------------------------------------------------------------------------------------
# The issue's examples at the default limits


def test_a_30_mb_reply_is_not_kept_or_resent(basin, small_sim):
    huge = _completion({"content": "y" * (30 * 1024 * 1024)})
    with ReplayServer([huge, good_reply("native")]) as srv:
        agent = OpenAIAgent(with_changes(get_model("replay"), base_url=srv.base_url, timeout_s=60.0, max_retries=1))
        assert agent.spec.limits.max_response_bytes == MAX_RESPONSE_BYTES
        t0 = time.monotonic()
        ep = run_episode(agent, make_env(basin, small_sim, max_message_chars=MAX_REPLY_CHARS))
        elapsed = time.monotonic() - t0
        sizes = _request_sizes(srv)
    got = [(t.kind, t.tool, t.error) for t in ep.turns]
    assert got == [("parse_failure", None, "no_tool_call")] + FINAL_TURNS and ep.stop_reason == "max_simulations"
    assert "discarded" in ep.turns[0].text and len(ep.turns[0].text) < 1000
    assert max(sizes) < 100_000 and elapsed < 60
    assert agent.usage["retries"] == 0


def test_a_5_mb_text_is_cut_and_marked(basin, small_sim):
    block = render_hermes(ToolCall("set_parameters", {"wm": 1.1}))
    big = _completion({"content": block + "\n" + "q" * (5 * 1024 * 1024)})
    with ReplayServer([big, good_reply("hermes")]) as srv:
        agent = OpenAIAgent(with_changes(get_model("replay"), base_url=srv.base_url, tool_mode="hermes",
                                         observation_role="user"))
        ep = run_episode(agent, make_env(basin, small_sim, max_message_chars=MAX_REPLY_CHARS))
        sizes = _request_sizes(srv)
    got = [(t.kind, t.tool, t.error) for t in ep.turns]
    assert got == [("tool", "set_parameters", None), ("parse_failure", None, "message_too_long")] + FINAL_TURNS
    kept = agent.history[2]["content"]
    assert kept.startswith(block) and len(kept) < MAX_REPLY_CHARS + 200 and "cut off" in kept
    assert max(sizes) < MAX_REPLY_CHARS + 50_000


def test_a_dripping_server_is_cut_at_the_deadline():
    ok = _completion({"content": "hello"})
    drip = {"status": 200, "body": ok, "drip_s": 0.3}
    with ReplayServer([drip, drip, ok]) as srv:
        client = ChatClient(with_changes(get_model("replay"), base_url=srv.base_url, timeout_s=1.0, max_retries=2,
                                         backoff_base_s=0.01, backoff_max_s=0.02))
        t0 = time.monotonic()
        c = client.complete([{"role": "user", "content": "hi"}])
        elapsed = time.monotonic() - t0
    assert c.content == "hello" and c.usage["attempts"] == 3
    assert client.meter.snapshot()["retry_reasons"] == {"timeout": 2}
    assert 2.0 <= elapsed < 2.0 + SLACK_S


def test_retries_run_out_on_drip_into_a_clean_error():
    drip = {"status": 200, "body": _completion({"content": "late"}), "drip_s": 0.3, "drip_headers": True}
    with ReplayServer([drip, drip]) as srv:
        client = ChatClient(with_changes(get_model("replay"), base_url=srv.base_url, timeout_s=0.8, max_retries=1,
                                         backoff_base_s=0.01, backoff_max_s=0.02))
        t0 = time.monotonic()
        with pytest.raises(LLMRequestError) as err:
            client.complete([{"role": "user", "content": "hi"}])
        elapsed = time.monotonic() - t0
    assert err.value.kind == "timeout" and err.value.attempts == 2 and "0.8 s" in str(err.value)
    assert elapsed < 1.6 + SLACK_S


def test_lone_surrogates_make_a_parse_failure_of_the_whole_message():
    block = render_hermes(ToolCall("run_simulation", {}))
    parsed = parse_message("ok \udc80 " + block)
    assert parsed.calls == [] and [f.reason for f in parsed.failures] == ["invalid_text"]
    assert "surrogate" in parsed.failures[0].detail and "\udc80" not in parsed.failures[0].detail
    assert parse_message("ok \U0001F600 " + block).ok  # a real emoji is text


def test_requests_never_carry_lone_surrogates():
    ok = _completion({"content": "fine"})
    with ReplayServer([ok]) as srv:
        client = ChatClient(with_changes(get_model("replay"), base_url=srv.base_url))
        c = client.complete([{"role": "user", "content": "bad \ud800 text"},
                             {"role": "assistant", "content": "x", "tool_calls": [
                                 _native_call("t", "set_parameters", '{"wm": 1.2, "n": "\udfff"}')]},
                             {"role": "tool", "tool_call_id": "t", "content": "{}"}])
        sent = srv.chat_requests()[0]["messages"]
    assert c.content == "fine"
    assert sent[0]["content"] == "bad \ufffd text" and "\ufffd" in sent[1]["tool_calls"][0]["function"]["arguments"]


def test_replay_server_hostile_modes():
    import urllib.request

    ok = _completion({"content": "x"})
    script = [{"raw": "<html>oops</html>", "content_type": "text/html"}, {"status": 200, "body": ok, "drip_s": 0.01}]
    with ReplayServer(script, strict=False) as srv:
        req = {"model": "m", "messages": [{"role": "user", "content": "u"}]}
        for want_type, want in (("text/html", b"<html>oops</html>"), ("application/json", json.dumps(ok).encode())):
            r = urllib.request.urlopen(urllib.request.Request(srv.base_url + "/chat/completions",
                                                              data=json.dumps(req).encode()), timeout=30)
            assert r.headers["Content-Type"] == want_type and r.read() == want
    for bad in ({"drip_s": -1}, {"drip_s": "1"}, {"drip_headers": 1}, {"content_type": 5}):
        with pytest.raises(ValueError, match="entry 0"):
            ReplayServer([{"status": 200, "body": {}, **bad}])
