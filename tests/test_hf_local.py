"""The local Hugging Face policy and the tiny offline Qwen3 model (docs/rl-notes.md sections 1, 2, 8).

Everything runs offline on a CPU: the model is a random tiny Qwen3, the tokenizer is trained on
the spot. A random model writes garbage (the environment turns it into parse failures); the
end-to-end test that needs valid calls forces the tokens of a scripted reply with a logits
processor, so the whole path (template, generation, decoding of special tokens, the env's parser,
tool responses rendered back, the next turn's suffix) is exercised and checked.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pytest

# No hub here: huggingface_hub reads this once, at import, so set it before transformers loads.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from hydroagent_hpc.agents.base import Policy  # noqa: E402
from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy, turn_seed  # noqa: E402
from hydroagent_hpc.config import preset  # noqa: E402
from hydroagent_hpc.env.environment import CalibrationEnv  # noqa: E402
from hydroagent_hpc.env.episode import run_episode  # noqa: E402
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response, tool_schemas  # noqa: E402
from hydroagent_hpc.sim.basin import load_basin  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.types import ToolCall  # noqa: E402


@pytest.fixture(scope="module", autouse=True)
def _single_thread_quiet():
    """One torch thread (a tiny model decodes faster on one, and a busy second core makes two
    threads several times slower); no weight-loading progress bars."""
    from transformers.utils import logging as hf_logging

    old_threads = torch.get_num_threads()
    torch.set_num_threads(1)
    hf_logging.disable_progress_bar()
    yield
    torch.set_num_threads(old_threads)
    hf_logging.enable_progress_bar()


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def model(tok):
    return tiny.build_tiny_qwen3(tok, seed=0)


@pytest.fixture(scope="module")
def basin(small_basin_dir):
    return load_basin(small_basin_dir)


def _env(basin, sim, **over):
    return CalibrationEnv(basin, sim, preset("paper", **{"max_turns": 6, "target_nse": 0.999, **over}), agent="hf")


def _encode(tok, text):
    return tok.encode(text, add_special_tokens=False)


SYSTEM = "You calibrate the CREST model. Call tools."
USER = "Calibrate basin syn_small. Target: NSE above 0.8."
SET = render_hermes(ToolCall("set_parameters", {"wm": 1.2, "alpha": 0.9}))
RUN = render_hermes(ToolCall("run_simulation", {}))
EVAL = render_hermes(ToolCall("evaluate", {}))


# ------------------------------------------------------------------------------ tokenizer


def test_tokenizer_specials_are_single_special_tokens(tok, model):
    specials = set(tok.all_special_tokens)
    for t in tiny.SPECIAL_TOKENS:
        ids = _encode(tok, t)
        assert len(ids) == 1, (t, ids)
        assert t in specials
        assert ids[0] in _encode(tok, f"abc{t}def")  # found inside text too
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|endoftext|>"
    assert tok.pad_token_id != tok.eos_token_id
    assert tok.padding_side == "left"
    assert model.config.vocab_size == len(tok)
    # A Hermes call keeps its tags as single ids and decodes back to the same text.
    ids = _encode(tok, "Lower wm. " + SET)
    assert ids.count(tok.convert_tokens_to_ids("<tool_call>")) == 1
    assert ids.count(tok.convert_tokens_to_ids("</tool_call>")) == 1
    assert tok.decode(ids, skip_special_tokens=False) == "Lower wm. " + SET
    text = "wm=1.5 ±0.1 km² °N 水 \n\t {}"
    assert tok.decode(_encode(tok, text)) == text  # byte-level: any text round-trips


def test_tokenizer_is_deterministic(tok):
    again = tiny.build_tiny_tokenizer()
    assert again.get_vocab() == tok.get_vocab()
    assert _encode(again, SYSTEM + SET) == _encode(tok, SYSTEM + SET)


# ------------------------------------------------------------------------------ chat template


def _conversation():
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER},
            {"role": "assistant", "content": "First a baseline. " + SET + "\n" + RUN},
            {"role": "tool", "content": render_tool_response({"status": "ok", "params": {"wm": 1.2}})},
            {"role": "tool", "content": render_tool_response({"status": "ok", "run": 1})},
            {"role": "assistant", "content": EVAL},
            {"role": "tool", "content": render_tool_response({"status": "ok", "NSE": 0.41})}]


def test_template_renders_tools_calls_and_responses(tok):
    tools = tool_schemas()
    msgs = _conversation()
    text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    tools_block = "<tools>" + "".join("\n" + json.dumps(t, ensure_ascii=False) for t in tools) + "\n</tools>"
    assert text.startswith("<|im_start|>system\n" + SYSTEM + "\n\n# Tools\n")
    system_turn = text[: text.index("<|im_end|>")]
    assert tools_block in system_turn  # the schemas are in the system turn, one per line
    assert '<tool_call>\n{"name": <function-name>, "arguments": <args-json-object>}\n</tool_call>' in system_turn
    assert f"<|im_start|>user\n{USER}<|im_end|>\n" in text
    assert f"<|im_start|>assistant\nFirst a baseline. {SET}\n{RUN}<|im_end|>\n" in text
    # Consecutive tool messages share one user turn, each in its own <tool_response>.
    assert ("<|im_start|>user\n<tool_response>\n" + msgs[3]["content"] + "\n</tool_response>\n<tool_response>\n"
            + msgs[4]["content"] + "\n</tool_response><|im_end|>\n") in text
    assert text.endswith("<tool_response>\n" + msgs[6]["content"] + "\n</tool_response><|im_end|>\n"
                         "<|im_start|>assistant\n")
    # Without tools: a plain system turn; without the generation prompt: no open assistant turn.
    plain = tok.apply_chat_template(msgs[:2], tokenize=False)
    assert plain == f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{USER}<|im_end|>\n"


def test_template_openai_tool_calls_render_like_render_hermes(tok):
    calls = [ToolCall("set_parameters", {"wm": 1.5, "alpha": 0.8}), ToolCall("run_simulation", {})]
    for as_string in (False, True):
        tc = [{"type": "function", "function": {"name": c.name, "arguments": json.dumps(c.arguments) if as_string
                                                else c.arguments}} for c in calls]
        msgs = [{"role": "user", "content": USER}, {"role": "assistant", "content": "Try this.", "tool_calls": tc}]
        text = tok.apply_chat_template(msgs, tokenize=False)
        want = "Try this.\n" + "\n".join(render_hermes(c) for c in calls)
        assert text.endswith(f"<|im_start|>assistant\n{want}<|im_end|>\n")


def test_template_assistant_mask_covers_content_and_im_end(tok):
    msgs = _conversation()[:6]
    out = tok.apply_chat_template(msgs, tools=tool_schemas(), return_assistant_tokens_mask=True, return_dict=True)
    ids, mask = out["input_ids"], out["assistant_masks"]
    masked = tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False)
    assert masked == msgs[2]["content"] + "<|im_end|>" + msgs[5]["content"] + "<|im_end|>"


_scalars = (st.none() | st.booleans() | st.floats(allow_nan=False, width=32) | st.integers(-10**6, 10**6)
            | st.text(max_size=8))
_json_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=3)
                            | st.dictionaries(st.text(max_size=6), c, max_size=3), max_leaves=6)
_prose = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=30)
_calls = st.sampled_from([SET, RUN, EVAL, "<tool_call>\n{bad json\n</tool_call>", "</tool_call>"])
_contents = st.lists(st.one_of(_prose, _calls), min_size=1, max_size=3).map(" ".join).map(str.strip).filter(bool)
_observations = st.dictionaries(st.text(min_size=1, max_size=8), _json_values, min_size=1, max_size=4) \
    .map(render_tool_response)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rounds=st.lists(st.tuples(_contents, st.lists(_observations, min_size=1, max_size=3)), min_size=1,
                       max_size=4))
def test_template_is_prefix_stable_and_concatenated_ids_match(tok, rounds):
    """Turn N renders as an exact prefix of turn N+1, and ids built by concatenation (prompt, then
    per turn content + <|im_end|>, then the encoded suffix) equal the ids of the full rendering."""
    tools = tool_schemas()
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    held_text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
    ids = _encode(tok, held_text)
    for content, observations in rounds:
        msgs.append({"role": "assistant", "content": content})
        msgs += [{"role": "tool", "content": o} for o in observations]
        held_text += content + "<|im_end|>"
        ids += _encode(tok, content) + [im_end]
        text = tok.apply_chat_template(msgs, tools=tools, tokenize=False, add_generation_prompt=True)
        assert text.startswith(held_text)
        ids += _encode(tok, text[len(held_text):])
        held_text = text
        assert ids == _encode(tok, text)


# ------------------------------------------------------------------------------ model files


def test_tiny_model_size_and_seed(tok, model):
    n = sum(p.numel() for p in model.parameters())
    assert 0.3e6 < n < 2e6
    assert model.config.tie_word_embeddings and model.config.bos_token_id is None
    assert model.config.eos_token_id == tok.eos_token_id and model.config.pad_token_id == tok.pad_token_id
    state = torch.random.get_rng_state()
    again = tiny.build_tiny_qwen3(tok, seed=0)
    other = tiny.build_tiny_qwen3(tok, seed=1)
    assert torch.equal(torch.random.get_rng_state(), state)  # the global RNG is untouched
    w = model.model.embed_tokens.weight
    assert torch.equal(again.model.embed_tokens.weight, w) and not torch.equal(other.model.embed_tokens.weight, w)


def test_save_load_round_trip_offline(tmp_path, tok, model):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = tiny.save_tiny(tmp_path / "tiny", model=model, tokenizer=tok)
    names = {p.name for p in path.iterdir()}
    assert {"config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "chat_template.jinja"} <= names
    tok2 = AutoTokenizer.from_pretrained(path)
    model2 = AutoModelForCausalLM.from_pretrained(path).eval()
    assert tok2.chat_template == tiny.CHAT_TEMPLATE and tok2.padding_side == "left"
    assert tok2.get_vocab() == tok.get_vocab()
    assert [tok2.convert_tokens_to_ids(t) for t in tiny.SPECIAL_TOKENS] == list(range(len(tiny.SPECIAL_TOKENS)))
    assert tok2.eos_token == "<|im_end|>" and tok2.pad_token == "<|endoftext|>"
    msgs = _conversation()
    assert (tok2.apply_chat_template(msgs, tools=tool_schemas(), tokenize=False)
            == tok.apply_chat_template(msgs, tools=tool_schemas(), tokenize=False))
    x = torch.tensor([_encode(tok, SYSTEM + SET)])
    with torch.inference_mode():
        assert torch.equal(model(x).logits, model2(x).logits)
    # The policy loads a folder by path, on the CPU, in float32.
    policy = HFLocalPolicy(str(path), device="cpu", greedy=True, max_new_tokens=8)
    assert policy.name == "hf:tiny" and policy.settings["dtype"] == "float32"
    ref = HFLocalPolicy(model, tok, greedy=True, max_new_tokens=8)
    msgs = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]
    assert policy.act(msgs) == ref.act(msgs)


# ------------------------------------------------------------------------------ decoding


def _start():
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": USER}]


def test_policy_protocol_and_settings(tok, model):
    p = HFLocalPolicy((model, tok), max_new_tokens=16, seed=5)
    assert isinstance(p, Policy)
    assert p.settings["temperature"] == 1.0 and p.settings["top_p"] == 0.95 and p.settings["top_k"] == 0
    assert p.max_context_tokens == 8192 and p.settings["device"] == "cpu"
    with pytest.raises(ValueError):
        HFLocalPolicy(model, tok, temperature=0.0)
    with pytest.raises(ValueError):
        HFLocalPolicy(model)  # an object without its tokenizer


def test_greedy_is_deterministic(tok, model):
    a = HFLocalPolicy(model, tok, greedy=True, max_new_tokens=24, seed=1)
    b = HFLocalPolicy(model, tok, greedy=True, max_new_tokens=24, seed=2)
    text = a.act(_start())
    assert b.act(_start()) == text and a.act(_start()) == text
    assert a.trace[0].completion_ids == b.trace[0].completion_ids and a.trace[0].seed is None
    # the completion is the argmax continuation
    with torch.inference_mode():
        logits = model(torch.tensor([a.trace[0].prompt_ids])).logits[0, -1]
    assert a.trace[0].completion_ids[0] == int(logits.argmax())


def test_sampling_same_seed_same_text_other_seed_differs(tok, model):
    def sample(seed, turn_msgs=None):
        p = HFLocalPolicy(model, tok, max_new_tokens=24, seed=seed)
        p.act(turn_msgs or _start())
        return p.trace[0].completion_ids

    state = torch.random.get_rng_state()
    assert sample(3) == sample(3)
    assert sample(3) != sample(4)
    assert torch.equal(torch.random.get_rng_state(), state)  # sampling never touches the global RNG
    assert turn_seed(3, 0) != turn_seed(3, 1) != turn_seed(4, 1)


def test_checkpoint_sampling_defaults_do_not_leak(tok, model):
    """A generation_config with top_k=1 (argmax) must not turn our sampling greedy."""
    saved = model.generation_config
    model.generation_config = type(saved)(**{**saved.to_dict(), "top_k": 1, "do_sample": True, "temperature": 0.01})
    try:
        outs = set()
        for seed in range(4):
            p = HFLocalPolicy(model, tok, max_new_tokens=12, seed=seed)
            p.act(_start())
            outs.add(tuple(p.trace[0].completion_ids))
        assert len(outs) > 1
        assert model.generation_config.top_k == 1  # restored after each call
    finally:
        model.generation_config = saved


# ------------------------------------------------------------------------------ episodes


class _Recorder:
    """Wraps a policy and keeps the last conversation it saw plus its reply."""

    def __init__(self, policy):
        self.policy, self.name, self.messages = policy, policy.name, []

    def act(self, messages):
        reply = self.policy.act(messages)
        self.messages = [dict(m) for m in messages] + ([{"role": "assistant", "content": reply}] if reply else [])
        return reply


class ForceReplies:
    """A logits processor that forces the tokens of scripted replies (turn k gets ``replies[k]``),
    then ``<|im_end|>``. The turn is the number of assistant headers in the sequence minus one."""

    def __init__(self, tok, replies):
        self.header = [tok.convert_tokens_to_ids("<|im_start|>")] + _encode(tok, "assistant\n")
        self.end = tok.convert_tokens_to_ids("<|im_end|>")
        self.replies = [_encode(tok, r) + [self.end] for r in replies]

    def __call__(self, input_ids, scores):
        row, h = input_ids[0].tolist(), len(self.header)
        starts = [i for i in range(len(row) - h + 1) if row[i:i + h] == self.header]
        target = self.replies[(len(starts) - 1) % len(self.replies)]
        n = len(row) - (starts[-1] + h)
        forced = torch.full_like(scores, float("-inf"))
        forced[:, target[n] if n < len(target) else self.end] = 0.0
        return forced


def test_end_to_end_forced_calls_reach_the_env(tok, model, basin, small_sim):
    replies = ["Start from a wetter soil. " + SET, RUN, EVAL]
    # stop_at_tool_call=False: the model writes its own <|im_end|> after each call (the old
    # behaviour); the stop at </tool_call> is checked in the tests below.
    policy = HFLocalPolicy(model, tok, max_new_tokens=64, seed=0, logits_processors=[ForceReplies(tok, replies)],
                           stop_at_tool_call=False)
    rec = _Recorder(policy)
    ep = run_episode(rec, _env(basin, small_sim))
    assert ep.stop_reason == "max_turns"
    assert [t.tool for t in ep.turns] == ["set_parameters", "run_simulation", "evaluate"] * 2
    assert all(t.kind == "tool" and t.ok for t in ep.turns)
    assert ep.turns[0].arguments == {"wm": 1.2, "alpha": 0.9} and ep.best_nse is not None and len(ep.sims) == 2
    assert [t.text for t in ep.turns] == replies * 2  # special tokens survived decoding, im_end was cut
    u = policy.usage
    assert u["turns"] == 6 and u["length_truncated"] == 0 and u["stop_reason"] is None
    assert u["completion_tokens"] == 2 * sum(len(_encode(tok, r)) + 1 for r in replies)
    assert u["total_tokens"] == u["prompt_tokens"] + u["completion_tokens"] and u["wall_s"] > 0
    assert [r["finish_reason"] for r in u["per_turn"]] == ["stop"] * 6
    # One token sequence: it equals the ids of the fully rendered conversation, and the mask marks
    # exactly the sampled replies with their <|im_end|>.
    ids, mask = policy.token_sequence()
    full = policy.render(rec.messages, add_generation_prompt=False)
    assert ids + _encode(tok, "\n") == _encode(tok, full)
    assert tok.decode([i for i, m in zip(ids, mask) if m], skip_special_tokens=False) == \
        "".join(r + "<|im_end|>" for r in replies * 2)
    assert u["context_tokens"] == len(ids) and u["new_prompt_tokens"] == mask.count(0)
    assert [len(t.prompt_ids) + len(t.completion_ids) for t in policy.trace] == \
        [r["new_prompt_tokens"] + r["completion_tokens"] for r in u["per_turn"]]
    assert not any(t.rerendered for t in policy.trace)


def _tool_call_conversation(policy, replies):
    """Drive ``policy`` through one turn per reply, answering each with a tool message."""
    msgs = _start()
    texts = []
    for k in range(len(replies)):
        text = policy.act(msgs)
        texts.append(text)
        msgs = msgs + [{"role": "assistant", "content": text},
                       {"role": "tool", "content": render_tool_response({"status": "ok", "turn": k})}]
    return msgs, texts


def test_turn_stops_at_tool_call_end_and_im_end_is_glue(tok, model):
    """A model that would go on to write its own <tool_response> is stopped at </tool_call>; the
    held sequence is exactly the builder's ids of the conversation, with the im_end mask 0."""
    replies = ["Lower wm. " + SET + "<tool_response>\n{\"NSE\": 0.99}", EVAL + "<tool_response>"]
    policy = HFLocalPolicy(model, tok, max_new_tokens=64, seed=0, logits_processors=[ForceReplies(tok, replies)])
    assert policy.tool_call_end_id == tok.convert_tokens_to_ids("</tool_call>")
    assert policy.tool_call_end_id in policy.stop_ids and policy.stop_ids[0] == policy.im_end_id
    msgs, texts = _tool_call_conversation(policy, replies)
    assert texts == ["Lower wm. " + SET, EVAL]
    assert all(t.endswith("</tool_call>") and "<tool_response>" not in t for t in texts)
    assert [t.finish_reason for t in policy.trace] == ["stop", "stop"]
    assert [t.stop_token for t in policy.trace] == ["</tool_call>", "</tool_call>"]
    assert [t.glue_ids for t in policy.trace] == [[policy.im_end_id]] * 2
    assert all(t.completion_ids[-1] == policy.tool_call_end_id for t in policy.trace)
    assert not any(t.rerendered for t in policy.trace)
    ids, mask = policy.token_sequence()
    traj = policy.builder.build(msgs)
    assert ids == traj.input_ids  # token-exact: the rendering of the conversation
    # The builder marks the im_end a teacher wrote (1); the policy did not sample it (0).
    glue_at = [end - 1 for _, end in traj.spans]
    assert [ids[i] for i in glue_at] == [policy.im_end_id] * 2 and [mask[i] for i in glue_at] == [0, 0]
    assert [m for i, m in enumerate(mask) if i not in glue_at] == \
        [m for i, m in enumerate(traj.assistant_mask) if i not in glue_at]
    u = policy.usage
    assert u["completion_tokens"] == sum(mask) == sum(len(t.completion_ids) for t in policy.trace)
    assert u["context_tokens"] == len(ids)
    assert mask.count(0) == u["new_prompt_tokens"] + 2
    # The next turn's prompt extends the held sequence (the prefix invariant holds through the glue).
    policy.act(msgs)
    assert not policy.trace[-1].rerendered
    assert policy.token_sequence()[0][: len(ids)] == ids


def test_stop_at_tool_call_off_keeps_the_old_behaviour(tok, model):
    replies = [EVAL + "<tool_response>"]
    policy = HFLocalPolicy(model, tok, max_new_tokens=64, seed=0, logits_processors=[ForceReplies(tok, replies)],
                           stop_at_tool_call=False)
    assert policy.tool_call_end_id is None and tok.convert_tokens_to_ids("</tool_call>") not in policy.stop_ids
    msgs, texts = _tool_call_conversation(policy, replies)
    assert texts == [EVAL + "<tool_response>"]
    t = policy.trace[0]
    assert t.stop_token == "<|im_end|>" and t.glue_ids == [] and t.completion_ids[-1] == policy.im_end_id
    ids, mask = policy.token_sequence()
    traj = policy.builder.build(msgs)
    assert ids == traj.input_ids and mask == traj.assistant_mask


def test_single_token_check_for_the_stop_tag(tok):
    """Only a tag that is one token of the tokenizer becomes a stop id (else: end token only)."""
    from hydroagent_hpc.agents.llm.hf_local import _single_token_id

    assert _single_token_id(tok, "</tool_call>") == tok.convert_tokens_to_ids("</tool_call>")
    assert _single_token_id(tok, "</no_such_tag>") is None


def test_end_to_end_random_model_records_parse_failures(tok, model, basin, small_sim):
    policy = HFLocalPolicy(model, tok, max_new_tokens=24, seed=11)
    ep = run_episode(policy, _env(basin, small_sim))
    assert ep.stop_reason in ("parse_failures", "max_turns", "patience")
    assert ep.turns and all(t.kind in ("parse_failure", "tool") for t in ep.turns)
    assert policy.usage["turns"] == ep.counters["messages"] == len(policy.trace)
    assert 0 < policy.usage["completion_tokens"] <= 24 * policy.usage["turns"]
    ids, mask = policy.token_sequence()
    assert sum(mask) == policy.usage["completion_tokens"] and len(ids) == policy.usage["context_tokens"]
    # The same seed replays the same episode.
    again = HFLocalPolicy(model, tok, max_new_tokens=24, seed=11)
    ep2 = run_episode(again, _env(basin, small_sim))
    assert [t.text for t in ep2.turns] == [t.text for t in ep.turns]
    assert [t.completion_ids for t in again.trace] == [t.completion_ids for t in policy.trace]


def test_context_overflow_at_start_ends_cleanly(tok, model, basin, small_sim, caplog):
    policy = HFLocalPolicy(model, tok, max_new_tokens=16, max_context_tokens=200)
    with caplog.at_level(logging.INFO, logger="hydroagent_hpc.agents.llm.hf_local"):
        ep = run_episode(policy, _env(basin, small_sim))
    assert ep.stop_reason.startswith("context_length") and ep.turns == []
    assert policy.stop_reason.startswith("context_length: prompt ") and "at turn 0" in policy.stop_reason
    assert policy.usage["stop_reason"] == policy.stop_reason and policy.usage["turns"] == 0
    assert any("context_length" in r.getMessage() for r in caplog.records)


def test_context_overflow_mid_episode_keeps_the_task(tok, model, basin, small_sim):
    probe = HFLocalPolicy(model, tok, max_new_tokens=16)
    env = _env(basin, small_sim)
    first = len(_encode(tok, probe.render(env.reset())))
    policy = HFLocalPolicy(model, tok, max_new_tokens=16, max_context_tokens=first + 16 + 20, seed=2)
    rec = _Recorder(policy)
    ep = run_episode(rec, env)
    assert ep.stop_reason == "policy_stopped" and ep.counters["messages"] == 1  # the recorder hides stop_reason
    assert "at turn 1" in policy.stop_reason
    # The conversation that overflowed still holds the system and user prompts: nothing is dropped.
    assert [m["role"] for m in rec.messages[:2]] == ["system", "user"]


def test_edited_history_is_re_rendered(tok, model, caplog):
    p = HFLocalPolicy(model, tok, greedy=True, max_new_tokens=8)
    msgs = _start()
    reply = p.act(msgs)
    edited = msgs + [{"role": "assistant", "content": "(edited) " + reply},
                     {"role": "tool", "content": render_tool_response({"status": "ok"})}]
    with caplog.at_level(logging.WARNING, logger="hydroagent_hpc.agents.llm.hf_local"):
        p.act(edited)
    assert p.trace[1].rerendered and any("re-rendering" in r.getMessage() for r in caplog.records)
    assert p.trace[1].prompt_ids == _encode(tok, p.render(edited))
    ids, mask = p.token_sequence()
    assert ids[: len(p.trace[1].prompt_ids)] == p.trace[1].prompt_ids
    assert mask.count(1) == len(p.trace[1].completion_ids)


def test_modules_import_without_torch():
    code = ("import sys; import hydroagent_hpc.agents.llm.hf_local, hydroagent_hpc.train; "
            "bad = [m for m in ('torch', 'transformers', 'tokenizers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_use_parameters_puts_the_snow_parameters_into_the_default_tools(tok, model):
    from hydroagent_hpc.params import CREST_SET, SNOW17_SET, SNOW_NAMES

    p = HFLocalPolicy((model, tok), max_new_tokens=8, seed=1)
    plain = p._render(_start(), True)
    assert p.tools == tool_schemas() and '"scf"' not in plain
    p.use_parameters(CREST_SET)  # a snow-free basin changes nothing
    assert p._render(_start(), True) == plain
    p.use_parameters(SNOW17_SET)
    snowy = p._render(_start(), True)
    assert all(f'"{n}"' in snowy for n in SNOW_NAMES) and p.tools == tool_schemas(parameters=SNOW17_SET)
    given_tools = tool_schemas(clip_out_of_bounds=False)
    q = HFLocalPolicy((model, tok), max_new_tokens=8, seed=1, tools=given_tools)
    q.use_parameters(SNOW17_SET)  # tools given by the caller are kept
    assert q.tools == given_tools
