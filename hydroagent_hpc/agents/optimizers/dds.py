"""Dynamically Dimensioned Search (Tolson and Shoemaker 2007), with a batch variant and warm starts.

DDS (Tolson, B. A. and Shoemaker, C. A., 2007, *Water Resour. Res.* 43, W01413) is a greedy,
single-solution global search designed for watershed-model calibration under a fixed budget of
``m`` evaluations. Here it maximises the score (NSE). With ``x_best`` the best solution so far and
``i`` the index of the evaluation being proposed (1-based, counting this optimizer's own
evaluations, the initialisation included):

1. Initialisation: the user's ``initial`` points if given, otherwise
   ``i0 = max(5, round(0.005·m))`` uniform random points; ``x_best`` is the best of them. While
   no point has a finite score yet (a batch asked before the initial scores are told, or every
   initial run failed), further proposals are uniform random points too.
2. Each dimension ``j`` is perturbed with probability ``P(i) = 1 - ln(i)/ln(m)``; if none is
   chosen, one dimension is chosen uniformly at random.
3. ``x_new_j = x_best_j + σ_j·N(0, 1)`` with ``σ_j = r·(x_max_j - x_min_j)``, ``r = 0.2``
   (in the unit cube, ``σ = r``).
4. Bounds by reflection: below ``x_min`` -> ``x_min + (x_min - x_new)``, and if that passes
   ``x_max`` -> ``x_min``; above ``x_max`` symmetrically (:func:`hydroagent_hpc.agents.optimizers.space.reflect`).
5. Greedy acceptance: ``x_best <- x_new`` if ``F(x_new) >= F(x_best)`` (ties accepted, as in
   the paper, so DDS can move across flat regions; NSE observations are rounded to 4 decimals).

Batch variant (our choice, for the "rounds" protocol): ``ask(k)`` returns ``k`` independent
perturbations of the same ``x_best``, with evaluation indices ``i, i+1, ..., i+k-1`` in the
schedule, so a round of ``k`` candidates costs ``k`` of the ``m`` evaluations exactly as ``k``
sequential steps would. All ``k`` are told back; ``x_best`` becomes the best of the round if it
is at least as good as the current one (greedy on the round's best). With ``k = 1`` this is
sequential DDS exactly.

Warm start (the hybrid of issue 5): pass ``initial=[params, ...]`` to have those points evaluated
first in place of the random initialisation (they count in the budget), or ``tell`` points
evaluated elsewhere, with their scores, before the first ``ask``: they then replace the
initialisation entirely, do not count in the budget ``m`` (give DDS the *remaining* budget), and
the schedule starts at ``i = 1``. A smaller ``r`` keeps the search closer to the warm start.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from hydroagent_hpc.agents.optimizers.space import AskTellOptimizer, ParameterSpace, reflect

log = logging.getLogger(__name__)

__all__ = ["DDS", "dds_probability", "dds_initial_count", "dds_perturb"]


def dds_probability(i: int, m: int) -> float:
    """``P(i) = 1 - ln(i)/ln(m)``, the chance each dimension is perturbed at evaluation ``i`` of ``m``.

    Clamped to ``[0, 1]`` (``i > m`` gives 0: one dimension only); ``m <= 1`` gives 0.
    """
    if m <= 1:
        return 0.0
    return min(1.0, max(0.0, 1.0 - math.log(max(i, 1)) / math.log(m)))


def dds_initial_count(m: int) -> int:
    """The number of random initial evaluations, ``max(5, round(0.005·m))``, capped at ``m``."""
    return max(1, min(m, max(5, int(round(0.005 * m)))))


def dds_perturb(center: np.ndarray, p: float, r: float, rng: np.random.Generator) -> np.ndarray:
    """One DDS neighbour of ``center`` in the unit cube (steps 2 to 4 above)."""
    d = center.size
    chosen = rng.random(d) < p
    if not chosen.any():
        chosen[rng.integers(d)] = True
    step = r * rng.standard_normal(d)
    new = center.copy()
    new[chosen] = center[chosen] + step[chosen]
    return reflect(new)


class DDS(AskTellOptimizer):
    """DDS over the tunable parameters (module docstring: algorithm, batch variant, warm start).

    ``r``: neighbourhood size as a fraction of each range (0.2, the paper's value).
    ``initial``: points to evaluate first, instead of the random initialisation.
    """

    name = "dds"

    def __init__(self, seed: int | None, budget: int, *, r: float = 0.2,
                 initial: Sequence[Mapping[str, float]] | None = None, space: ParameterSpace | None = None) -> None:
        super().__init__(seed, budget, space)
        if not 0.0 < r <= 1.0:
            raise ValueError(f"r={r!r}: the DDS neighbourhood is a fraction of the range in (0, 1]")
        self.r = float(r)
        self._init_queue = [self.space.to_unit(p) for p in (initial or [])]
        self.n_init = len(self._init_queue) if self._init_queue else dds_initial_count(self.budget)
        self._issued = 0  # own evaluations proposed so far (the schedule's i - 1)
        self._init_issued = 0
        self._center: np.ndarray | None = None
        self._center_score = float("-inf")
        self._external = False

    @property
    def iteration(self) -> int:
        """The index ``i`` the next proposal gets in the schedule."""
        return self._issued + 1

    def _in_init(self) -> bool:
        if self._external and self._center is not None and not self._init_queue:
            return False  # a told warm start replaces the random initialisation
        return self._init_issued < self.n_init or self._center is None

    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        out = []
        for _ in range(n):
            if self._in_init():
                if self._init_queue:
                    u = self._init_queue.pop(0)
                else:
                    u = self.rng.random(self.space.dim)
                self._init_issued += 1
                token = ("init", self._issued + 1)
            else:
                i = self._issued + 1
                assert self._center is not None  # _in_init() holds until a centre exists
                u = dds_perturb(self._center, dds_probability(i, self.budget), self.r, self.rng)
                token = ("step", i)
            self._issued += 1
            out.append((u, token))
        return out

    def _accept(self, u: np.ndarray, score: float) -> None:
        if score == float("-inf"):
            return
        if self._center is None or score >= self._center_score:
            self._center = np.array(u, dtype=float)
            self._center_score = score

    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        self._accept(u, score)

    def _observe_external(self, u: np.ndarray, score: float) -> None:
        if score == float("-inf"):
            return
        self._external = True
        self._accept(u, score)
