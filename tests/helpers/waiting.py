"""Wait for a condition, with a deadline, instead of sleeping a fixed time and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

__all__ = ["wait_until"]


def wait_until(condition: Callable[[], T], timeout: float, what: str, *, interval: float = 0.05,
               max_interval: float = 1.0, ignore: tuple[type[BaseException], ...] = ()) -> T:
    """Call ``condition`` until it returns something truthy and return that; fail after ``timeout`` s.

    ``condition`` is asked at once, then every ``interval`` seconds (doubling up to ``max_interval``,
    1 s by default, so a slow condition such as ``sacct`` is not hammered; pass ``max_interval=interval``
    to poll at a fixed rate when the state to catch is short-lived). Exceptions of the types in ``ignore`` count as
    "not yet" (a file being created at that instant). After ``timeout`` seconds it raises
    ``AssertionError`` naming ``what`` and the last answer, so a hang becomes a clear failure.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            last = condition()
        except ignore as err:
            last = err
        else:
            if last:
                return last
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last answer: {last!r})")
        time.sleep(min(interval, max(0.0, deadline - time.monotonic())))
        interval = min(2 * interval, max_interval)
