"""The reward ledger: per-turn and terminal rewards from the environment's own record.

Nothing here reads model text. The environment tells the ledger what happened (a valid
set_parameters, a successful or failed run, a credited evaluation with the NSE the simulator's
output gave, a parse failure) and the ledger pays what the preset says (``RewardConfig``).

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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from hydroagent_hpc.config import RewardConfig

__all__ = ["RewardLedger", "Payment"]


@dataclass(frozen=True)
class Payment:
    reward: float
    terms: dict[str, float]


def _clip(x: float, lo_hi: tuple[float, float]) -> float:
    return min(max(x, lo_hi[0]), lo_hi[1])


@dataclass
class RewardLedger:
    """Keeps the running best and the counts the terminal reward needs."""

    config: RewardConfig
    target: float
    best: float | None = None
    previous: float | None = None
    n_eval: int = 0
    n_improve: int = 0
    history: list[float] = field(default_factory=list)

    def _pay(self, terms: dict[str, float]) -> Payment:
        if not self.config.per_turn:
            return Payment(0.0, {f"unpaid_{k}": v for k, v in terms.items()})
        return Payment(float(sum(terms.values())), terms)

    def set_parameters(self) -> Payment:
        return self._pay({"set_parameters_ok": self.config.set_parameters_ok})

    def simulation(self, ok: bool) -> Payment:
        if ok:
            return self._pay({"simulation_ok": self.config.simulation_ok})
        return self._pay({"simulation_failed": self.config.simulation_failed})

    def parse_failure(self) -> Payment:
        return self._pay({"parse_failure": self.config.parse_failure})

    def nothing(self) -> Payment:
        return Payment(0.0, {})

    def evaluation(self, nse: float) -> tuple[Payment, bool]:
        """A credited evaluation with the run's NSE; returns the payment and whether it improved the best.

        A non-finite NSE (zero-variance observations) counts as an evaluation without improvement.
        """
        cfg = self.config
        self.n_eval += 1
        if not math.isfinite(nse):
            return self._pay({"delta_nse_best": 0.0}), False
        self.history.append(nse)
        before = self.best
        improved = before is None or nse > before
        if improved:
            self.n_improve += 1
            self.best = nse
        d_best = _clip(self.best, cfg.delta_clip) - (_clip(before, cfg.delta_clip) if before is not None else 0.0)
        d_prev = nse - (self.previous if self.previous is not None else 0.0)
        self.previous = nse
        paid, logged = ("delta_nse_best", "delta_nse_previous") if cfg.delta_nse == "best" else \
            ("delta_nse_previous", "delta_nse_best")
        values = {"delta_nse_best": d_best, "delta_nse_previous": d_prev}
        if cfg.delta_nse == "off" or not cfg.per_turn:
            return Payment(0.0, {f"unpaid_{k}": v for k, v in values.items()}), improved
        return Payment(values[paid], {paid: values[paid], f"unpaid_{logged}": values[logged]}), improved

    def terminal(self) -> Payment:
        cfg = self.config
        if self.best is None:
            return Payment(cfg.empty_penalty, {"empty_penalty": cfg.empty_penalty})
        terms = {
            "best_nse_clipped": _clip(self.best, cfg.best_clip),
            "target_bonus": cfg.target_bonus if self.best > self.target else 0.0,
            "eval_bonus": cfg.eval_bonus * self.n_eval,
            "improve_bonus": cfg.improve_bonus * max(0, self.n_improve - 1),
        }
        return Payment(float(sum(terms.values())), terms)
