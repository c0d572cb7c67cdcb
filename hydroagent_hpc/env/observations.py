"""What the agent sees of a run: metrics, a compact hydrograph and the multi-criteria summary.

``evaluate_run`` scores a :class:`SimulationResult` with :func:`hydroagent_hpc.metrics.evaluate`
on its evaluation mask (post-warm-up, observed finite and not -999) and keeps JSON-ready values.
The two views follow the preset's observation keys:

* ``paper``: run_simulation shows the hydrograph and the diagnostics (peak error and timing,
  volume ratio, recession, time-to-peak, baseflow, events); evaluate shows NSE, KGE and its
  components, RMSE, PBIAS, high/low-flow KGE, the running best, the target and whether this
  run improved on the best.
* ``released``: run_simulation shows only the status; evaluate shows the eight keys of the
  authors' training environment (NSE, CC, KGE, sim_peak, obs_peak, peak_ratio,
  lag_hours_sim_minus_obs, num_points).

The compact hydrograph aggregates the scored window into ``hydrograph_points`` bins (60 by
default: daily means for a 60-day hourly window), each value to 3 significant digits, so sim
and obs together cost about 120 numbers (roughly 400 tokens) whatever the window length.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np

from hydroagent_hpc.config import EnvConfig
from hydroagent_hpc.metrics import evaluate
from hydroagent_hpc.types import SimRecord, SimulationResult

if TYPE_CHECKING:  # the environment imports this module
    from hydroagent_hpc.env.environment import CalibrationEnv

__all__ = ["evaluate_run", "compact_hydrograph", "simulation_view", "evaluation_view", "PAPER_EVAL_KEYS",
           "DIAGNOSTIC_KEYS"]

PAPER_EVAL_KEYS = ("NSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta", "RMSE", "PBIAS", "volume_ratio", "KGE_high",
                   "KGE_low", "logNSE", "nse_band")
DIAGNOSTIC_KEYS = ("peak_sim", "peak_obs", "peak_error_pct", "peak_lag_h", "volume_ratio", "recession_k_sim",
                   "recession_k_obs", "time_to_peak_sim_h", "time_to_peak_obs_h", "bfi_sim", "bfi_obs", "events_sim",
                   "events_obs")


def _clean(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        return float(v)
    if isinstance(v, str):
        return v
    return None


def evaluate_run(res: SimulationResult) -> dict[str, Any]:
    """All scalar metrics of a run (floats, ints, strings; NaN kept as NaN), plus reasons."""
    mask = res.evaluation_mask()
    m = evaluate(res.observed, res.discharge, res.times, mask=mask)
    out = {k: _clean(v) for k, v in m.items() if _clean(v) is not None}
    reasons = m.get("reasons")
    if isinstance(reasons, dict) and reasons:
        out["reasons"] = {str(k): str(v) for k, v in reasons.items()}
    return out


def _sig(x: float, digits: int = 3) -> float | None:
    if x is None or not math.isfinite(x):
        return None
    if x == 0:
        return 0.0
    return float(f"{x:.{digits}g}")


def compact_hydrograph(times: np.ndarray, observed: np.ndarray, simulated: np.ndarray, warmup: np.ndarray,
                       points: int) -> dict[str, Any]:
    """Bin means of simulated and observed discharge over the scored window."""
    keep = ~np.asarray(warmup, dtype=bool)
    t, o, s = times[keep], np.asarray(observed, float)[keep], np.asarray(simulated, float)[keep]
    o = np.where(o > -998.0, o, np.nan)
    n = t.size
    bins = max(1, min(points, n))
    edges = np.linspace(0, n, bins + 1).astype(int)
    sim_m, obs_m = [], []
    for a, b in zip(edges[:-1], edges[1:]):
        sim_m.append(_sig(float(np.mean(s[a:b]))) if b > a else None)
        ob = o[a:b]
        obs_m.append(_sig(float(np.nanmean(ob))) if b > a and np.isfinite(ob).any() else None)
    step_h = float((t[1] - t[0]) / np.timedelta64(1, "h")) if n > 1 else 0.0
    return {"start": str(t[0]).replace("T", " ") if n else None, "bin_hours": round(step_h * n / bins, 3),
            "unit": "m3/s (bin means)", "sim": sim_m, "obs": obs_m}


def _round(v: Any) -> Any:
    if isinstance(v, float):
        return round(v, 4) if math.isfinite(v) else None
    return v


def simulation_view(rec: SimRecord, env: CalibrationEnv, config: EnvConfig) -> dict[str, Any]:
    """The run_simulation observation for a successful run."""
    if config.observation == "released":
        return {"status": "ok", "message": f"Simulation completed successfully (run #{rec.run_id})",
                "output_file": f"ts.{env.basin.basin_id.lower()}.crest.csv", "run_number": rec.run_id}
    series = env.observed_series  # an ObservedSeries: set by the first successful run, which this one is or follows
    if series is None or rec.discharge is None:
        raise ValueError(f"simulation_view: run {rec.run_id} is not a successful run with a hydrograph "
                         f"(call it only for runs whose record has ok=True)")
    view = {"status": "ok", "run": rec.run_id,
            "message": f"simulation {rec.run_id} finished; call evaluate to score it",
            "hydrograph": compact_hydrograph(series.times, series.observed, rec.discharge, series.warmup,
                                             config.hydrograph_points),
            "diagnostics": {k: _round(rec.metrics.get(k)) for k in DIAGNOSTIC_KEYS}}
    return view


def evaluation_view(rec: SimRecord, env: CalibrationEnv, config: EnvConfig, improved: bool | None,
                    brief: bool = False) -> dict[str, Any]:
    """The evaluate observation (or one candidate's row in a round, with ``brief``)."""
    m = rec.metrics
    if not rec.ok:
        return {"run": rec.run_id, "status": "error", "message": f"simulation failed: {rec.error}"}
    if config.observation == "released":
        view = {"status": "ok", "message": f"Metrics calculated from {m.get('n_points', 0)} data points",
                "NSE": m.get("NSE"), "CC": m.get("KGE_r"), "KGE": m.get("KGE"), "sim_peak": m.get("peak_sim"),
                "obs_peak": m.get("peak_obs"), "peak_ratio": m.get("peak_ratio"),
                "lag_hours_sim_minus_obs": m.get("peak_lag_h"), "num_points": m.get("n_points")}
        view = {k: _round(v) for k, v in view.items()}
        if brief:
            view["run"] = rec.run_id
            view["params"] = {k: round(v, 6) for k, v in rec.params.items()}
        return view
    view = {"status": "ok", "run": rec.run_id, **{k: _round(m.get(k)) for k in PAPER_EVAL_KEYS}}
    if brief:
        view["peak_error_pct"] = _round(m.get("peak_error_pct"))
        view["peak_lag_h"] = _round(m.get("peak_lag_h"))
        view["params"] = {k: round(v, 6) for k, v in rec.params.items()}
        return view
    best = env.best_view()
    view.update({"improved": improved, "best": best, "target_nse": env.target,
                 "target_met": bool(best is not None and best["nse"] >= env.target),
                 "evaluations_without_improvement": env.since_improvement,
                 "simulations_left": None if env.config.max_simulations is None else
                 env.config.max_simulations - env.counters["simulations"],
                 "turns_left": None if env.config.max_turns is None else env.config.max_turns - len(env.turns) - 1})
    return view
