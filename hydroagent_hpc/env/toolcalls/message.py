"""A parsed assistant message: its tool calls, its parse failures, and how both are collected.

:class:`ParsedMessage` is what both parsers (Hermes text in :mod:`.parse`, OpenAI ``tool_calls`` in
:mod:`.openai`) return; :class:`Builder` numbers calls and failures in order of appearance and
caps their count; :func:`call_from_object` turns one decoded ``{"name", "arguments"}`` object into
a :class:`~hydroagent_hpc.types.ToolCall` or a reasoned rejection.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any

from hydroagent_hpc.env.toolcalls.schema import TOOL_NAMES
from hydroagent_hpc.env.toolcalls.strictjson import Rejected, json_type, show, strict_loads, truncate
from hydroagent_hpc.types import ToolCall

__all__ = ["PARSE_REASONS", "OPEN_TAG", "CLOSE_TAG", "ParseFailure", "ParsedMessage", "Builder",
           "call_from_object"]

#: Codes a :class:`ParseFailure` may carry.
PARSE_REASONS = ("no_tool_call", "malformed_json", "not_an_object", "malformed_call", "unknown_tool",
                 "bad_arguments", "unclosed_tag", "stray_close_tag", "too_many_calls", "message_too_long",
                 "invalid_text")

OPEN_TAG, CLOSE_TAG = "<tool_call>", "</tool_call>"


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
        tagged: list[tuple[int, ToolCall | ParseFailure]] = list(zip(self.call_positions, self.calls))
        tagged += [(f.position, f) for f in self.failures]
        return [item for _, item in sorted(tagged, key=lambda t: t[0])]

    @property
    def ok(self) -> bool:
        """At least one call and no failure."""
        return bool(self.calls) and not self.failures


def _close_name(name: str) -> str:
    match = difflib.get_close_matches(name.lower(), TOOL_NAMES, n=1, cutoff=0.6)
    return f' Did you mean "{match[0]}"?' if match else ""


def call_from_object(obj: Any, call_id: str | None = None) -> ToolCall:
    """A ToolCall from a decoded {"name", "arguments"} object, or Rejected."""
    if not isinstance(obj, dict):
        raise Rejected("not_an_object", f'a tool call must be a JSON object {{"name": ..., "arguments": {{...}}}}, '
                                        f"got a JSON {json_type(obj)}")
    extra = sorted(set(obj) - {"name", "arguments"})
    if extra:
        hint = ' (use "arguments")' if "parameters" in extra or "args" in extra else ""
        raise Rejected("malformed_call", f"unexpected key(s) {', '.join(map(repr, extra))}{hint}; "
                                         'a call has exactly "name" and "arguments"')
    if "name" not in obj:
        raise Rejected("malformed_call", 'the call has no "name"; add "name": one of ' + ", ".join(TOOL_NAMES))
    name = obj["name"]
    if not isinstance(name, str):
        raise Rejected("malformed_call", f'"name" must be a string, got a JSON {json_type(name)}')
    if name not in TOOL_NAMES:
        raise Rejected("unknown_tool", f"unknown tool {show(name, 60)}; the tools are "
                                       f"{', '.join(TOOL_NAMES)}.{_close_name(name)}")
    if "arguments" not in obj:
        raise Rejected("bad_arguments", 'the call has no "arguments"; add "arguments": {} '
                                        "(or the parameters for set_parameters)")
    return ToolCall(name=name, arguments=_arguments(obj["arguments"], name), call_id=call_id)


def _arguments(args: Any, tool: str) -> dict[str, Any]:
    if isinstance(args, str):  # OpenAI style: a JSON string holding the object
        try:
            args = strict_loads(args, f"the arguments of {tool}")
        except Rejected as exc:
            raise Rejected("bad_arguments", exc.detail) from None
        if not isinstance(args, dict):
            raise Rejected("bad_arguments", f'"arguments" of {tool} must hold a JSON object, got a JSON '
                                            f"{json_type(args)}")
    if not isinstance(args, dict):
        raise Rejected("bad_arguments", f'"arguments" of {tool} must be a JSON object such as {{}}, got a JSON '
                                        f"{json_type(args)}")
    return args


class Builder:
    """Collects calls and failures with their positions, at most ``max_calls`` items."""

    def __init__(self, max_calls: int) -> None:
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
        self.failures.append(ParseFailure(reason, detail, truncate(raw), self.n))
        self.n += 1

    def flush(self) -> None:
        if self.dropped:
            self.fail("too_many_calls", f"{self.dropped} more tool-call block(s) ignored; send at most "
                                        f"{self.max_calls} per message", self.dropped_raw)
            self.dropped = 0

    def finish(self, text: str) -> ParsedMessage:
        self.flush()
        return ParsedMessage(self.calls, self.failures, text.strip(), self.positions)
