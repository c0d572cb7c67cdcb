"""The ``PYTHONPATH`` of a test's child process: the given folders, then the checkout, then the caller's own.

A cluster's module system, or wheels carried beside an image (the GPU check on a lent machine), put packages
on the caller's ``PYTHONPATH``; a child that replaced it with the checkout alone could not import them.
"""

from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def pythonpath(*first: Path | str) -> str:
    """``first`` folders, the checkout, then the caller's ``PYTHONPATH`` entries; each once, empty ones dropped."""
    caller = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    parts = [str(p) for p in (*first, ROOT, *caller) if str(p)]
    return os.pathsep.join(dict.fromkeys(parts))
