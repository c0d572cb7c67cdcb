"""Strict YAML for the toolkit's own files (campaigns, environment configs).

:func:`load_strict` reads one YAML document with PyYAML's safe loader and refuses, with the file and
line, what a hand-written config never needs and a hostile or mistyped one uses:

- a key repeated in one mapping (plain YAML keeps the last value silently);
- a key that is not text (``1: x``, ``null: x``, ``[a]: x``);
- aliases that expand to more than ``max_nodes`` nodes (an "alias bomb": a 1.4 KB file of nine
  levels of nine aliases stands for 9**9 nodes; the expanded size of every node is counted while
  the document is composed, so the refusal comes after reading the file once, in milliseconds);
- nesting deeper than ``max_depth`` (PyYAML composes recursively and would end in a RecursionError);
- files larger than ``max_bytes`` or not UTF-8.

The document's node tree is kept, so errors found later (a wrong type under ``env.max_turns``) can be
located with :meth:`YamlDocument.line_of` or :meth:`YamlDocument.where`, following the key path
(never the whole tree: aliases make that exponential).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from hydroagent_hpc.errors import ConfigError, HydroAgentError

__all__ = ["YamlDocument", "load_strict", "path_of", "brief", "MAX_NODES", "MAX_DEPTH", "MAX_BYTES"]

MAX_NODES = 100_000  # nodes after aliases are expanded (a 1,000-basin campaign is about 2,000)
MAX_DEPTH = 32  # nested collections (campaign files use 4)
MAX_BYTES = 8 * 1024 * 1024
_MERGE = "tag:yaml.org,2002:merge"


def brief(value: Any, limit: int = 60) -> str:
    """``repr(value)`` cut to ``limit`` characters (messages never print a whole hostile value)."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that counts expanded nodes and depth while composing and checks keys while constructing."""

    def __init__(self, stream: str, source: str, error: type[HydroAgentError], max_nodes: int, max_depth: int,
                 text_keys: bool) -> None:
        super().__init__(stream)
        self._source, self._error, self._text_keys = source, error, text_keys
        self._max_nodes, self._max_depth = max_nodes, max_depth
        self._depth = 0
        self._size: dict[int, int] = {}  # id(node) -> nodes it stands for with aliases expanded

    def _fail(self, mark: Any, message: str, fix: str = "") -> HydroAgentError:
        return self._error(f"{self._source}:{mark.line + 1}: {message}", fix)

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):  # the anchored node, already composed and counted
            return super().compose_node(parent, index)
        event = self.peek_event()  # type: ignore[no-untyped-call]  # unannotated in types-PyYAML's Parser
        self._depth += 1
        if self._depth > self._max_depth:
            raise self._fail(event.start_mark, f"nested more than {self._max_depth} levels deep",
                             "write the value flat; configuration files need a few levels at most")
        try:
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if node is None:  # Optional only in the stubs: PyYAML composes a node for every event it reaches here
            return None
        if isinstance(node, yaml.SequenceNode):
            size = 1 + sum(self._size.get(id(c), 1) for c in node.value)
        elif isinstance(node, yaml.MappingNode):
            size = 1 + sum(self._size.get(id(k), 1) + self._size.get(id(v), 1) for k, v in node.value)
        else:
            size = 1
        if size > self._max_nodes:
            raise self._fail(node.start_mark, f"this value expands to {size:,} nodes through aliases (*name), more "
                                              f"than the {self._max_nodes:,} a configuration file may hold",
                             "write the values out, or use fewer aliases")
        self._size[id(node)] = size
        return node

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == _MERGE:
                    continue
                line = key_node.start_mark.line + 1
                key = self.construct_object(key_node, deep=True)
                if self._text_keys and not isinstance(key, str):
                    shown = key_node.value if isinstance(key_node, yaml.ScalarNode) else brief(key)
                    raise self._fail(key_node.start_mark, f"{shown}: keys must be text, not {type(key).__name__}",
                                     "spell the key as a name (quote it if it looks like a number)")
                try:
                    first = seen.get(key)
                except TypeError:  # an unhashable key: PyYAML's own error says so below
                    continue
                if first is not None:
                    raise self._fail(key_node.start_mark, f"{key}: duplicate key (first given on line {first})",
                                     f"keep one '{key}:' in this mapping")
                seen[key] = line
        return super().construct_mapping(node, deep=deep)


_PATH = re.compile(r"^\s*([A-Za-z_][\w-]*(?:\[\d+\]|\.[A-Za-z_][\w-]*)*)\s*(?:[:=]|$)")


def path_of(message: str) -> tuple[str | int, ...]:
    """The key path a message starts with: ``"env.rewards.delta_clip[0]: ..."`` -> ``("env", "rewards",
    "delta_clip", 0)``; ``()`` when it starts with none."""
    m = _PATH.match(message)
    if not m:
        return ()
    out: list[str | int] = []
    for part in re.findall(r"\[(\d+)\]|([A-Za-z_][\w-]*)", m.group(1)):
        out.append(int(part[0]) if part[0] else part[1])
    return tuple(out)


@dataclass(frozen=True)
class YamlDocument:
    """One strictly read YAML document: its data, its node tree (for lines) and its file."""

    data: Any
    root: Any
    source: str

    def line_of(self, path: Sequence[str | int]) -> int | None:
        """The 1-based line of the deepest element of ``path`` found (a key's line; an item's line)."""
        node, line = self.root, None
        for part in path:
            if isinstance(node, yaml.MappingNode):
                for k, v in node.value:
                    if isinstance(k, yaml.ScalarNode) and k.value == str(part):
                        node, line = v, k.start_mark.line + 1
                        break
                else:
                    break
            elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
                node = node.value[part]
                line = node.start_mark.line + 1
            else:
                break
        return line

    def where(self, path: Sequence[str | int]) -> str:
        """``"file:line"`` of ``path`` (``"file"`` when no line is known)."""
        line = self.line_of(path)
        return f"{self.source}:{line}" if line else self.source


def load_strict(path: str | Path, *, error: type[HydroAgentError] = ConfigError, what: str = "file",
                max_nodes: int = MAX_NODES, max_depth: int = MAX_DEPTH, max_bytes: int = MAX_BYTES,
                text_keys: bool = True) -> YamlDocument:
    """Read ``path`` strictly (see the module docstring); every problem is an ``error`` naming file:line."""
    p = Path(path)
    source = str(p)
    try:
        size = p.stat().st_size
        if size > max_bytes:
            raise error(f"{source}: {size:,} bytes; a {what} may be at most {max_bytes:,} bytes")
        raw = p.read_bytes()
    except FileNotFoundError:
        raise error(f"{what} not found: {source}", "check the path") from None
    except IsADirectoryError:
        raise error(f"{source}: is a folder, not a {what}") from None
    except OSError as exc:
        raise error(f"{source}: cannot read the {what}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise error(f"{source}:{line}: not UTF-8 text", "save the file as UTF-8") from None
    loader = _StrictLoader(text, source, error, max_nodes, max_depth, text_keys)
    try:
        root = loader.get_single_node()
        data = loader.construct_document(root) if root is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        at = f"{source}:{mark.line + 1}" if mark is not None else source
        problem = " ".join(str(x) for x in (exc.context, exc.problem) if x)
        raise error(f"{at}: not valid YAML: {problem}") from None
    except yaml.YAMLError as exc:
        raise error(f"{source}: not valid YAML: {exc}") from None
    finally:
        loader.dispose()
    return YamlDocument(data, root, source)
