"""Classic optimizers as agents: an ask/tell optimizer driving CalibrationEnv's direct tools.

:class:`OptimizerPolicy` implements :class:`~hydroagent_hpc.agents.base.DirectPolicy`: it reads
scores only from the observations the environment returns (the environment's own record) and
never looks inside it, except ``env.config`` (protocol and budget) and ``env.done``.

* "turns" protocol: per candidate, ``set_parameters`` (all 11 tunable values),
  ``run_simulation`` and, if the run succeeded, ``evaluate``; the score is the evaluate
  observation's ``NSE``. A failed run, an ``"error"`` status or a missing/non-finite NSE is a failed
  candidate (``-inf``). Three tool calls per simulation, so a ``max_turns`` cap allows
  ``max_turns // 3`` simulations.
* "rounds" protocol: per round, ``ask(min(candidates_per_round, simulations left))``, queue each
  (``set_parameters`` + ``run_simulation``), one ``evaluate`` runs the round as one batched
  simulator call; the scores are read from ``obs["candidates"]`` in queue order (their ``run``
  ids increase in that order), and all are told at once.

The parameters searched are the basin's (``env.parameters``): a policy built by name
(:func:`make_optimizer_policy`) rebuilds its optimizer over the basin's set before the first ask,
so on a basin with Snow-17 it searches 19 dimensions (the 11 multipliers and the 8 snow
parameters) and on every other basin the paper's 11.

The policy stops when the environment is done or when it has spent
``min(optimizer.budget, simulation_budget(env.config))`` simulations.

:func:`make_optimizer_policy` builds the five baselines by name (on a log scale for the
wide-range multipliers unless ``scale="linear"``; see :func:`make_optimizer`): ``dds``
(:class:`~hydroagent_hpc.agents.optimizers.dds.DDS`), ``sceua``
(:class:`~hydroagent_hpc.agents.optimizers.sceua.SCEUA`),
``lhs`` and ``random`` (:mod:`hydroagent_hpc.agents.optimizers.sampling`) and ``dream``
(:class:`~hydroagent_hpc.agents.optimizers.dream.DREAM`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from hydroagent_hpc.agents.optimizers.dds import DDS
from hydroagent_hpc.agents.optimizers.dream import DREAM
from hydroagent_hpc.agents.optimizers.sampling import LatinHypercubeSearch, RandomSearch
from hydroagent_hpc.agents.optimizers.sceua import SCEUA
from hydroagent_hpc.agents.optimizers.space import Candidate, Optimizer, ParameterSpace, clean_score
from hydroagent_hpc.params import ParameterSet

if TYPE_CHECKING:
    from hydroagent_hpc.env.environment import CalibrationEnv

log = logging.getLogger(__name__)

__all__ = ["OPTIMIZERS", "OptimizerPolicy", "make_optimizer", "make_optimizer_policy", "simulation_budget"]

OPTIMIZERS: Mapping[str, Callable[..., Optimizer]] = {
    "dds": DDS,
    "sceua": SCEUA,
    "lhs": LatinHypercubeSearch,
    "random": RandomSearch,
    "dream": DREAM,
}


def simulation_budget(config: Any) -> int | None:
    """The most simulations an optimizer can run under an :class:`~hydroagent_hpc.config.EnvConfig`.

    turns: ``min(max_simulations, max_turns // 3)``; rounds: ``min(max_simulations,
    max_rounds·candidates_per_round, what max_turns allows at 2 calls per candidate + 1 per round)``.
    ``None`` when nothing limits it.
    """
    limits = []
    if config.max_simulations is not None:
        limits.append(int(config.max_simulations))
    if config.protocol == "rounds":
        k = int(config.candidates_per_round)
        limits.append(int(config.max_rounds) * k)
        if config.max_turns is not None:
            full, rest = divmod(int(config.max_turns), 2 * k + 1)
            limits.append(full * k + max(0, (rest - 1) // 2))
    elif config.max_turns is not None:
        limits.append(int(config.max_turns) // 3)
    return min(limits) if limits else None


def _nse(obs: Mapping[str, Any] | None) -> float:
    if not isinstance(obs, Mapping) or obs.get("status") != "ok":
        return float("-inf")
    return clean_score(obs.get("NSE"))


class OptimizerPolicy:
    """Drive ``env`` with ``optimizer`` until the episode or the budget ends (module docstring).

    The optimizer keeps its state between calls: use a fresh policy (and optimizer) per episode.
    """

    def __init__(self, optimizer: Optimizer, name: str | None = None,
                 rebuild: Callable[[ParameterSet], Optimizer] | None = None) -> None:
        self.optimizer = optimizer
        self.name: str = name or str(getattr(optimizer, "name", "optimizer"))
        self.simulations = 0  # simulations this policy caused in its last run
        self.rebuild = rebuild  # the same optimizer over another basin's parameter set

    def _adopt(self, env: CalibrationEnv) -> None:
        """Search the basin's parameters (``env.parameters``) where they differ from the optimizer's space."""
        pset = getattr(env, "parameters", None)
        space = getattr(self.optimizer, "space", None)
        if not isinstance(pset, ParameterSet) or space is None or tuple(space.names) == pset.tunable:
            return
        if self.rebuild is not None and not getattr(self.optimizer, "n_asked", 0):
            self.optimizer = self.rebuild(pset)
            log.info("%s: searching the basin's %d parameters (%s)", self.name, len(pset.tunable),
                     "with Snow-17" if pset.snow else "CREST/KW")
        else:
            log.info("%s: the optimizer searches %d parameters; the basin's others keep their values",
                     self.name, len(space.names))

    def run(self, env: CalibrationEnv) -> None:
        self._adopt(env)
        budget = self.optimizer.budget
        cap = simulation_budget(env.config)
        if cap is not None and cap < budget:
            log.info("%s: the environment allows %d simulations, fewer than the optimizer's budget %d",
                     self.name, cap, budget)
            budget = cap
        self.simulations = 0
        if env.config.protocol == "rounds":
            self._run_rounds(env, budget)
        else:
            self._run_turns(env, budget)

    def _run_turns(self, env, budget: int) -> None:
        opt = self.optimizer
        while not env.done and self.simulations < budget:
            cands = opt.ask(1)
            if not cands:
                log.warning("%s: the optimizer proposed nothing; stopping", self.name)
                return
            cand = cands[0]
            obs = env.set_parameters(**cand)
            if env.done:
                return
            if obs.get("status") != "ok":
                log.warning("%s: set_parameters was refused (%s)", self.name, obs.get("detail") or obs.get("message"))
                opt.tell([cand], [float("-inf")])
                continue
            run = env.run_simulation()
            if run.get("status") != "ok":
                if "run" not in run:  # refused, not run: the environment's budget is spent
                    log.info("%s: run_simulation refused: %s", self.name, run.get("message"))
                    return
                self.simulations += 1
                opt.tell([cand], [float("-inf")])
                continue
            self.simulations += 1
            if env.done:
                return
            opt.tell([cand], [_nse(env.evaluate())])

    def _run_rounds(self, env, budget: int) -> None:
        opt = self.optimizer
        k = int(env.config.candidates_per_round)
        while not env.done and self.simulations < budget:
            cands = opt.ask(min(k, budget - self.simulations))
            if not cands:
                log.warning("%s: the optimizer proposed nothing; stopping", self.name)
                return
            queued: list[bool] = []
            for cand in cands:
                obs = env.set_parameters(**cand)
                if env.done:
                    return
                ok = obs.get("status") == "ok"
                if ok:
                    run = env.run_simulation()
                    if env.done:
                        return
                    ok = run.get("status") == "ok"
                queued.append(ok)
            if not any(queued):
                log.warning("%s: no candidate of the round could be queued; stopping", self.name)
                return
            result = env.evaluate()
            rows = result.get("candidates") or []
            if len(rows) != sum(queued):
                log.warning("%s: evaluate scored %d candidates, %d were queued", self.name, len(rows), sum(queued))
            scores: list[float] = []
            it = iter(rows)
            for cand, ok in zip(cands, queued):
                scores.append(_row_score(next(it, None), cand) if ok else float("-inf"))
            self.simulations += sum(queued)
            opt.tell(cands, scores)


def _row_score(row: Mapping[str, Any] | None, cand: Candidate) -> float:
    """A round candidate's NSE, after checking the row is the candidate queued (6-decimal params)."""
    if row is None:
        return float("-inf")
    shown = row.get("params")
    if isinstance(shown, Mapping):
        off = [k for k, v in cand.items() if k in shown and abs(float(shown[k]) - v) > 1e-6 * max(1.0, abs(v))]
        if off:
            log.warning("round candidate %s does not match the queued parameters (%s)", row.get("run"), off)
    return _nse(row)


def make_optimizer(name: str, seed: int, budget: int, *, scale: str = "log", parameters: ParameterSet | None = None,
                   **options: Any) -> Optimizer:
    """The optimizer ``name`` (one of :data:`OPTIMIZERS`) with ``seed``, ``budget`` and its options.

    ``scale``: "log" (default: the wide-range multipliers wm, fc, iwu, under, leaki, alpha, beta
    searched on a log scale, :meth:`~hydroagent_hpc.agents.optimizers.space.ParameterSpace.log_scaled`) or
    "linear" (the box exactly as the papers use it). On the synthetic twins, DDS reached NSE 0.94
    within 200 runs on every seed tried with "log", and stalled near NSE 0.03 on 2 of 5 seeds of
    syn_07144100 with "linear" (a flat "mean-flow" plateau at large beta); see the optimizers
    benchmark, ``python -m hydroagent_hpc.bench.optimizers``. ``parameters``: a basin's set
    (``env.parameters``; default the paper's 11 multipliers), e.g. 19 names with Snow-17.
    """
    try:
        cls = OPTIMIZERS[name]
    except KeyError:
        raise ValueError(f"unknown optimizer {name!r}; choose one of: {', '.join(OPTIMIZERS)}") from None
    if scale not in ("linear", "log"):
        raise ValueError(f"scale={scale!r}: use 'linear' or 'log'")
    if parameters is not None:
        space = ParameterSpace.of(parameters, scale)
    else:
        space = ParameterSpace.log_scaled() if scale == "log" else ParameterSpace()
    return cls(seed, budget, space=space, **options)


def make_optimizer_policy(name: str, seed: int, budget: int, **options: Any) -> OptimizerPolicy:
    """An :class:`OptimizerPolicy` around :func:`make_optimizer`; its ``name`` is the optimizer's."""
    def rebuild(parameters: ParameterSet) -> Optimizer:
        return make_optimizer(name, seed, budget, parameters=parameters, **options)

    return OptimizerPolicy(make_optimizer(name, seed, budget, **options), name=name, rebuild=rebuild)
