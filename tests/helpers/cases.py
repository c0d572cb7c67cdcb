"""How many of a generated family of test cases run: all of them, or the fixed ones and a seeded sample.

The fault generators (damaged checkpoints, stage records, hostile servers, kill moments) produce hundreds
of cases of a few seconds to a minute each: every one of them is a finding the day it fails, but together
they are most of the suite's time. So by default each family runs its fixed cases (one of each kind, in
``make test``) and a seeded sample of the rest (with the tests marked slow, ``make test TESTS=all``, as CI
runs it); ``HYDROAGENT_CASES=all`` runs every case of every family (the closing notes' counts are made
that way). The sample is seeded by the family's name, so a run is repeatable and a failure reruns with
the same command.
"""

from __future__ import annotations

import os
import random
from collections.abc import Iterable, Sequence
from typing import Any

import pytest

#: ``HYDROAGENT_CASES=all``: every generated case runs (the sample otherwise).
ENV = "HYDROAGENT_CASES"


def every_case() -> bool:
    """Whether this run asked for every generated case."""
    return os.environ.get(ENV, "").strip().lower() == "all"


def sampled(family: str, params: Sequence[Any], *, fast: Iterable[str] = (), sample: int) -> list[Any]:
    """``params`` (``pytest.param`` objects with ids) as the tests to collect.

    The ids in ``fast`` run unmarked; ``sample`` of the others, drawn with a seed made from ``family``,
    run marked slow; the rest are not collected unless :func:`every_case` (then they all run, marked slow).
    """
    fast = set(fast)
    ids = [p.id for p in params]
    unknown = fast - set(ids)
    if unknown:
        raise ValueError(f"{family}: fixed cases {sorted(unknown)} are not generated any more; update the list")
    rest = [p for p in params if p.id not in fast]
    if not every_case():
        chosen = set(random.Random(family).sample([p.id for p in rest], min(sample, len(rest))))
        rest = [p for p in rest if p.id in chosen]
    keep = {p.id for p in rest} | fast
    return [pytest.param(*p.values, id=p.id, marks=[*p.marks, *(() if p.id in fast else (pytest.mark.slow,))])
            for p in params if p.id in keep]
