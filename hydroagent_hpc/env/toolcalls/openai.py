"""OpenAI function calling: ``message.tool_calls`` in, :class:`~.message.ParsedMessage` out, and back.

Absolute imports throughout, so this module's name never shadows the ``openai`` client package.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from typing import Any

from hydroagent_hpc.env.toolcalls.message import Builder, ParsedMessage, call_from_object
from hydroagent_hpc.env.toolcalls.strictjson import Rejected, show, strict_loads, truncate
from hydroagent_hpc.types import ToolCall

__all__ = ["from_openai_tool_calls", "to_openai_tool_call"]


def _get(obj: Any, key: str) -> Any:
    if isinstance(obj, Mapping):
        return obj.get(key)
    return getattr(obj, key, None)


def from_openai_tool_calls(tool_calls: Iterable[Any] | None, max_calls: int = 10,
                           content: str | None = None) -> ParsedMessage:
    """Parse an OpenAI ``message.tool_calls`` list (client objects or dicts). Never raises.

    Each item needs ``type`` "function" (when present) and ``function.name``/``function.arguments``;
    ``arguments`` is a JSON string holding an object (a dict is accepted too). An empty or
    whitespace-only string counts as ``{}``: some servers send it for functions without
    arguments; it is unambiguous, not a repair. ``content`` becomes the message text.
    """
    b = Builder(max_calls)
    for item in list(tool_calls or []):
        if b.full():
            b.drop(truncate(repr(item)))
            continue
        try:
            b.call(_openai_call(item))
        except Rejected as exc:
            b.fail(exc.reason, exc.detail, truncate(repr(item)))
        except Exception as exc:  # an exotic object; still never raise
            b.fail("malformed_call", f"unreadable tool call ({type(exc).__name__})", truncate(repr(item)))
    if b.n == 0 and not b.dropped:
        b.fail("no_tool_call", "the message has no tool calls; every reply must call at least one tool")
    return b.finish(content or "")


def _openai_call(item: Any) -> ToolCall:
    typ = _get(item, "type")
    if typ is not None and typ != "function":
        raise Rejected("malformed_call", f'tool call type must be "function", got {show(str(typ))}')
    fn = _get(item, "function")
    if fn is None:
        raise Rejected("malformed_call", 'the tool call has no "function"')
    name, args = _get(fn, "name"), _get(fn, "arguments")
    call_id = _get(item, "id")
    call_id = str(call_id) if call_id is not None else None
    if isinstance(args, str) and not args.strip():
        args = {}
    elif isinstance(args, str):
        try:
            args = strict_loads(args, "the arguments")
        except Rejected as exc:
            raise Rejected("bad_arguments", exc.detail) from None
    elif isinstance(args, Mapping):
        args = dict(args)
        if not _finite_tree(args):
            raise Rejected("bad_arguments", "arguments contain a non-finite number; use finite numbers")
    elif args is not None:
        raise Rejected("bad_arguments", "function.arguments must be a JSON string holding an object")
    obj = {"name": name} if name is not None else {}
    if args is not None:
        obj["arguments"] = args
    return call_from_object(obj, call_id)


def _finite_tree(v: Any) -> bool:
    if isinstance(v, float):
        return math.isfinite(v)
    if isinstance(v, Mapping):
        return all(_finite_tree(x) for x in v.values())
    if isinstance(v, (list, tuple)):
        return all(_finite_tree(x) for x in v)
    return True


def to_openai_tool_call(call: ToolCall, index: int = 0) -> dict[str, Any]:
    """``{"id", "type": "function", "function": {"name", "arguments": JSON string}}``.

    The id is ``call.call_id`` or ``call_<index>``.
    """
    return {"id": call.call_id or f"call_{index}", "type": "function",
            "function": {"name": call.name,
                         "arguments": json.dumps(dict(call.arguments), ensure_ascii=False, allow_nan=False)}}
