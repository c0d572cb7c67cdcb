"""Which sampled tokens carry the agent's decisions: the arguments of its tool calls (``pg_tokens: arguments``).

An assistant turn of the calibration protocol is a sentence of prose, then one tool call::

    NSE 0.849 is the best so far. ... (alpha0).
    <tool_call>
    {"name": "set_parameters", "arguments": {"alpha0": 0.911}}
    </tool_call>

After SFT the prose and the call's syntax are copied almost deterministically, and most of what a
sampled group varies in is the syntax (a brace, a quote: a parse failure) while the moves, the
parameters and values inside ``"arguments"``, are where the NSE differences come from
(docs/learning.md). With ``pg_tokens: arguments`` the policy-gradient term of the GRPO loss is taken
on the tokens of the arguments only, from the end of the ``"arguments":`` key to the closing
``</tool_call>``; every sampled token still carries the KL and entropy terms, so the prose and the
syntax are held to the reference while the moves are ranked. The loss's normaliser (the step's
sampled tokens) is unchanged: the gradient of the arguments' tokens is the one ``pg_tokens: all``
gives them.

A token is an argument token when its decoded text overlaps the arguments' characters. The text of
a span is the concatenation of its tokens' decoded pieces (:class:`PieceTable`); byte-level pieces
of a multi-byte character decode to replacement characters of another length, which only shifts
offsets after them inside that span (the markers are ASCII).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["PG_TOKENS", "OPEN", "CLOSE", "ARGUMENTS_KEY", "PieceTable", "argument_mask"]

#: Which sampled tokens carry the policy gradient: every sampled token (the paper's) or the tool calls'
#: arguments (ours; module docstring).
PG_TOKENS = ("all", "arguments")
OPEN, CLOSE, ARGUMENTS_KEY = "<tool_call>", "</tool_call>", '"arguments":'


class PieceTable:
    """The decoded text of single token ids, decoded once each (``tokenizer.decode([id])``, special tokens
    kept: ``<tool_call>`` is one)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._pieces: dict[int, str] = {}

    def __call__(self, ids: Sequence[int]) -> list[str]:
        out = []
        for i in ids:
            piece = self._pieces.get(i)
            if piece is None:
                piece = self._pieces[i] = self._tokenizer.decode([i], skip_special_tokens=False)
            out.append(piece)
        return out


def _argument_ranges(text: str) -> list[tuple[int, int]]:
    """Character ranges ``[a, b)`` of ``text`` holding a tool call's arguments: after each ``"arguments":``
    inside ``<tool_call>`` ... ``</tool_call>`` (or the text's end, for a call cut short) up to the close."""
    ranges = []
    at = 0
    while (open_at := text.find(OPEN, at)) >= 0:
        close_at = text.find(CLOSE, open_at + len(OPEN))
        end = close_at if close_at >= 0 else len(text)
        key = text.find(ARGUMENTS_KEY, open_at + len(OPEN), end)
        if key >= 0 and key + len(ARGUMENTS_KEY) < end:
            ranges.append((key + len(ARGUMENTS_KEY), end))
        if close_at < 0:
            break
        at = close_at + len(CLOSE)
    return ranges


def argument_mask(pieces: Sequence[str], spans: Sequence[tuple[int, int]]) -> np.ndarray:
    """A 0/1 float32 array over the tokens: 1 where a token of an assistant span overlaps its tool call's
    arguments (module docstring); 0 elsewhere (prompt, tool results, prose, the call's name and syntax).

    ``pieces[t]`` is token ``t``'s decoded text; ``spans`` the assistant turns' half-open token spans.
    A turn without a tool call, or whose call has no ``"arguments":`` key, has no argument token.
    """
    out = np.zeros(len(pieces), dtype=np.float32)
    for start, end in spans:
        ends = np.cumsum([len(p) for p in pieces[start:end]])
        starts = ends - np.asarray([len(p) for p in pieces[start:end]], dtype=ends.dtype)
        for a, b in _argument_ranges("".join(pieces[start:end])):
            out[start:end][(starts < b) & (ends > a)] = 1.0
    return out
