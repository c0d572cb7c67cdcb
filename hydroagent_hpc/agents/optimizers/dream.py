"""DREAM, the DiffeRential Evolution Adaptive Metropolis sampler (Vrugt et al. 2009), ask/tell.

Classic DREAM (Vrugt, J. A., ter Braak, C. J. F., Diks, C. G. H., Robinson, B. A., Hyman, J. M.
and Higdon, D., 2009, *Int. J. Nonlin. Sci. Num.* 10(3), 273-290; settings as in Vrugt 2016,
*Environ. Model. Softw.* 75, 273-316), the sampler the paper's human expert used. It is an MCMC
method, not an optimiser: here it runs within the same simulation budget as the others and
reports the best score it met (the agents are compared on best NSE, like the paper).

``N`` chains in the unit cube of the 11 tunable parameters, started from a Latin hypercube of
``N`` points. Each generation proposes, for every chain ``i`` from the chains' current states
``X``:

* ``δ ~ U{1..δ_max}`` pairs of other chains ``r1(j) != r2(j) != i``, all distinct;
* crossover: ``CR = m/n_CR`` with ``m ~ p_CR``; the dimensions ``A`` with ``U < CR`` are updated
  (at least one), ``d' = |A|``;
* ``dX_i[A] = ζ + (1 + λ)·γ(δ, d')·Σ_j (X_r1(j)[A] - X_r2(j)[A])``, ``λ ~ U(-c, c)``,
  ``ζ ~ N(0, c*²)``, ``γ = 2.38/sqrt(2δd')``, and ``γ = 1`` with probability ``p_γ`` (mode
  jumping); other dimensions unchanged;
* bounds: reflection at 0 and 1, and a uniform draw for a coordinate still outside;
* Metropolis: chain ``i`` moves to the proposal with probability ``min(1, exp(ℓ(z) - ℓ(x_i)))``.

During burn-in (the first half of the budget) the crossover probabilities ``p_CR`` adapt to the
normalised squared jump distance each ``CR`` achieves (``p_m ∝ Δ_m / L_m``, kept at least
``0.1/n_CR`` so no value dies out), and after each generation chains whose mean ``ℓ`` over the
last half of their samples falls below ``Q1 - 2·IQR`` of all chains' means are reset to the
current best chain's state and history (the outlier test; we do not restart burn-in after it).

Likelihood from NSE (documented choice): for Gaussian, independent residuals with unknown
variance integrated out under Jeffreys' prior (Box and Tiao 1973), ``ℓ = -(n/2)·ln(SSE)`` up to a
constant, and ``SSE = (1 - NSE)·Σ(o - ō)²``, so ``ℓ(NSE) = -(n_eff/2)·ln(1 - NSE)``. Hourly
residuals are strongly autocorrelated, so ``n`` is the *effective* sample size
``n_eff ≈ n·(1 - ρ₁)/(1 + ρ₁)``; with ``n ≈ 1440`` hourly steps and ``ρ₁ ≈ 0.95`` that is about
40, and the agent does not observe ``ρ₁``, so ``n_eff`` is an option, default 50. A failed run
(non-finite NSE) has ``ℓ = -inf``: never accepted; a chain sitting on a failed start always moves.

Defaults: ``N = 10`` chains (one generation fills one 10-candidate round; DREAM needs
``N >= 2δ_max + 1``), ``δ_max = 3``, ``n_CR = 3``, ``c = 0.1``, ``c* = 1e-6``, ``p_γ = 0.2``.

Batching: the generation's ``N`` proposals are made together from the states at its start, so a
batch holds up to the rest of the current generation; the next generation needs all scores of
this one, so a batch larger than what is left of a generation comes back short.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np
from scipy.stats import qmc

from hydroagent_hpc.agents.optimizers.space import AskTellOptimizer, ParameterSpace

log = logging.getLogger(__name__)

__all__ = ["DREAM", "nse_log_likelihood"]


def nse_log_likelihood(nse: float, n_eff: float = 50.0) -> float:
    """``ℓ = -(n_eff/2)·ln(1 - NSE)``; ``-inf`` for a non-finite NSE; ``1 - NSE`` floored at 1e-12."""
    if not math.isfinite(nse):
        return float("-inf")
    return -0.5 * n_eff * math.log(max(1.0 - nse, 1e-12))


class DREAM(AskTellOptimizer):
    """Classic DREAM over the tunable parameters (module docstring: algorithm, likelihood, defaults)."""

    name = "dream"

    def __init__(self, seed: int | None, budget: int, *, chains: int = 10, delta_max: int = 3, n_cr: int = 3,
                 c: float = 0.1, c_star: float = 1e-6, p_gamma_one: float = 0.2, n_eff: float = 50.0,
                 burn_in_fraction: float = 0.5, space: ParameterSpace | None = None) -> None:
        super().__init__(seed, budget, space)
        if chains < 3:
            raise ValueError(f"chains={chains}: DREAM needs at least 3 chains")
        self.N = int(chains)
        self.delta_max = max(1, min(int(delta_max), (self.N - 1) // 2))
        self.n_cr = int(n_cr)
        self.c, self.c_star, self.p_gamma_one, self.n_eff = float(c), float(c_star), float(p_gamma_one), float(n_eff)
        self.burn_in = int(burn_in_fraction * self.budget)
        d = self.space.dim
        self.p_cr = np.full(self.n_cr, 1.0 / self.n_cr)
        self._cr_jump = np.zeros(self.n_cr)
        self._cr_count = np.zeros(self.n_cr)
        self.X = qmc.LatinHypercube(d=d, rng=np.random.default_rng(self.rng.integers(2**63))).random(self.N)
        self.logl = np.full(self.N, -np.inf)
        self.history: list[list[float]] = [[] for _ in range(self.N)]
        self.generation = -1  # -1: the initial states are being scored
        self._props = self.X.copy()
        self._prop_cr = np.zeros(self.N, dtype=int)
        self._prop_logl = np.full(self.N, -np.inf)
        self._told = np.zeros(self.N, dtype=bool)
        self._next = 0  # next proposal of the generation to hand out
        self.accepted = 0
        self.proposed = 0
        self.resets = 0

    # ------------------------------------------------------------------ proposals
    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        out: list[tuple[np.ndarray, Any]] = []
        while len(out) < n:
            if self._next < self.N:
                i = self._next
                self._next += 1
                out.append((self._props[i].copy(), (self.generation, i)))
            elif self._told.all():
                self._new_generation()
            else:
                break
        return out

    def _new_generation(self) -> None:
        self.generation += 1
        d = self.space.dim
        for i in range(self.N):
            delta = int(self.rng.integers(1, self.delta_max + 1))
            others = np.array([j for j in range(self.N) if j != i])
            r = self.rng.choice(others, size=2 * delta, replace=False)
            m = int(self.rng.choice(self.n_cr, p=self.p_cr))
            cr = (m + 1) / self.n_cr
            a = self.rng.random(d) < cr
            if not a.any():
                a[self.rng.integers(d)] = True
            d_eff = int(a.sum())
            gamma = 2.38 / math.sqrt(2.0 * delta * d_eff)
            if self.rng.random() < self.p_gamma_one:
                gamma = 1.0
            diff = (self.X[r[:delta]] - self.X[r[delta:]]).sum(axis=0)
            lam = self.rng.uniform(-self.c, self.c, d)
            zeta = self.rng.normal(0.0, self.c_star, d)
            z = self.X[i].copy()
            z[a] += zeta[a] + (1.0 + lam[a]) * gamma * diff[a]
            self._props[i] = self._bound(z)
            self._prop_cr[i] = m
        self._told[:] = False
        self._next = 0

    def _bound(self, z: np.ndarray) -> np.ndarray:
        z = np.where(z < 0.0, -z, z)
        z = np.where(z > 1.0, 2.0 - z, z)
        bad = (z < 0.0) | (z > 1.0)
        if bad.any():
            z[bad] = self.rng.random(int(bad.sum()))
        return z

    # ------------------------------------------------------------------ results
    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        generation, i = token
        if generation != self.generation or self._told[i]:
            return  # a stale or repeated answer: only the best is updated
        self._prop_logl[i] = nse_log_likelihood(score, self.n_eff)
        self._told[i] = True
        if self._told.all():
            self._close_generation()

    def _close_generation(self) -> None:
        if self.generation < 0:  # the initial states
            self.logl = self._prop_logl.copy()
            for i in range(self.N):
                self.history[i].append(self.logl[i])
            return
        old = self.X.copy()
        for i in range(self.N):
            new_l, cur_l = self._prop_logl[i], self.logl[i]
            u = self.rng.random()
            if new_l == -np.inf:
                accept = cur_l == -np.inf
            elif cur_l == -np.inf:
                accept = True
            else:
                accept = u < math.exp(min(0.0, new_l - cur_l))
            self.proposed += 1
            if accept:
                self.accepted += 1
                self.X[i] = self._props[i]
                self.logl[i] = new_l
            self.history[i].append(self.logl[i])
        if self.n_told <= self.burn_in:
            self._adapt_crossover(old)
            self._remove_outliers()

    def _adapt_crossover(self, old: np.ndarray) -> None:
        """``Δ_m += Σ_j (x_new - x_old)_j² / var_j``; ``p_m ∝ Δ_m / L_m`` (Vrugt et al. 2009, sec. 3)."""
        var = old.var(axis=0)
        var = np.where(var > 0.0, var, 1.0)
        jump = (((self.X - old) ** 2) / var).sum(axis=1)
        np.add.at(self._cr_jump, self._prop_cr, jump)
        np.add.at(self._cr_count, self._prop_cr, 1.0)
        if (self._cr_count > 0).all() and self._cr_jump.sum() > 0.0:
            w = self._cr_jump / self._cr_count
            p = w / w.sum()
            p = np.maximum(p, 0.1 / self.n_cr)
            self.p_cr = p / p.sum()

    def _remove_outliers(self) -> None:
        """Reset chains below ``Q1 - 2·IQR`` of the chains' mean ℓ over their last halves."""
        omega = np.array([np.mean(h[len(h) // 2:]) for h in self.history])
        finite = np.isfinite(omega)
        if finite.sum() < 2:
            return
        q1, q3 = np.percentile(omega[finite], [25.0, 75.0])
        outliers = ~finite | (omega < q1 - 2.0 * (q3 - q1))
        if not outliers.any():
            return
        best = int(np.argmax(self.logl))
        for i in np.flatnonzero(outliers):
            if i == best:
                continue
            self.X[i] = self.X[best]
            self.logl[i] = self.logl[best]
            self.history[i] = list(self.history[best])
            self.resets += 1
        log.debug("DREAM generation %d: reset %d outlier chain(s)", self.generation, int(outliers.sum()))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.proposed if self.proposed else float("nan")
