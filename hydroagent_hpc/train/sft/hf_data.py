"""SFT examples as a conversational JSON Lines data set (the Hugging Face ``datasets`` / TRL format).

The format layer of ``hydroagent train sft-data ... --export-hf DIR`` and ``hydroagent train
sft-import``; :mod:`hydroagent_hpc.train.sft.data` builds and tokenises, this module only converts
and checks records. One record per line of ``DIR/train.jsonl``:

- ``messages``: ``{"role", "content"}`` dicts (``system``, ``user``, ``assistant``, ``tool``). An
  assistant message whose text is prose followed by Hermes ``<tool_call>`` blocks, exactly as the
  chat template writes OpenAI-style calls, becomes ``content`` (the prose) plus ``tool_calls``:
  ``[{"type": "function", "function": {"name": ..., "arguments": "<JSON text>"}}]``, the arguments
  as the JSON text the model wrote (the OpenAI shape; a string, so the template writes it back
  character for character). A message the template would not give back identically (a corrupted
  error-recovery call, prose after a block, other spacing) keeps its text in ``content``: the
  conversion never changes a token (:func:`to_record` checks it with the template).
- ``tools``: the tool schemas the chat template receives, as one JSON text (TRL's ``SFTTrainer``
  decodes a string ``tools`` column; a list of schemas would be merged into one Arrow struct type
  by ``datasets``, which adds every other tool's keys as nulls).
- ``train_mask``: per message, true where the model learns the message (assistant messages, except
  error-recovery corruptions, which are context only).
- ``weight`` (the example's weight), ``episode_id`` (its source episode), ``best_nse`` (the
  episode's final best NSE, null when it never scored one), ``variant`` / ``n_variants``
  (stopping-point variant), ``basin_id``, ``agent``.

:func:`read_records` reads such a file (or every ``*.jsonl`` file of a folder, by name) strictly:
each problem is one :class:`HFDataError` line naming the file, the line and the field. Only
``messages`` is required; ``tools`` defaults to none, ``train_mask`` to every assistant message,
``weight`` to 1, ``episode_id`` to ``FILE:LINE``. ``tool_calls`` arguments may also be JSON
objects (other data sets write them so); a ``tool_calls`` of null (``datasets`` adds it to every
message) is ignored.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydroagent_hpc.env.toolcalls import CLOSE_TAG, OPEN_TAG
from hydroagent_hpc.errors import HydroAgentError

__all__ = ["HFDataError", "DATA_FILE", "CARD_FILE", "COLUMNS", "ROLES", "Record", "split_calls", "to_record",
           "record_line", "parse_record", "read_records", "builder_messages", "write_text_atomic"]

#: The records' file inside an export folder, and its dataset card.
DATA_FILE = "train.jsonl"
CARD_FILE = "README.md"
ROLES = ("system", "user", "assistant", "tool")
#: Every column of an exported record, with what it holds (the dataset card lists them).
COLUMNS = {
    "messages": "the conversation: role/content; assistant calls as tool_calls (function.name, function.arguments "
                "as JSON text); tool results as role tool",
    "tools": "the tool schemas the chat template receives (JSON text of a list)",
    "train_mask": "per message: true where the model learns it (assistant messages except error-recovery "
                  "corruptions)",
    "weight": "the example's training weight (per-token loss weight)",
    "episode_id": "the campaign episode the example comes from",
    "best_nse": "the episode's final best NSE (null: never scored)",
    "variant": "0-based stopping-point variant of the episode",
    "n_variants": "the episode's number of variants (its weight is split among them)",
    "basin_id": "the episode's basin",
    "agent": "the teacher agent",
}
_FIX = "write one JSON object per line with messages (and optionally tools, train_mask, weight, episode_id)"


class HFDataError(HydroAgentError, ValueError):
    """A conversational record that cannot be read (the message names the file, the line and the field)."""


@dataclass
class Record:
    """One checked record: builder messages (assistant ``"train": False`` where the mask says so; tool
    calls as the chat template takes them), tool schemas and the example's columns."""

    where: str  # FILE:LINE
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    weight: float = 1.0
    episode_id: str = ""
    best_nse: float | None = None
    variant: int = 0
    n_variants: int = 1
    basin_id: str = ""
    agent: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------- export


def _no_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    keys = [k for k, _ in pairs]
    if len(set(keys)) != len(keys):
        raise ValueError("a key is repeated")
    return dict(pairs)


def _object_text(text: str) -> bool:
    """Whether ``text`` is the JSON text of one object, no key repeated at any depth."""
    try:
        return isinstance(json.loads(text, object_pairs_hook=_no_repeats), dict)
    except ValueError:
        return False


def split_calls(text: str) -> tuple[str, list[dict[str, Any]]] | None:
    """``(prose, tool_calls)`` of an assistant text written as prose, then (after one newline when
    there is prose) ``<tool_call>`` blocks separated by single newlines, each
    ``<tool_call>\\n{"name": "N", "arguments": {...}}\\n</tool_call>`` (the arguments kept as their
    JSON text); None when the text has no block or is not written that way."""
    start = text.find(OPEN_TAG)
    if start < 0:
        return None
    prose = text[:start]
    if prose:
        if not prose.endswith("\n"):
            return None
        prose = prose[:-1]
    calls: list[dict[str, Any]] = []
    pos = start
    opening, closing = OPEN_TAG + "\n", "\n" + CLOSE_TAG
    while True:
        if not text.startswith(opening, pos):
            return None
        end = text.find(closing, pos)
        if end < 0:
            return None
        body = text[pos + len(opening):end]
        try:
            parsed = json.loads(body, object_pairs_hook=_no_repeats)
        except ValueError:
            return None
        if not isinstance(parsed, dict) or list(parsed) != ["name", "arguments"] or not isinstance(
                parsed["name"], str) or not isinstance(parsed["arguments"], dict):
            return None
        head = '{"name": "' + parsed["name"] + '", "arguments": '
        if not body.startswith(head) or not body.endswith("}") or not _object_text(body[len(head):-1]):
            return None
        calls.append({"type": "function",
                      "function": {"name": parsed["name"], "arguments": body[len(head):-1]}})
        pos = end + len(closing)
        if pos == len(text):
            return prose, calls
        if not text.startswith("\n" + OPEN_TAG, pos):
            return None
        pos += 1


def to_record(messages: Sequence[Mapping[str, Any]], tools: Sequence[Mapping[str, Any]] | None,
              render: Callable[[list[dict[str, Any]]], str], **columns: Any) -> dict[str, Any]:
    """The exported record of builder ``messages`` (``"train": False`` on masked assistant messages).

    ``render(messages)`` is the chat template's text of a conversation; an assistant message becomes
    content + ``tool_calls`` only when ``render`` writes the two forms identically (after a neutral
    user turn), so the record tokenises as the original did. ``columns``: the example's other columns.
    """
    out: list[dict[str, Any]] = []
    mask: list[bool] = []
    for m in messages:
        role, content = m.get("role"), m.get("content")
        mask.append(role == "assistant" and m.get("train", True) is not False)
        msg: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant" and isinstance(content, str):
            split = split_calls(content)
            if split is not None:
                structured = {"role": "assistant", "content": split[0], "tool_calls": split[1]}
                probe = {"role": "user", "content": "."}
                if render([probe, structured]) == render([probe, {"role": "assistant", "content": content}]):
                    msg = structured
        out.append(msg)
    return {"messages": out, "tools": json.dumps(list(tools) if tools is not None else None, ensure_ascii=False),
            "train_mask": mask, **columns}


def record_line(record: Mapping[str, Any]) -> str:
    """One JSON Lines line (no NaN: a missing number is null)."""
    return json.dumps(record, ensure_ascii=False, allow_nan=False) + "\n"


def write_text_atomic(path: Path, text: str | Iterator[str]) -> None:
    """``path`` written through a temporary file beside it, made durable and renamed into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            for part in ([text] if isinstance(text, str) else text):
                fh.write(part)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


# --------------------------------------------------------------------------------------------- import


def _files(src: Path) -> list[Path]:
    if src.is_dir():
        files = sorted(p for p in src.glob("*.jsonl") if p.is_file())
        if not files:
            raise HFDataError(f"{src}: no *.jsonl file in the folder", fix="pass a folder written by --export-hf, "
                                                                          "or the JSON Lines file itself")
        return files
    if not src.is_file():
        raise HFDataError(f"{src}: no such file or folder", fix="pass a .jsonl file or a folder of them")
    return [src]


def _fail(where: str, what: str, fix: str = _FIX) -> HFDataError:
    return HFDataError(f"{where}: {what}", fix=fix)


def _tool_call(where: str, j: int, k: int, call: Any) -> dict[str, Any]:
    at = f"messages[{j}].tool_calls[{k}]"
    if not isinstance(call, dict):
        raise _fail(where, f"{at}: must be an object, got {type(call).__name__}")
    fn = call.get("function")
    if not isinstance(fn, dict):
        raise _fail(where, f"{at}.function: must be an object with name and arguments",
                    'write {"type": "function", "function": {"name": ..., "arguments": ...}}')
    name, args = fn.get("name"), fn.get("arguments")
    if not isinstance(name, str) or not name:
        raise _fail(where, f"{at}.function.name: must be a non-empty string, got {name!r}")
    if isinstance(args, str):
        try:
            decoded = json.loads(args)
        except ValueError as exc:
            raise _fail(where, f"{at}.function.arguments: not JSON ({exc})",
                        "write the arguments as a JSON object or its JSON text") from None
        if not isinstance(decoded, dict):
            raise _fail(where, f"{at}.function.arguments: the JSON text is a {type(decoded).__name__}, not an object")
    elif not isinstance(args, dict):
        raise _fail(where, f"{at}.function.arguments: must be a JSON object or its JSON text, got "
                           f"{type(args).__name__}")
    return {"type": "function", "function": {"name": name, "arguments": args}}


def _messages(where: str, raw: Any, mask: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list) or not raw:
        raise _fail(where, "messages: must be a non-empty list of {role, content} objects")
    if mask is not None and (not isinstance(mask, list) or len(mask) != len(raw)
                             or not all(isinstance(v, bool) or v in (0, 1) for v in mask)):
        raise _fail(where, f"train_mask: must be a list of {len(raw)} booleans (one per message)",
                    "drop train_mask (every assistant message is learned) or give one true/false per message")
    out: list[dict[str, Any]] = []
    for j, m in enumerate(raw):
        if not isinstance(m, dict):
            raise _fail(where, f"messages[{j}]: must be an object, got {type(m).__name__}")
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise _fail(where, f"messages[{j}].role: {role!r} is not one of {', '.join(ROLES)}")
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            raise _fail(where, f"messages[{j}].tool_calls: only assistant messages make tool calls ({role})")
        if calls is not None and not isinstance(calls, list):
            raise _fail(where, f"messages[{j}].tool_calls: must be a list, got {type(calls).__name__}")
        if content is None and calls:
            content = ""
        if not isinstance(content, str):
            raise _fail(where, f"messages[{j}].content: must be a string, got {type(content).__name__}")
        unknown = sorted(set(m) - {"role", "content", "tool_calls"})
        if unknown:
            raise _fail(where, f"messages[{j}]: unknown field {unknown[0]!r}",
                        "keep role, content and (assistant) tool_calls; per-message masks go in train_mask")
        msg: dict[str, Any] = {"role": role, "content": content}
        if calls:
            msg["tool_calls"] = [_tool_call(where, j, k, c) for k, c in enumerate(calls)]
        if mask is not None:
            if bool(mask[j]) and role != "assistant":
                raise _fail(where, f"train_mask[{j}]: true on a {role} message; only assistant messages are learned")
            if role == "assistant" and not bool(mask[j]):
                msg["train"] = False
        out.append(msg)
    if not any(m["role"] == "assistant" for m in out):
        raise _fail(where, "messages: no assistant message, nothing to learn")
    return out


def _tools(where: str, raw: Any) -> list[dict[str, Any]] | None:
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError as exc:
            raise _fail(where, f"tools: not JSON text ({exc})", "write tools as a list of schemas or its JSON text"
                        ) from None
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(isinstance(t, dict) for t in raw):
        raise _fail(where, "tools: must be a list of JSON schema objects (or its JSON text)")
    return raw


def _number(where: str, name: str, raw: Any, *, whole: bool = False, minimum: float | None = None) -> Any:
    ok = isinstance(raw, (int, float)) and not isinstance(raw, bool) and math.isfinite(raw)
    if ok and whole:
        ok = float(raw).is_integer()
    if not ok or (minimum is not None and raw < minimum):
        kind = "a whole number" if whole else "a finite number"
        limit = f" >= {minimum:g}" if minimum is not None else ""
        raise _fail(where, f"{name}: must be {kind}{limit}, got {raw!r}")
    return int(raw) if whole else float(raw)


def parse_record(where: str, data: Any) -> Record:
    """One checked record of the decoded JSON object ``data`` found at ``where`` (FILE:LINE)."""
    if not isinstance(data, dict):
        raise _fail(where, f"the line is a JSON {type(data).__name__}, not an object")
    unknown = sorted(set(data) - set(COLUMNS))
    if unknown:
        raise _fail(where, f"unknown field {unknown[0]!r}", f"the fields are {', '.join(COLUMNS)}")
    rec = Record(where, _messages(where, data.get("messages"), data.get("train_mask")),
                 _tools(where, data.get("tools")))
    if data.get("weight") is not None:
        rec.weight = _number(where, "weight", data["weight"], minimum=0.0)
    rec.best_nse = None if data.get("best_nse") is None else _number(where, "best_nse", data["best_nse"])
    for name in ("variant", "n_variants"):
        if data.get(name) is not None:
            setattr(rec, name, _number(where, name, data[name], whole=True, minimum=0 if name == "variant" else 1))
    for name in ("episode_id", "basin_id", "agent"):
        value = data.get(name)
        if value is not None and not isinstance(value, str):
            raise _fail(where, f"{name}: must be a string, got {type(value).__name__}")
        setattr(rec, name, value or "")
    rec.episode_id = rec.episode_id or where
    return rec


def read_records(src: str | os.PathLike[str]) -> list[Record]:
    """Every record of a JSON Lines file, or of each ``*.jsonl`` file of a folder (files by name, lines
    in order; blank lines skipped), checked; :class:`HFDataError` names the first bad file, line, field."""
    records: list[Record] = []
    for path in _files(Path(src)):
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise HFDataError(f"{path}: cannot be read ({exc})", fix="pass a UTF-8 JSON Lines file") from None
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                data = json.loads(line)
            except ValueError as exc:
                raise _fail(where, f"not JSON ({exc})", "write one JSON object per line") from None
            records.append(parse_record(where, data))
    if not records:
        raise HFDataError(f"{src}: holds no record", fix=_FIX)
    return records


def builder_messages(record: Record) -> list[dict[str, Any]]:
    """The record's messages as :class:`~hydroagent_hpc.agents.llm.trajectory.TrajectoryBuilder` takes them."""
    return [dict(m) for m in record.messages]
