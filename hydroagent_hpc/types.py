"""The central value types. ``SimulationResult`` is one run of the simulator.

``Episode`` is one calibration attempt; ``Basin``, ``ToolCall``, ``Turn`` and ``SimRecord`` are its parts.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

__all__ = ["SimulationResult", "GaugeSeries", "Basin", "ToolCall", "Turn", "SimRecord", "Episode"]


@dataclass(frozen=True)
class GaugeSeries:
    """Per-step series at one gauge, over every step of the run (warm-up included)."""

    discharge: np.ndarray  # m3/s
    observed: np.ndarray  # m3/s, NaN where the file has no row; EF5's -999 kept as written
    precip: np.ndarray  # mm/h, area mean upstream of the gauge
    pet: np.ndarray  # mm/h
    soil_moisture: np.ndarray  # % of WM
    fast_flow: np.ndarray  # overland excess, mm/s (area mean)
    slow_flow: np.ndarray  # interflow excess, mm/s (area mean)
    temperature: np.ndarray | None = None  # degC, area mean (only with Snow-17)
    swe: np.ndarray | None = None  # snow water equivalent, mm, area mean (only with Snow-17)


@dataclass(frozen=True)
class SimulationResult:
    """One simulator run: step end times, the primary gauge's series, and every gauge's.

    ``warmup[t]`` is True for steps before TIME_WARMEND (EF5 does not print them; metrics skip
    them). ``params`` are the multipliers the run used; ``backend`` is "embedded" or "ef5".
    """

    times: np.ndarray  # datetime64[m], end of each step
    gauge: str
    gauges: Mapping[str, GaugeSeries]
    warmup: np.ndarray
    params: Mapping[str, float]
    wall_time_s: float
    missing_precip: int = 0
    missing_pet: int = 0
    backend: str = "embedded"
    info: Mapping[str, object] = field(default_factory=dict)

    @property
    def primary(self) -> GaugeSeries:
        return self.gauges[self.gauge]

    @property
    def discharge(self) -> np.ndarray:
        return self.primary.discharge

    @property
    def observed(self) -> np.ndarray:
        return self.primary.observed

    @property
    def precip(self) -> np.ndarray:
        return self.primary.precip

    @property
    def pet(self) -> np.ndarray:
        return self.primary.pet

    @property
    def soil_moisture(self) -> np.ndarray:
        return self.primary.soil_moisture

    @property
    def fast_flow(self) -> np.ndarray:
        return self.primary.fast_flow

    @property
    def slow_flow(self) -> np.ndarray:
        return self.primary.slow_flow

    def evaluation_mask(self) -> np.ndarray:
        """Steps to score: after warm-up, observed finite and not EF5's -999 sentinel."""
        obs = self.observed
        mask: np.ndarray = (~self.warmup) & np.isfinite(obs) & (obs > -998.0) & np.isfinite(self.discharge)
        return mask


# ---------------------------------------------------------------------------------------------
# Calibration records: a basin to calibrate, tool calls, turns, simulations, and the episode.


@dataclass(frozen=True)
class Basin:
    """A basin an agent calibrates: where its control file is and what the prompts may say.

    ``basin_id`` is always a string (USGS ids keep their leading zeros). ``target_nse`` is the
    per-basin target (0.8075 for the paper's canonical gauge 02338660, 0.7 otherwise unless the
    basin says so). ``notes`` carries climate and land-cover remarks where they are known.
    """

    basin_id: str
    name: str
    control: str
    area_km2: float
    lat: float
    lon: float
    timestep: str
    window_start: str  # "YYYY-MM-DD HH:MM", first scored step
    window_end: str
    warmup_start: str | None = None  # TIME_BEGIN when a warm-up precedes the window
    target_nse: float = 0.7
    paper_gauge_id: str | None = None
    synthetic: bool = False
    notes: str = ""


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call. ``arguments`` is already a dict (JSON object)."""

    name: str
    arguments: Mapping[str, object]
    call_id: str | None = None


@dataclass
class Turn:
    """One tool call or one parse failure, with what the environment answered and paid.

    ``kind`` is "tool" or "parse_failure". ``message_index`` numbers the assistant messages;
    several turns can share one message. ``reward_terms`` names each part of ``reward``.
    ``run_id`` is the simulation a run_simulation produced or an evaluate scored.
    """

    index: int
    message_index: int
    kind: str
    tool: str | None
    arguments: Mapping[str, object] | None
    observation: Mapping[str, object]
    reward: float
    reward_terms: Mapping[str, float]
    ok: bool
    error: str | None = None
    run_id: int | None = None
    text: str = ""  # the assistant message (stored on the first turn of each message)
    started_s: float = 0.0  # seconds since the episode started
    duration_s: float = 0.0


@dataclass
class SimRecord:
    """One simulation: its parameters, outcome, metrics (scored at once) and discharge."""

    run_id: int
    params: Mapping[str, float]
    ok: bool
    error: str | None
    metrics: Mapping[str, object]
    wall_time_s: float
    evaluated: bool = False
    round: int | None = None
    discharge: np.ndarray | None = None  # float32 over the basin's steps (warm-up included)


@dataclass
class Episode:
    """One calibration attempt by one policy on one basin: the full record.

    ``counters`` holds precisely defined counts (turns, parse_failures, simulations,
    failed_simulations, evaluations, improvements, clipped_values, rounds); ``terminal_terms``
    names each part of the terminal reward; ``times``/``observed`` are the basin's series,
    stored once per basin by the store.
    """

    episode_id: str
    basin_id: str
    agent: str
    preset: str
    protocol: str
    seed: int
    config: Mapping[str, object]
    turns: list[Turn] = field(default_factory=list)
    sims: list[SimRecord] = field(default_factory=list)
    best_nse: float | None = None
    best_run: int | None = None
    best_params: Mapping[str, float] | None = None
    stop_reason: str = ""
    terminal_reward: float = 0.0
    terminal_terms: Mapping[str, float] = field(default_factory=dict)
    counters: Mapping[str, int] = field(default_factory=dict)
    wall_time_s: float = 0.0
    started_utc: str = ""
    provenance: Mapping[str, object] = field(default_factory=dict)
    usage: Mapping[str, object] = field(default_factory=dict)  # tokens, cost, model (LLM agents)
    times: np.ndarray | None = None  # datetime64[m] step end times of the basin
    observed: np.ndarray | None = None
    warmup: np.ndarray | None = None

    @property
    def total_reward(self) -> float:
        return float(sum(t.reward for t in self.turns) + self.terminal_reward)
