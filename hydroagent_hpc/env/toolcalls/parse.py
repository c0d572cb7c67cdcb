"""Hermes parsing: the ``<tool_call>`` blocks of one assistant message, read strictly.

A block must hold exactly one JSON object with ``name`` and ``arguments``; anything else is a
:class:`~.message.ParseFailure` with a reason code and a fix, never a repaired call (the reference
parser turned broken JSON into ``{}`` calls; see docs/reference-implementation.md, section 4).
"""

from __future__ import annotations

import re

from hydroagent_hpc.env.toolcalls.message import OPEN_TAG, Builder, ParsedMessage, ParseFailure, call_from_object
from hydroagent_hpc.env.toolcalls.strictjson import RAW_CHARS, Rejected, strict_loads

__all__ = ["MAX_MESSAGE_CHARS", "LONE_SURROGATE", "parse_message"]

MAX_MESSAGE_CHARS = 200_000
_TAG_RE = re.compile(r"<tool_call>|</tool_call>")
#: A code point that UTF-8 cannot encode: half of a UTF-16 surrogate pair, alone in a Python str
#: (a JSON body can carry one as an escape such as ``\\ud800``).
LONE_SURROGATE = re.compile("[\ud800-\udfff]")


def parse_message(text: str, max_calls: int = 10, max_chars: int = MAX_MESSAGE_CHARS) -> ParsedMessage:
    """Parse the Hermes ``<tool_call>`` blocks of one assistant message. Never raises.

    Only the first ``max_chars`` characters are scanned (a longer message adds a
    "message_too_long" failure at the end). At most ``max_calls`` blocks become items; further
    blocks make one "too_many_calls" failure. A message without any block is one "no_tool_call".
    A message holding a lone surrogate (:data:`LONE_SURROGATE`) is not text: it is one
    "invalid_text" failure and none of its calls runs.
    """
    if not isinstance(text, str):
        return ParsedMessage([], [ParseFailure("no_tool_call", f"the message is not text ({type(text).__name__})")])
    bad = LONE_SURROGATE.search(text)
    if bad is not None:
        return ParsedMessage([], [ParseFailure(
            "invalid_text", f"the message is not valid Unicode: an unpaired surrogate U+{ord(bad.group()):04X} at "
                            f"character {bad.start()}; nothing in it was run. Send plain UTF-8 text and repeat the "
                            "tool calls")])
    too_long = len(text) > max_chars
    scan = text[:max_chars] if too_long else text
    b = Builder(max_calls)
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
                    b.call(call_from_object(strict_loads(body.strip())))
                except Rejected as exc:
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


def _item(b: Builder, reason: str, raw: str, detail: str) -> None:
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
