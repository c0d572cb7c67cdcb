"""The episode store: one HDF5 file per campaign (or per shard), written crash-safely, read as pandas.

Write with :class:`EpisodeWriter`; read with :func:`read_episodes`, :func:`read_sims`,
:func:`read_turns`, :func:`read_basins`, :func:`read_series`, :func:`load_episode` and
:func:`iter_episodes`; combine shards with :func:`merge`; check a store with :func:`verify_store`
and copy the intact episodes of a damaged one with :func:`salvage`; :func:`check_stores` and
:func:`done_ids` say which episodes several stores hold intact (only those count as done). The
layout and the guarantees are in ``docs/store_schema.md``.
"""

from hydroagent_hpc.store.errors import (
                                         CorruptStoreError,
                                         DuplicateEpisodeError,
                                         EpisodeNotFoundError,
                                         MergeError,
                                         SchemaError,
                                         StoreError,
                                         StoreLockedError,
)
from hydroagent_hpc.store.frames import (
                                         Series,
                                         StoreInfo,
                                         inspect_store,
                                         iter_episodes,
                                         load_episode,
                                         read_basins,
                                         read_episodes,
                                         read_series,
                                         read_sims,
                                         read_turns,
                                         stored_ids,
)
from hydroagent_hpc.store.merge import merge, merge_held, salvage
from hydroagent_hpc.store.schema import SCHEMA_NAME, SCHEMA_VERSION
from hydroagent_hpc.store.verify import Holdings, StoreHealth, check_stores, done_ids, verify_store
from hydroagent_hpc.store.writer import EpisodeWriter

__all__ = [
    "EpisodeWriter", "stored_ids", "read_episodes", "read_sims", "read_turns", "read_basins", "read_series",
    "Series", "load_episode", "iter_episodes", "inspect_store", "StoreInfo", "merge", "verify_store", "StoreHealth",
    "salvage", "check_stores", "Holdings", "done_ids", "merge_held", "SCHEMA_NAME",
    "SCHEMA_VERSION", "StoreError", "SchemaError", "CorruptStoreError", "StoreLockedError",
    "DuplicateEpisodeError", "EpisodeNotFoundError", "MergeError",
]
