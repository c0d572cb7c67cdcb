"""One named table per extension point: agent kinds, simulator backends, pool backends, presets.

A :class:`Registry` maps names to entries of one type. Entries are added by a call
(``AGENT_KINDS.register("dds", entry)``) or as a decorator (``@BACKENDS.register("embedded")``),
looked up with :meth:`Registry.lookup` or ``registry[name]`` (an unknown name raises
:class:`UnknownNameError`, a :class:`~hydroagent_hpc.errors.ConfigError` that lists the valid names
and says how to add one), and listed in registration order with :meth:`Registry.names`.

Each extension point owns exactly one instance, defined beside the code it extends
(:data:`hydroagent_hpc.agents.factory.AGENT_KINDS`, :data:`hydroagent_hpc.sim.BACKENDS`,
:data:`hydroagent_hpc.hpc.pool.BACKENDS`, :data:`hydroagent_hpc.config.PRESETS`,
:data:`hydroagent_hpc.sim.kernels.KERNELS`); everything that
validates, builds or offers a choice of that kind reads that one table. There is no global index of
registries and no import-time discovery.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Generic, TypeVar, overload

from hydroagent_hpc.errors import ConfigError, HydroAgentError

__all__ = ["Registry", "UnknownNameError", "DuplicateNameError"]

T = TypeVar("T")


class UnknownNameError(ConfigError):
    """A name that is not in a registry; the message lists the valid names and the fix."""


class DuplicateNameError(HydroAgentError, ValueError):
    """A second entry under a name a registry already holds."""


class Registry(Generic[T]):
    """Named entries of one extension point (``what``: how the entries are called in messages).

    ``where`` names the module holding the registration lines; it goes into the fix of an unknown
    name ("register it in ...").
    """

    def __init__(self, what: str, where: str = "") -> None:
        self.what = what
        self.where = where
        self._entries: dict[str, T] = {}

    @overload
    def register(self, name: str) -> Callable[[T], T]: ...

    @overload
    def register(self, name: str, entry: T, *, replace: bool = False) -> T: ...

    def register(self, name: str, entry: T | None = None, *, replace: bool = False) -> T | Callable[[T], T]:
        """Add ``entry`` under ``name`` and return it; without ``entry``, a decorator that adds its target.

        A name may be registered once; ``replace=True`` swaps an entry on purpose (tests, plugins
        that override a built-in).
        """
        if not isinstance(name, str) or not name or name != name.strip() or "/" in name:
            raise ValueError(f"{self.what} name {name!r}: a non-empty word without '/' or surrounding spaces")

        def add(value: T) -> T:
            if name in self._entries and not replace:
                raise DuplicateNameError(f"{self.what} {name!r} is already registered",
                                         fix="choose another name, or pass replace=True to override it")
            self._entries[name] = value
            return value

        if entry is None:
            return add
        return add(entry)

    def unregister(self, name: str) -> None:
        """Remove ``name`` (a test's temporary entry); unknown names raise :class:`UnknownNameError`."""
        self.lookup(name)
        del self._entries[name]

    def lookup(self, name: str) -> T:
        """The entry under ``name``; an unknown name raises :class:`UnknownNameError` listing the valid ones."""
        try:
            return self._entries[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name from a parsed file
            where = f" with one line in {self.where}" if self.where else ""
            raise UnknownNameError(f"unknown {self.what} {name!r}; choose one of: {', '.join(self._entries)}",
                                   fix=f"use one of the names above, or register a new {self.what}{where}") from None

    def names(self) -> tuple[str, ...]:
        """The registered names, in registration order."""
        return tuple(self._entries)

    def items(self) -> tuple[tuple[str, T], ...]:
        """``(name, entry)`` pairs, in registration order."""
        return tuple(self._entries.items())

    def __getitem__(self, name: str) -> T:
        return self.lookup(name)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and name in self._entries

    def __iter__(self) -> Iterator[str]:
        return iter(tuple(self._entries))

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Registry({self.what!r}: {', '.join(self._entries)})"
