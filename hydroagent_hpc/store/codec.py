"""Bytes of the store: columns to packed records and UTF-8 text, JSON, metric values, CRC-32.

Column-wise throughout: a table is encoded from ``{column: sequence}`` and decoded to
``{column: array or list}``, so readers never loop over HDF5 objects, only over decoded strings.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydroagent_hpc.store.schema import Table

__all__ = ["to_json", "from_json", "encode_rows", "Decoded", "decode_rows", "row_checksums", "seal",
           "text_bounds_ok", "MetricKind", "encode_metric", "decode_metric", "ENCODING"]

#: Text encoding of every string; ``surrogatepass`` keeps any Python str (even lone surrogates).
ENCODING = ("utf-8", "surrogatepass")


def _json_default(obj: object) -> object:
    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Mapping):
        return dict(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON-serialisable")


def to_json(value: object, what: str) -> str:
    """JSON text of ``value`` (NaN allowed, numpy scalars and arrays as numbers and lists)."""
    try:
        return json.dumps(value, ensure_ascii=False, allow_nan=True, default=_json_default,
                          separators=(",", ":"))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{what}: cannot store as JSON ({exc}); use str, numbers, bools, None, "
                        f"lists and str-keyed mappings") from None


def from_json(text: str | None) -> Any:
    """Inverse of :func:`to_json`; ``None`` stays ``None``."""
    return None if text is None else json.loads(text)


def encode_rows(table: Table, columns: Mapping[str, Sequence[Any] | np.ndarray], n: int,
                text_base: int) -> tuple[np.ndarray, bytes]:
    """Pack ``n`` rows of ``table`` from per-column sequences; strings go to the returned text bytes.

    ``text_base`` is the current length of the table's ``text`` dataset, so offsets are absolute.
    ``None`` marks a null in a nullable column (a ``ValueError`` elsewhere).
    """
    out = np.zeros(n, dtype=table.dtype)
    nulls = np.zeros(n, dtype=np.uint32)
    parts: list[bytes] = []
    pos = text_base
    for col in table.columns:
        values = columns[col.name]
        if len(values) != n:
            raise ValueError(f"{table.name}.{col.name}: {len(values)} values for {n} rows")
        bit = np.uint32(1 << table.nullable.index(col.name)) if col.nullable else None
        if col.is_text:
            offs = np.zeros(n, dtype=np.int64)
            lens = np.full(n, -1, dtype=np.int64)
            for i, v in enumerate(values):
                if v is None:
                    if bit is None:
                        raise ValueError(f"{table.name}.{col.name} may not be None")
                    nulls[i] |= bit
                    continue
                b = v.encode(*ENCODING)
                parts.append(b)
                offs[i] = pos
                lens[i] = len(b)
                pos += len(b)
            out[f"{col.name}.off"] = offs
            out[f"{col.name}.len"] = lens
            continue
        if isinstance(values, np.ndarray) and bit is None:
            out[col.name] = values
            continue
        if bit is not None:
            missing = np.fromiter((v is None for v in values), dtype=bool, count=n)
            nulls[missing] |= bit
            fill = math.nan if col.kind == "f8" else 0
            values = [fill if v is None else v for v in values]
        elif any(v is None for v in values):
            raise ValueError(f"{table.name}.{col.name} may not be None")
        out[col.name] = np.asarray(values, dtype=np.float64 if col.kind == "f8" else np.int64)
    if table.nullable:
        out["nulls"] = nulls
    return out, b"".join(parts)


@dataclass
class Decoded:
    """Decoded columns: arrays for numbers (bool for bool columns), lists of str/None for text."""

    values: dict[str, Any] = field(default_factory=dict)
    nulls: dict[str, np.ndarray] = field(default_factory=dict)

    def __getitem__(self, name: str) -> Any:
        return self.values[name]

    def optional(self, name: str) -> list[Any]:
        """The column as a Python list with ``None`` at nulls."""
        vals = self.values[name]
        mask = self.nulls.get(name)
        items = vals if isinstance(vals, list) else vals.tolist()
        if mask is None or isinstance(vals, list):
            return list(items)
        return [None if m else v for v, m in zip(items, mask.tolist())]


def decode_rows(table: Table, rows: np.ndarray, text: bytes, text_base: int,
                names: Sequence[str] | None = None) -> Decoded:
    """Unpack ``rows``; ``text`` holds the table's text bytes from absolute offset ``text_base``."""
    out = Decoded()
    nulls = rows["nulls"] if table.nullable else None
    for col in table.columns:
        if names is not None and col.name not in names:
            continue
        if col.nullable:
            out.nulls[col.name] = (nulls & np.uint32(1 << table.nullable.index(col.name))) != 0
        if col.is_text:
            offs = (rows[f"{col.name}.off"] - text_base).tolist()
            lens = rows[f"{col.name}.len"].tolist()
            out.values[col.name] = [None if n < 0 else text[o:o + n].decode(*ENCODING)
                                    for o, n in zip(offs, lens)]
        elif col.kind == "bool":
            out.values[col.name] = rows[col.name] != 0
        else:
            out.values[col.name] = np.array(rows[col.name])
    return out


def text_bounds_ok(table: Table, rows: np.ndarray, text_len: int) -> np.ndarray:
    """Per row: every string reference lies inside a text dataset of ``text_len`` bytes."""
    ok = np.ones(len(rows), dtype=bool)
    for col in table.columns:
        if col.is_text:
            off, n = rows[f"{col.name}.off"], rows[f"{col.name}.len"]
            ok &= (n == -1) | ((n >= 0) & (off >= 0) & (off + np.maximum(n, 0) <= text_len))
    return ok


def row_checksums(rows: np.ndarray) -> np.ndarray:
    """CRC-32 of each record's bytes except its trailing 4-byte ``crc`` field."""
    rows = np.ascontiguousarray(rows)
    raw = rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)[:, :-4]
    return np.fromiter((zlib.crc32(r) for r in raw), dtype=np.uint32, count=len(rows))


def seal(rows: np.ndarray) -> np.ndarray:
    """Set each record's ``crc`` field (the table must have ``checksum=True``)."""
    rows["crc"] = row_checksums(rows)
    return rows


class MetricKind:
    """Codes of the ``metrics.kind`` column."""

    FLOAT, INT, BOOL, STR, NONE, JSON = 0, 1, 2, 3, 4, 5


def encode_metric(value: object, what: str) -> tuple[int, float, int, str | None]:
    """A metric value as ``(kind, num, inum, text)``."""
    if value is None:
        return MetricKind.NONE, math.nan, 0, None
    if isinstance(value, (bool, np.bool_)):
        return MetricKind.BOOL, math.nan, int(value), None
    if isinstance(value, (int, np.integer)):
        v = int(value)
        if -(2 ** 63) <= v < 2 ** 63:
            return MetricKind.INT, math.nan, v, None
        return MetricKind.JSON, math.nan, 0, to_json(v, what)
    if isinstance(value, (float, np.floating)):
        return MetricKind.FLOAT, float(value), 0, None
    if isinstance(value, str):
        return MetricKind.STR, math.nan, 0, value
    return MetricKind.JSON, math.nan, 0, to_json(value, what)


def decode_metric(kind: int, num: float, inum: int, text: str | None) -> object:
    """Inverse of :func:`encode_metric`."""
    if kind == MetricKind.FLOAT:
        return num
    if kind == MetricKind.INT:
        return inum
    if kind == MetricKind.BOOL:
        return bool(inum)
    if kind == MetricKind.STR:
        return text
    if kind == MetricKind.NONE:
        return None
    return from_json(text)
