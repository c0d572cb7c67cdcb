"""``evaluate``: every metric of a simulated against an observed hydrograph in one call.

The joint mask, the time axis and the event lists are built once and shared; the whole call
takes under 2 ms on 1,440 hourly points (see ``hydroagent_hpc.bench.metrics``).
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics.errors import mae_core, me_core, pbias_core, rmse_core, rsr_core, volume_ratio_core
from hydroagent_hpc.metrics.events import DEFAULT_DETECTOR, EventDetector, find_events
from hydroagent_hpc.metrics.fdc import fhv_core, flv_core, fms_core
from hydroagent_hpc.metrics.peaks import event_scores_core, peak_timing_core, peak_values_core, time_to_peak_core
from hydroagent_hpc.metrics.scores import (
    kge_components_core,
    kge_high_core,
    kge_low_core,
    log_nse_core,
    nse_band,
    nse_core,
)
from hydroagent_hpc.metrics.series import MIN_POINTS_NSE, PairedSeries, Scored, TimesLike, prepare
from hydroagent_hpc.metrics.signatures import DEFAULT_BASEFLOW, BaseflowFilter, bfi_core, recession_k_core

logger = logging.getLogger(__name__)

#: Keys :func:`evaluate` always returns (besides ``reasons``), in a stable order.
METRIC_KEYS: tuple[str, ...] = (
    "NSE", "logNSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta",
    "KGEprime", "KGEprime_r", "KGEprime_gamma", "KGEprime_beta",
    "RMSE", "MAE", "ME", "RSR", "PBIAS", "volume_ratio",
    "peak_sim", "peak_obs", "peak_ratio", "peak_error_pct", "peak_lag_h",
    "peak_timing_mae_h", "peak_timing_bias_h", "peak_timing_n", "missed_peaks", "peak_mape",
    "time_to_peak_obs_h", "time_to_peak_sim_h", "time_to_peak_error_h",
    "event_nse", "event_peak_ratio", "event_lag_h",
    "recession_k_obs", "recession_k_sim", "bfi_obs", "bfi_sim",
    "events_obs", "events_sim",
    "FHV", "FLV", "FMS", "KGE_high", "KGE_low",
    "n_points", "n_valid", "n_masked", "dt_h", "nse_band",
    "bfi_alpha", "bfi_passes", "bfi_reflect_steps", "peak_window_h",
)


def evaluate(
    obs: ArrayLike,
    sim: ArrayLike,
    times: TimesLike,
    mask: ArrayLike | None = None,
    *,
    warmup_end: np.datetime64 | _dt.datetime | None = None,
    detector: EventDetector = DEFAULT_DETECTOR,
    baseflow: BaseflowFilter = DEFAULT_BASEFLOW,
    peak_window_h: float = 12.0,
    n_top_events: int = 3,
    min_points_nse: int = MIN_POINTS_NSE,
    bands: str = "moriasi2015",
) -> dict[str, Any]:
    """Evaluate ``sim`` against ``obs`` and return a flat dict of metrics plus ``reasons``.

    Parameters
    ----------
    obs, sim
        Discharge series of equal length (m3/s). NaN, +-inf and EF5's -999 sentinel (any value
        <= -998) in either series drop that step from **both** (joint mask).
    times
        Time stamps (``numpy.datetime64`` array or ``datetime`` sequence), strictly increasing;
        the time step is read from them (median spacing), never assumed.
    mask
        Optional boolean array, **True = use this point** (for example False over a warm-up).
    warmup_end
        Optional time stamp; steps before it are dropped (EF5's ``TIME_WARMEND``).
    detector, baseflow, peak_window_h, n_top_events
        Event detector, Lyne-Hollick settings, half-width of the peak-timing window and the
        number of largest observed events used for ``event_*`` scores.
    min_points_nse
        Minimum jointly valid points for NSE and log-NSE (project convention 10).
    bands
        NSE band table for ``nse_band`` (``"moriasi2015"`` or ``"hydroagent_paper"``).

    Returns
    -------
    dict
        Every key of :data:`METRIC_KEYS` (floats, NaN when undefined; ``events_*``,
        ``n_*`` and ``peak_timing_n`` are ints; ``nse_band`` a string) and ``reasons``:
        metric key -> why it is NaN, or which convention replaced an undefined component
        (e.g. ``KGE_r`` set to 0 for a constant simulation). Sign conventions: PBIAS and ME
        positive = simulation too high; lags positive = simulation late.

    Keys beyond the obvious ones: ``peak_timing_mae_h`` / ``peak_timing_bias_h`` mean |lag| and
    mean lag of the simulated maximum within +-``peak_window_h`` of each observed event peak
    (``peak_timing_n`` peaks used); ``missed_peaks`` fraction of observed event peaks with no
    simulated event peak within that window; ``peak_mape`` mean |s - o| / o (%) at observed
    event peaks; ``time_to_peak_*_h`` for the largest observed event, ``time_to_peak_error_h``
    mean (sim - obs) over all observed events; ``event_nse`` / ``event_peak_ratio`` /
    ``event_lag_h`` means over the ``n_top_events`` largest observed events (padded windows);
    ``recession_k_*`` median exponential recession rate (1/h) on the observed falling limbs;
    ``bfi_*`` Lyne-Hollick baseflow index with ``bfi_alpha`` / ``bfi_passes`` /
    ``bfi_reflect_steps``; ``n_points`` = ``n_valid`` jointly valid steps used, ``n_masked``
    the rest; ``dt_h`` the median time step read from ``times``.

    Raises
    ------
    ValueError
        Programmer errors only: lengths of obs, sim, times or mask differ, mask not boolean,
        times not strictly increasing. Data problems never raise.

    References are in each metric's docstring (hydroagent_hpc.metrics.scores, fdc, peaks,
    signatures) and in docs/metrics.md.
    """
    if times is None:
        raise ValueError("evaluate needs times: the time step is read from them, never assumed")
    ps = prepare(obs, sim, times, mask, warmup_end)
    with np.errstate(all="ignore"):
        out, reasons = _compute(ps, detector, baseflow, peak_window_h, n_top_events, min_points_nse)
    _sanitise(out, reasons)
    out["nse_band"] = nse_band(out["NSE"], bands)
    result: dict[str, Any] = {key: out[key] for key in METRIC_KEYS}
    result["reasons"] = reasons
    if reasons:
        logger.debug("evaluate: %d undefined or substituted metrics: %s", len(reasons), reasons)
    return result


def _sanitise(out: dict[str, Any], reasons: dict[str, str]) -> None:
    """Map +-inf to NaN and make sure every NaN carries a reason (safety net for overflow)."""
    for key, value in out.items():
        if isinstance(value, np.floating):
            value = out[key] = float(value)
        if isinstance(value, float) and not math.isfinite(value):
            if math.isinf(value):
                out[key] = float("nan")
                reasons.setdefault(key, "non-finite result (overflow)")
            else:
                reasons.setdefault(key, "numerically undefined")


def _compute(
    ps: PairedSeries,
    detector: EventDetector,
    baseflow: BaseflowFilter,
    peak_window_h: float,
    n_top_events: int,
    min_points_nse: int,
) -> tuple[dict[str, Any], dict[str, str]]:
    """All metrics on a prepared pair; returns (values, reasons)."""
    assert ps.t_h is not None  # evaluate always passes times
    reasons: dict[str, str] = {}
    out: dict[str, Any] = {}

    def put(key: str, scored: Scored) -> None:
        value, why = scored
        out[key] = value
        if why is not None:
            reasons[key] = why

    o, s = ps.o, ps.s
    put("NSE", nse_core(o, s, min_points_nse))
    put("logNSE", log_nse_core(o, s, min_points_nse))
    kge, r, alpha, beta, kgep, gamma = kge_components_core(o, s, reasons)
    out.update(KGE=kge, KGE_r=r, KGE_alpha=alpha, KGE_beta=beta)
    out.update(KGEprime=kgep, KGEprime_r=r, KGEprime_gamma=gamma, KGEprime_beta=beta)
    for key in ("r", "beta"):
        if f"KGE_{key}" in reasons:
            reasons[f"KGEprime_{key}"] = reasons[f"KGE_{key}"]
    put("RMSE", rmse_core(o, s))
    put("MAE", mae_core(o, s))
    put("ME", me_core(o, s))
    put("RSR", rsr_core(o, s))
    put("PBIAS", pbias_core(o, s))
    put("volume_ratio", volume_ratio_core(o, s))
    put("KGE_high", kge_high_core(o, s))
    put("KGE_low", kge_low_core(o, s))
    put("FHV", fhv_core(o, s))
    put("FLV", flv_core(o, s))
    put("FMS", fms_core(o, s))

    for key, scored in peak_values_core(ps).items():
        put(key, scored)
    dt_ok = math.isfinite(ps.dt_h) and ps.dt_h > 0
    ev_obs = find_events(ps.obs, ps.valid, ps.t_h, ps.dt_h, detector)
    ev_sim = find_events(ps.sim, ps.valid, ps.t_h, ps.dt_h, detector)
    out["events_obs"], out["events_sim"] = len(ev_obs), len(ev_sim)
    if ps.n_valid < 3 or not dt_ok:
        reasons["events_obs"] = reasons["events_sim"] = "fewer than 3 valid points or no time step"
    timing, timing_reasons = peak_timing_core(ps, ev_obs, ev_sim, peak_window_h)
    reasons.update(timing_reasons)
    out.update(
        peak_timing_mae_h=timing.mae_h,
        peak_timing_bias_h=timing.bias_h,
        peak_timing_n=timing.n_peaks,
        missed_peaks=timing.missed_peaks,
        peak_mape=timing.peak_mape,
    )
    for key, scored in time_to_peak_core(ps, ev_obs).items():
        put(key, scored)
    for key, scored in event_scores_core(ps, ev_obs, n_top_events).items():
        put(key, scored)
    put("recession_k_obs", recession_k_core(ps.obs, ps.valid, ps.t_h, ev_obs))
    put("recession_k_sim", recession_k_core(ps.sim, ps.valid, ps.t_h, ev_obs))
    put("bfi_obs", bfi_core(ps.obs, ps.valid, ps.dt_h, baseflow))
    put("bfi_sim", bfi_core(ps.sim, ps.valid, ps.dt_h, baseflow))

    out["n_points"] = out["n_valid"] = ps.n_valid
    out["n_masked"] = ps.n_masked
    out["dt_h"] = ps.dt_h
    out["bfi_alpha"] = baseflow.alpha(ps.dt_h) if dt_ok else float("nan")
    if not dt_ok:
        reasons["dt_h"] = reasons["bfi_alpha"] = "fewer than two time stamps"
    out["bfi_passes"] = baseflow.passes
    out["bfi_reflect_steps"] = baseflow.reflect
    out["peak_window_h"] = peak_window_h
    return out, reasons
