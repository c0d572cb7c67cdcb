"""Sampling baselines: plain uniform random search and Latin hypercube search.

Both ignore the scores (they only keep the best) and propose any number of points at once, so a
round of the batched simulator is always full.

* :class:`RandomSearch`: independent uniform points in the parameter box.
* :class:`LatinHypercubeSearch`: one Latin hypercube design of ``budget`` points (McKay,
  Beckman and Conover 1979) in the unit cube, from :class:`scipy.stats.qmc.LatinHypercube`
  (each of the 11 axes cut into ``budget`` equal strata, each stratum sampled exactly once, at a
  random position inside it). Points are handed out in the design's order; if more are asked
  than the budget, a fresh design of ``budget`` points follows. A partial budget is a random
  subset of the design, not itself stratified.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from scipy.stats import qmc

from hydroagent_hpc.agents.optimizers.space import AskTellOptimizer, ParameterSpace

__all__ = ["RandomSearch", "LatinHypercubeSearch"]


class RandomSearch(AskTellOptimizer):
    """Uniform random search: ``u ~ U[0, 1]^11``, mapped linearly to the bounds."""

    name = "random"

    def __init__(self, seed: int | None, budget: int, space: ParameterSpace | None = None) -> None:
        super().__init__(seed, budget, space)

    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        return [(u, None) for u in self.rng.random((n, self.space.dim))]

    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        pass


class LatinHypercubeSearch(AskTellOptimizer):
    """Latin hypercube search over the budget (scipy's ``LatinHypercube``, not scrambled-optimised).

    ``strength=1`` and ``optimization=None`` are scipy's defaults: a plain random LHS. The design
    generator is seeded from this optimizer's own generator, so a seed fixes the design.
    """

    name = "lhs"

    def __init__(self, seed: int | None, budget: int, space: ParameterSpace | None = None) -> None:
        super().__init__(seed, budget, space)
        self._design = np.empty((0, self.space.dim))
        self._next = 0

    def _new_design(self) -> np.ndarray:
        sampler = qmc.LatinHypercube(d=self.space.dim, rng=np.random.default_rng(self.rng.integers(2**63)))
        return sampler.random(self.budget)

    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        out = []
        for _ in range(n):
            if self._next >= len(self._design):
                self._design = self._new_design()
                self._next = 0
            out.append((self._design[self._next], None))
            self._next += 1
        return out

    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        pass
