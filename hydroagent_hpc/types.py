"""The central value types. ``SimulationResult`` is one run of the simulator.

(``Episode`` and friends join this module with the calibration environment.)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import numpy as np

__all__ = ["SimulationResult", "GaugeSeries"]


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
        return (~self.warmup) & np.isfinite(obs) & (obs > -998.0) & np.isfinite(self.discharge)
