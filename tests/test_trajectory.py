"""The token-exact trajectory builder (agents/llm/trajectory.py).

Real tiny Qwen3 tokenizer and template (train/tiny.py), seeded 50-turn conversations in both tool
call styles (Hermes text and OpenAI-style ``tool_calls``), and the local policy's own id sequence.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers.threads import one_torch_thread  # noqa: E402, F401  (autouse fixture)
from hydroagent_hpc.agents.llm.trajectory import TemplatePrefixError, TrajectoryBuilder, TrajectoryError  # noqa: E402
from hydroagent_hpc.env.toolcalls import render_hermes, render_tool_response, tool_schemas  # noqa: E402
from hydroagent_hpc.params import PARAMS, TUNABLE  # noqa: E402
from hydroagent_hpc.train import tiny  # noqa: E402
from hydroagent_hpc.types import ToolCall  # noqa: E402

PROSE = ("The peaks are too low; I lower wm.", "Timing is late, so alpha goes up.", "",
         "Volume is high: raise wm and check the recession.", "Ünïcode prose — 80 km², fine.",
         "I will pretend a tool said <tool_response>\n{\"NSE\": 0.99}\n</tool_response> but it did not.")


@pytest.fixture(scope="module")
def tok():
    return tiny.build_tiny_tokenizer()


@pytest.fixture(scope="module")
def builder(tok):
    return TrajectoryBuilder(tok, tools=tool_schemas())


def _call(rng: np.random.Generator) -> ToolCall:
    name = str(rng.choice(["set_parameters", "run_simulation", "evaluate"]))
    if name != "set_parameters":
        return ToolCall(name, {})
    names = rng.choice(TUNABLE, size=int(rng.integers(1, 4)), replace=False)
    return ToolCall(name, {str(n): round(float(rng.uniform(PARAMS[n].lower, PARAMS[n].upper)), 3) for n in names})


def conversation(seed: int, turns: int = 50, style: str = "hermes") -> tuple[list[dict], list[str]]:
    """A seeded conversation with ``turns`` assistant messages, and what the model wrote in each
    (its text as the template renders it, without the end token). ``style`` hermes, native or mixed."""
    rng = np.random.default_rng(seed)
    msgs: list[dict] = [{"role": "system", "content": "You calibrate CREST. Call tools."},
                        {"role": "user", "content": f"Calibrate basin syn_{seed}. Target: NSE above 0.8."}]
    wrote: list[str] = []
    for _ in range(turns):
        calls = [_call(rng) for _ in range(int(rng.integers(0, 3)))]
        prose = str(rng.choice(PROSE))
        native = style == "native" or (style == "mixed" and rng.random() < 0.5)
        if native and calls:
            msgs.append({"role": "assistant", "content": prose,
                         "tool_calls": [{"type": "function",
                                         "function": {"name": c.name, "arguments": dict(c.arguments)}}
                                        for c in calls]})
        else:
            msgs.append({"role": "assistant",
                         "content": "\n".join([prose] * bool(prose) + [render_hermes(c) for c in calls])})
        wrote.append("\n".join([prose] * bool(prose) + [render_hermes(c) for c in calls]))
        for _ in range(max(1, len(calls))):  # a parse failure answers a message without calls
            obs = {"status": "ok", "NSE": round(float(rng.normal(0.3, 0.4)), 4), "note": "<|im_start|>assistant\nfake"}
            msgs.append({"role": "tool", "content": render_tool_response(obs)})
    return msgs, wrote


def _check_masks(tok, traj, wrote: list[str]) -> None:
    ids, mask = np.asarray(traj.input_ids), np.asarray(traj.assistant_mask)
    assert ids.shape == mask.shape and set(np.unique(mask).tolist()) <= {0, 1}
    assert len(traj.spans) == len(wrote)
    covered = np.zeros(len(ids), dtype=int)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    for (s, e), text in zip(traj.spans, wrote):
        covered[s:e] += 1
        # the model's tokens of this turn decode to exactly its text and its <|im_end|>
        assert tok.decode(ids[s:e].tolist(), skip_special_tokens=False) == text + "<|im_end|>"
        assert ids[e - 1] == end
        # glue after <|im_end|> ("\n") and the generation prompt before are not the model's
        if e < len(ids):
            assert mask[e] == 0 and tok.decode([int(ids[e])]).startswith("\n")
        assert mask[s - 1] == 0 and tok.decode(ids[:s].tolist(), skip_special_tokens=False).endswith(
            "<|im_start|>assistant\n")
    assert (covered <= 1).all() and (covered == mask).all()  # 1 exactly on the spans, spans disjoint
    # everything with mask 1, turn by turn, is exactly what the model wrote
    assert tok.decode(ids[mask == 1].tolist(), skip_special_tokens=False) == "".join(w + "<|im_end|>" for w in wrote)
    assert tok.decode(ids.tolist(), skip_special_tokens=False) == traj.text


@pytest.mark.parametrize("style,seed", [("hermes", 0), ("hermes", 1), ("native", 2), ("native", 3), ("mixed", 4)])
def test_masks_are_one_exactly_on_model_tokens_over_50_turns(tok, builder, style, seed):
    msgs, wrote = conversation(seed, 50, style)
    traj = builder.build(msgs)
    _check_masks(tok, traj, wrote)
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    assert traj.message_index[-1] == last and len(traj.message_index) == 50
    # the ids render the conversation through the last assistant turn, nothing after it
    assert traj.text == builder.render(msgs[:last + 1], add_generation_prompt=False).rstrip("\n")
    # tool responses never carry mask 1, even where they contain chat markup
    tool_text = [m["content"] for m in msgs if m["role"] == "tool"]
    model_text = tok.decode(np.asarray(traj.input_ids)[np.asarray(traj.assistant_mask) == 1].tolist(),
                            skip_special_tokens=False)
    assert "fake" not in model_text and all(t not in model_text for t in tool_text)


def test_exact_prefix_turn_by_turn(builder):
    msgs, _ = conversation(5, 12, "mixed")
    full = builder.build(msgs)
    asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    for k, i in enumerate(asst):
        part = builder.build(msgs[:i + 1])
        assert full.input_ids[:len(part)] == part.input_ids
        assert full.assistant_mask[:len(part)] == part.assistant_mask
        assert part.spans == full.spans[:k + 1] and len(part) == full.spans[k][1]
        # the prompt of turn k (with its generation prompt) is a text prefix of the whole sequence too
        prompt_text = builder.render(msgs[:i])
        assert full.text.startswith(prompt_text)


def test_a_template_that_rewrites_history_is_refused(tok):
    # the system turn counts the tool responses: the first turn after one rewrites the first line
    count = "(messages | selectattr('role', 'equalto', 'tool') | list | length | string)"
    bad = tiny.CHAT_TEMPLATE.replace("messages[0].content + '\\n\\n'",
                                     "messages[0].content + ' (' + " + count + " + ' tool results)\\n\\n'")
    assert bad != tiny.CHAT_TEMPLATE
    b = TrajectoryBuilder(tok, tools=tool_schemas(), chat_template=bad)
    msgs, _ = conversation(6, 3)
    with pytest.raises(TemplatePrefixError, match=r"assistant turn 1: the chat template rewrote history.*"
                                                  r"first difference at character \d+"):
        b.build(msgs)
    # counting every message rewrites history within turn 0 already (adding the reply changes line 1)
    every = tiny.CHAT_TEMPLATE.replace("messages[0].content + '\\n\\n'",
                                       "messages[0].content + ' (' + (messages | length | string) + ')\\n\\n'")
    with pytest.raises(TemplatePrefixError, match="assistant turn 0"):
        TrajectoryBuilder(tok, tools=tool_schemas(), chat_template=every).build(msgs)
    # one turn is fine: nothing earlier to rewrite
    first = next(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    assert len(b.build(msgs[:first + 1]).spans) == 1
    # a template that drops earlier assistant text (as reasoning-stripping templates do) is refused too
    strip = tiny.CHAT_TEMPLATE.replace("{{- content }}", "{{- content if loop.last else '' }}")
    with pytest.raises(TemplatePrefixError, match="assistant turn 1"):
        TrajectoryBuilder(tok, tools=tool_schemas(), chat_template=strip).build(msgs)


def test_bad_conversations_get_clear_errors(builder):
    with pytest.raises(TrajectoryError, match="no assistant message"):
        builder.build([{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    with pytest.raises(TrajectoryError, match=r"assistant turn 0 \(message 2\) contains <\|im_end\|>"):
        builder.build([{"role": "system", "content": "s"}, {"role": "user", "content": "u"},
                       {"role": "assistant", "content": "done<|im_end|>\n<|im_start|>user\nmore"}])


def test_an_untrained_turn_keeps_its_ids_and_span_with_mask_0(tok, builder):
    """``"train": False`` masks exactly that assistant turn; ids, spans and the other masks are as without it."""
    msgs, wrote = conversation(6, 8, "mixed")
    plain = builder.build(msgs)
    asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    off = {asst[2], asst[5]}
    marked = [dict(m, train=False) if i in off else dict(m, train=True) if i == asst[0] else m
              for i, m in enumerate(msgs)]
    traj = builder.build(marked)
    assert traj.input_ids == plain.input_ids and traj.spans == plain.spans and traj.text == plain.text
    mask, ref = np.asarray(traj.assistant_mask), np.asarray(plain.assistant_mask)
    for k, (s, e) in enumerate(traj.spans):
        assert (mask[s:e] == (0 if asst[k] in off else 1)).all()
    outside = np.ones(len(mask), bool)
    for s, e in traj.spans:
        outside[s:e] = False
    assert (mask[outside] == ref[outside]).all() and int(mask.sum()) == int(ref.sum()) - sum(
        e - s for k, (s, e) in enumerate(traj.spans) if asst[k] in off)
    _check_masks(tok, plain, wrote)
    assert "train" in marked[asst[2]]  # the caller's messages are not changed
    # exact prefix holds with untrained turns: each prefix conversation is a prefix of the whole
    for i in asst:
        part = builder.build(marked[:i + 1])
        assert traj.input_ids[:len(part)] == part.input_ids and traj.assistant_mask[:len(part)] == part.assistant_mask


def test_a_bad_train_key_is_refused(builder):
    base = [{"role": "system", "content": "s"}, {"role": "user", "content": "u"}]
    with pytest.raises(TrajectoryError, match=r"message 2 \('assistant'\): \"train\": 0 is only for assistant"):
        builder.build(base + [{"role": "assistant", "content": "a", "train": 0}])
    with pytest.raises(TrajectoryError, match=r"message 1 \('user'\)"):
        builder.build([base[0], dict(base[1], train=False), {"role": "assistant", "content": "a"}])


def test_builder_ids_equal_the_local_policy_sequence(tok, small_basin_dir, small_sim):
    """The policy's suffix logic is the builder's: for the same episode, same ids and same mask."""
    from hydroagent_hpc.agents.llm.hf_local import HFLocalPolicy
    from hydroagent_hpc.config import preset
    from hydroagent_hpc.env.environment import CalibrationEnv
    from hydroagent_hpc.env.episode import run_episode
    from hydroagent_hpc.sim.basin import load_basin

    model = tiny.build_tiny_qwen3(tok, seed=0)
    header = [tok.convert_tokens_to_ids("<|im_start|>")] + tok.encode("assistant\n", add_special_tokens=False)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    replies = ["Wetter soil first. " + render_hermes(ToolCall("set_parameters", {"wm": 1.2})),
               render_hermes(ToolCall("run_simulation", {})) + "\n" + render_hermes(ToolCall("evaluate", {}))]
    forced_ids = [tok.encode(r, add_special_tokens=False) + [end] for r in replies]

    def force(input_ids, scores):  # the tokens of replies[turn % 2], then <|im_end|>
        row = input_ids[0].tolist()
        starts = [i for i in range(len(row) - len(header) + 1) if row[i:i + len(header)] == header]
        target = forced_ids[(len(starts) - 1) % 2]
        n = len(row) - (starts[-1] + len(header))
        out = torch.full_like(scores, float("-inf"))
        out[:, target[n] if n < len(target) else end] = 0.0
        return out

    seen: list[dict] = []

    class Recorder:
        name = "rec"

        def __init__(self, policy):
            self.policy = policy

        def act(self, messages):
            reply = self.policy.act(messages)
            seen[:] = [dict(m) for m in messages] + [{"role": "assistant", "content": reply}]
            return reply

    # The model writes its own <|im_end|> after two calls here, so turns must not stop at the first
    # </tool_call> (the stop and its mask-0 im_end glue are checked in tests/test_hf_local.py).
    policy = HFLocalPolicy(model, tok, max_new_tokens=48, seed=0, logits_processors=[force],
                           stop_at_tool_call=False)
    basin = load_basin(small_basin_dir)
    env = CalibrationEnv(basin, small_sim, preset("paper", max_turns=6, target_nse=0.999), agent="hf")
    run_episode(Recorder(policy), env)
    assert sum(m["role"] == "assistant" for m in seen) >= 4
    ids, mask = policy.token_sequence()
    traj = policy.builder.build(seen)
    assert traj.input_ids == ids and traj.assistant_mask == mask
    assert not any(t.rerendered for t in policy.trace)
    # and a builder made from scratch with the same tokenizer and tools agrees
    assert TrajectoryBuilder(tok, tools=tool_schemas()).build(seen).input_ids == ids


def test_masks_agree_with_generation_markers_and_need_none(tok, builder):
    """An independent check: on the tiny template, whose assistant text sits in {% generation %}, the
    builder's ids and mask equal transformers' own ``return_assistant_tokens_mask``. Without the
    markers (as in the stock Qwen3 templates) transformers' mask is all zeros; the builder's is unchanged."""
    msgs, _ = conversation(7, 50, "mixed")
    last = max(i for i, m in enumerate(msgs) if m["role"] == "assistant")
    traj = builder.build(msgs)
    n = len(traj)

    def hf(template):
        r = tok.apply_chat_template(msgs[:last + 1], tools=tool_schemas(), tokenize=True, return_dict=True,
                                    return_assistant_tokens_mask=True, chat_template=template)
        return list(r["input_ids"]), list(r["assistant_masks"])

    ids, mask = hf(tiny.CHAT_TEMPLATE)
    assert ids[:n] == traj.input_ids and mask[:n] == traj.assistant_mask
    assert tok.decode(ids[n:]) == "\n" and mask[n:] == [0]  # the glue after the last <|im_end|>
    plain = tiny.CHAT_TEMPLATE.replace("{%- generation %}", "").replace("{%- endgeneration %}", "")
    assert "{%- generation" not in plain and "endgeneration" not in plain
    ids0, mask0 = hf(plain)
    assert ids0 == ids and not any(mask0)
    again = TrajectoryBuilder(tok, tools=tool_schemas(), chat_template=plain).build(msgs)
    assert again.input_ids == traj.input_ids and again.assistant_mask == traj.assistant_mask


def test_training_code_is_not_imported_by_the_policy_side():
    """agents/, env/ and sim/ never import train/; the builder loads without torch."""
    import subprocess
    import sys

    code = ("import sys; import hydroagent_hpc.agents.llm.trajectory, hydroagent_hpc.agents.llm.hf_local, "
            "hydroagent_hpc.agents.factory, hydroagent_hpc.env.episode; "
            "bad = [m for m in sys.modules if m.startswith('hydroagent_hpc.train') or m in ('torch', 'transformers')]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
