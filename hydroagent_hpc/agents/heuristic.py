"""The heuristic hydrologist: calibrates the way an expert reads a hydrograph.

It speaks the same text protocol as a language model (a short diagnosis, then one Hermes tool
call per message: set_parameters -> run_simulation -> evaluate), reading only the observations
the environment returned, so its episodes can serve as SFT teacher data at no API cost.

Diagnosis -> move (CREST/KW process knowledge; Wang et al. 2011, Xue et al. 2013):

* volume error (|PBIAS| > 5 %): a surplus points to evapotranspiration (raise ``ke``), the
  impervious fraction (lower ``im``) or soil storage (raise ``wm``); a deficit the reverse;
* peak too low with balanced volume: routing attenuates too much (lower ``alpha0``, ``alpha``);
  too high: raise ``alpha0`` (overland storage) or ``alpha``;
* simulated peak late (lag > 1 h): routing too slow (lower ``alpha``, ``beta``); early: raise;
* recession too steep or too little baseflow: more soil and interflow storage (raise ``wm``,
  lower ``leaki``, raise ``fc``); too flat: the reverse;
* nothing clearly wrong: a coordinate step on the parameter least recently tried.

On a basin with Snow-17 (the environment shows the snow parameters in its set_parameters
observation; a snow-free basin never does) the snow parameters join the moves: a volume error
also points to the snowfall correction (``scf``), and the coordinate probes cover all 19.

A move that lowers NSE is reverted and the opposite direction is tried with a smaller step;
step sizes (multiplicative, in log space) shrink after failures, so the search converges; when
every step has collapsed it restarts around the best set with half the previous initial step
(``max_restarts`` times), then stops. Deterministic for a seed (the seed only breaks ties).

``overshoot`` (default 0: off) is for teacher data only. With that probability a move writes its
parameter past the bound it moves towards (by a factor exp(U(0.1, 0.5)), or a quarter of the range
for a signed parameter); the environment clips it and says so, and the hydrologist carries on from
the clipped value, which is what it assumed anyway. This is noise injection for imitation learning
(DART; Laskey et al. 2017, "DART: Noise Injection for Robust Imitation Learning"): a student trained
only on a teacher that never leaves the bounds has never seen a ``clipped`` observation, and a small
model that writes one out-of-range value then derails on the unfamiliar reply. Measured in
``python -m hydroagent_hpc.bench.sft_learning --overshoot P``.

``digits`` (default None: six decimals, as before) is for teacher data too: every value a move
sets is rounded to that many significant digits, in the hydrologist's own state as well as in the
call, so it writes ``0.549`` where it would write ``0.548812``. A small student repeats long digit
strings badly (a greedy loop such as ``0.91105911059...`` runs past its token budget).

``partial`` (default False: every call lists all tunable values, as before) is for teacher data
too: a ``set_parameters`` call sends only the values that differ from the ones the environment
holds (its defaults at the start, then the ``params`` of its last ``set_parameters`` reply, so a
clipped value counts as what the environment used), which the tool allows (partial updates).
The search is unchanged; the call is a key or two (``{"ke": 1.2}``) instead of an 11-key object
that a small student has to copy back exactly, value by value (malformed argument objects, keys
repeated, are how it broke in docs/grpo.md, "SFT learning on CPU").

``explore`` (default 0: off) is for teacher data too: with that probability a move after an
evaluation is replaced by a move of a parameter and direction drawn uniformly among those still
free to move (epsilon-greedy; the reverting and step shrinking that follow are the usual ones). A
student imitating a teacher whose moves never vary samples its moves almost deterministically, so
a GRPO group has nothing among its moves to rank (docs/learning.md); with exploring teacher data
the student's moves carry a spread that the simulator's reward can sharpen. ``explore_start``
(default 0: off) does the same for the first call: with that probability the overland storage it
starts with (``alpha0``, 0.5 otherwise) is drawn log-uniformly from [0.1, 1.5], so a student samples
first guesses as well.

``quote`` (default False: the diagnosis in words, as before) is for teacher data too: the text
before each move quotes the observed values it acts on in the observation's own spelling
(``NSE=0.8125 is the best so far. peak_ratio=1.2685: peak 27 % too high ...``) instead of
restating them rounded (``NSE 0.812``). The move depends on the number; a small student trained
from scratch learns to copy a value exactly (one attention pattern: find the key, repeat what
follows) long before it learns to compute from it, and a copied ``peak_ratio=1.`` sits right
before the words and the call that depend on it. Without it the students of docs/learning.md wrote
the same NSE and the same move on every basin.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hydroagent_hpc.env.toolcalls import render_hermes
from hydroagent_hpc.params import PARAMS, SNOW_NAMES, TUNABLE, spec_of
from hydroagent_hpc.types import ToolCall

__all__ = ["HeuristicHydrologist"]

# Where a zero default would stall multiplicative steps (alpha0 = 0 is HydroAgent's default).
_FLOOR = {"alpha0": 0.05, "im": 0.02}


@dataclass
class _Move:
    name: str
    direction: int  # +1 raise, -1 lower
    reason: str


@dataclass
class HeuristicHydrologist:
    """A deterministic, diagnosis-driven calibrator (a text Policy)."""

    seed: int = 0
    name: str = "heuristic"
    step0: float = 0.6  # initial log-step (x1.8)
    min_step: float = 0.02
    max_restarts: int = 3  # after the steps collapse, restart around the best with half the step
    overshoot: float = 0.0  # teacher data: probability that a move asks past its bound (see the module doc)
    digits: int | None = None  # teacher data: significant digits of the values a move sets (None: 6 decimals)
    partial: bool = False  # teacher data: send only the values that differ from the environment's (module doc)
    explore: float = 0.0  # teacher data: probability that a move is a uniformly drawn one (module doc)
    explore_start: float = 0.0  # teacher data: probability that the starting alpha0 is drawn (module doc)
    quote: bool = False  # teacher data: quote the observed values a move acts on, as spelled (module doc)
    _rng: Any = None
    _noise: Any = None
    _explore: Any = None
    _explore_start: Any = None
    _phase: str = "start"
    _current: dict[str, float] = field(default_factory=dict)
    _best: dict[str, float] | None = None
    _best_nse: float = -math.inf
    _steps: dict[str, float] = field(default_factory=dict)
    _last_move: _Move | None = None
    _tried: dict[str, int] = field(default_factory=dict)
    _diag: dict[str, Any] = field(default_factory=dict)
    _queue: list[_Move] = field(default_factory=list)
    _evals: int = 0
    _restarts: int = 0
    _names: tuple[str, ...] = TUNABLE  # the basin's tunable names (with Snow-17 once the environment shows them)
    _env: dict[str, float] = field(default_factory=dict)  # the values the environment holds (for ``partial``)

    def __post_init__(self) -> None:
        if not 0.0 <= self.overshoot <= 1.0:
            raise ValueError(f"heuristic: overshoot must be a probability in [0, 1], got {self.overshoot!r}")
        if self.digits is not None and (isinstance(self.digits, bool) or not isinstance(self.digits, int)
                                        or not 1 <= self.digits <= 15):
            raise ValueError(f"heuristic: digits must be a whole number from 1 to 15, got {self.digits!r}")
        for key in ("partial", "quote"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"heuristic: {key} must be true or false, got {getattr(self, key)!r}")
        for key in ("explore", "explore_start"):
            p = getattr(self, key)
            if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p <= 1.0:
                raise ValueError(f"heuristic: {key} must be a probability in [0, 1], got {p!r}")
        self._rng = np.random.default_rng(self.seed)
        # a separate stream, so overshoot = 0 leaves the tie-breaking draws (and the episodes) unchanged
        self._noise = np.random.default_rng([self.seed, 0x0E5])
        self._explore = np.random.default_rng([self.seed, 0xE7])  # its own stream too (explore = 0: unchanged)
        self._explore_start = np.random.default_rng([self.seed, 0x57A])
        self._steps = dict.fromkeys(TUNABLE, self.step0)
        self._env = {k: float(PARAMS[k].default) for k in TUNABLE}

    def _see_parameters(self, obs: dict | None) -> None:
        """Learn the basin's Snow-17 parameters (and their values) from a set_parameters observation."""
        shown = (obs or {}).get("params") or (obs or {}).get("validated_params")
        if isinstance(shown, dict):  # what the environment now holds (clipped values as it used them)
            self._env.update({k: v for k, v in ((k, _number(x)) for k, x in shown.items()) if v is not None})
        if not isinstance(shown, dict) or self._names != TUNABLE or not all(k in shown for k in SNOW_NAMES):
            return
        self._names = TUNABLE + SNOW_NAMES
        for k in SNOW_NAMES:
            self._steps.setdefault(k, self.step0)
            v = _number(shown[k])
            self._current[k] = v if v is not None else float(spec_of(k).default)

    # ------------------------------------------------------------------ protocol
    def act(self, messages: list[dict[str, str]]) -> str | None:
        obs = _last_tool_observation(messages)
        if self._phase == "start":
            self._phase = "run"
            return self._say_set("Starting calibration from the default multipliers. alpha0 = 0 routes overland "
                                 "flow to the channel within one step, which usually makes peaks too sharp; "
                                 "I give it some overland storage first.", self._start_params())
        if obs is not None and obs.get("status") == "error" and obs.get("error") == "parse_failure":
            return None  # our own call was refused: something is off, stop rather than loop
        if self._phase == "run":
            self._see_parameters(obs)
            if obs is not None and obs.get("status") not in (None, "ok"):
                return None
            self._phase = "evaluate"
            return "Running the model with these multipliers.\n" + render_hermes(ToolCall("run_simulation", {}))
        if self._phase == "evaluate":
            if obs is not None and obs.get("status") == "ok":
                self._diag = dict(obs.get("diagnostics") or {})
            self._phase = "decide"
            return "Scoring the run against the observations.\n" + render_hermes(ToolCall("evaluate", {}))
        # decide: read the evaluation, then propose the next parameter set
        nse = _number(obs.get("NSE")) if obs else None
        if nse is None:
            nse = -math.inf
        self._evals += 1
        note = self._learn(nse, obs or {})
        move = self._next_move(obs or {})
        if move is None:
            return None
        if self.explore > 0.0 and self._explore.random() < self.explore:
            move = self._random_move() or move
        params = self._apply(move)
        self._phase = "run"
        if self.overshoot > 0.0 and self._noise.random() < self.overshoot:
            params[move.name] = self._past_bound(move)
        return self._say_set(f"{note} {move.reason}", params)

    # ------------------------------------------------------------------ decisions
    def _start_params(self) -> dict[str, float]:
        """HydroAgent's defaults (the environment starts there), with some overland storage."""
        base = {k: float(PARAMS[k].default) for k in TUNABLE}
        if base["alpha0"] <= 0.0:
            base["alpha0"] = 0.5
            if self.explore_start > 0.0 and self._explore_start.random() < self.explore_start:
                base["alpha0"] = self._round(math.exp(float(self._explore_start.uniform(math.log(0.1), math.log(1.5)))))
        self._current = dict(base)
        self._last_move = None
        return dict(base)

    def _learn(self, nse: float, obs: dict) -> str:
        improved = nse > self._best_nse
        move = self._last_move
        if improved:
            gain = nse - self._best_nse if math.isfinite(self._best_nse) else float("nan")
            self._best, self._best_nse = dict(self._current), nse
            if move is not None:
                self._steps[move.name] = min(self._steps[move.name] * 1.2, 1.0)
                # keep going the same way while it pays
                self._queue.insert(0, _Move(move.name, move.direction, f"That helped, so I push {move.name} further "
                                                                        f"{'up' if move.direction > 0 else 'down'}."))
            return (self._nse_text(nse, obs) + (f" (+{gain:.3f})" if math.isfinite(gain) else "")
                    + " is the best so far.")
        # worse: revert to the best and try the opposite direction with a smaller step
        if self._best is not None:
            self._current = dict(self._best)
        if move is not None:
            self._steps[move.name] *= 0.5
            if not any(m.name == move.name for m in self._queue) and self._steps[move.name] >= self.min_step:
                self._queue.append(_Move(move.name, -move.direction, f"The other direction for {move.name}, "
                                                                      "with a smaller step."))
        return f"{self._nse_text(nse, obs)} is no better than {self._best_nse:.3f}; I go back to the best set."

    def _nse_text(self, nse: float, obs: dict) -> str:
        """``NSE 0.812``, or with :attr:`quote` the observation's own spelling, ``NSE=0.8125``."""
        if self.quote and "NSE" in obs:
            return f"NSE={_spelled(obs['NSE'])}"
        return f"NSE {nse:.3f}"

    def _next_move(self, obs: dict) -> _Move | None:
        while self._queue:
            m = self._queue.pop(0)
            if self._steps[m.name] >= self.min_step and self._can_move(m):
                return m
        for m in self._diagnose(obs):
            if self._steps[m.name] >= self.min_step and self._can_move(m):
                return m
        # nothing diagnosed: coordinate step on the parameter least recently tried
        live = [k for k in self._names if self._steps[k] >= self.min_step]
        if not live:
            if self._restarts >= self.max_restarts:
                return None
            # converged locally: restart around the best with half the previous initial step
            self._restarts += 1
            size = self.step0 * 0.5 ** self._restarts
            self._steps = dict.fromkeys(self._names, size)
            live = list(self._names)
        order = sorted(live, key=lambda k: (self._tried.get(k, -1), self._rng.random()))
        k = order[0]
        d = 1 if self._rng.random() < 0.5 else -1
        m = _Move(k, d, f"The diagnostics look balanced; a small probe of {k}.")
        return m if self._can_move(m) else _Move(k, -d, m.reason)

    def _random_move(self) -> _Move | None:
        """A parameter and direction drawn uniformly among those free to move (teacher ``explore``)."""
        free = [_Move(k, d, f"I try {k} {'up' if d > 0 else 'down'} to see how the fit responds.")
                for k in self._names for d in (1, -1) if self._steps[k] >= self.min_step]
        free = [m for m in free if self._can_move(m)]
        return free[int(self._explore.integers(len(free)))] if free else None

    def _diagnose(self, obs: dict) -> list[_Move]:
        d = {**self._diag, **obs}
        read: dict[str, str] = {}  # what each reading came from, as the observation spelled it (``quote``)

        def value(*keys: str) -> float | None:
            for k in keys:
                v = _number(d.get(k))
                if v is not None:
                    read[keys[0]] = f"{k}={_spelled(d[k])}"
                    return v
            return None

        def said(key: str, text: str) -> str:
            return f"{read[key]}: {text}" if self.quote and key in read else text

        moves: list[_Move] = []
        pbias = value("PBIAS")
        vr = value("volume_ratio")
        if pbias is None and vr is not None:
            pbias = (vr - 1.0) * 100.0
            read["PBIAS"] = read["volume_ratio"]
        peak_err = value("peak_error_pct")
        if peak_err is None:
            ratio = value("peak_ratio")
            peak_err = (ratio - 1.0) * 100.0 if ratio is not None else None
            if "peak_ratio" in read:
                read["peak_error_pct"] = read["peak_ratio"]
        lag = value("peak_lag_h", "lag_hours_sim_minus_obs")
        k_sim, k_obs = value("recession_k_sim"), _number(d.get("recession_k_obs"))
        bfi_sim, bfi_obs = value("bfi_sim"), _number(d.get("bfi_obs"))
        if pbias is not None and abs(pbias) > 5.0:
            s = 1 if pbias > 0 else -1
            word = "surplus" if s > 0 else "deficit"
            moves += [_Move("ke", s, said("PBIAS", f"Volume {word} of {abs(pbias):.0f} %: evapotranspiration (ke).")),
                      _Move("im", -s, said("PBIAS", f"Volume {word}: impervious fraction (im).")),
                      _Move("wm", s, said("PBIAS", f"Volume {word}: soil water capacity (wm)."))]
            if "scf" in self._names:
                moves.insert(1, _Move("scf", -s, said("PBIAS", f"Volume {word}: snowfall correction (scf).")))
        if peak_err is not None and abs(peak_err) > 10.0 and (pbias is None or abs(pbias) <= 15.0):
            s = 1 if peak_err > 0 else -1
            word = "high" if s > 0 else "low"
            moves += [_Move("alpha0", s, said("peak_error_pct", f"Peak {abs(peak_err):.0f} % too {word} with fair "
                                                                "volume: overland routing (alpha0).")),
                      _Move("alpha", s, said("peak_error_pct", f"Peak too {word}: channel storage (alpha)."))]
        if lag is not None and abs(lag) > 1.0:
            s = -1 if lag > 0 else 1
            word = "late" if lag > 0 else "early"
            moves += [_Move("alpha", s, said("peak_lag_h", f"Simulated peak {abs(lag):.0f} h {word}: channel routing "
                                                           "speed (alpha).")),
                      _Move("beta", s, said("peak_lag_h", f"Peak timing {word}: channel beta."))]
        if k_sim is not None and k_obs is not None and abs(k_sim - k_obs) > 0.1 * max(abs(k_obs), 1e-6):
            steep = k_sim > k_obs
            s = 1 if steep else -1
            moves += [_Move("wm", s, said("recession_k_sim", "Recession " + ("too steep" if steep else "too flat")
                                          + ": soil storage (wm).")),
                      _Move("leaki", -s, said("recession_k_sim", "Recession shape: interflow leakage (leaki)."))]
        if bfi_sim is not None and bfi_obs is not None and abs(bfi_sim - bfi_obs) > 0.05:
            s = 1 if bfi_sim < bfi_obs else -1
            share = "too small" if s > 0 else "too large"
            moves += [_Move("fc", s, said("bfi_sim", f"Baseflow share {share}: infiltration (fc).")),
                      _Move("under", -s, said("bfi_sim", "Baseflow share: interflow speed (under)."))]
        return moves

    def _can_move(self, m: _Move) -> bool:
        spec = spec_of(m.name)
        v = self._current.get(m.name, spec.default)
        return (v < spec.upper) if m.direction > 0 else (v > spec.lower)

    def _apply(self, m: _Move) -> dict[str, float]:
        spec = spec_of(m.name)
        if spec.lower < 0.0:  # a signed value (Snow-17's mbase, degC): additive steps
            v = self._current.get(m.name, spec.default)
            new = v + m.direction * self._steps[m.name] * (spec.upper - spec.lower) / 4.0
        else:
            v = max(self._current.get(m.name, spec.default), _FLOOR.get(m.name, 0.0), 1e-6)
            new = v * math.exp(m.direction * self._steps[m.name])
        self._current[m.name] = self._round(float(min(max(new, spec.lower), spec.upper)))
        self._tried[m.name] = self._evals
        self._last_move = m
        return dict(self._current)

    def _past_bound(self, m: _Move) -> float:
        """A value beyond the bound ``m`` moves towards (teacher noise; the environment clips it)."""
        spec = spec_of(m.name)
        bound = spec.upper if m.direction > 0 else spec.lower
        factor = math.exp(float(self._noise.uniform(0.1, 0.5)))
        if spec.lower < 0.0 or bound <= 0.0:  # signed or zero bound: step a quarter of the range past it
            return self._round(float(bound + m.direction * (spec.upper - spec.lower) / 4.0))
        return self._round(float(bound * factor if m.direction > 0 else bound / factor))

    def _round(self, v: float) -> float:
        """``v`` to :attr:`digits` significant digits (unchanged when ``digits`` is None)."""
        if self.digits is None or v == 0.0 or not math.isfinite(v):
            return v
        return float(f"{v:.{self.digits}g}")

    def _say_set(self, text: str, params: dict[str, float]) -> str:
        shown = {k: round(float(v), 6) for k, v in params.items()}
        if self.partial:  # only what changes; all of it if nothing would (the call must set something)
            changed = {k: v for k, v in shown.items() if k not in self._env or round(self._env[k], 6) != v}
            shown = changed or shown
        return f"{text}\n" + render_hermes(ToolCall("set_parameters", shown))


def _spelled(v: Any) -> str:
    """``v`` as the observation's JSON spells it (``1.2685``, ``-2.0``): what a quoting teacher copies."""
    return json.dumps(v)


def _number(v: Any) -> float | None:
    if isinstance(v, bool) or v is None:
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _last_tool_observation(messages: list[dict[str, str]]) -> dict | None:
    for m in reversed(messages):
        if m.get("role") == "tool":
            try:
                obs = json.loads(m.get("content") or "null")
            except json.JSONDecodeError:
                return None
            return obs if isinstance(obs, dict) else None
        if m.get("role") == "assistant":
            return None
    return None

