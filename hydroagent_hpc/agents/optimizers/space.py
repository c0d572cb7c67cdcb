"""The search space of the classic optimizers and their ask/tell contract.

Every optimizer in :mod:`hydroagent_hpc.agents` (DDS, SCE-UA, DREAM, Latin hypercube, random
search) works in the unit cube ``[0, 1]^11`` of the 11 tunable multipliers (``params.TUNABLE``;
``th`` and ``isu`` are fixed and never proposed) and maps a point ``u`` to parameters linearly,
``x = lower + u·(upper - lower)``, clipped to the bounds of ``params.PARAMS``. Linear scaling is
what the papers use (DDS perturbs with ``r·(upper - lower)``; SCE-UA samples uniformly in the
feasible box), so by default the algorithms are the published ones.

A basin with Snow-17 calibrates its 8 snow parameters too: ``ParameterSpace.of(env.parameters)``
(what :class:`~hydroagent_hpc.agents.optimizers.policy.OptimizerPolicy` builds for such a basin)
is the 19-dimensional box of the 11 multipliers and the snow parameters' bounds
(``params.SNOW_PARAMS``); every other basin keeps the 11.

``ParameterSpace.log_scaled()`` (``scale="log"`` in the optimizer factory) maps the multipliers
whose range spans a factor of 10 or more and whose lower bound is a real scale (``>= 0.01``:
wm, fc, iwu, under, leaki, alpha, beta) logarithmically, ``x = lower·(upper/lower)^u``, so a
step is a ratio, as multipliers are usually calibrated; ``b`` (lower bound 1e-6, a numerical floor),
``im``, ``alpha0`` (lower bound 0) and ``ke`` stay linear.

The contract (:class:`Optimizer`): ``ask(n)`` proposes up to ``n`` parameter dicts (all 11
names), ``tell(candidates, scores)`` reports their scores, ``best`` is ``(params, score)``. The
score is maximised (NSE). A score that is not a finite number (``None``, NaN, ±inf: a failed
run) counts as ``-inf``, the worst possible. ``tell`` matches candidates to earlier asks by their
values; a candidate that was never asked (a warm start evaluated elsewhere) is accepted too and
handed to the optimizer as external knowledge (what each one does with it is in its docstring).

:class:`AskTellOptimizer` does the bookkeeping (random generator from ``seed``, pending asks,
best so far, the trace of told scores) so each algorithm only writes ``_propose`` and
``_observe``.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from hydroagent_hpc.params import SNOW_PARAMS, TUNABLE, ParameterSet, spec_of

__all__ = ["Candidate", "Optimizer", "ParameterSpace", "AskTellOptimizer", "clean_score", "reflect"]

Candidate = dict[str, float]


def clean_score(score: Any) -> float:
    """A score as the optimizers see it: finite numbers as floats, anything else ``-inf``."""
    try:
        v = float(score)
    except (TypeError, ValueError):
        return float("-inf")
    return v if math.isfinite(v) else float("-inf")


def reflect(u: np.ndarray) -> np.ndarray:
    """Mirror coordinates that left ``[0, 1]`` back inside (Tolson and Shoemaker 2007, step 3).

    ``u < 0`` becomes ``-u`` and ``u > 1`` becomes ``2 - u``; a coordinate that the mirror
    throws past the opposite bound is set to the bound it was reflected from (``0`` or ``1``),
    as in DDS. Works elementwise on any array.
    """
    u = np.asarray(u, dtype=float)
    out = u.copy()
    low = u < 0.0
    high = u > 1.0
    out[low] = -u[low]
    out[low & (out > 1.0)] = 0.0
    out[high] = 2.0 - u[high]
    out[high & (out < 0.0)] = 1.0
    return out


class ParameterSpace:
    """The box of the tunable multipliers and the linear map to and from the unit cube."""

    def __init__(self, names: Sequence[str] = TUNABLE, log_names: Sequence[str] = ()) -> None:
        self.names = tuple(names)
        for n in self.names:
            if not isinstance(n, str) or n not in (*TUNABLE, *SNOW_PARAMS):
                raise ValueError(f"{n!r} is not a tunable parameter; tunable: {', '.join(TUNABLE)} "
                                 f"(with Snow-17 also {', '.join(SNOW_PARAMS)})")
        self.lower = np.array([spec_of(n).lower for n in self.names], dtype=float)
        self.upper = np.array([spec_of(n).upper for n in self.names], dtype=float)
        self.width = self.upper - self.lower
        bad = [n for n in log_names if n not in self.names or spec_of(n).lower <= 0.0]
        if bad:
            raise ValueError(f"cannot log-scale {', '.join(bad)}: a log-scaled parameter needs a lower bound > 0")
        self.log_names = tuple(n for n in self.names if n in log_names)
        self._log = np.array([n in self.log_names for n in self.names])
        self._log_lower = np.log(np.where(self._log, self.lower, 1.0))
        self._log_width = np.log(np.where(self._log, self.upper, 1.0)) - self._log_lower

    @classmethod
    def log_scaled(cls, names: Sequence[str] = TUNABLE) -> ParameterSpace:
        """Log scale for every multiplier with ``lower >= 0.01`` and ``upper/lower >= 10`` (module docstring)."""
        logs = [n for n in names if spec_of(n).lower >= 0.01 and spec_of(n).upper / spec_of(n).lower >= 10.0]
        return cls(names, log_names=logs)

    @classmethod
    def of(cls, parameters: ParameterSet, scale: str = "log") -> ParameterSpace:
        """The space of a basin's parameter set (``env.parameters``): 11 names, or 19 with Snow-17."""
        if scale not in ("linear", "log"):
            raise ValueError(f"scale={scale!r}: use 'linear' or 'log'")
        return cls.log_scaled(parameters.tunable) if scale == "log" else cls(parameters.tunable)

    @property
    def dim(self) -> int:
        return len(self.names)

    def to_params(self, u: np.ndarray) -> Candidate:
        """Unit-cube point -> parameter dict (Python floats, inside the bounds)."""
        u = np.clip(u, 0.0, 1.0)
        x = self.lower + u * self.width
        if self.log_names:
            x = np.where(self._log, np.exp(self._log_lower + u * self._log_width), x)
        x = np.clip(x, self.lower, self.upper)
        return {n: float(v) for n, v in zip(self.names, x)}

    def to_unit(self, params: Mapping[str, float]) -> np.ndarray:
        """Parameter dict -> unit-cube point (values outside the bounds are clipped)."""
        missing = [n for n in self.names if n not in params]
        if missing:
            raise ValueError(f"candidate lacks {', '.join(missing)}; a candidate names all of {', '.join(self.names)}")
        x = np.clip(np.array([float(params[n]) for n in self.names]), self.lower, self.upper)
        u = (x - self.lower) / self.width
        if self.log_names:
            u = np.where(self._log, (np.log(np.where(self._log, x, 1.0)) - self._log_lower) /
                         np.where(self._log, self._log_width, 1.0), u)
        return np.clip(u, 0.0, 1.0)

    def key(self, params: Mapping[str, float]) -> tuple[float, ...]:
        return tuple(float(params.get(n, math.nan)) for n in self.names)


@runtime_checkable
class Optimizer(Protocol):
    """Ask/tell optimizer over the tunable parameters, maximising the told score."""

    name: str
    budget: int

    def ask(self, n: int) -> list[Candidate]:
        ...

    def tell(self, candidates: Sequence[Mapping[str, float]], scores: Sequence[float]) -> None:
        ...

    @property
    def best(self) -> tuple[Candidate | None, float]:
        ...


class AskTellOptimizer:
    """Shared bookkeeping: seeded generator, pending asks, best so far, trace of scores.

    Subclasses implement ``_propose(n) -> list[(u, token)]`` (up to ``n`` unit-cube points, each
    with an opaque token handed back on tell) and ``_observe(token, u, score)``; optionally
    ``_observe_external(u, score)`` for told points that were never asked.
    """

    name = "optimizer"

    def __init__(self, seed: int | None, budget: int, space: ParameterSpace | None = None) -> None:
        if isinstance(budget, bool) or int(budget) < 1:
            raise ValueError(f"budget={budget!r}: the number of simulations must be at least 1")
        self.seed = seed
        self.budget = int(budget)
        self.rng = np.random.default_rng(seed)
        self.space = space or ParameterSpace()
        self.n_asked = 0
        self.n_told = 0
        self.scores: list[float] = []  # told scores in order (asked and external)
        self._pending: dict[tuple[float, ...], deque[tuple[np.ndarray, Any]]] = {}
        self._best_u: np.ndarray | None = None
        self._best_score = float("-inf")

    # ------------------------------------------------------------------ contract
    def ask(self, n: int) -> list[Candidate]:
        """Up to ``n`` new candidates (fewer only where the algorithm must wait for scores)."""
        if isinstance(n, bool) or int(n) < 0:
            raise ValueError(f"ask(n={n!r}): n must be a whole number >= 0")
        out = []
        for u, token in self._propose(int(n)):
            u = np.clip(np.asarray(u, dtype=float), 0.0, 1.0)
            params = self.space.to_params(u)
            self._pending.setdefault(self.space.key(params), deque()).append((u, token))
            out.append(params)
        self.n_asked += len(out)
        return out

    def tell(self, candidates: Sequence[Mapping[str, float]], scores: Sequence[float]) -> None:
        """Report scores (higher is better; non-finite = failed) for asked or external points."""
        if len(candidates) != len(scores):
            raise ValueError(f"tell: {len(candidates)} candidates but {len(scores)} scores")
        for cand, raw in zip(candidates, scores):
            score = clean_score(raw)
            queue = self._pending.get(self.space.key(cand))
            if queue:
                u, token = queue.popleft()
                if not queue:
                    del self._pending[self.space.key(cand)]
                self.n_told += 1
                self._record(u, score)
                self._observe(token, u, score)
            else:
                u = self.space.to_unit(cand)
                self._record(u, score)
                self._observe_external(u, score)

    @property
    def best(self) -> tuple[Candidate | None, float]:
        """``(params, score)`` of the best told point; ``(None, -inf)`` before any finite score."""
        if self._best_u is None:
            return None, float("-inf")
        return self.space.to_params(self._best_u), self._best_score

    @property
    def pending(self) -> int:
        """How many asked candidates have no score yet."""
        return sum(len(q) for q in self._pending.values())

    # ------------------------------------------------------------------ hooks
    def _propose(self, n: int) -> list[tuple[np.ndarray, Any]]:
        raise NotImplementedError

    def _observe(self, token: Any, u: np.ndarray, score: float) -> None:
        raise NotImplementedError

    def _observe_external(self, u: np.ndarray, score: float) -> None:
        """Default: a point evaluated elsewhere only updates the best (done by ``_record``)."""

    def _record(self, u: np.ndarray, score: float) -> None:
        self.scores.append(score)
        if score > self._best_score:
            self._best_u = np.array(u, dtype=float)
            self._best_score = score
