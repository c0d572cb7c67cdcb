"""System and user prompts for one calibration task, rendered from a Basin, a preset and a budget.

Presets:

- ``paper``: as the paper describes the task: run_simulation shows multi-criteria hydrograph
  diagnostics, evaluate returns the metrics, the running best and the target status; the
  episode stops at the target or after ``patience`` evaluations without a new best.
- ``released``: the structure of the authors' released prompt (role, three tools, strict
  format rule, set -> run -> evaluate, a short diagnosis after each evaluate, one process at a
  time) with its defects fixed: the right hemisphere in the location, the target and the budget
  stated, th and isu stated as fixed (docs/reference-implementation.md, sections 4 and 11).

Wording is ours. Prompts stay compact (system under ~600 words, user under ~400) because a 4B
model with an 8k context reads them; the tool-call example comes from
:func:`hydroagent_hpc.env.toolcalls.format_example` so prompt and parser never drift. Only what the
basin declares about itself is shown (never hidden truth, never file paths).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hydroagent_hpc.env.toolcalls import describe_parameter, format_example
from hydroagent_hpc.params import CREST_SET, ParameterSet
from hydroagent_hpc.types import Basin, ToolCall

__all__ = ["PRESETS", "Budget", "system_prompt", "user_prompt", "render_messages", "format_coordinates",
           "format_timestep"]

PRESETS = ("paper", "released")


@dataclass(frozen=True)
class Budget:
    """What the prompts say about limits and stop rules. ``None`` switches a limit off.

    Field names match ``config.EnvConfig`` so an EnvConfig can be passed directly.
    ``protocol`` "turns": one candidate per set -> run -> evaluate, ``max_turns`` tool calls.
    "rounds": up to ``max_rounds`` rounds of up to ``candidates_per_round`` simulations, a round
    ending at evaluate. ``patience`` counts evaluations (= rounds) in a row without a new best.
    ``target_nse`` None means the basin's own target.
    """

    protocol: str = "turns"
    max_turns: int | None = 50
    max_simulations: int | None = None
    max_rounds: int = 20
    candidates_per_round: int = 10
    target_nse: float | None = None
    stop_at_target: bool = True
    patience: int | None = 5
    wall_clock_s: float | None = None
    clip_out_of_bounds: bool = True

    def __post_init__(self) -> None:
        if self.protocol not in ("turns", "rounds"):
            raise ValueError(f"protocol={self.protocol!r}: use 'turns' or 'rounds'")
        for name in ("max_turns", "max_simulations", "patience"):
            v = getattr(self, name)
            if v is not None and v < 0:
                raise ValueError(f"{name}={v!r}: must be >= 0 or None (off)")
        for name in ("max_rounds", "candidates_per_round"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}={getattr(self, name)!r}: must be at least 1")
        if self.wall_clock_s is not None and self.wall_clock_s <= 0:
            raise ValueError(f"wall_clock_s={self.wall_clock_s!r}: must be positive or None (off)")

    @classmethod
    def coerce(cls, obj: Any) -> Budget:
        """A Budget from a Budget, a mapping (unknown keys are errors) or any object with these
        attributes (e.g. an EnvConfig; missing ones take the defaults), or None (defaults)."""
        if obj is None:
            return cls()
        if isinstance(obj, cls):
            return obj
        names = [f.name for f in dataclasses.fields(cls)]
        if isinstance(obj, Mapping):
            unknown = sorted(set(obj) - set(names))
            if unknown:
                raise ValueError(f"unknown budget key(s) {unknown}; valid: {', '.join(names)}")
            return cls(**dict(obj))
        return cls(**{n: getattr(obj, n) for n in names if hasattr(obj, n)})


# ---------------------------------------------------------------------------------------------
# Small formatters


def format_coordinates(lat: float, lon: float, digits: int = 2) -> str:
    """``33.24°N, 84.99°W``: absolute values with the hemisphere letter (never negative °E)."""
    la, lo = round(float(lat), digits), round(float(lon), digits)
    ns = "S" if la < 0 else "N"
    ew = "W" if lo < 0 else "E"
    return f"{abs(la):.{digits}f}°{ns}, {abs(lo):.{digits}f}°{ew}"


_UNITS = {"y": "year", "m": "month", "d": "day", "h": "hour", "u": "minute", "s": "second"}


def format_timestep(timestep: str) -> str:
    """EF5's ``1h``, ``15u``, ``1d`` in words (``1 hour``, ``15 minutes``); unknown forms as given."""
    m = re.fullmatch(r"\s*(\d*)\s*([ymdhus])\s*", str(timestep).lower())
    if not m:
        return str(timestep)
    n = int(m.group(1) or 1)
    unit = _UNITS[m.group(2)]
    return f"{n} {unit}{'' if n == 1 else 's'}"


def _num(x: float) -> str:
    s = f"{float(x):.2f}".rstrip("0").rstrip(".")
    return s or "0"


def _duration(seconds: float) -> str:
    s = float(seconds)
    if s >= 3600 and s % 3600 == 0:
        return f"{int(s // 3600)} h"
    if s >= 60:
        return f"{round(s / 60)} min"
    return f"{_num(s)} s"


def _check_preset(preset: str) -> None:
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r}; choose one of: {', '.join(PRESETS)}")


def _gauge_label(basin: Basin) -> str:
    bid = basin.basin_id
    return f"USGS gauge {bid}" if bid.isdigit() and 8 <= len(bid) <= 15 else f"basin {bid}"


def _target(basin: Basin | None, budget: Budget) -> float | None:
    if budget.target_nse is not None:
        return budget.target_nse
    return basin.target_nse if basin is not None else None


# ---------------------------------------------------------------------------------------------
# System prompt

_FORMAT = (
    "Tool-call format. Write each call as a block exactly like the example: the opening tag, a newline, one "
    "JSON object with \"name\" and \"arguments\", a newline, the closing tag. Numbers go without quotes; "
    "run_simulation and evaluate take {}. No Markdown, no Python syntax. Several blocks may follow each other "
    "in one reply. Example:\n{example}\nEvery reply must contain at least one tool call.")

_PROCESSES = (
    "Which parameters act on which process: runoff volume and wetness: wm, b, im, fc, ke, iwu; "
    "timing and shape of peaks: alpha, beta, alpha0, under; recession and baseflow: leaki, under.")


def _protocol(budget: Budget, preset: str) -> str:
    if budget.protocol == "rounds":
        return (f"Protocol (rounds). Work in rounds. In each round try up to {budget.candidates_per_round} "
                "candidate parameter sets, each with set_parameters followed by run_simulation, then call "
                "evaluate once: it scores the round's simulations and closes the round. "
                f"At most {budget.max_rounds} rounds.")
    if preset == "released":
        return ("Protocol. Always set_parameters, then run_simulation, then evaluate. After each evaluate, "
                "write one or two sentences of diagnosis (what is wrong with the hydrograph and why), then "
                "call set_parameters again.")
    return ("Protocol (turns). Test one candidate at a time: set_parameters, run_simulation, evaluate. "
            "evaluate scores only a fresh successful simulation.")


def system_prompt(preset: str, budget: Any = None, parameters: ParameterSet = CREST_SET) -> str:
    """The system prompt of ``preset`` ("paper" or "released") for this budget's protocol.

    ``parameters`` is the basin's set: for a basin with Snow-17 the prompt also tells the agent
    about the snow parameters (a snow-free basin's prompt is unchanged).
    """
    _check_preset(preset)
    b = Budget.coerce(budget)
    clip = ("out-of-bounds values are clipped to the nearest bound and reported" if b.clip_out_of_bounds
            else "out-of-bounds values are rejected")
    example = format_example(ToolCall("set_parameters", {"wm": 1.5, "alpha": 0.8}))
    if preset == "paper":
        parts = [
            "You calibrate the CREST rainfall-runoff model (as the EF5 simulator runs it, with kinematic-wave "
            "routing) for one river basin, so that simulated discharge matches observed discharge. You act only "
            "through tools; every number you report must come from a tool result.",
            "Tools:\n"
            "- set_parameters: change one or more of the 11 tunable multipliers; the others keep their values; "
            f"{clip}.\n"
            "- run_simulation: run the model with the current parameters; it returns hydrograph diagnostics "
            "(peak error and timing, volume ratio, recession, time to peak, baseflow, event counts).\n"
            "- evaluate: score the latest simulation: NSE, KGE and its components, RMSE, percent bias, "
            "high- and low-flow KGE, your best NSE so far and whether the target is reached.",
            _FORMAT.replace("{example}", example),
            _protocol(b, preset),
            "Use the diagnostics to find the process that is most wrong (peak size, volume, timing, recession) "
            "and change the parameters that control it. " + _PROCESSES,
            "th and isu are fixed; do not send them.",
        ]
        if parameters.snow:
            parts.insert(2, _SNOW_SYSTEM)
    else:
        parts = [
            "You are an expert hydrologic calibration scientist. You calibrate the CREST model inside the EF5 "
            "simulator by calling tools. Never narrate imagined runs, guess metric values or write tables of "
            "results you have not received.",
            "You have three tools:\n"
            f"- set_parameters: numbers for the multipliers you want to change (the rest keep their values); {clip}.\n"
            "- run_simulation: runs EF5 with the current parameters; it reports success but no metrics.\n"
            "- evaluate: the only tool that reports performance (NSE, KGE, correlation, peaks, peak lag).",
            _FORMAT.replace("{example}", example),
            _protocol(b, preset),
            "Change one process at a time (peak size, volume or timing) so you can tell what helped. "
            + _PROCESSES,
            "th and isu are fixed; never send them.",
        ]
        if parameters.snow:
            parts.insert(2, _SNOW_SYSTEM)
    return "\n\n".join(parts)


_SNOW_SYSTEM = (
    "This basin also runs the Snow-17 snow model in front of CREST (precipitation falls as snow below 1 degC, "
    "the pack melts with temperature). set_parameters also takes its 8 parameters (values, not multipliers): "
    "scf (snowfall correction) scales snow volume, mfmax and mfmin (melt factors in summer and winter) and mbase "
    "(melt base temperature) time the melt, uadj (rain-on-snow melt), tipm, nmf (cold content) and plwhc "
    "(liquid water the pack holds).")


# ---------------------------------------------------------------------------------------------
# User prompt


def _budget_lines(basin: Basin | None, b: Budget) -> list[str]:
    target = _target(basin, b)
    limits = []
    if b.protocol == "rounds":
        limits.append(f"{b.max_rounds} rounds of up to {b.candidates_per_round} simulations")
    if b.max_turns is not None:
        limits.append(f"{b.max_turns} tool calls")
    if b.max_simulations is not None:
        limits.append(f"{b.max_simulations} simulations")
    if b.wall_clock_s is not None:
        limits.append(f"{_duration(b.wall_clock_s)} of wall-clock time")
    lines = []
    if target is not None:
        lines.append(f"Target: NSE above {target:g} over the scored window.")
    lines.append("Budget: at most " + ", ".join(limits) + "." if limits else "Budget: no fixed limit.")
    stops = []
    if b.stop_at_target and target is not None:
        stops.append("your best NSE exceeds the target")
    if b.patience is not None:
        unit = "rounds" if b.protocol == "rounds" else "evaluations"
        stops.append(f"{b.patience} {unit} in a row bring no new best NSE")
    stops.append("the budget is used up")
    lines.append("The episode ends when " + ", or ".join(stops) + ". Your best simulation counts, not the last.")
    return lines


def user_prompt(basin: Basin, preset: str, budget: Any = None, parameters: ParameterSet = CREST_SET) -> str:
    """The task: basin facts, window, parameter table, fixed parameters, target and budget.

    The table lists the basin's ``parameters``: the Snow-17 ones only for a basin with snow.
    """
    _check_preset(preset)
    b = Budget.coerce(budget)
    label = _gauge_label(basin)
    name = f" ({basin.name})" if basin.name and basin.name != basin.basin_id else ""
    lines = [f"Calibrate the CREST model for {label}{name}.", "", "Basin:"]
    lines.append(f"- Drainage area: {_num(basin.area_km2)} km²")
    lines.append(f"- Gauge location: {format_coordinates(basin.lat, basin.lon)}")
    if basin.notes:
        lines.append(f"- Notes: {basin.notes}")
    lines.append(f"- Time step: {format_timestep(basin.timestep)}")
    lines.append(f"- Scored window: {basin.window_start} to {basin.window_end}")
    if basin.warmup_start:
        lines.append(f"- Warm-up: the model starts at {basin.warmup_start}; steps before the window are not "
                     "scored.")
    else:
        lines.append("- Warm-up: none; the model starts at the window start, so iwu (initial soil water) "
                     "shapes the first days, which are scored.")
    lines += ["", "Tunable parameters (multipliers unless noted; you start from the defaults):"]
    lines += [f"- {n}: {describe_parameter(n)}" for n in parameters.tunable if n not in parameters.snow_names]
    if parameters.snow:
        lines.append("Snow-17 parameters (this basin has SNOW=SNOW17; values, not multipliers; melt factors per "
                     "6 hours):")
        lines += [f"- {n}: {describe_parameter(n)}" for n in parameters.snow_names]
    fixed = list(parameters.fixed)
    lines.append("Fixed (do not send them):")
    lines += [f"- {n}: {describe_parameter(n)}" for n in fixed]
    lines.append("")
    if preset == "paper":
        lines.append("Goal: maximise the Nash-Sutcliffe efficiency (NSE) of simulated against observed "
                     "discharge over the scored window.")
    else:
        lines.append("Objective: maximise NSE over the scored window; keep iterating while you still find "
                     "improvements.")
    lines += _budget_lines(basin, b)
    lines += ["", "Begin by calling set_parameters."]
    return "\n".join(lines)


def render_messages(basin: Basin, preset: str, budget: Any = None,
                    parameters: ParameterSet = CREST_SET) -> list[dict[str, Any]]:
    """``[{"role": "system", ...}, {"role": "user", ...}]`` for a chat model (``parameters``: the basin's set)."""
    return [{"role": "system", "content": system_prompt(preset, budget, parameters)},
            {"role": "user", "content": user_prompt(basin, preset, budget, parameters)}]
