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
    """The file is damaged: truncated, unreadable HDF5 structures, or rows that fail their checksum.

    ``damaged`` names what is damaged (episode ids, or ``record N`` where even the id is not
    trustworthy) and ``intact`` the committed episodes that still check out, when they are known
    (``summarized`` is then true; readers fill them in from :func:`hydroagent_hpc.store.verify_store`).
    """

    def __init__(self, message: str = "", fix: str = "", *, damaged: tuple[str, ...] = (),
                 intact: tuple[str, ...] = (), summarized: bool = False) -> None:
        super().__init__(message, fix)
        self.damaged = damaged
        self.intact = intact
        self.summarized = summarized


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
