"""Tool schemas, strict Hermes parsing, argument validation, rendering and the OpenAI adapter."""

from __future__ import annotations

import json
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hydroagent_hpc.env.toolcalls import (
    MAX_MESSAGE_CHARS,
    PARSE_REASONS,
    TOOL_NAMES,
    VALIDATION_REASONS,
    ParsedMessage,
    ParseFailure,
    from_openai_tool_calls,
    parse_message,
    render_hermes,
    render_tool_response,
    retry_hint,
    to_openai_tool_call,
    tool_schemas,
    validate_arguments,
)
from hydroagent_hpc.params import DEFAULTS, PARAMS, TUNABLE
from hydroagent_hpc.types import ToolCall

CUR = dict(DEFAULTS)


def block(obj_text: str) -> str:
    return f"<tool_call>\n{obj_text}\n</tool_call>"


def one_failure(text: str) -> ParseFailure:
    m = parse_message(text)
    assert not m.calls, m
    assert len(m.failures) == 1, m.failures
    assert m.failures[0].reason in PARSE_REASONS
    return m.failures[0]


def strict_loads(s: str):
    def bad(c):
        raise ValueError(c)
    return json.loads(s, parse_constant=bad)


# --------------------------------------------------------------------------------- schemas
def test_schemas_three_tools_in_openai_format():
    schemas = tool_schemas()
    assert [s["function"]["name"] for s in schemas] == list(TOOL_NAMES)
    for s in schemas:
        assert s["type"] == "function"
        assert s["function"]["description"]
        assert s["function"]["parameters"]["type"] == "object"
        assert s["function"]["parameters"]["additionalProperties"] is False
    json.dumps(schemas, allow_nan=False)
    assert tool_schemas() == schemas and tool_schemas() is not schemas


def test_set_parameters_schema_has_the_11_tunable_with_bounds_and_no_required():
    fn = tool_schemas()[0]["function"]
    props = fn["parameters"]["properties"]
    assert list(props) == list(TUNABLE) and len(props) == 11
    assert "th" not in props and "isu" not in props
    assert fn["parameters"]["required"] == []
    assert "partial" in fn["description"].lower() and "keep" in fn["description"]
    for name, prop in props.items():
        p = PARAMS[name]
        assert prop["type"] == "number"
        assert f"[{p.lower:g}, {p.upper:g}]" in prop["description"]
        assert p.meaning in prop["description"]


def test_schema_bounds_rule_follows_clip_setting():
    assert "clipped" in tool_schemas()[0]["function"]["description"]
    off = tool_schemas(clip_out_of_bounds=False)[0]["function"]["description"]
    assert "invalid" in off and "clipped" not in off and "{" not in off


def test_no_argument_tools_have_empty_schemas():
    for s in tool_schemas()[1:]:
        assert s["function"]["parameters"]["properties"] == {}
        assert s["function"]["parameters"]["required"] == []


# --------------------------------------------------------------------------------- parsing: valid
def test_single_call_with_prose_around():
    text = "Raise soil capacity.\n" + block('{"name": "set_parameters", "arguments": {"wm": 1.5}}') + "\nThen run."
    m = parse_message(text)
    assert m.ok
    assert m.calls == [ToolCall("set_parameters", {"wm": 1.5})]
    assert m.failures == []
    assert m.text == "Raise soil capacity.\n\nThen run."
    assert m.call_positions == [0]


def test_multiple_calls_in_order():
    text = "\n".join(block(f'{{"name": "{n}", "arguments": {a}}}')
                     for n, a in [("set_parameters", '{"b": 0.5, "alpha": 2}'), ("run_simulation", "{}"),
                                  ("evaluate", "{}")])
    m = parse_message(text)
    assert [c.name for c in m.calls] == list(TOOL_NAMES)
    assert m.calls[0].arguments == {"b": 0.5, "alpha": 2}
    assert m.call_positions == [0, 1, 2] and m.text == ""


def test_arguments_as_json_string_openai_style():
    m = parse_message(block(json.dumps({"name": "set_parameters", "arguments": json.dumps({"ke": 1.1})})))
    assert m.calls == [ToolCall("set_parameters", {"ke": 1.1})]


def test_whitespace_inside_tags_and_compact_json():
    m = parse_message('<tool_call>  {"name":"evaluate","arguments":{}}   </tool_call>')
    assert m.calls == [ToolCall("evaluate", {})]


# --------------------------------------------------------------------------------- parsing: failures
def test_no_tool_call():
    f = one_failure("I think wm should go up.")
    assert f.reason == "no_tool_call" and f.position == 0
    assert parse_message("").failures[0].reason == "no_tool_call"
    assert parse_message(None).failures[0].reason == "no_tool_call"  # type: ignore[arg-type]


def test_no_tool_call_hints_at_missing_tags():
    f = one_failure('{"name": "evaluate", "arguments": {}}')
    assert f.reason == "no_tool_call" and "<tool_call>" in f.detail


@pytest.mark.parametrize("body", [
    '{"name": "run_simulation", "arguments": {}',          # missing brace: never repaired
    "{'name': 'evaluate', 'arguments': {}}",               # Python quotes
    'set_parameters(wm=1.5)',                              # Python call
    '```json\n{"name": "evaluate", "arguments": {}}\n```',  # Markdown fence
    '{"name": "evaluate", "arguments": {}} {"name": "evaluate", "arguments": {}}',  # two objects
    '',
])
def test_malformed_json_is_a_failure_never_a_repaired_call(body):
    f = one_failure(block(body))
    assert f.reason == "malformed_json"
    assert f.detail


@pytest.mark.parametrize("lit", ["NaN", "Infinity", "-Infinity", "1e400", "-1e999"])
def test_non_finite_literals_rejected(lit):
    f = one_failure(block(f'{{"name": "set_parameters", "arguments": {{"wm": {lit}}}}}'))
    assert f.reason == "malformed_json"


def test_non_finite_inside_argument_string_rejected():
    f = one_failure(block(json.dumps({"name": "set_parameters", "arguments": '{"wm": NaN}'})))
    assert f.reason == "bad_arguments"


@pytest.mark.parametrize("body", [
    '{"name": "evaluate", "arguments": {}, "name": "run_simulation"}',
    '{"name": "set_parameters", "arguments": {"wm": 1.5, "wm": 9}}',
])
def test_duplicate_keys_rejected(body):
    f = one_failure(block(body))
    assert f.reason == "malformed_json" and "duplicate" in f.detail


@pytest.mark.parametrize("body", ["[1, 2]", '"evaluate"', "42", "null", "true"])
def test_not_an_object(body):
    assert one_failure(block(body)).reason == "not_an_object"


@pytest.mark.parametrize("body,word", [
    ('{"arguments": {}}', "name"),
    ('{"name": 3, "arguments": {}}', "string"),
    ('{"name": "evaluate", "arguments": {}, "id": "x"}', "id"),
    ('{"name": "set_parameters", "parameters": {"wm": 1}}', "arguments"),
])
def test_malformed_call(body, word):
    f = one_failure(block(body))
    assert f.reason == "malformed_call" and word in f.detail


def test_unknown_tool_suggests_the_right_one():
    f = one_failure(block('{"name": "Set_Parameters", "arguments": {"wm": 1}}'))
    assert f.reason == "unknown_tool" and "set_parameters" in f.detail
    assert one_failure(block('{"name": "finish", "arguments": {}}')).reason == "unknown_tool"


@pytest.mark.parametrize("args", ['[1]', '"wm=1.5"', '"[1]"', '"{broken"', "null", "3"])
def test_bad_arguments(args):
    assert one_failure(block(f'{{"name": "set_parameters", "arguments": {args}}}')).reason == "bad_arguments"


def test_missing_arguments_is_bad_arguments():
    f = one_failure(block('{"name": "run_simulation"}'))
    assert f.reason == "bad_arguments" and '"arguments": {}' in f.detail


def test_unclosed_and_stray_tags():
    assert one_failure('<tool_call>\n{"name": "evaluate", "arguments": {}}').reason == "unclosed_tag"
    assert one_failure('{"name": "evaluate", "arguments": {}}\n</tool_call>').reason == "stray_close_tag"
    m = parse_message('<tool_call>{"name": "evaluate"' + block('{"name": "evaluate", "arguments": {}}'))
    assert [f.reason for f in m.failures] == ["unclosed_tag"] and m.calls == [ToolCall("evaluate", {})]


def test_too_many_calls_one_failure_after_max():
    text = "".join(block('{"name": "evaluate", "arguments": {}}') for _ in range(25))
    m = parse_message(text, max_calls=10)
    assert len(m.calls) == 10
    assert [f.reason for f in m.failures] == ["too_many_calls"]
    assert m.failures[0].position == 10 and "15" in m.failures[0].detail


def test_message_too_long_scans_only_the_cap():
    text = block('{"name": "evaluate", "arguments": {}}') + "x" * (MAX_MESSAGE_CHARS + 10)
    m = parse_message(text)
    assert m.calls == [ToolCall("evaluate", {})]
    assert [f.reason for f in m.failures] == ["message_too_long"]
    assert len(m.text) <= MAX_MESSAGE_CHARS


def test_pathological_inputs_do_not_raise():
    for text in ["<tool_call>" + "[" * 100_000 + "</tool_call>",
                 "<tool_call>" + '{"a":' * 5000 + "1" + "}" * 5000 + "</tool_call>",
                 block('{"name": "set_parameters", "arguments": {"wm": ' + "9" * 6000 + "}}"),
                 "</tool_call>" * 50_000, "<tool_call>" * 50_000]:
        m = parse_message(text)
        assert m.failures and not m.calls
        assert len(m.failures) <= 12
    deep = '{"name": "set_parameters", "arguments": {"wm": ' + "[" * 40 + "]" * 40 + "}}"
    assert one_failure(block(deep)).reason == "malformed_json"


def test_raw_is_truncated():
    f = one_failure(block("{" + "x" * 10_000))
    assert len(f.raw) < 300


def test_order_of_calls_and_failures_is_preserved():
    text = (block('{"name": "set_parameters", "arguments": {"wm": 2}}')
            + block("not json")
            + block('{"name": "run_simulation", "arguments": {}}')
            + block('{"name": "nope", "arguments": {}}')
            + block('{"name": "evaluate", "arguments": {}}'))
    m = parse_message(text)
    assert m.call_positions == [0, 2, 4]
    assert [f.position for f in m.failures] == [1, 3]
    kinds = [it.name if isinstance(it, ToolCall) else it.reason for it in m.items()]
    assert kinds == ["set_parameters", "malformed_json", "run_simulation", "unknown_tool", "evaluate"]
    assert not m.ok


# --------------------------------------------------------------------------------- validation
def test_set_parameters_partial_update_returns_floats():
    v = validate_arguments(ToolCall("set_parameters", {"wm": 2, "alpha": 0.5}), CUR)
    assert v.ok and v.reason == "" and v.clipped == {}
    assert v.params == {**CUR, "wm": 2.0, "alpha": 0.5}
    assert list(v.params) == list(PARAMS)
    assert all(type(x) is float for x in v.params.values())
    assert v.applied == {"wm": 2.0, "alpha": 0.5}


def test_clipping_reports_exactly_what_changed():
    v = validate_arguments(ToolCall("set_parameters", {"wm": 12, "b": 0, "ke": 0.5, "fc": 1.5}), CUR)
    assert v.ok
    assert v.clipped == {"wm": (12.0, 10.0), "b": (0.0, 1e-6), "ke": (0.5, 0.8)}
    assert v.params["wm"] == 10.0 and v.params["b"] == 1e-6 and v.params["ke"] == 0.8 and v.params["fc"] == 1.5
    assert "wm clipped from 12 to 10" in v.detail


def test_clip_off_rejects_out_of_bounds():
    v = validate_arguments(ToolCall("set_parameters", {"wm": 12}), CUR, clip=False)
    assert not v.ok and v.reason == "out_of_bounds" and "wm" in v.detail and v.params == CUR


@pytest.mark.parametrize("value", ["1.5", True, False, None, [1.5], {"v": 1.5}])
def test_non_numbers_rejected(value):
    v = validate_arguments(ToolCall("set_parameters", {"wm": value}), CUR)
    assert not v.ok and v.reason == "not_a_number" and "wm" in v.detail
    assert v.params == CUR and v.applied == {}


def test_string_number_hint():
    v = validate_arguments(ToolCall("set_parameters", {"wm": "1.5"}), CUR)
    assert "without quotes" in v.detail


@pytest.mark.parametrize("value,reason", [(1e12, "too_large"), (-5e15, "too_large"), (10**400, "too_large"),
                                          (float("inf"), "not_finite"), (float("nan"), "not_finite"),
                                          (float("-inf"), "not_finite")])
def test_huge_and_non_finite_rejected(value, reason):
    v = validate_arguments(ToolCall("set_parameters", {"iwu": value}), CUR)
    assert not v.ok and v.reason == reason


def test_numpy_numbers_accepted_as_floats():
    v = validate_arguments(ToolCall("set_parameters", {"wm": np.float32(2.0), "b": np.int64(1)}), CUR)
    assert v.ok and type(v.params["wm"]) is float and type(v.params["b"]) is float
    assert not validate_arguments(ToolCall("set_parameters", {"wm": np.bool_(True)}), CUR).ok


@pytest.mark.parametrize("name", ["th", "isu", "TH"])
def test_fixed_parameters_rejected(name):
    v = validate_arguments(ToolCall("set_parameters", {name: 10}), CUR)
    assert not v.ok and v.reason == "fixed_parameter" and "fixed" in v.detail


def test_unknown_names_list_valid_names_and_bounds():
    v = validate_arguments(ToolCall("set_parameters", {"soil": 1.0}), CUR)
    assert not v.ok and v.reason == "unknown_parameter" and '"soil"' in v.detail
    for name in TUNABLE:
        p = PARAMS[name]
        assert f"{name} [{p.lower:g}, {p.upper:g}]" in v.detail


def test_upper_case_rejected_with_hint():
    v = validate_arguments(ToolCall("set_parameters", {"WM": 1.0}), CUR)
    assert not v.ok and v.reason == "unknown_parameter" and 'use "wm"' in v.detail


def test_one_bad_value_rejects_the_whole_call_and_lists_every_problem():
    v = validate_arguments(ToolCall("set_parameters", {"wm": 2.0, "b": "x", "th": 5, "zz": 1}), CUR)
    assert not v.ok and v.params == CUR and v.applied == {}
    assert all(s in v.detail for s in ("b must", "th is fixed", '"zz"', "Nothing was changed"))


def test_empty_set_parameters_rejected():
    v = validate_arguments(ToolCall("set_parameters", {}), CUR)
    assert not v.ok and v.reason == "empty_arguments" and "at least one" in v.detail


@pytest.mark.parametrize("tool", ["run_simulation", "evaluate"])
def test_no_argument_tools_strict(tool):
    ok = validate_arguments(ToolCall(tool, {}), CUR)
    assert ok.ok and ok.params == CUR
    bad = validate_arguments(ToolCall(tool, {"wm": 1.0}), CUR)
    assert not bad.ok and bad.reason == "bad_arguments" and "{}" in bad.detail


def test_unknown_tool_in_validation_and_reason_codes():
    v = validate_arguments(ToolCall("finish", {}), CUR)
    assert not v.ok and v.reason == "unknown_tool"
    assert v.reason in VALIDATION_REASONS


def test_missing_current_values_take_defaults():
    v = validate_arguments(ToolCall("set_parameters", {"wm": 3}), {"b": 2.0})
    assert v.params == {**DEFAULTS, "b": 2.0, "wm": 3.0}


# --------------------------------------------------------------------------------- rendering
def test_render_hermes_exact_format():
    s = render_hermes(ToolCall("set_parameters", {"wm": 1.5, "alpha": 0.8}))
    assert s == '<tool_call>\n{"name": "set_parameters", "arguments": {"wm": 1.5, "alpha": 0.8}}\n</tool_call>'
    assert render_hermes(ToolCall("evaluate", {})) == '<tool_call>\n{"name": "evaluate", "arguments": {}}\n</tool_call>'
    with pytest.raises(ValueError):
        render_hermes(ToolCall("set_parameters", {"wm": float("nan")}))


def test_render_tool_response_is_valid_compact_json():
    obs = {"status": "ok", "NSE": float("nan"), "peak_ratio": float("inf"), "n": np.int64(3),
           "series": np.array([1.0, np.nan], dtype=np.float32), "flag": np.bool_(True), 5: "five",
           "nested": {"x": (float("-inf"), 0.123456789)}}
    s = render_tool_response(obs)
    assert strict_loads(s) == {"status": "ok", "NSE": None, "peak_ratio": None, "n": 3, "series": [1.0, None],
                               "flag": True, "5": "five", "nested": {"x": [None, 0.123456789]}}
    assert ", " not in s and ": " not in s
    assert list(json.loads(s)) == ["status", "NSE", "peak_ratio", "n", "series", "flag", "5", "nested"]
    assert render_tool_response(obs) == s
    assert json.loads(render_tool_response({"x": 0.123456789}, digits=4)) == {"x": 0.1235}
    assert list(json.loads(render_tool_response({"b": 1, "a": 2}, sort_keys=True))) == ["a", "b"]


finite = st.floats(allow_nan=False, allow_infinity=False)


@settings(max_examples=300, deadline=None)
@given(st.dictionaries(st.sampled_from(TUNABLE), finite, min_size=1))
def test_render_parse_round_trip(args):
    call = ToolCall("set_parameters", args)
    m = parse_message("Try this.\n" + render_hermes(call))
    assert m.ok and m.calls == [call]
    assert all(type(m.calls[0].arguments[k]) is float for k in args)
    oa = from_openai_tool_calls([to_openai_tool_call(call)])
    assert oa.ok and oa.calls[0].arguments == args
    v = validate_arguments(m.calls[0], CUR)
    if all(abs(x) < 1e12 for x in args.values()):
        assert v.ok
        for k, x in args.items():
            p = PARAMS[k]
            assert v.params[k] == min(max(x, p.lower), p.upper)
            assert (k in v.clipped) == (not p.lower <= x <= p.upper)


# --------------------------------------------------------------------------------- fuzzing
_json_atoms = st.one_of(st.none(), st.booleans(), st.integers(-10**15, 10**15), finite, st.text(max_size=5),
                        st.sampled_from([float("nan"), float("inf"), float("-inf"), 1e300]))
_json_values = st.recursive(_json_atoms, lambda c: st.one_of(st.lists(c, max_size=3),
                                                              st.dictionaries(st.text(max_size=6), c, max_size=3)),
                            max_leaves=8)
_names = st.one_of(st.sampled_from(TOOL_NAMES), st.text(max_size=8))
_keys = st.one_of(st.sampled_from(list(PARAMS) + ["WM", "Alpha", ""]), st.text(max_size=6))
_args = st.one_of(st.dictionaries(_keys, _json_values, max_size=4), _json_values)


@st.composite
def _call_json(draw):
    obj = {"name": draw(_names), "arguments": draw(_args)}
    if draw(st.booleans()):
        obj["arguments"] = json.dumps(obj["arguments"])
    text = json.dumps(obj)  # allow_nan default: may contain NaN/Infinity literals
    if draw(st.integers(0, 4)) == 0:  # mutate: cut, duplicate or inject
        i = draw(st.integers(0, len(text)))
        text = draw(st.sampled_from([text[:i], text[:i] + text[i:][::-1], text[:i] + '"wm": 1, ' + text[i:],
                                     text[:i] + "<tool_call>" + text[i:]]))
    return text


_fragments = st.one_of(
    st.sampled_from(["<tool_call>", "</tool_call>", "<tool_call>\n", "\n</tool_call>", "{", "}", '"', "[",
                     "NaN", "```", "\n"]),
    st.text(max_size=20),
    _call_json(),
    _call_json().map(lambda t: f"<tool_call>\n{t}\n</tool_call>"),
)


@pytest.mark.slow
@settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(_fragments, max_size=8).map("".join), st.integers(0, 12))
def test_parse_never_raises_and_only_bounded_floats_pass(text, max_calls):
    m = parse_message(text, max_calls=max_calls)
    assert isinstance(m, ParsedMessage)
    assert m.calls or m.failures
    positions = sorted(m.call_positions + [f.position for f in m.failures])
    assert positions == list(range(len(positions)))
    assert len(m.calls) <= max_calls
    for f in m.failures:
        assert f.reason in PARSE_REASONS and f.detail
    for call in m.calls:
        assert call.name in TOOL_NAMES and isinstance(call.arguments, dict)
        v = validate_arguments(call, CUR)
        assert isinstance(v.params, dict)
        if v.ok and call.name == "set_parameters":
            for k, x in v.params.items():
                assert type(x) is float and math.isfinite(x)
                assert PARAMS[k].lower <= x <= PARAMS[k].upper
            assert set(v.applied) <= set(TUNABLE)
        elif not v.ok:
            assert v.reason in VALIDATION_REASONS and v.params == CUR


def test_random_mutations_of_valid_messages_never_raise():
    rng = random.Random(20260517)
    base = ("Lower the peak.\n" + render_hermes(ToolCall("set_parameters", {"wm": 2.5, "alpha": 0.7, "iwu": 40}))
            + "\n" + render_hermes(ToolCall("run_simulation", {})) + render_hermes(ToolCall("evaluate", {})))
    alphabet = '{}[]",:<>/\\ntoolcal_0123456789.eE-+NaIfy wm'
    for _ in range(5000):
        chars = list(base)
        for _ in range(rng.randint(1, 6)):
            i = rng.randrange(len(chars) + 1)
            op = rng.random()
            if op < 0.4 and chars:
                del chars[min(i, len(chars) - 1)]
            elif op < 0.8:
                chars.insert(i, rng.choice(alphabet))
            else:
                j = rng.randrange(len(chars) + 1)
                chars[i:i] = chars[min(i, j):max(i, j)][:50]
        m = parse_message("".join(chars))
        for call in m.calls:
            v = validate_arguments(call, CUR)
            if v.ok:
                assert all(type(x) is float and PARAMS[k].lower <= x <= PARAMS[k].upper for k, x in v.params.items())


# --------------------------------------------------------------------------------- OpenAI adapter
def test_openai_adapter_dicts_and_objects():
    dict_call = {"id": "call_a", "type": "function",
                 "function": {"name": "set_parameters", "arguments": '{"wm": 1.2}'}}
    obj_call = SimpleNamespace(id="call_b", type="function",
                               function=SimpleNamespace(name="run_simulation", arguments="{}"))
    m = from_openai_tool_calls([dict_call, obj_call], content="Raising wm.")
    assert m.ok and m.text == "Raising wm."
    assert m.calls == [ToolCall("set_parameters", {"wm": 1.2}, "call_a"), ToolCall("run_simulation", {}, "call_b")]


def test_openai_adapter_strictness_and_order():
    calls = [
        {"id": "1", "type": "function", "function": {"name": "evaluate", "arguments": ""}},        # "" = {}
        {"id": "2", "type": "function", "function": {"name": "set_parameters", "arguments": '{"wm": NaN}'}},
        {"id": "3", "type": "function", "function": {"name": "set_parameters", "arguments": "{bad"}},
        {"id": "4", "type": "function", "function": {"name": "finish", "arguments": "{}"}},
        {"id": "5", "type": "code", "function": {"name": "evaluate", "arguments": "{}"}},
        {"id": "6", "type": "function"},
        {"id": "7", "type": "function", "function": {"name": "set_parameters", "arguments": "[1]"}},
        {"id": "8", "type": "function", "function": {"name": "set_parameters", "arguments": {"wm": float("inf")}}},
        42,
        {"id": "9", "type": "function", "function": {"name": "evaluate", "arguments": {}}},
    ]
    m = from_openai_tool_calls(calls, max_calls=20)
    kinds = [it.call_id if isinstance(it, ToolCall) else it.reason for it in m.items()]
    assert kinds == ["1", "bad_arguments", "bad_arguments", "unknown_tool", "malformed_call", "malformed_call",
                     "bad_arguments", "bad_arguments", "malformed_call", "9"]
    assert from_openai_tool_calls([]).failures[0].reason == "no_tool_call"
    assert from_openai_tool_calls(None).failures[0].reason == "no_tool_call"
    many = from_openai_tool_calls([calls[0]] * 12, max_calls=10)
    assert len(many.calls) == 10 and [f.reason for f in many.failures] == ["too_many_calls"]


def test_to_openai_tool_call():
    d = to_openai_tool_call(ToolCall("set_parameters", {"wm": 2.0}), index=3)
    assert d == {"id": "call_3", "type": "function",
                 "function": {"name": "set_parameters", "arguments": '{"wm": 2.0}'}}
    assert to_openai_tool_call(ToolCall("evaluate", {}, "abc"))["id"] == "abc"


# --------------------------------------------------------------------------------- hints
def test_retry_hint_names_the_problem_and_shows_a_parseable_example():
    fails = parse_message(block("{oops")).failures
    hint = retry_hint(fails)
    assert "malformed_json" in hint and "<tool_call>" in hint
    m = parse_message(hint.split("Example:", 1)[1])
    assert m.ok and [c.name for c in m.calls] == ["set_parameters", "run_simulation"]
    assert "<tool_call>" in retry_hint([])
