"""The exceptions of the episode store; every message names the file and the fix."""

from __future__ import annotations

from hydroagent_hpc.errors import HydroAgentError

__all__ = ["StoreError", "SchemaError", "CorruptStoreError", "StoreLockedError", "DuplicateEpisodeError",
           "EpisodeNotFoundError", "MergeError"]


class StoreError(HydroAgentError):
    """Base class of every error the store raises on purpose."""


class SchemaError(StoreError):
    """The file is not an episode store, or one of another schema version."""


class CorruptStoreError(StoreError):
    """A committed episode points at rows that are missing or belong to another episode."""


class StoreLockedError(StoreError):
    """Another process holds the writer lock of this store (one writer per file)."""


class DuplicateEpisodeError(StoreError, ValueError):
    """An episode id is already stored in the file (or given twice to a merge)."""


class EpisodeNotFoundError(StoreError, KeyError):
    """No committed episode with this id in the file."""

    def __str__(self) -> str:  # KeyError would quote the whole message
        return str(self.args[0]) if self.args else ""


class MergeError(StoreError):
    """A merge would not hold every episode exactly once."""

    exit_code = 1
