"""Shuffled Complex Evolution (SCE-UA; Duan, Sorooshian and Gupta 1992, 1994), ask/tell.

SCE-UA (Duan, Q., Sorooshian, S. and Gupta, V., 1992, *Water Resour. Res.* 28(4), 1015-1031;
defaults from Duan et al. 1994, *J. Hydrol.* 158, 265-284), maximising the score, in the unit
cube of the ``n = 11`` tunable parameters:

1. Sample ``s = p·m`` points uniformly in the box and score them.
2. Sort best first and deal them into ``p`` complexes: complex ``k`` gets sorted points
   ``k, k+p, k+2p, ...``.
3. Evolve each complex by competitive complex evolution (CCE), ``β`` steps per complex. One step:
   pick a sub-complex of ``q`` points without replacement with the trapezoidal probabilities
   ``p_i = 2(m+1-i) / (m(m+1))`` (rank ``i = 1`` the best); let ``u_q`` be its worst point and
   ``g`` the centroid of the other ``q - 1``;
   reflection ``r = 2g - u_q`` (if ``r`` leaves the box: a uniform point in the smallest box ``H``
   holding the complex instead, the mutation); if ``F(r) > F(u_q)`` replace ``u_q`` by ``r``;
   else contraction ``c = (g + u_q)/2``; if ``F(c) > F(u_q)`` replace; else replace ``u_q`` by a
   uniform point of ``H`` (mutation). ``α = 1`` such iteration per sub-complex.
4. Shuffle: merge the complexes and go to 2, until the budget is spent (the budget is the only
   stopping rule; no convergence test, no complex-number reduction).

Defaults (Duan et al. 1994's recommendations for ``n`` parameters): ``m = 2n + 1 = 23`` points
per complex, ``q = n + 1 = 12``, ``α = 1``, ``β = 2n + 1 = 23``, and ``p = 2`` complexes (the
smallest they recommend; with a budget of a few hundred, the initial sample of ``s = 46`` already
costs a quarter of 200 runs, and more complexes would leave almost nothing for evolution).

Batching (how asks are served): the initial sample can be asked in any number; if a batch asks
for more than remain while some are still unscored, extra uniform points join the initial
sample (the population grows; complexes may then hold ``m + 1`` points). Complexes evolve
independently between shuffles, and a step is a short sequence of evaluations (reflection, then
perhaps contraction, then perhaps mutation), so a batch holds the next evaluation of every open
step first, then new steps: each new step goes to the complex with the fewest steps started since
the last shuffle, and steps open at the same time take disjoint points (a point that is an open
step's ``u_q`` is left out of later sub-complexes until that step ends; at most ``m - q`` open
steps per complex). The shuffle comes when every complex has started its ``β`` steps; steps still
open then finish in whichever complex their ``u_q`` is dealt to (the mutation box ``H`` is that
complex's). Asked one at a time (the "turns" protocol) nothing is ever open at a shuffle, and
this is SCE-UA exactly as published. A warm start told before the initial sample is complete
joins the sample.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydroagent_hpc.agents.optimizers.space import AskTellOptimizer, ParameterSpace

log = logging.getLogger(__name__)

__all__ = ["SCEUA", "trapezoidal_probabilities"]


def trapezoidal_probabilities(m: int) -> np.ndarray:
    """``p_i = 2(m+1-i) / (m(m+1))``, ``i = 1..m`` (rank 1 the best): the sub-complex selection."""
    i = np.arange(1, m + 1)
    return 2.0 * (m + 1 - i) / (m * (m + 1))


@dataclass(eq=False)  # steps are compared by identity
class _Step:
    target: int  # population index of u_q
    centroid: np.ndarray
    stage: str = "reflect"  # reflect -> contract -> mutate
    point: np.ndarray = field(default_factory=lambda: np.empty(0))


class SCEUA(AskTellOptimizer):
    """SCE-UA over the tunable parameters (module docstring: algorithm, defaults, batching)."""

    name = "sceua"

    def __init__(self, seed: int | None, budget: int, *, complexes: int = 2, points_per_complex: int | None = None,
                 subcomplex_size: int | None = None, steps_per_shuffle: int | None = None,
                 space: ParameterSpace | None = None) -> None:
        super().__init__(seed, budget, space)
        n = self.space.dim
        self.p = int(complexes)
        self.m = int(points_per_complex or 2 * n + 1)
        self.q = int(subcomplex_size or n + 1)
        self.beta = int(steps_per_shuffle or 2 * n + 1)
        if self.p < 1 or self.q < 2 or self.m < self.q or self.beta < 1:
            raise ValueError(f"SCE-UA needs complexes >= 1, 2 <= q <= m and beta >= 1; got p={self.p}, m={self.m}, "
                             f"q={self.q}, beta={self.beta}")
        self.s = self.p * self.m
        self.X = np.empty((0, n))  # the population (unit cube)
        self.F = np.empty(0)  # its scores
        self._scored = np.empty(0, dtype=bool)
        self._init_issued = 0
        self.complexes: list[list[int]] | None = None
        self._started = [0] * self.p
        self._open: list[_Step] = []  # steps started and not finished
        self._home: dict[int, int] = {}  # population index -> its complex
        self._ready: list[_Step] = []  # steps whose next evaluation is waiting to be asked
        self.shuffles = 0

    # ------------------------------------------------------------------ proposals
    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        out: list[tuple[np.ndarray, Any]] = []
        while len(out) < n:
            if self._ready:
                step = self._ready.pop(0)
                out.append((step.point, step))
            elif self.complexes is None:
                index = self._new_sample_point()
                out.append((self.X[index].copy(), ("init", index)))
            else:
                started = self._start_step()
                if started is None:
                    break  # every complex waits for scores (only with many open steps)
                out.append((started.point, started))
        return out

    def _new_sample_point(self) -> int:
        """Add a uniform point to the initial sample; returns its population index."""
        self.X = np.vstack([self.X, self.rng.random(self.space.dim)])
        self.F = np.append(self.F, -np.inf)
        self._scored = np.append(self._scored, False)
        self._init_issued += 1
        return len(self.X) - 1

    def _start_step(self) -> _Step | None:
        assert self.complexes is not None
        if min(self._started) >= self.beta:
            self._shuffle()
        order = sorted(range(self.p), key=lambda k: (self._started[k] >= self.beta, self._started[k], k))
        for k in order:
            free = self._free_points(k)
            if len(free) < self.q:
                continue
            step = self._new_step(k, free)
            self._started[k] += 1
            self._open.append(step)
            return step
        return None

    def _free_points(self, k: int) -> list[int]:
        assert self.complexes is not None  # steps start only after the initial sample is dealt into complexes
        taken = {s.target for s in self._open}
        return [i for i in self.complexes[k] if i not in taken]

    def _new_step(self, k: int, free: list[int]) -> _Step:
        ranked = sorted(free, key=lambda i: -self.F[i])  # best first (stable: ties keep complex order)
        pick = self.rng.choice(len(ranked), size=self.q, replace=False, p=trapezoidal_probabilities(len(ranked)))
        sub = [ranked[j] for j in sorted(pick)]
        worst = sub[-1]
        centroid = self.X[sub[:-1]].mean(axis=0)
        step = _Step(worst, centroid)
        r = 2.0 * centroid - self.X[worst]
        if np.any(r < 0.0) or np.any(r > 1.0):
            r = self._hypercube_point(k)
        step.point = r
        return step

    def _hypercube_point(self, k: int) -> np.ndarray:
        assert self.complexes is not None  # only a started step (complexes dealt) asks for one
        pts = self.X[self.complexes[k]]
        lo, hi = pts.min(axis=0), pts.max(axis=0)
        return lo + self.rng.random(self.space.dim) * (hi - lo)

    # ------------------------------------------------------------------ results
    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        if isinstance(token, tuple):  # a point of the initial sample
            self.F[token[1]] = score
            self._scored[token[1]] = True
            self._maybe_partition()
            return
        step: _Step = token
        improved = score > self.F[step.target]
        if improved or step.stage == "mutate":
            self.X[step.target] = u
            self.F[step.target] = score
            self._open.remove(step)
            return
        if step.stage == "reflect":
            step.stage = "contract"
            step.point = 0.5 * (step.centroid + self.X[step.target])
        else:
            step.stage = "mutate"
            step.point = self._hypercube_point(self._home[step.target])
        self._ready.append(step)

    def _observe_external(self, u: np.ndarray, score: float) -> None:
        if self.complexes is None:  # a warm start joins the initial sample
            self.X = np.vstack([self.X, u])
            self.F = np.append(self.F, score)
            self._scored = np.append(self._scored, True)
            self._maybe_partition()

    def _maybe_partition(self) -> None:
        if self.complexes is None and len(self.X) >= self.s and self._scored.all():
            self._deal()

    def _deal(self) -> None:
        order = np.argsort(-self.F, kind="stable")
        self.complexes = [[int(i) for i in order[k::self.p]] for k in range(self.p)]
        self._home = {i: k for k, members in enumerate(self.complexes) for i in members}
        self._started = [0] * self.p

    def _shuffle(self) -> None:
        self.shuffles += 1
        log.debug("SCE-UA shuffle %d after %d evaluations, best %.4f", self.shuffles, self.n_told, self._best_score)
        self._deal()
