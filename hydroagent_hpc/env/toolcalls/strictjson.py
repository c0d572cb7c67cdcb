"""Strict JSON for untrusted model output: no NaN/Infinity, no overflow, no duplicate keys, bounded depth.

Package-internal helpers shared by the Hermes and the OpenAI parsers: :class:`Rejected` carries a
parse-failure reason code and a detail that says what is wrong and how to fix it.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

__all__ = ["MAX_DEPTH", "RAW_CHARS", "Rejected", "truncate", "show", "strict_loads", "json_tip", "json_type"]

MAX_DEPTH = 32  # nesting allowed inside one call object
RAW_CHARS = 200


class Rejected(ValueError):
    """Untrusted input refused: ``reason`` is a parse or validation code, ``detail`` the fix."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(detail)
        self.reason, self.detail = reason, detail


def truncate(s: str, n: int = RAW_CHARS) -> str:
    """``s`` cut to ``n`` characters, with "..." when it was longer."""
    return s if len(s) <= n else s[:n] + "..."


def show(s: str, n: int = 40) -> str:
    """An untrusted string quoted for a message: shortened, JSON-escaped, plain ASCII."""
    return json.dumps(truncate(s, n))


def _no_constant(name: str) -> float:
    raise Rejected("malformed_json", f"{name} is not a JSON number; use a finite number such as 1.0")


def _finite_float(s: str) -> float:
    v = float(s)
    if not math.isfinite(v):
        raise Rejected("malformed_json", f"number {truncate(s, 40)} overflows; use a finite number")
    return v


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise Rejected("malformed_json", f"duplicate key {show(k)}; give each key once")
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


def strict_loads(s: str, what: str = "the tool call") -> Any:
    """Strict JSON: no NaN/Infinity, no overflowing numbers, no duplicate keys, bounded depth."""
    try:
        value = json.loads(s, parse_constant=_no_constant, parse_float=_finite_float,
                           object_pairs_hook=_no_duplicates)
    except Rejected:
        raise
    except RecursionError:
        raise Rejected("malformed_json", f"{what} is nested too deeply") from None
    except ValueError as exc:  # JSONDecodeError, and int() beyond Python's digit limit
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "number too long"
        where = f" at line {exc.lineno} column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise Rejected("malformed_json", f"{what} is not valid JSON{where}: {msg}. {json_tip(s)}") from None
    if not _depth_ok(value):
        raise Rejected("malformed_json", f"{what} is nested deeper than {MAX_DEPTH} levels")
    return value


def json_tip(s: str) -> str:
    """The most likely fix for a block that is not JSON (fences, Python-style call, single quotes)."""
    t = s.strip()
    if t.startswith("```"):
        return "Put the bare JSON object inside the tags, without Markdown fences."
    if re.match(r"^[A-Za-z_]\w*\s*\(", t):
        return 'Write a JSON object {"name": ..., "arguments": {...}}, not a Python-style call.'
    if "'" in t and '"' not in t:
        return "Use double quotes for keys and strings."
    return 'Write exactly one JSON object {"name": ..., "arguments": {...}} per block.'


def json_type(v: Any) -> str:
    """The JSON name of a decoded value's type, for messages ("null", "number", "array", ...)."""
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
