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
and a ladder of worse-then-better sets +0.10 per rung. Every bonus a transcript can collect
beyond what the direct route to its result collects is, by definition, a bonus it can farm, so
safe shaping gives the bonuses an episode *budget* fixed by the shortest successful episode
(run, evaluate) and lets a transcript earn at most ``epsilon = shaping_cap`` (0.05) beyond it:

* novelty (what counts at all): ``set_parameters_ok`` only when the call changes the
  parameters to a set the episode has not held before, and at most once between two runs (a
  queued candidate counts as a run in the rounds protocol); ``simulation_ok`` only for the first
  run of a parameter set; ``eval_bonus`` per distinct parameter set evaluated (``n_eval`` in the
  terminal counts distinct sets; the environment's counters keep every credited evaluation);
* budget: with ``s+ = max(0, x)`` and ``[turns]`` = 1 when runs are paid per turn (per-turn
  terms on and the turns protocol; the rounds protocol pays no run bonus)::

      b_min = [turns] simulation_ok+ + eval_bonus+          (what run, evaluate is paid)
      B     = b_min + epsilon                                (all four bonuses, per episode)
      C     = [turns] simulation_ok+ + min(set_parameters_ok+, epsilon)   (the per-turn part)

  Per-turn bonuses are paid in order until ``C`` is spent: the first valid change of the
  parameters and the first successful run, the steps of every direct route, are paid in full
  (0.02 + 0.05 with the published constants, where ``set_parameters_ok <= epsilon``); later ones
  are recorded with their cut. The terminal
  bonuses for distinct evaluations and for improvements get ``B - (per-turn paid)``, which is
  at least ``eval_bonus+``: the slack epsilon is left to evaluating more parameter sets and
  improving on them (progress), not to more calls. A payment cut by the budget carries a
  negative ``shaping_cap`` term, so the paid terms still sum to the reward.

Why this design. A potential-based shaping (pay Phi(s') - Phi(s), Phi = 0 at the end) cannot
be farmed either, but it sums to a constant over every episode, so under the default
episode-sum credit of GRPO it pays nothing and a rollout that makes valid calls is worth no more
than one that does not call at all. Paying "only for progress" (per improvement) is still
farmed by a ladder, whose every rung is progress. A budget keeps what the bonuses are for: a
valid call and a successful run are worth +0.07 over an episode without them (the dense signal
a model that never calls the tool needs), evaluating another set and improving on it is worth up
to epsilon more, and nothing beyond that is for sale.

Penalties (``parse_failure``, ``simulation_failed``) are always paid and must be <= 0 in safe
mode; a negative activity constant is a cost, paid outside the budget. The change in NSE is not
shaping: ``delta_nse_best`` is non-zero only when the best improves (or at the first credited
evaluation, from best_0 = 0), so its sum over an episode is clip(best), whatever the route;
``delta_nse_previous`` sums to the last NSE <= best.

Guarantee (epsilon). Let T be any transcript with a credited evaluation and D the direct
transcript to T's best parameter set P (set P, run, evaluate; the set is a no-op when P is the
initial set). Every term but the activity bonuses is the same for T and D or lower for T
(clip(best), target bonus, the NSE changes; penalties and costs are <= 0). T's bonuses are at
most B. Any transcript with a credited evaluation is paid at least b_min: its per-turn bonuses
are min(what novelty counts, C) >= ``[turns] simulation_ok+`` (a credited evaluation needs a
first successful run of some set, which novelty counts) and its terminal keeps B - C >=
``eval_bonus+``. So R(T) - R(D) <= B - b_min = epsilon = ``shaping_cap`` (0.05 by default), and
the same holds against any other transcript with a credited evaluation and the same best. The
bound is tight where P is the initial set (D then has no set_parameters to be paid). Farming at
P itself (no-op sets, repeated runs, repeated run/evaluate pairs, stale evaluates) earns exactly
nothing over D. ``tests/test_rewards_farming.py`` checks both on generated and searched
transcripts of real episodes; docs/guarantees.md has the measured largest excess.

``shaping: "literal"`` pays the constants as written (no novelty rule, no budget), as the paper
and the released code do: farmable without limit (a ladder pays +0.19 a rung in ``paper``, +0.12
in ``released``; the largest excess measured is +2.44 and +1.50), for ablations only.

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
    """Keeps the running best, the counts the terminal reward needs, and what shaping has paid.

    ``protocol`` is the environment's ("turns" or "rounds"): it says whether runs are paid per
    turn, which fixes the shortest successful episode's bonuses (``b_min`` in the module docstring).
    """

    config: RewardConfig
    target: float
    protocol: str = "turns"
    best: float | None = None
    previous: float | None = None
    n_eval: int = 0  # credited evaluations
    n_eval_paid: int = 0  # those the eval bonus counts (safe: distinct parameter sets)
    n_improve: int = 0
    shaping_paid: float = 0.0  # per-turn bonuses paid so far; counts against the per-turn part C and the budget B
    history: list[float] = field(default_factory=list)
    held: set[ParamKey] = field(default_factory=set)  # parameter sets the episode has held
    ran: set[ParamKey] = field(default_factory=set)  # parameter sets run (ok or not)
    evaluated: set[ParamKey] = field(default_factory=set)  # parameter sets credited by an evaluate
    set_paid_since_run: bool = False  # safe: one paid set_parameters per run

    @property
    def safe(self) -> bool:
        return self.config.shaping == "safe"

    @property
    def _run_bonus(self) -> float:
        """``[turns] simulation_ok+``: the run bonus the shortest successful episode is paid per turn."""
        cfg = self.config
        return max(0.0, cfg.simulation_ok) if cfg.per_turn and self.protocol == "turns" else 0.0

    @property
    def budget(self) -> float:
        """B = b_min + epsilon: the most the four activity bonuses pay per episode (infinite for literal)."""
        if not self.safe:
            return math.inf
        return self._run_bonus + max(0.0, self.config.eval_bonus) + self.config.shaping_cap

    @property
    def turn_budget(self) -> float:
        """C = [turns] simulation_ok+ + min(set_parameters_ok+, epsilon): the per-turn part of B."""
        if not self.safe:
            return math.inf
        return self._run_bonus + min(max(0.0, self.config.set_parameters_ok), self.config.shaping_cap)

    def _pay(self, terms: dict[str, float]) -> Payment:
        if not self.config.per_turn:
            return Payment(0.0, {f"unpaid_{k}": v for k, v in terms.items()})
        return Payment(float(sum(terms.values())), terms)

    def _bonus(self, name: str, value: float, novel: bool) -> Payment:
        """A per-turn activity bonus: paid if novel (always, for literal shaping), within C."""
        if not self.config.per_turn or (self.safe and not novel):
            return Payment(0.0, {f"unpaid_{name}": value})
        if value <= 0.0:  # a cost per call, not a bonus: outside the budget
            return Payment(value, {name: value})
        if not self.safe:
            return Payment(value, {name: value})
        granted = min(value, max(0.0, self.turn_budget - self.shaping_paid))
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
        bonus = max(0.0, terms["eval_bonus"]) + max(0.0, terms["improve_bonus"])  # costs are paid in full
        if bonus > 0.0:
            granted = min(bonus, max(0.0, self.budget - self.shaping_paid))
            if granted < bonus:
                terms["shaping_cap"] = granted - bonus
        return Payment(float(sum(terms.values())), terms)
