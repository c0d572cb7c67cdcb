"""Writing a basin folder whole or not at all: build it beside its destination, then rename."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["staged_folder"]


@contextmanager
def staged_folder(out: str | os.PathLike[str]) -> Iterator[Path]:
    """Yield an empty ``.<name>.partial-<pid>`` folder next to ``out``; on success it replaces ``out``.

    On any exception (a kill included, through ``BaseException``) the partial folder is removed
    and ``out`` is left as it was, so a reader never sees a half-written basin.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    try:
        yield tmp
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
