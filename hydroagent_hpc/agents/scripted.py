"""A scripted policy: replays a fixed list of assistant messages or tool calls.

Used to test the environment end to end and to replay recorded episodes. A script file is JSON:
a list whose items are either assistant message strings (sent as they are, malformed or not)
or tool-call objects ``{"name": ..., "arguments": {...}}`` (rendered in the Hermes format).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.types import ToolCall

__all__ = ["ScriptedPolicy", "load_script"]


class ScriptedPolicy:
    """Replays ``items`` one per turn; stops when they run out."""

    def __init__(self, items: Sequence[Any], name: str = "scripted") -> None:
        self.name = name
        self._messages = [self._render(i, x) for i, x in enumerate(items)]
        self._next = 0

    @staticmethod
    def _render(index: int, item: Any) -> str:
        if isinstance(item, str):
            return item
        if isinstance(item, ToolCall):
            return render_hermes(item)
        if isinstance(item, dict) and "name" in item:
            return render_hermes(ToolCall(str(item["name"]), dict(item.get("arguments") or {})))
        if isinstance(item, list):
            return "\n".join(ScriptedPolicy._render(index, x) for x in item)
        raise ValueError(f"script item {index}: expected a message string, a tool call object or a list of them, "
                         f"got {type(item).__name__}")

    def act(self, messages: list[dict[str, str]]) -> str | None:
        if self._next >= len(self._messages):
            return None
        text = self._messages[self._next]
        self._next += 1
        return text


def load_script(path: str | Path) -> list[Any]:
    """Read a script file (a JSON list), with a clear error for anything else."""
    p = Path(path)
    try:
        data = json.loads(p.read_text())
    except FileNotFoundError:
        raise ValueError(f"script file not found: {p}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"{p}:{exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(data, list):
        raise ValueError(f"{p}: a script is a JSON list of messages or tool calls")
    return data
