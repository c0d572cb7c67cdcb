"""The three calibration tools: one source for their schemas, parsing, validation and rendering.

Tools (descriptions in :data:`TOOL_DESCRIPTIONS`, parameter properties from ``params.PARAMS``):

- ``set_parameters``: a partial update of the 11 tunable multipliers (others keep their value);
- ``run_simulation`` and ``evaluate``: no arguments (exactly ``{}``).

Model output is untrusted. :func:`parse_message` reads Hermes blocks
(``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``) strictly: a block that is
not exactly one JSON object with ``name`` and ``arguments`` is a :class:`ParseFailure`, never a
repaired call (the reference parser turned broken JSON into ``{}`` calls; see
docs/reference-implementation.md, section 4). NaN/Infinity literals, overflowing numbers and
duplicate keys are rejected. :func:`validate_arguments` then checks a call against the tool:
only finite real numbers under tunable lower-case names reach the returned parameter dict, as
Python floats.

Decisions: upper-case names are rejected with a hint (one canonical spelling keeps training
data consistent); out-of-bounds values are clipped and reported per parameter (or rejected with
``clip=False``); observations render non-finite floats as ``null`` (JSON has no NaN).
"""

from __future__ import annotations

import difflib
import json
import math
import numbers
import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

from hydroagent_hpc.params import DEFAULTS, PARAM_NAMES, PARAMS, TUNABLE
from hydroagent_hpc.types import ToolCall

__all__ = [
    "TOOL_NAMES", "TOOL_DESCRIPTIONS", "BOUNDS_RULES", "PARSE_REASONS", "VALIDATION_REASONS", "MAX_MESSAGE_CHARS",
    "MAX_ABS_VALUE", "ParseFailure", "ParsedMessage", "Validated", "tool_schemas", "parse_message",
    "validate_arguments", "render_hermes", "render_tool_response", "from_openai_tool_calls",
    "to_openai_tool_call", "retry_hint", "format_example", "describe_parameter",
]

TOOL_NAMES = ("set_parameters", "run_simulation", "evaluate")

#: The tools' descriptions; ``{bounds_rule}`` is filled by :func:`tool_schemas`.
TOOL_DESCRIPTIONS: Mapping[str, str] = MappingProxyType({
    "set_parameters": (
        "Change one or more of the 11 tunable CREST/kinematic-wave multipliers. Partial updates are "
        "allowed: parameters you leave out keep their current value. Values must be plain JSON numbers; "
        "{bounds_rule} th and isu are fixed and cannot be set. Does not run the model."),
    "run_simulation": (
        "Run the model with the current parameters. Takes no arguments ({}). Reports whether the run "
        "succeeded; call evaluate next to score it."),
    "evaluate": (
        "Score your newest simulation(s) against the observed discharge (NSE and other metrics). Takes no "
        "arguments ({}). Needs a new successful simulation since the last evaluate."),
})
BOUNDS_RULES = MappingProxyType({
    True: "a value outside a parameter's bounds is clipped to the nearest bound and the clip is reported.",
    False: "a value outside a parameter's bounds makes the call invalid.",
})

#: Codes a :class:`ParseFailure` may carry.
PARSE_REASONS = ("no_tool_call", "malformed_json", "not_an_object", "malformed_call", "unknown_tool",
                 "bad_arguments", "unclosed_tag", "stray_close_tag", "too_many_calls", "message_too_long")
#: Codes a failed :class:`Validated` may carry.
VALIDATION_REASONS = ("unknown_tool", "bad_arguments", "empty_arguments", "unknown_parameter",
                      "fixed_parameter", "not_a_number", "not_finite", "too_large", "out_of_bounds")

MAX_MESSAGE_CHARS = 200_000
MAX_ABS_VALUE = 1e12
MAX_DEPTH = 32  # nesting allowed inside one call object
RAW_CHARS = 200

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"
_TAG_RE = re.compile(r"<tool_call>|</tool_call>")


def _fmt(x: float) -> str:
    return f"{x:g}"


def _unit(name: str) -> str:
    """The unit of a value given directly ("" for grid multipliers and dimensionless values)."""
    u = PARAMS[name].unit
    return "" if "(x grid)" in u or u.strip() in ("", "-") else u


def _bounds_text(name: str) -> str:
    p = PARAMS[name]
    return f"{name} [{_fmt(p.lower)}, {_fmt(p.upper)}]"


def describe_parameter(name: str) -> str:
    """One line for a parameter: meaning, unit, bounds, default (schemas and prompts share it)."""
    p = PARAMS[name]
    unit = f" ({_unit(name)})" if _unit(name) else ""
    if p.fixed:
        return f"{p.meaning}{unit}; fixed at {_fmt(p.default)}"
    return f"{p.meaning}{unit}; bounds [{_fmt(p.lower)}, {_fmt(p.upper)}], default {_fmt(p.default)}"


VALID_NAMES_TEXT = ", ".join(_bounds_text(n) for n in TUNABLE)


def tool_schemas(clip_out_of_bounds: bool = True) -> list[dict]:
    """The three tools as OpenAI function schemas (also what the Qwen3 template puts in <tools>).

    ``clip_out_of_bounds`` must match what :func:`validate_arguments` is told (``clip``); it only
    changes one sentence of set_parameters' description.
    """
    props = {name: {"type": "number", "description": describe_parameter(name)} for name in TUNABLE}
    empty = {"type": "object", "properties": {}, "required": [], "additionalProperties": False}
    args = {
        "set_parameters": {"type": "object", "properties": props, "required": [], "additionalProperties": False},
        "run_simulation": empty,
        "evaluate": empty,
    }
    rule = BOUNDS_RULES[bool(clip_out_of_bounds)]
    return [{"type": "function",
             "function": {"name": n, "description": TOOL_DESCRIPTIONS[n].replace("{bounds_rule}", rule),
                          "parameters": json.loads(json.dumps(args[n]))}}
            for n in TOOL_NAMES]


# ---------------------------------------------------------------------------------------------
# Parsing


@dataclass(frozen=True)
class ParseFailure:
    """A part of an assistant message that is not a usable tool call.

    ``reason`` is one of :data:`PARSE_REASONS`; ``detail`` says what is wrong and how to fix it;
    ``raw`` is the offending snippet (truncated); ``position`` orders it among the message's calls.
    """

    reason: str
    detail: str
    raw: str = ""
    position: int = 0


@dataclass(frozen=True)
class ParsedMessage:
    """Tool calls and failures of one assistant message, with the prose outside the blocks.

    ``call_positions[i]`` is the position of ``calls[i]``; positions of calls and failures
    together are 0, 1, 2, ... in order of appearance, and :meth:`items` merges them in that order
    (the order the environment executes them in).
    """

    calls: list[ToolCall] = field(default_factory=list)
    failures: list[ParseFailure] = field(default_factory=list)
    text: str = ""
    call_positions: list[int] = field(default_factory=list)

    def items(self) -> list[ToolCall | ParseFailure]:
        tagged = [(p, c) for p, c in zip(self.call_positions, self.calls)]
        tagged += [(f.position, f) for f in self.failures]
        return [item for _, item in sorted(tagged, key=lambda t: t[0])]

    @property
    def ok(self) -> bool:
        """At least one call and no failure."""
        return bool(self.calls) and not self.failures


class _Rejected(ValueError):
    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def _truncate(s: str, n: int = RAW_CHARS) -> str:
    return s if len(s) <= n else s[:n] + "..."


def _show(s: str, n: int = 40) -> str:
    """An untrusted string quoted for a message: shortened, JSON-escaped, plain ASCII."""
    return json.dumps(_truncate(s, n))


def _no_constant(name: str):
    raise _Rejected("malformed_json", f"{name} is not a JSON number; use a finite number such as 1.0")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise _Rejected("malformed_json", f"number {_truncate(s, 40)} overflows; use a finite number")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict:
    out: dict = {}
    for k, v in pairs:
        if k in out:
            raise _Rejected("malformed_json", f"duplicate key {_show(k)}; give each key once")
        out[k] = v
    return out


def _depth_ok(value: Any) -> bool:
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if d > MAX_DEPTH:
            return False
        if isinstance(v, dict):
            stack.extend((x, d + 1) for x in v.values())
        elif isinstance(v, list):
            stack.extend((x, d + 1) for x in v)
    return True


def _loads(s: str, what: str = "the tool call") -> Any:
    """Strict JSON: no NaN/Infinity, no overflowing numbers, no duplicate keys, bounded depth."""
    try:
        value = json.loads(s, parse_constant=_no_constant, parse_float=_finite_float,
                           object_pairs_hook=_no_duplicates)
    except _Rejected:
        raise
    except RecursionError:
        raise _Rejected("malformed_json", f"{what} is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int() beyond Python's digit limit
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "number too long"
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise _Rejected("malformed_json", f"{what} is not valid JSON{where}: {msg}. {_json_tip(s)}") from None
    if not _depth_ok(value):
        raise _Rejected("malformed_json", f"{what} is nested deeper than {MAX_DEPTH} levels")
    return value


def _json_tip(s: str) -> str:
    t = s.strip()
    if t.startswith("```"):
        return "Put the bare JSON object inside the tags, without Markdown fences."
    if re.match(r"^[A-Za-z_]\w*\s*\(", t):
        return 'Write a JSON object {"name": ..., "arguments": {...}}, not a Python-style call.'
    if "'" in t and '"' not in t:
        return "Use double quotes for keys and strings."
    return 'Write exactly one JSON object {"name": ..., "arguments": {...}} per block.'


def _close_name(name: str) -> str:
    match = difflib.get_close_matches(name.lower(), TOOL_NAMES, n=1, cutoff=0.6)
    return f' Did you mean "{match[0]}"?' if match else ""


def _call_from_object(obj: Any, call_id: str | None = None) -> ToolCall:
    """A ToolCall from a decoded {"name", "arguments"} object, or _Rejected."""
    if not isinstance(obj, dict):
        raise _Rejected("not_an_object", f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, '
                                         f"got a JSON {_json_type(obj)}")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        hint = ' (use "arguments")' if "parameters" in extra or "args" in extra else ""
        raise _Rejected("malformed_call", f"unexpected key(s) {', '.join(map(repr, extra))}{hint}; "
                                          'a call has exactly "name" and "arguments"')
    if "name" not in obj:
        raise _Rejected("malformed_call", 'the call has no "name"; add "name": one of ' + ", ".join(TOOL_NAMES))
    name = obj["name"]
    if not isinstance(name, str):
        raise _Rejected("malformed_call", f'"name" must be a string, got a JSON {_json_type(name)}')
    if name not in TOOL_NAMES:
        raise _Rejected("unknown_tool", f"unknown tool {_show(name, 60)}; the tools are "
                                        f"{', '.join(TOOL_NAMES)}.{_close_name(name)}")
    if "arguments" not in obj:
        raise _Rejected("bad_arguments", 'the call has no "arguments"; add "arguments": {} '
                                         "(or the parameters for set_parameters)")
    return ToolCall(name=name, arguments=_arguments(obj["arguments"], name), call_id=call_id)


def _arguments(args: Any, tool: str) -> dict:
    if isinstance(args, str):  # OpenAI style: a JSON string holding the object
        try:
            args = _loads(args, f"the arguments of {tool}")
        except _Rejected as exc:
            raise _Rejected("bad_arguments", exc.detail) from None
        if not isinstance(args, dict):
            raise _Rejected("bad_arguments", f'"arguments" of {tool} must hold a JSON object, got a JSON '
                                             f"{_json_type(args)}")
    if not isinstance(args, dict):
        raise _Rejected("bad_arguments", f'"arguments" of {tool} must be a JSON object such as {{}}, got a JSON '
                                         f"{_json_type(args)}")
    return args


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    if isinstance(v, list):
        return "array"
    if isinstance(v, dict):
        return "object"
    return type(v).__name__


class _Builder:
    """Collects calls and failures with their positions, at most ``max_calls`` items."""

    def __init__(self, max_calls: int):
        self.max_calls = max(0, int(max_calls))
        self.calls: list[ToolCall] = []
        self.positions: list[int] = []
        self.failures: list[ParseFailure] = []
        self.n = 0
        self.dropped = 0
        self.dropped_raw = ""

    def full(self) -> bool:
        return self.n >= self.max_calls

    def drop(self, raw: str) -> None:
        if not self.dropped:
            self.dropped_raw = raw
        self.dropped += 1

    def call(self, c: ToolCall) -> None:
        self.calls.append(c)
        self.positions.append(self.n)
        self.n += 1

    def fail(self, reason: str, detail: str, raw: str = "") -> None:
        self.failures.append(ParseFailure(reason, detail, _truncate(raw), self.n))
        self.n += 1

    def flush(self) -> None:
        if self.dropped:
            self.fail("too_many_calls", f"{self.dropped} more tool-call block(s) ignored; send at most "
                                        f"{self.max_calls} per message", self.dropped_raw)
            self.dropped = 0

    def finish(self, text: str) -> ParsedMessage:
        self.flush()
        return ParsedMessage(self.calls, self.failures, text.strip(), self.positions)


def parse_message(text: str, max_calls: int = 10, max_chars: int = MAX_MESSAGE_CHARS) -> ParsedMessage:
    """Parse the Hermes ``<tool_call>`` blocks of one assistant message. Never raises.

    Only the first ``max_chars`` characters are scanned (a longer message adds a
    "message_too_long" failure at the end). At most ``max_calls`` blocks become items; further
    blocks make one "too_many_calls" failure. A message without any block is one "no_tool_call".
    """
    if not isinstance(text, str):
        return ParsedMessage([], [ParseFailure("no_tool_call", f"the message is not text ({type(text).__name__})")])
    too_long = len(text) > max_chars
    scan = text[:max_chars] if too_long else text
    b = _Builder(max_calls)
    prose: list[str] = []
    pos = 0
    open_at: int | None = None  # index just after an unmatched <tool_call>
    open_start = 0
    for m in _TAG_RE.finditer(scan):
        if m.group() == OPEN_TAG:
            if open_at is None:
                prose.append(scan[pos:m.start()])
            else:  # a new block opens before the previous one closed
                _item(b, "unclosed_tag", scan[open_start:m.start()],
                      "a <tool_call> block was not closed before the next one; end each call with </tool_call>")
            open_at, open_start = m.end(), m.start()
        elif open_at is None:  # a close tag with nothing open
            prose.append(scan[pos:m.start()])
            _item(b, "stray_close_tag", scan[max(pos, m.start() - RAW_CHARS):m.end()],
                  "</tool_call> without a matching <tool_call>; start each call with <tool_call> on its own line")
        else:
            body = scan[open_at:m.start()]
            if b.full():
                b.drop(scan[open_start:m.end()])
            else:
                try:
                    b.call(_call_from_object(_loads(body.strip())))
                except _Rejected as exc:
                    b.fail(exc.reason, exc.detail, body.strip())
            open_at = None
        pos = m.end()
    if open_at is not None:
        _item(b, "unclosed_tag", scan[open_start:],
              "a <tool_call> block has no closing </tool_call>; end each call with </tool_call>")
    else:
        prose.append(scan[pos:])
    if b.n == 0 and not b.dropped:
        b.fail("no_tool_call", _no_call_detail(scan), scan[:RAW_CHARS])
    b.flush()
    if too_long:
        b.fail("message_too_long", f"the message has {len(text)} characters; only the first {max_chars} were read. "
                                   "Keep replies short: a few sentences and the tool calls",
               text[max_chars:][:RAW_CHARS])
    return b.finish("".join(prose))


def _item(b: _Builder, reason: str, raw: str, detail: str) -> None:
    if b.full():
        b.drop(raw)
    else:
        b.fail(reason, detail, raw)


def _no_call_detail(text: str) -> str:
    base = "the message contains no <tool_call> block"
    if '"name"' in text and '"arguments"' in text:
        return base + '; a {"name": ..., "arguments": ...} object must be wrapped in <tool_call> and </tool_call>'
    if "```" in text:
        return base + "; do not use Markdown code blocks, wrap the JSON in <tool_call> tags"
    return base + "; every reply must call at least one tool"


# ---------------------------------------------------------------------------------------------
# Validation


@dataclass(frozen=True)
class Validated:
    """The outcome of checking one call against its tool.

    ``params`` is the full parameter set after the call (``current`` merged with the update; the
    current set unchanged for run_simulation, evaluate and any error), every value a Python float.
    ``applied`` holds the values this call set (after clipping); ``clipped[name] = (asked, used)``.
    On error ``reason`` is one of :data:`VALIDATION_REASONS` and ``detail`` names the field and
    the fix; on success ``detail`` describes any clipping.
    """

    tool: str
    ok: bool
    params: dict[str, float]
    applied: dict[str, float] = field(default_factory=dict)
    clipped: dict[str, tuple[float, float]] = field(default_factory=dict)
    reason: str = ""
    detail: str = ""


def _full(current: Mapping[str, float]) -> dict[str, float]:
    """All 13 parameters in EF5 order: ``current`` where given, else the default."""
    return {n: float(current[n]) if n in current else float(DEFAULTS[n]) for n in PARAM_NAMES}


def _is_number(v: Any) -> bool:
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and type(v).__name__ not in ("bool", "bool_")


def validate_arguments(call: ToolCall, current: Mapping[str, float], *, clip: bool = True) -> Validated:
    """Check ``call`` against its tool and return the new parameter set or an error.

    set_parameters: at least one parameter; names must be tunable and lower-case; values must be
    real numbers (int or float; not bool, str, null, arrays or objects), finite, with
    ``abs < 1e12``. Out-of-bounds values are clipped (``clip=False``: rejected). Any problem
    rejects the whole call and nothing is applied; the detail lists every problem.
    run_simulation / evaluate: arguments must be exactly ``{}``.
    """
    base = _full(current)
    name, args = call.name, call.arguments
    if name not in TOOL_NAMES:
        return Validated(str(name), False, base, reason="unknown_tool",
                         detail=f"unknown tool {_show(str(name), 60)}; the tools are {', '.join(TOOL_NAMES)}")
    if not isinstance(args, Mapping):
        return Validated(name, False, base, reason="bad_arguments",
                         detail=f"arguments of {name} must be a JSON object")
    if name != "set_parameters":
        if args:
            keys = ", ".join(_show(str(k)) for k in list(args)[:5])
            return Validated(name, False, base, reason="bad_arguments",
                             detail=f"{name} takes no arguments, got {keys}; call it with \"arguments\": {{}}")
        return Validated(name, True, base)
    if not args:
        return Validated(name, False, base, reason="empty_arguments",
                         detail="set_parameters needs at least one parameter, e.g. {\"wm\": 1.5}; valid: "
                                + VALID_NAMES_TEXT)
    problems: list[tuple[str, str]] = []
    applied: dict[str, float] = {}
    clipped: dict[str, tuple[float, float]] = {}
    for key, value in args.items():
        code, msg = _check_one(key, value)
        if code:
            problems.append((code, msg))
            continue
        p = PARAMS[key]
        v = float(value) + 0.0  # a Python float; -0.0 becomes 0.0
        used = min(max(v, p.lower), p.upper)
        if used != v:
            if not clip:
                problems.append(("out_of_bounds", f"{key}={_fmt(v)} is outside its bounds "
                                                  f"[{_fmt(p.lower)}, {_fmt(p.upper)}]; choose a value inside"))
                continue
            clipped[key] = (v, float(used))
        applied[key] = float(used)
    if problems:
        detail = "; ".join(m for _, m in problems)
        if any(c == "unknown_parameter" for c, _ in problems):
            detail += ". Valid parameters: " + VALID_NAMES_TEXT
        return Validated(name, False, base, reason=problems[0][0], detail=detail + ". Nothing was changed.")
    new = dict(base)
    new.update(applied)
    detail = "; ".join(f"{k} clipped from {_fmt(a)} to {_fmt(u)} (bounds [{_fmt(PARAMS[k].lower)}, "
                       f"{_fmt(PARAMS[k].upper)}])" for k, (a, u) in clipped.items())
    return Validated(name, True, new, applied, clipped, detail=detail)


def _check_one(key: Any, value: Any) -> tuple[str, str]:
    if not isinstance(key, str):
        return "unknown_parameter", f"parameter name {_show(str(key))} is not a string"
    shown = _show(key)
    if key not in PARAMS:
        if key.lower() in PARAMS and PARAMS[key.lower()].fixed:
            return "fixed_parameter", f"{shown}: {key.lower()} is fixed and cannot be set (names are lower-case)"
        if key.lower() in PARAMS:
            return "unknown_parameter", f"unknown parameter {shown}: names are lower-case, use {_show(key.lower())}"
        match = difflib.get_close_matches(key.lower(), TUNABLE, n=1, cutoff=0.7)
        hint = f" (did you mean {_show(match[0])}?)" if match else ""
        return "unknown_parameter", f"unknown parameter {shown}{hint}"
    p = PARAMS[key]
    if p.fixed:
        return "fixed_parameter", f"{key} is fixed at {_fmt(p.default)} and cannot be set; leave it out"
    if not _is_number(value):
        got = _json_type(value)
        fix = " (write the number without quotes)" if isinstance(value, str) else ""
        return "not_a_number", f"{key} must be a JSON number, got a {got}{fix}"
    within = f"use a value within [{_fmt(p.lower)}, {_fmt(p.upper)}]"
    if isinstance(value, numbers.Integral):
        if abs(int(value)) >= MAX_ABS_VALUE:
            return "too_large", f"{key} is too large; {within}"
        return "", ""
    try:
        v = float(value)
    except (OverflowError, ValueError, TypeError):
        return "too_large", f"{key} is not a usable number; {within}"
    if not math.isfinite(v):
        return "not_finite", f"{key} must be finite; {within}"
    if abs(v) >= MAX_ABS_VALUE:
        return "too_large", f"{key}={v:g} is too large; {within}"
    return "", ""


# ---------------------------------------------------------------------------------------------
# Rendering


def render_hermes(call: ToolCall) -> str:
    """``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`` as the Qwen3 template writes it.

    Same serialisation as the template's ``tojson`` (``json.dumps`` defaults, ``ensure_ascii=False``,
    insertion order); raises ValueError for non-finite numbers (they have no JSON form).
    """
    body = json.dumps({"name": call.name, "arguments": dict(call.arguments)}, ensure_ascii=False, allow_nan=False)
    return f"{OPEN_TAG}\n{body}\n{CLOSE_TAG}"


def _jsonable(v: Any, digits: int | None) -> Any:
    if v is None or isinstance(v, (bool, str)):
        return v
    if isinstance(v, numbers.Integral):
        return int(v)
    if isinstance(v, numbers.Real):
        f = float(v)
        if not math.isfinite(f):
            return None
        return round(f, digits) if digits is not None else f
    if isinstance(v, Mapping):
        return {str(k): _jsonable(x, digits) for k, x in v.items()}
    if hasattr(v, "tolist") and not isinstance(v, (bytes, bytearray)):  # numpy arrays and scalars
        return _jsonable(v.tolist(), digits)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x, digits) for x in v]
    return str(v)


def render_tool_response(observation: Mapping, digits: int | None = None, sort_keys: bool = False) -> str:
    """An observation as compact JSON (always valid JSON).

    Key order is the mapping's insertion order (deterministic: the environment builds each
    observation in a fixed order; ``sort_keys=True`` sorts). Non-finite floats (NaN, +-inf)
    become ``null``, meaning "not available"; numpy values become plain numbers and lists;
    anything else unknown becomes its string. ``digits`` rounds floats.
    """
    return json.dumps(_jsonable(observation, digits), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, sort_keys=sort_keys)


# ---------------------------------------------------------------------------------------------
# OpenAI function calling


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def from_openai_tool_calls(tool_calls: Iterable | None, max_calls: int = 10,
                           content: str | None = None) -> ParsedMessage:
    """Parse an OpenAI ``message.tool_calls`` list (client objects or dicts). Never raises.

    Each item needs ``type`` "function" (when present) and ``function.name``/``function.arguments``;
    ``arguments`` is a JSON string holding an object (a dict is accepted too). An empty or
    whitespace-only string counts as ``{}``: some servers send it for functions without
    arguments; it is unambiguous, not a repair. ``content`` becomes the message text.
    """
    b = _Builder(max_calls)
    for item in list(tool_calls or []):
        if b.full():
            b.drop(_truncate(repr(item)))
            continue
        try:
            b.call(_openai_call(item))
        except _Rejected as exc:
            b.fail(exc.reason, exc.detail, _truncate(repr(item)))
        except Exception as exc:  # an exotic object; still never raise
            b.fail("malformed_call", f"unreadable tool call ({type(exc).__name__})", _truncate(repr(item)))
    if b.n == 0 and not b.dropped:
        b.fail("no_tool_call", "the message has no tool calls; every reply must call at least one tool")
    return b.finish(content or "")


def _openai_call(item: Any) -> ToolCall:
    typ = _get(item, "type")
    if typ is not None and typ != "function":
        raise _Rejected("malformed_call", f'tool call type must be "function", got {_show(str(typ))}')
    fn = _get(item, "function")
    if fn is None:
        raise _Rejected("malformed_call", 'the tool call has no "function"')
    name, args = _get(fn, "name"), _get(fn, "arguments")
    call_id = _get(item, "id")
    call_id = str(call_id) if call_id is not None else None
    if isinstance(args, str) and not args.strip():
        args = {}
    elif isinstance(args, str):
        try:
            args = _loads(args, "the arguments")
        except _Rejected as exc:
            raise _Rejected("bad_arguments", exc.detail) from None
    elif isinstance(args, Mapping):
        args = dict(args)
        if not _finite_tree(args):
            raise _Rejected("bad_arguments", "arguments contain a non-finite number; use finite numbers")
    elif args is not None:
        raise _Rejected("bad_arguments", "function.arguments must be a JSON string holding an object")
    obj = {"name": name} if name is not None else {}
    if args is not None:
        obj["arguments"] = args
    return _call_from_object(obj, call_id)


def _finite_tree(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, Mapping):
        return all(_finite_tree(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(_finite_tree(x) for x in v)
    return True


def to_openai_tool_call(call: ToolCall, index: int = 0) -> dict:
    """``{"id", "type": "function", "function": {"name", "arguments": JSON string}}``.

    The id is ``call.call_id`` or ``call_<index>``.
    """
    return {"id": call.call_id or f"call_{index}", "type": "function",
            "function": {"name": call.name,
                         "arguments": json.dumps(dict(call.arguments), ensure_ascii=False, allow_nan=False)}}


# ---------------------------------------------------------------------------------------------
# Hints


def format_example(call: ToolCall | None = None) -> str:
    """A rendered example call (the one place prompts and hints take it from)."""
    return render_hermes(call or ToolCall("set_parameters", {"wm": 1.5, "alpha": 0.8}))


def retry_hint(failures: Iterable[ParseFailure]) -> str:
    """A short message asking the model to re-send its calls in the exact format."""
    failures = list(failures)
    problems = "; ".join(f"{f.reason}: {f.detail}" for f in failures[:3])
    if len(failures) > 3:
        problems += f"; and {len(failures) - 3} more"
    lines = []
    if problems:
        lines.append(f"Your last message had unusable tool calls ({problems}).")
    lines += [
        "Send each call as a block exactly like the examples: the opening tag, a newline, one JSON object with "
        "\"name\" and \"arguments\", a newline, the closing tag. Numbers without quotes, double-quoted keys, "
        "no Markdown. Example:",
        format_example(ToolCall("set_parameters", {"wm": 1.5})),
        format_example(ToolCall("run_simulation", {})),
    ]
    return "\n".join(lines)
