"""CalibrationEnv: the simulator as a tool loop for language models and optimizers.

One environment per episode. ``reset()`` gives the system and user messages; ``step(text)``
parses every tool call in an assistant message, executes them in order (never concurrently:
a run always sees the parameters set before it, an evaluate always sees the run before it),
and returns one observation per call or parse failure, the reward, and whether the episode
is over. Code-driven agents call ``set_parameters(**values)``, ``run_simulation()`` and
``evaluate()`` directly; both paths share the same bookkeeping.

Rewards come from the environment's own record (:mod:`hydroagent_hpc.env.rewards`): an evaluate is
credited only for a fresh successful run, and its NSE is the simulator's, scored by
:func:`hydroagent_hpc.metrics.evaluate` on the post-warm-up steps with one joint mask.

Two protocols: "turns" (one parameter set per simulation) and "rounds" (the frontier
benchmark: run_simulation queues the current parameters as a candidate of the round; evaluate
runs the round's candidates in one batched call and ends the round).
"""

from __future__ import annotations

import logging
import math
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

import numpy as np

from hydroagent_hpc.config import EnvConfig, to_dict
from hydroagent_hpc.env import prompts, toolcalls
from hydroagent_hpc.env.observations import evaluate_run, evaluation_view, simulation_view
from hydroagent_hpc.env.rewards import Payment, RewardLedger
from hydroagent_hpc.params import ParameterSet, ParamValues, check_values, parameter_set_of
from hydroagent_hpc.provenance import provenance
from hydroagent_hpc.sim import Simulator
from hydroagent_hpc.sim.errors import HydroAgentError
from hydroagent_hpc.types import Basin, Episode, SimRecord, SimulationResult, ToolCall, Turn

log = logging.getLogger(__name__)

__all__ = ["CalibrationEnv", "StepResult", "ToolOutcome", "ObservedSeries", "parse_failure_observation"]


def parse_failure_observation(reason: str, detail: str) -> dict[str, Any]:
    """The observation the environment answers one parse failure with (reason, detail, retry hint).

    A function, not only a method, so the SFT data builder's error-recovery turns
    (:mod:`hydroagent_hpc.train.sft.data`) show a model exactly the reply inference shows it.
    """
    return {"status": "error", "error": "parse_failure", "reason": reason, "detail": detail,
            "hint": toolcalls.retry_hint([toolcalls.ParseFailure(reason, detail)])}


@dataclass
class StepResult:
    observations: list[dict[str, Any]]
    reward: float
    done: bool
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ToolOutcome:
    """What one tool call (or one parse failure) did, as the turn records it.

    ``observation``: what the agent sees; ``payment``: the reward and its terms; ``ok``: whether
    the call succeeded; ``error``: the reason when it did not; ``run_id``: the simulation it ran or
    scored; ``arguments``: the arguments as recorded.
    """

    observation: dict[str, Any]
    payment: Payment
    ok: bool
    error: str | None = None
    run_id: int | None = None
    arguments: dict[str, Any] | None = None


@dataclass(frozen=True)
class ObservedSeries:
    """The basin's time axis, observed discharge and warm-up mask (from the first successful run)."""

    times: np.ndarray
    observed: np.ndarray
    warmup: np.ndarray


class CalibrationEnv:
    """Calibrate ``basin`` with ``simulator`` under ``config`` (see :class:`EnvConfig`)."""

    def __init__(self, basin: Basin, simulator: Simulator, config: EnvConfig, *, agent: str = "unknown",
                 seed: int = 0, episode_id: str | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        if not isinstance(simulator, Simulator):
            raise TypeError(f"simulator: {type(simulator).__name__} is not a Simulator "
                            "(base_params, run(params), run_batch(param_sets)); open one with sim.open_simulator")
        self.basin = basin
        self.sim = simulator
        self.config = config
        self.agent = agent
        self.seed = seed
        self.episode_id = episode_id or uuid.uuid4().hex[:16]
        self._clock = clock
        self.target = config.target_nse if config.target_nse is not None else basin.target_nse
        #: The basin's calibratable parameters: the 13 multipliers, and Snow-17's when the task has snow.
        self.parameters: ParameterSet = parameter_set_of(simulator)
        initial = {k: float(v) for k, v in simulator.base_params.items()}
        if self.parameters.snow:  # the control file's Snow-17 values (the embedded engine keeps them apart)
            snow = {**self.parameters.defaults, **(getattr(simulator, "base_snow_params", None) or {})}
            initial.update({k: float(snow[k]) for k in self.parameters.snow_names if k not in initial})
        # the control file's values enter the environment here: validated once, then the record travels as it is
        self._initial: ParamValues = check_values(initial, "the simulator's base parameters",
                                                  snow=self.parameters.snow)
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> list[dict[str, str]]:
        """Start the episode over; returns the system and user messages."""
        self.params: ParamValues = self._initial  # validated and immutable: passed on, never copied or re-checked
        self.turns: list[Turn] = []
        self.sims: list[SimRecord] = []
        self.ledger = RewardLedger(self.config.rewards, self.target, protocol=self.config.protocol)
        self.best_run: int | None = None
        self.done = False
        self.stop_reason = ""
        self.message_index = -1
        self.parse_streak = 0
        self.since_improvement = 0
        self.round = 0
        self.pending: list[ParamValues] = []  # queued candidates of the current round
        self.fresh_run: int | None = None  # a successful run not yet evaluated (turns protocol)
        self.counters = {"turns": 0, "parse_failures": 0, "simulations": 0, "failed_simulations": 0,
                         "evaluations": 0, "credited_evaluations": 0, "improvements": 0, "clipped_values": 0,
                         "rounds": 0, "messages": 0}
        self._t0 = self._clock()
        self._started_utc = datetime.now(timezone.utc).isoformat(timespec="seconds")
        self._terminal: Payment | None = None
        self._series: ObservedSeries | None = None  # from the first successful run
        self.messages = prompts.render_messages(self.basin, self.config.preset, self._budget(), self.parameters)
        return [dict(m) for m in self.messages]

    def _budget(self) -> prompts.Budget:
        c = self.config
        max_sims = c.max_simulations
        if c.protocol == "rounds" and max_sims is None:
            max_sims = c.max_rounds * c.candidates_per_round
        return prompts.Budget(protocol=c.protocol, max_turns=c.max_turns, max_simulations=max_sims,
                              max_rounds=c.max_rounds, candidates_per_round=c.candidates_per_round,
                              target_nse=self.target, stop_at_target=c.stop_at_target, patience=c.patience,
                              wall_clock_s=c.wall_clock_s, clip_out_of_bounds=c.clip_out_of_bounds)

    # ------------------------------------------------------------------ text interface
    def step(self, assistant_text: str) -> StepResult:
        """Parse and execute every tool call in one assistant message, in order."""
        if self.done:
            raise RuntimeError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        text = assistant_text if isinstance(assistant_text, str) else ""
        parsed = toolcalls.parse_message(text, max_calls=self.config.max_calls_per_message,
                                         max_chars=self.config.max_message_chars)
        return self._run_items(parsed, text[: self.config.max_message_chars])

    def step_parsed(self, parsed: toolcalls.ParsedMessage, text: str = "") -> StepResult:
        """The same as :meth:`step` for calls already parsed (e.g. OpenAI function calls)."""
        if self.done:
            raise RuntimeError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        return self._run_items(parsed, text)

    def _run_items(self, parsed: toolcalls.ParsedMessage, text: str) -> StepResult:
        self.message_index += 1
        self.counters["messages"] += 1
        observations: list[dict[str, Any]] = []
        reward = 0.0
        first = True
        items = parsed.items()
        had_call = any(isinstance(it, ToolCall) for it in items)
        for item in items:
            if self.done:
                break
            t_start = self._clock()
            if isinstance(item, ToolCall):
                out = self._dispatch(item)
                tool = item.name
            else:
                out = self._parse_failure(item.reason, item.detail)
                tool = None
            self._record(tool, out, text if first else "", t_start)
            first = False
            observations.append(out.observation)
            reward += out.payment.reward
            self._check_stop()
        if not had_call and self.config.end_on_no_tool_call and not self.done:
            self._finish("no_tool_call")
        if self.done:
            reward += self._terminal_payment().reward
        return StepResult(observations, reward, self.done, {"stop_reason": self.stop_reason, "turns": len(self.turns)})

    # ------------------------------------------------------------------ direct interface
    def set_parameters(self, **values: Any) -> dict[str, Any]:
        return self._direct(ToolCall("set_parameters", dict(values)))

    def run_simulation(self) -> dict[str, Any]:
        return self._direct(ToolCall("run_simulation", {}))

    def evaluate(self) -> dict[str, Any]:
        return self._direct(ToolCall("evaluate", {}))

    def _direct(self, call: ToolCall) -> dict[str, Any]:
        if self.done:
            raise RuntimeError(f"episode {self.episode_id} is over ({self.stop_reason}); call reset()")
        self.message_index += 1
        self.counters["messages"] += 1
        t_start = self._clock()
        out = self._dispatch(call)
        self._record(call.name, out, "", t_start)
        self._check_stop()
        return out.observation

    # ------------------------------------------------------------------ tools
    def _dispatch(self, call: ToolCall) -> ToolOutcome:
        if call.name not in toolcalls.TOOL_NAMES:
            return self._parse_failure("unknown_tool", f"unknown tool {call.name!r}; the tools are "
                                                       f"{', '.join(toolcalls.TOOL_NAMES)}")
        v = toolcalls.validate_arguments(call, self.params, clip=self.config.clip_out_of_bounds,
                                         parameters=self.parameters)
        if not v.ok:
            return self._parse_failure(v.reason, v.detail, call.arguments)
        if call.name == "set_parameters":
            return self._tool_set(v)
        if call.name == "run_simulation":
            return self._tool_run()
        return self._tool_evaluate()

    def _parse_failure(self, reason: str, detail: str, args: Mapping[str, Any] | None = None) -> ToolOutcome:
        self.counters["parse_failures"] += 1
        self.parse_streak += 1
        obs = parse_failure_observation(reason, detail)
        return ToolOutcome(obs, self.ledger.parse_failure(), False, reason, None, _safe_args(args))

    def _tool_set(self, v: toolcalls.Validated) -> ToolOutcome:
        self.parse_streak = 0
        before, self.params = self.params, v.params
        self.counters["clipped_values"] += len(v.clipped)
        shown = {k: round(self.params[k], 6) for k in self.parameters.names}
        key = "params" if self.config.observation == "paper" else "validated_params"
        obs: dict[str, Any] = {"status": "ok", key: shown}
        if v.clipped:
            obs["clipped"] = {k: {"asked": a, "used": u} for k, (a, u) in v.clipped.items()}
            obs["message"] = "some values were outside their bounds and were clipped: " + ", ".join(
                f"{k} {a:g} -> {u:g}" for k, (a, u) in v.clipped.items())
        return ToolOutcome(obs, self.ledger.set_parameters(before, self.params), True, None, None, dict(v.applied))

    def _tool_run(self) -> ToolOutcome:
        self.parse_streak = 0
        c = self.config
        if c.max_simulations is not None and self.counters["simulations"] + len(self.pending) >= c.max_simulations:
            return ToolOutcome({"status": "error", "message": f"the simulation budget ({c.max_simulations}) is spent"
                                + ("; call evaluate to run the queued candidates" if self.pending else "")},
                               self.ledger.nothing(), False, "budget", None, {})
        if c.protocol == "rounds":
            if len(self.pending) >= c.candidates_per_round:
                return ToolOutcome({"status": "error", "message": f"round {self.round + 1} already has "
                                    f"{c.candidates_per_round} candidates; call evaluate to run and score them"},
                                   self.ledger.nothing(), False, "round_full", None, {})
            self.pending.append(self.params)
            obs = {"status": "ok", "message": f"queued as candidate {len(self.pending)} of round {self.round + 1}; "
                                              "evaluate runs and scores the round's candidates",
                   "round": self.round + 1, "candidate": len(self.pending)}
            return ToolOutcome(obs, self.ledger.queued(), True, None, None, {})
        rec = self._simulate([self.params])[0]
        if rec.ok:
            self.fresh_run = rec.run_id
            obs = simulation_view(rec, self, c)
        else:
            self.fresh_run = None
            obs = {"status": "error", "run": rec.run_id, "message": f"simulation {rec.run_id} failed: {rec.error}"}
        return ToolOutcome(obs, self.ledger.simulation(rec.ok, rec.params), rec.ok,
                           None if rec.ok else "simulation_failed", rec.run_id, {})

    def _tool_evaluate(self) -> ToolOutcome:
        self.parse_streak = 0
        self.counters["evaluations"] += 1
        if self.config.protocol == "rounds":
            return self._evaluate_round()
        if self.fresh_run is None:
            last = self.sims[-1] if self.sims else None
            why = ("no simulation has run yet" if last is None else
                   f"simulation {last.run_id} failed" if not last.ok else
                   f"simulation {last.run_id} was already evaluated")
            return ToolOutcome({"status": "error",
                                "message": f"nothing new to evaluate: {why}; call run_simulation first"},
                               self.ledger.nothing(), False, "no_fresh_run", None, {})
        rec = self.sims[self.fresh_run - 1]
        self.fresh_run = None
        pay, improved = self._credit(rec)
        obs = evaluation_view(rec, self, self.config, improved)
        return ToolOutcome(obs, pay, True, None, rec.run_id, {})

    def _evaluate_round(self) -> ToolOutcome:
        if not self.pending:
            return ToolOutcome({"status": "error", "message": "no candidates in this round; call run_simulation first"},
                               self.ledger.nothing(), False, "no_fresh_run", None, {})
        recs = self._simulate(self.pending, round_=self.round + 1)
        self.pending = []
        self.round += 1
        self.counters["rounds"] = self.round
        ok = [r for r in recs if r.ok]
        before = self.ledger.best
        pay = self.ledger.nothing()
        improved = False
        if ok:
            top = max(ok, key=lambda r: _nse(r))
            for r in ok:
                r.evaluated = True
            pay, improved = self._credit(top)
        obs = {"status": "ok" if ok else "error", "round": self.round,
               "candidates": [evaluation_view(r, self, self.config, None, brief=True) for r in recs],
               "best": self._best_view(), "improved": improved,
               "previous_best_nse": None if before is None else round(before, 4), "target_nse": self.target,
               "rounds_left": self.config.max_rounds - self.round}
        if not ok:
            obs["message"] = "every candidate of this round failed"
        return ToolOutcome(obs, pay, bool(ok), None if ok else "simulation_failed", recs[-1].run_id, {})

    def _credit(self, rec: SimRecord) -> tuple[Payment, bool]:
        rec.evaluated = True
        nse = _nse(rec)
        pay, improved = self.ledger.evaluation(nse, rec.params)
        self.counters["credited_evaluations"] += 1
        if improved:
            self.best_run = rec.run_id
            self.counters["improvements"] += 1
            self.since_improvement = 0
        else:
            self.since_improvement += 1
        return pay, improved

    @property
    def observed_series(self) -> ObservedSeries | None:
        """The observed discharge on the simulation's times (read-only), set by the first successful run;
        ``None`` before it. What the observation views (:mod:`hydroagent_hpc.env.observations`) read."""
        return self._series

    def best_view(self) -> dict[str, Any] | None:
        """The best run so far as the observations show it (run number, NSE, ...); ``None`` before one."""
        return self._best_view()

    def _best_view(self) -> dict[str, Any] | None:
        if self.best_run is None:
            return None
        rec = self.sims[self.best_run - 1]
        return {"nse": round(_nse(rec), 4), "run": rec.run_id,
                "params": {k: round(v, 6) for k, v in rec.params.items()}}

    # ------------------------------------------------------------------ simulation
    def _simulate(self, param_sets: list[ParamValues], round_: int | None = None) -> list[SimRecord]:
        """Run parameter sets (batched when there are several) and score each at once. They are validated
        records (:class:`~hydroagent_hpc.params.ParamValues`): the simulator takes them without checking again."""
        t0 = time.perf_counter()
        results: list[SimulationResult | Exception] = []
        if len(param_sets) > 1:
            try:
                results = list(self.sim.run_batch(param_sets))
            except HydroAgentError:
                results = []  # one bad member: fall back to single runs to tell which
        if not results:
            for p in param_sets:
                try:
                    results.append(self.sim.run(p))
                except (HydroAgentError, ValueError) as exc:
                    results.append(exc)
        recs = []
        for p, res in zip(param_sets, results):
            self.counters["simulations"] += 1
            run_id = len(self.sims) + 1
            if isinstance(res, Exception):
                self.counters["failed_simulations"] += 1
                msg = getattr(res, "message", str(res))
                rec = SimRecord(run_id, dict(p), False, msg[:500], {}, time.perf_counter() - t0, round=round_)
            else:
                metrics = evaluate_run(res)
                rec = SimRecord(run_id, dict(p), True, None, metrics, res.wall_time_s, round=round_,
                                discharge=np.asarray(res.discharge, dtype=np.float32))
                if self._series is None:
                    self._series = ObservedSeries(res.times, np.asarray(res.observed, dtype=np.float64),
                                                  np.asarray(res.warmup))
            self.sims.append(rec)
            recs.append(rec)
        return recs

    # ------------------------------------------------------------------ stop rules
    def _check_stop(self) -> None:
        if self.done:
            return
        c = self.config
        best = self.ledger.best
        if c.stop_at_target and best is not None and best >= self.target:
            self._finish("target_reached")
        elif c.patience is not None and self.since_improvement >= c.patience:
            self._finish("patience")
        elif c.max_consecutive_parse_failures is not None and self.parse_streak > c.max_consecutive_parse_failures:
            self._finish("parse_failures")
        elif c.max_turns is not None and len(self.turns) >= c.max_turns:
            self._finish("max_turns")
        elif c.protocol == "rounds" and self.round >= c.max_rounds:
            self._finish("max_rounds")
        elif c.max_simulations is not None and self.counters["simulations"] >= c.max_simulations and \
                self.fresh_run is None and not self.pending:
            self._finish("max_simulations")
        elif c.wall_clock_s is not None and self._clock() - self._t0 >= c.wall_clock_s:
            self._finish("wall_clock")

    def _finish(self, reason: str) -> None:
        self.done = True
        self.stop_reason = reason
        log.info("episode %s on %s: %s after %d turns, best NSE %s", self.episode_id, self.basin.basin_id, reason,
                 len(self.turns), self.ledger.best)

    def close(self, reason: str = "policy_stopped") -> None:
        """End the episode from outside (the policy stopped, an error, a budget of the caller)."""
        if not self.done:
            self._finish(reason)

    def _terminal_payment(self) -> Payment:
        if self._terminal is None:
            self._terminal = self.ledger.terminal()
        return self._terminal

    # ------------------------------------------------------------------ record
    def _record(self, tool: str | None, out: ToolOutcome, text: str, t_start: float) -> None:
        obs, pay = out.observation, out.payment
        kind = "parse_failure" if obs.get("error") == "parse_failure" else "tool"
        self.counters["turns"] += 1
        self.turns.append(Turn(index=len(self.turns), message_index=self.message_index, kind=kind, tool=tool,
                               arguments=out.arguments, observation=obs, reward=pay.reward,
                               reward_terms=dict(pay.terms), ok=bool(out.ok), error=None if out.ok else out.error,
                               run_id=out.run_id, text=text,
                               started_s=t_start - self._t0, duration_s=self._clock() - t_start))

    def episode(self) -> Episode:
        """The episode record (call after the episode is done; closes it if not)."""
        if not self.done:
            self.close("policy_stopped")
        term = self._terminal_payment()
        best = self.sims[self.best_run - 1] if self.best_run else None
        series = self._series
        return Episode(
            episode_id=self.episode_id, basin_id=self.basin.basin_id, agent=self.agent, preset=self.config.preset,
            protocol=self.config.protocol, seed=self.seed,
            config={"env": to_dict(self.config), "target_nse": self.target, "basin": _basin_dict(self.basin),
                    **({"snow17": True} if self.parameters.snow else {})},  # the basin's parameter set
            turns=list(self.turns), sims=list(self.sims), best_nse=self.ledger.best,
            best_run=self.best_run, best_params=dict(best.params) if best else None, stop_reason=self.stop_reason,
            terminal_reward=term.reward, terminal_terms=dict(term.terms), counters=dict(self.counters),
            wall_time_s=self._clock() - self._t0, started_utc=self._started_utc, provenance=provenance(),
            times=series.times if series else None, observed=series.observed if series else None,
            warmup=series.warmup if series else None)


def _nse(rec: SimRecord) -> float:
    raw: Any = rec.metrics.get("NSE", float("nan")) if rec.metrics else float("nan")
    try:
        v = float(raw)
    except (TypeError, ValueError):
        return float("nan")
    return v if math.isfinite(v) else float("-inf")


def _safe_args(args: Mapping[Any, Any] | None) -> dict[str, Any] | None:
    """Arguments as recorded: JSON-able, size-limited (they may be hostile)."""
    if args is None:
        return None
    out: dict[str, Any] = {}
    for i, (k, v) in enumerate(args.items()):
        if i >= 32:
            out["..."] = f"{len(args) - 32} more"
            break
        out[str(k)[:64]] = v if isinstance(v, (int, float, bool)) or v is None else repr(v)[:200]
    return out


def _basin_dict(b: Basin) -> dict[str, Any]:
    from dataclasses import asdict

    return asdict(b)

