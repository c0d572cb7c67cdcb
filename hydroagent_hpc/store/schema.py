"""The HDF5 layout of an episode store: tables, columns, ragged series, version and checks.

Every object is created when the file is created (SWMR writers may only append), so the layout
below is the whole file. ``store_schema.md`` beside the package documents it for readers that
do not use this code.

A *table* is a group holding ``rows`` (a 1-D compound dataset, one record per row) and ``text``
(a 1-D ``uint8`` dataset of UTF-8 bytes). A string column is two fields, ``<name>.off`` and
``<name>.len``, addressing ``text``; a nullable column has a bit in the row's ``nulls`` field.
A *series* is a 1-D dataset that rows address with ``<name>_start``/``<name>_len`` pairs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from importlib import metadata
from pathlib import Path

import h5py
import numpy as np

from hydroagent_hpc.params import PARAM_NAMES
from hydroagent_hpc.store.errors import CorruptStoreError, SchemaError

__all__ = ["SCHEMA_NAME", "SCHEMA_VERSION", "LIBVER", "Column", "Table", "TABLES", "SERIES", "EPISODES",
           "TURNS", "SIMS", "METRICS", "METRIC_KEYS", "BASINS", "DATASETS", "create_layout", "check_schema"]

#: Value of the root attribute ``schema``: what kind of file this is.
SCHEMA_NAME = "hydroagent_hpc.episode_store"
#: Value of the root attribute ``schema_version``; bump it on any change of the layout below.
#: Version 2 (this one) seals every row a result depends on with a CRC-32; version 1 checked only
#: the episode record itself and is refused with a clear :class:`SchemaError`.
SCHEMA_VERSION = 2
#: HDF5 format bounds: the 1.10 format (the oldest with SWMR) so HDF5 >= 1.10 can read the files.
LIBVER = ("v110", "v110")

# Chunk sizes: about 64 KiB per chunk for tables and text, 512 KiB for series.
_ROW_CHUNK_BYTES = 64 * 1024
_TEXT_CHUNK = 64 * 1024
_SERIES_CHUNK_BYTES = 512 * 1024

try:
    _PACKAGE_VERSION = metadata.version("hydroagent-hpc")
except metadata.PackageNotFoundError:  # running from a source tree that is not installed
    _PACKAGE_VERSION = "unknown"

_KINDS: dict[str, str | None] = {"i8": "<i8", "i4": "<i4", "u1": "u1", "u4": "<u4", "f8": "<f8", "bool": "u1",
                                 "str": None, "json": None}


@dataclass(frozen=True)
class Column:
    """One logical column. ``kind`` is i8, i4, u1, u4, f8, bool, str or json (JSON text in a str)."""

    name: str
    kind: str
    nullable: bool = False

    def __post_init__(self) -> None:
        if self.kind not in _KINDS:
            raise ValueError(f"column {self.name}: unknown kind {self.kind!r}")

    @property
    def is_text(self) -> bool:
        return self.kind in ("str", "json")


@dataclass(frozen=True)
class Table:
    """A table: its columns, whether each row carries its own CRC-32 (``checksum``), and a doc line.

    A row's ``crc`` covers the record's bytes before it and then the UTF-8 bytes of each of its
    non-null strings, in column order (:func:`codec.row_checksums`). Tables without a per-row
    checksum (turns, sims, metrics) are sealed per episode by the episode record instead.
    """

    name: str
    columns: tuple[Column, ...]
    doc: str
    checksum: bool = False

    @cached_property
    def nullable(self) -> tuple[str, ...]:
        """Names of the nullable columns; bit ``i`` of ``nulls`` belongs to the i-th."""
        names = tuple(c.name for c in self.columns if c.nullable)
        if len(names) > 32:
            raise ValueError(f"table {self.name}: more than 32 nullable columns")
        return names

    @cached_property
    def dtype(self) -> np.dtype[np.void]:
        """The packed little-endian record type of ``rows``."""
        fields: list[tuple[str, str]] = []
        for c in self.columns:
            kind = _KINDS[c.kind]
            if kind is None:
                fields += [(f"{c.name}.off", "<i8"), (f"{c.name}.len", "<i8")]
            else:
                fields.append((c.name, kind))
        if self.nullable:
            fields.append(("nulls", "<u4"))
        if self.checksum:
            fields.append(("crc", "<u4"))
        return np.dtype(fields)

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name} has no column {name!r}")


def _c(name: str, kind: str, nullable: bool = False) -> Column:
    return Column(name, kind, nullable)


#: One row per committed episode. Appending a valid row (CRC-32 over the rest of the record and its
#: strings) is the commit: every other row of the episode was written and flushed before it. The
#: ``*_crc`` fields seal the episode's blocks in the other tables (see ``codec.block_checksum``):
#: ``turns_crc``, ``sims_crc``, ``metrics_crc`` cover its rows and their strings, ``discharge_crc``
#: its simulated discharge; so a changed byte anywhere in an episode fails one CRC.
EPISODES = Table("episodes", (
    _c("episode_id", "str"), _c("basin_id", "str"), _c("agent", "str"), _c("preset", "str"),
    _c("protocol", "str"), _c("seed", "i8"), _c("basin_key", "i8"),
    _c("best_nse", "f8", True), _c("best_run", "i8", True), _c("best_params", "json", True),
    _c("stop_reason", "str"), _c("terminal_reward", "f8"), _c("total_reward", "f8"),
    _c("wall_time_s", "f8"), _c("started_utc", "str"),
    _c("config", "json"), _c("terminal_terms", "json"), _c("counters", "json"),
    _c("provenance", "json"), _c("usage", "json"),
    _c("turn_start", "i8"), _c("turn_count", "i8"), _c("sim_start", "i8"), _c("sim_count", "i8"),
    _c("metric_start", "i8"), _c("metric_count", "i8"), _c("keys_end", "i8"),
    _c("turns_crc", "u4"), _c("sims_crc", "u4"), _c("metrics_crc", "u4"), _c("discharge_crc", "u4"),
), "one row per episode; a row whose crc matches commits the episode", checksum=True)

#: One row per Turn, in episode order; ``episode_row`` is the row of its episode in ``episodes``.
TURNS = Table("turns", (
    _c("episode_row", "i8"), _c("index", "i8"), _c("message_index", "i8"), _c("kind", "str"),
    _c("tool", "str", True), _c("arguments", "json", True), _c("observation", "json", True),
    _c("reward", "f8"), _c("reward_terms", "json", True), _c("ok", "bool"), _c("error", "str", True),
    _c("run_id", "i8", True), _c("text", "str"), _c("started_s", "f8"), _c("duration_s", "f8"),
), "one row per turn (tool call or parse failure)")

#: One row per SimRecord. ``param.<name>`` holds the 13 multipliers (NaN when absent; bit i of
#: ``params_set`` says whether PARAM_NAMES[i] was given); other names go to ``extra_params``.
SIMS = Table("sims", (
    _c("episode_row", "i8"), _c("run_id", "i8"), _c("ok", "bool"), _c("error", "str", True),
    _c("wall_time_s", "f8"), _c("evaluated", "bool"), _c("round", "i8", True),
    *(_c(f"param.{p}", "f8") for p in PARAM_NAMES), _c("params_set", "i8"),
    _c("extra_params", "json", True), _c("discharge_start", "i8"), _c("discharge_len", "i8", True),
), "one row per simulation; discharge in series/discharge")

#: One row per (simulation, metric). ``kind``: 0 float (num), 1 int (inum), 2 bool (inum),
#: 3 str (text), 4 None, 5 any other JSON value (text).
METRICS = Table("metrics", (
    _c("sim_row", "i8"), _c("key", "i4"), _c("kind", "u1"), _c("num", "f8"), _c("inum", "i8"),
    _c("text", "str", True),
), "one row per metric of a simulation; key indexes metric_keys")

#: Metric names; a metric's ``key`` is a row number here.
METRIC_KEYS = Table("metric_keys", (_c("name", "str"),), "metric names, addressed by row number", checksum=True)

#: One row per distinct basin record (id + series + Basin fields), shared by its episodes. The row
#: carries a CRC-32; ``digest`` (SHA-1, ``rows.basin_digest``) seals its series.
BASINS = Table("basins", (
    _c("basin_id", "str"), _c("digest", "str"), _c("info", "json", True), _c("times_unit", "str", True),
    _c("times_start", "i8"), _c("times_len", "i8", True), _c("observed_start", "i8"),
    _c("observed_len", "i8", True), _c("warmup_start", "i8"), _c("warmup_len", "i8", True),
), "one row per basin series; observed is stored once per basin; digest seals the series", checksum=True)

TABLES: tuple[Table, ...] = (EPISODES, TURNS, SIMS, METRICS, METRIC_KEYS, BASINS)

#: Ragged 1-D series under ``/series``: name -> dtype.
SERIES: dict[str, str] = {"times": "<i8", "observed": "<f8", "warmup": "u1", "discharge": "<f4"}


#: Every dataset of the layout, by path.
DATASETS: tuple[str, ...] = tuple(f"{t.name}/{part}" for t in TABLES for part in ("rows", "text")) + tuple(
    f"series/{name}" for name in SERIES)


def create_layout(f: h5py.File) -> None:
    """Create every group, dataset and attribute of an empty store in ``f`` (opened for writing)."""
    f.attrs["schema"] = SCHEMA_NAME
    f.attrs["schema_version"] = SCHEMA_VERSION
    f.attrs["created_by"] = f"hydroagent_hpc {_PACKAGE_VERSION}"
    f.attrs["param_names"] = json.dumps(list(PARAM_NAMES))
    f.attrs["doc"] = ("hydroagent_hpc episode store; layout in docs/store_schema.md. An episode "
                      "exists when its row in episodes/rows has a matching crc.")
    for table in TABLES:
        g = f.create_group(table.name)
        g.attrs["doc"] = table.doc
        rows = max(1, _ROW_CHUNK_BYTES // table.dtype.itemsize)
        g.create_dataset("rows", shape=(0,), maxshape=(None,), dtype=table.dtype, chunks=(rows,))
        g.create_dataset("text", shape=(0,), maxshape=(None,), dtype="u1", chunks=(_TEXT_CHUNK,))
    g = f.create_group("series")
    g.attrs["doc"] = "ragged 1-D series addressed by <name>_start/<name>_len in sims and basins"
    for name, dt in SERIES.items():
        n = _SERIES_CHUNK_BYTES // np.dtype(dt).itemsize
        g.create_dataset(name, shape=(0,), maxshape=(None,), dtype=dt, chunks=(n,))


def check_schema(f: h5py.File, path: str | Path) -> None:
    """Raise :class:`SchemaError` naming ``path`` and the fix unless ``f`` is a store of this version."""
    name = f.attrs.get("schema")
    version = f.attrs.get("schema_version")
    if version is None or name is None:
        raise SchemaError(
            f"{path}: not an episode store of hydroagent_hpc (no 'schema'/'schema_version' attribute on "
            f"the root group; it may be an older or foreign HDF5 file). Write episodes to a new file with "
            f"EpisodeWriter, or pass the path of a store it created.")
    if isinstance(name, bytes):
        name = name.decode()
    if name != SCHEMA_NAME:
        raise SchemaError(f"{path}: schema {name!r} is not {SCHEMA_NAME!r}; this is not an episode store.")
    version = int(version)
    if version == 1:
        made = f.attrs.get("created_by", "an unknown version")
        raise SchemaError(
            f"{path}: episode store schema version 1 (older; written by {made}): its simulation, turn, metric "
            f"and discharge rows carry no checksums, so damage in them cannot be detected, and this "
            f"hydroagent_hpc {_PACKAGE_VERSION} reads version {SCHEMA_VERSION} only. Read it with the release "
            f"that wrote it, or rerun the campaign into a new store.")
    if version != SCHEMA_VERSION:
        made = f.attrs.get("created_by", "an unknown version")
        newer = "newer" if version > SCHEMA_VERSION else "older"
        raise SchemaError(
            f"{path}: episode store schema version {version} ({newer}; written by {made}) but this "
            f"hydroagent_hpc {_PACKAGE_VERSION} reads version {SCHEMA_VERSION}. Read it with the release that "
            f"wrote it, or write a new store.")
    for table in TABLES:
        try:
            rows, text = f[f"{table.name}/rows"], f[f"{table.name}/text"]
        except KeyError as exc:
            if "doesn't exist" not in str(exc):  # h5py's KeyError for an object header it cannot read
                raise CorruptStoreError(f"{path}: HDF5 cannot open table {table.name!r} ({str(exc).strip(chr(39))}); "
                                        f"its HDF5 structures are damaged") from None
            raise SchemaError(f"{path}: schema version {version} but table {table.name!r} is missing; "
                              f"the file is damaged or was edited by hand.") from None
        if rows.dtype != table.dtype or text.dtype != np.uint8:  # a store of this version never differs
            raise CorruptStoreError(f"{path}: table {table.name!r} has record type {rows.dtype}, expected "
                                    f"{table.dtype}; the file is damaged (or was edited by hand).")
    for name, dt in SERIES.items():
        try:
            ds = f.get(f"series/{name}")
        except (KeyError, OSError, RuntimeError) as exc:
            raise CorruptStoreError(f"{path}: HDF5 cannot open series/{name} ({str(exc).strip(chr(39))}); its HDF5 "
                                    f"structures are damaged") from None
        if ds is None or ds.dtype != np.dtype(dt):
            raise CorruptStoreError(f"{path}: series/{name} is missing or not {dt}; the file is damaged.")
