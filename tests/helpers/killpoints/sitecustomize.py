"""Kill points for the fault tests: a real SIGKILL just before the n-th time a process writes something.

Python imports ``sitecustomize`` at start-up from the first folder of ``sys.path`` that holds one, so a
child started with this folder first on ``PYTHONPATH`` loads this file before its own code. It
names every write the process makes to the disk (opening a file to write or append, a rename, a
folder made or removed, ``torch.save``, an HDF5 file opened to write, flushed or closed) as an
event ``kind:where#n`` (``where`` is the path's last two parts; ``n`` counts that event), and:

- ``HYDROAGENT_KILL_TRACE=FILE``: appends each event to FILE, one a line;
- ``HYDROAGENT_KILL_AT=EVENT``: sends itself SIGKILL just before that event happens.

Only the process started with these variables acts on them (it records its id in
``HYDROAGENT_KILL_OWNER``, which its children inherit and so stay out), and its own process id in a
path (temporary names) is written ``PID``, so that two runs name the same events alike.

Between two writes a process changes only its memory, so "just before each write of an uninterrupted
run" is every moment of that run that leaves a different state on disk: during a step (before its
metrics row), during a checkpoint (before each file, the manifest, the rename), between the
checkpoint and the row, during the ``latest`` pointer update, during the final save.
"""

from __future__ import annotations

import builtins
import importlib.abc
import importlib.machinery
import io
import os
import shutil
import signal
import sys
from typing import Any

_OWNER = os.environ.setdefault("HYDROAGENT_KILL_OWNER", str(os.getpid()))
_MINE = _OWNER == str(os.getpid())
_TRACE = os.environ.get("HYDROAGENT_KILL_TRACE") if _MINE else None
_AT = os.environ.get("HYDROAGENT_KILL_AT") if _MINE else None
_PID = str(os.getpid())
_counts: dict[str, int] = {}
_fd = os.open(_TRACE, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644) if _TRACE else None


def _where(path: Any) -> str:
    try:
        text = os.fsdecode(os.fspath(path))
    except TypeError:
        return "?"
    parts = [p for p in text.replace(os.sep, "/").split("/") if p]
    return "/".join(parts[-2:]).replace(_PID, "PID")


def event(kind: str, path: Any) -> None:
    name = f"{kind}:{_where(path)}"
    n = _counts[name] = _counts.get(name, 0) + 1
    label = f"{name}#{n}"
    if _fd is not None:
        os.write(_fd, (label + "\n").encode())
    if _AT == label:
        os.kill(os.getpid(), signal.SIGKILL)


def _writes(mode: Any) -> bool:
    return isinstance(mode, str) and any(c in mode for c in "wax+")


_open = builtins.open


def _patched_open(file: Any, mode: str = "r", *args: Any, **kwargs: Any) -> Any:
    if _writes(mode) and not isinstance(file, int):
        event(f"open-{mode.replace('b', '').replace('t', '')}", file)
    return _open(file, mode, *args, **kwargs)


def _wrap(module: Any, attr: str, kind: str, pick: Any) -> None:
    original = getattr(module, attr)

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        event(kind, pick(args, kwargs))
        return original(*args, **kwargs)

    wrapper.__wrapped__ = original  # type: ignore[attr-defined]
    setattr(module, attr, wrapper)


def _pair(a: Any, k: Any) -> str:
    return f"{_where(a[0])}>{_where(a[1])}"


def _patch_torch(torch: Any) -> None:
    _wrap(torch, "save", "torch.save", lambda a, k: a[1] if isinstance(a[1], (str, os.PathLike)) else "stream")


def _patch_h5py(h5py: Any) -> None:
    cls = h5py.File
    init, flush, close = cls.__init__, cls.flush, cls.close

    def __init__(self: Any, name: Any, mode: str = "r", *args: Any, **kwargs: Any) -> None:
        if mode != "r":
            event(f"h5open-{mode}", name)
        init(self, name, mode, *args, **kwargs)

    def _name(self: Any) -> str:
        try:
            return str(self.filename)
        except Exception:
            return "closed"

    def flush_(self: Any) -> None:
        if self.id.valid and self.mode != "r":
            event("h5flush", _name(self))
        flush(self)

    def close_(self: Any) -> None:
        if self.id.valid and self.mode != "r":
            event("h5close", _name(self))
        close(self)

    cls.__init__, cls.flush, cls.close = __init__, flush_, close_


_PATCH = {"torch": _patch_torch, "h5py": _patch_h5py}


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any, name: str) -> None:
        self.inner, self.name = inner, name

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _PATCH[self.name](module)


class _Finder(importlib.abc.MetaPathFinder):
    """Patches torch and h5py as they are imported (importing them here would slow every child)."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name not in _PATCH:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader, name)
        return spec


if _TRACE or _AT:
    builtins.open = _patched_open
    io.open = _patched_open
    _wrap(os, "replace", "replace", _pair)
    _wrap(os, "rename", "rename", _pair)
    _wrap(os, "mkdir", "mkdir", lambda a, k: a[0])
    _wrap(shutil, "rmtree", "rmtree", lambda a, k: a[0])
    sys.meta_path.insert(0, _Finder())
