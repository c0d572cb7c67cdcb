"""Rendering: calls as Hermes blocks, observations as JSON, and the examples and hints built from them.

Observations render non-finite floats as ``null`` (JSON has no NaN).
"""

from __future__ import annotations

import json
import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

from hydroagent_hpc.env.toolcalls.message import CLOSE_TAG, OPEN_TAG, ParseFailure
from hydroagent_hpc.types import ToolCall

__all__ = ["render_hermes", "render_tool_response", "format_example", "retry_hint"]


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


def render_tool_response(observation: Mapping[str, Any], digits: int | None = None, sort_keys: bool = False) -> str:
    """An observation as compact JSON (always valid JSON).

    Key order is the mapping's insertion order (deterministic: the environment builds each
    observation in a fixed order; ``sort_keys=True`` sorts). Non-finite floats (NaN, +-inf)
    become ``null``, meaning "not available"; numpy values become plain numbers and lists;
    anything else unknown becomes its string. ``digits`` rounds floats.
    """
    return json.dumps(_jsonable(observation, digits), separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False, sort_keys=sort_keys)


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
