"""The reward ledger: per-turn and terminal rewards from the environment's own record.

Nothing here reads model text. The environment tells the ledger what happened (a set_parameters
with the parameters before and after, a successful or failed run of a parameter set, a credited
evaluation with the NSE the simulator's output gave, a parse failure) and the ledger pays what
the preset says (``RewardConfig``).

Terms (li2026hydroagent section 2.4; docs/reference-implementation.md section 5):

* per turn: ``set_parameters_ok``, ``simulation_ok`` / ``simulation_failed``,
  ``parse_failure``, and on a credited evaluate
  ``delta_nse_best = clip(best_t) - clip(best_{t-1})`` (best_0 = 0, clip to ``delta_clip``)
  or ``delta_nse_previous = NSE_t - NSE_{t-1}`` (NSE_0 = 0, the released code's form);
* terminal: ``empty_penalty`` when no evaluation was credited, else
  ``clip(best) + target_bonus·[best > target] + eval_bonus·n_eval
  + improve_bonus·max(0, n_improve - 1)``.

An evaluation is credited only for a fresh successful run (the environment enforces it), so
evaluating the same run twice earns nothing the second time.

Shaping that cannot be farmed (``shaping: "safe"``, the default of both presets)
--------------------------------------------------------------------------------
The activity bonuses (``set_parameters_ok``, ``simulation_ok``, ``eval_bonus``,
``improve_bonus``) taken literally pay for activity, not progress: 47 no-op set_parameters
calls earn +0.94, 50 runs of one parameter set +2.5, identical run/evaluate pairs +0.02 each,
and a ladder of worse-then-better sets +0.10 per rung. In safe mode the ledger pays

* ``set_parameters_ok`` only when the call changes the parameters to a set the episode has
  not held before (no-ops and change-and-change-back pay nothing), and at most once between
  two runs (a queued candidate counts as a run in the rounds protocol);
* ``simulation_ok`` only for the first run of a parameter set in the episode;
* ``eval_bonus`` only per distinct parameter set evaluated (``n_eval`` in the terminal
  counts distinct sets; the environment's counters keep every credited evaluation);
* all four bonuses together at most ``shaping_cap`` per episode: per-turn bonuses are paid
  until the cap is spent, the terminal bonuses get what is left. A payment cut by the cap
  carries a negative ``shaping_cap`` term, so the paid terms still sum to the reward.

Penalties (``parse_failure``, ``simulation_failed``) are always paid and must be <= 0 in safe
mode. The change in NSE is not shaping: ``delta_nse_best`` is non-zero only when the best
improves (or at the first credited evaluation, from best_0 = 0), so its sum over an episode
is clip(best), whatever the route; ``delta_nse_previous`` sums to the last NSE <= best.

Guarantee (epsilon): for any transcript T whose best NSE is that of parameter set P, and the
direct transcript D = set P, run, evaluate, R(T) - R(D) <= shaping_cap - shaping(D) <=
``shaping_cap`` (0.25 by default); farming at P itself (no-op sets, repeated runs, repeated
run/evaluate pairs, stale evaluates) earns exactly nothing over D.
``tests/test_rewards_farming.py`` checks both on generated transcripts of real episodes.
``shaping: "literal"`` pays the constants as written (no novelty rule, no cap), for ablations.

A paid term is a key without the ``unpaid_`` prefix; ``reward == sum`` of the paid terms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from hydroagent_hpc.config import RewardConfig

__all__ = ["RewardLedger", "Payment", "param_key"]

ParamKey = tuple[tuple[str, float], ...]


@dataclass(frozen=True)
class Payment:
    reward: float
    terms: dict[str, float]


def _clip(x: float, lo_hi: tuple[float, float]) -> float:
    return min(max(x, lo_hi[0]), lo_hi[1])


def param_key(params: Mapping[str, float]) -> ParamKey:
    """A hashable identity of a parameter set: its (name, value) pairs by name, values exact."""
    return tuple(sorted((str(k), float(v) + 0.0) for k, v in params.items()))


@dataclass
class RewardLedger:
    """Keeps the running best, the counts the terminal reward needs, and what shaping has paid."""

    config: RewardConfig
    target: float
    best: float | None = None
    previous: float | None = None
    n_eval: int = 0  # credited evaluations
    n_eval_paid: int = 0  # those the eval bonus counts (safe: distinct parameter sets)
    n_improve: int = 0
    shaping_paid: float = 0.0  # per-turn bonuses paid so far; counts against shaping_cap
    history: list[float] = field(default_factory=list)
    held: set[ParamKey] = field(default_factory=set)  # parameter sets the episode has held
    ran: set[ParamKey] = field(default_factory=set)  # parameter sets run (ok or not)
    evaluated: set[ParamKey] = field(default_factory=set)  # parameter sets credited by an evaluate
    set_paid_since_run: bool = False  # safe: one paid set_parameters per run

    @property
    def safe(self) -> bool:
        return self.config.shaping == "safe"

    def _pay(self, terms: dict[str, float]) -> Payment:
        if not self.config.per_turn:
            return Payment(0.0, {f"unpaid_{k}": v for k, v in terms.items()})
        return Payment(float(sum(terms.values())), terms)

    def _room(self) -> float:
        """What the cap still allows (infinite for literal shaping)."""
        if not self.safe:
            return math.inf
        return max(0.0, self.config.shaping_cap - self.shaping_paid)

    def _bonus(self, name: str, value: float, novel: bool) -> Payment:
        """A per-turn activity bonus: paid if novel (always, for literal shaping), within the cap."""
        if not self.config.per_turn or (self.safe and not novel):
            return Payment(0.0, {f"unpaid_{name}": value})
        if value <= 0.0:  # a cost per call, not a bonus: nothing to cap
            return Payment(value, {name: value})
        granted = min(value, self._room())
        if self.safe:
            self.shaping_paid += granted
        terms = {name: value}
        if granted < value:
            terms["shaping_cap"] = granted - value
        return Payment(granted, terms)

    def set_parameters(self, before: Mapping[str, float], after: Mapping[str, float]) -> Payment:
        """A valid set_parameters that moved the parameters from ``before`` to ``after``."""
        old, new = param_key(before), param_key(after)
        novel = new != old and new not in self.held and not self.set_paid_since_run
        self.held.update((old, new))
        pay = self._bonus("set_parameters_ok", self.config.set_parameters_ok, novel)
        self.set_paid_since_run = self.set_paid_since_run or novel
        return pay

    def simulation(self, ok: bool, params: Mapping[str, float]) -> Payment:
        """A run of ``params``: the bonus for the first run of a set, the penalty for any failure."""
        key = param_key(params)
        novel = key not in self.ran
        self.ran.add(key)
        self.set_paid_since_run = False
        if ok:
            return self._bonus("simulation_ok", self.config.simulation_ok, novel)
        return self._pay({"simulation_failed": self.config.simulation_failed})

    def parse_failure(self) -> Payment:
        return self._pay({"parse_failure": self.config.parse_failure})

    def nothing(self) -> Payment:
        return Payment(0.0, {})

    def queued(self) -> Payment:
        """A candidate queued for the round (rounds protocol): pays nothing; counts as a run for the
        once-per-run rule of ``set_parameters_ok``."""
        self.set_paid_since_run = False
        return Payment(0.0, {})

    def evaluation(self, nse: float, params: Mapping[str, float]) -> tuple[Payment, bool]:
        """A credited evaluation of a run of ``params`` with its NSE; returns the payment and whether it
        improved the best.

        A non-finite NSE (zero-variance observations) counts as an evaluation without improvement.
        """
        cfg = self.config
        self.n_eval += 1
        key = param_key(params)
        if key not in self.evaluated or not self.safe:
            self.n_eval_paid += 1
        self.evaluated.add(key)
        if not math.isfinite(nse):
            return self._pay({"delta_nse_best": 0.0}), False
        self.history.append(nse)
        before = self.best
        improved = before is None or nse > before
        best = nse if improved else before
        assert best is not None  # improved is True whenever before is None
        if improved:
            self.n_improve += 1
            self.best = best
        d_best = _clip(best, cfg.delta_clip) - (_clip(before, cfg.delta_clip) if before is not None else 0.0)
        d_prev = nse - (self.previous if self.previous is not None else 0.0)
        self.previous = nse
        paid, logged = ("delta_nse_best", "delta_nse_previous") if cfg.delta_nse == "best" else \
            ("delta_nse_previous", "delta_nse_best")
        values = {"delta_nse_best": d_best, "delta_nse_previous": d_prev}
        if cfg.delta_nse == "off" or not cfg.per_turn:
            return Payment(0.0, {f"unpaid_{k}": v for k, v in values.items()}), improved
        return Payment(values[paid], {paid: values[paid], f"unpaid_{logged}": values[logged]}), improved

    def terminal(self) -> Payment:
        """The terminal reward (pure: calling it twice pays the same)."""
        cfg = self.config
        if self.best is None:
            return Payment(cfg.empty_penalty, {"empty_penalty": cfg.empty_penalty})
        terms = {
            "best_nse_clipped": _clip(self.best, cfg.best_clip),
            "target_bonus": cfg.target_bonus if self.best > self.target else 0.0,
            "eval_bonus": cfg.eval_bonus * self.n_eval_paid,
            "improve_bonus": cfg.improve_bonus * max(0, self.n_improve - 1),
        }
        bonus = terms["eval_bonus"] + terms["improve_bonus"]
        if bonus > 0.0:
            granted = min(bonus, self._room())
            if granted < bonus:
                terms["shaping_cap"] = granted - bonus
        return Payment(float(sum(terms.values())), terms)
