"""Bytes of the store: columns to packed records and UTF-8 text, JSON, metric values, CRC-32 seals.

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

__all__ = ["to_json", "from_json", "encode_rows", "Decoded", "decode_rows", "row_checksums", "seal", "text_span",
           "block_checksum", "series_checksum", "is_blank", "text_bounds_ok", "MetricKind", "encode_metric",
           "decode_metric", "ENCODING"]

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
                text_base: int, row_base: int | None = None) -> tuple[np.ndarray, bytes]:
    """Pack ``n`` rows of ``table`` from per-column sequences; strings go to the returned text bytes.

    ``text_base`` is the current length of the table's ``text`` dataset, so offsets are absolute.
    ``None`` marks a null in a nullable column (a ``ValueError`` elsewhere). Rows of a table with
    ``checksum=True`` come back sealed (:func:`seal`) for row numbers from ``row_base`` (required then).
    """
    if table.checksum and row_base is None:
        raise ValueError(f"{table.name}: rows carry a checksum over their row number; pass row_base")
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
    text = b"".join(parts)
    if table.checksum and row_base is not None:
        seal(table, out, text, text_base, np.arange(row_base, row_base + n, dtype=np.int64))
    return out, text


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
        if col.nullable and nulls is not None:
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


def _record_bytes(rows: np.ndarray) -> np.ndarray:
    """The records of ``rows`` as an ``(n, itemsize)`` uint8 array (a copy only if not contiguous)."""
    rows = np.ascontiguousarray(rows)
    return rows.view(np.uint8).reshape(len(rows), rows.dtype.itemsize)


def _string_refs(table: Table, rows: np.ndarray) -> list[tuple[list[int], list[int]]]:
    return [(rows[f"{c.name}.off"].tolist(), rows[f"{c.name}.len"].tolist()) for c in table.columns if c.is_text]


def row_checksums(table: Table, rows: np.ndarray, text: bytes, text_base: int, numbers: np.ndarray) -> np.ndarray:
    """Per record: CRC-32 of its row number (``numbers``, 8 bytes little-endian), then its bytes
    except the trailing 4-byte ``crc`` field, then the UTF-8 bytes of each of its non-null strings
    in column order (``text`` holds the table's text from absolute offset ``text_base``).

    The row number binds a record to its place: a valid record copied over another row fails.

    A string reference outside ``text`` makes that row's value differ from any it could match
    (the reference is checked with :func:`text_bounds_ok` too).
    """
    raw = _record_bytes(rows)[:, :-4]
    refs = _string_refs(table, rows)
    out = np.empty(len(rows), dtype=np.uint32)
    end = text_base + len(text)
    where = np.asarray(numbers, dtype="<i8")
    if len(where) != len(rows):
        raise ValueError(f"{table.name}: {len(where)} row numbers for {len(rows)} rows")
    for i in range(len(rows)):
        crc = zlib.crc32(raw[i], zlib.crc32(where[i].tobytes()))
        for offs, lens in refs:
            off, n = offs[i], lens[i]
            if n > 0:
                if off < text_base or off + n > end:
                    crc ^= 0xFFFFFFFF  # unreachable bytes: never a match for the stored crc of this record
                    break
                crc = zlib.crc32(text[off - text_base:off - text_base + n], crc)
        out[i] = crc
    return out


def seal(table: Table, rows: np.ndarray, text: bytes, text_base: int, numbers: np.ndarray) -> np.ndarray:
    """Set each record's ``crc`` field (the table must have ``checksum=True``); see :func:`row_checksums`."""
    rows["crc"] = row_checksums(table, rows, text, text_base, numbers)
    return rows


def text_span(table: Table, rows: np.ndarray) -> tuple[int, int]:
    """``(lo, hi)``: the text bytes the strings of ``rows`` occupy (``(0, 0)`` when they have none).

    The writer appends an episode's strings of one table as one contiguous blob, so for the rows
    of one episode this is exactly that blob.
    """
    lo, hi = -1, 0
    for c in table.columns:
        if c.is_text and len(rows):
            n = rows[f"{c.name}.len"]
            live = n >= 0
            if live.any():
                off = rows[f"{c.name}.off"][live]
                m = int(off.min())
                lo = m if lo < 0 else min(lo, m)
                hi = max(hi, int((off + n[live]).max()))
    return (0, 0) if lo < 0 or hi <= lo else (lo, hi)


def block_checksum(rows: np.ndarray, text: bytes) -> int:
    """CRC-32 of a block of records (their bytes, in order) followed by the block's text bytes.

    This is how an episode record seals its ``turns``, ``sims`` and ``metrics`` rows: ``text`` is
    the table's ``text[lo:hi]`` with ``(lo, hi)`` = :func:`text_span` of the rows.
    """
    return zlib.crc32(text, zlib.crc32(np.ascontiguousarray(rows).tobytes()))


def series_checksum(values: np.ndarray) -> int:
    """CRC-32 of a series' bytes as stored (``discharge_crc``: the episode's float32 discharge)."""
    return zlib.crc32(np.ascontiguousarray(values).tobytes())


def is_blank(rows: np.ndarray) -> np.ndarray:
    """Per record: every byte is zero (HDF5's fill value: a record that was never written)."""
    if not len(rows):
        return np.zeros(0, dtype=bool)
    return np.asarray(~_record_bytes(rows).any(axis=1), dtype=bool)


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
