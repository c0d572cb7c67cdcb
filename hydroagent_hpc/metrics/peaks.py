"""Peak magnitude and timing metrics: whole-window peak, windowed event timing, time to peak.

Conventions (docs/metrics.md §4): lags are ``t_sim - t_obs`` in hours read from the time stamps,
**positive = simulated peak late**. Whole-window peaks (HydroAgent's definition) compare the two
maxima over the joint mask, which may belong to different events; the windowed metrics pair each
observed event peak with the simulated maximum near it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics.events import DEFAULT_DETECTOR, Event, EventDetector, find_events, steps
from hydroagent_hpc.metrics.scores import nse_core
from hydroagent_hpc.metrics.series import (
    PairedSeries,
    Scored,
    TimesLike,
    prepare,
    record,
    too_few,
    undefined,
)

NAN = float("nan")


@dataclass(frozen=True)
class PeakTiming:
    """Windowed peak-timing results over observed events (hours, fractions, percent)."""

    mae_h: float
    bias_h: float
    n_peaks: int
    missed_peaks: float
    peak_mape: float


def peak_values_core(ps: PairedSeries) -> dict[str, Scored]:
    """Whole-window peak metrics on a prepared pair."""
    if ps.n_valid < 2:
        why = undefined(too_few(ps.n_valid, 2))
        return dict.fromkeys(("peak_obs", "peak_sim", "peak_ratio", "peak_error_pct", "peak_lag_h"), why)
    io, is_ = int(np.argmax(ps.o)), int(np.argmax(ps.s))
    po, psim = float(ps.o[io]), float(ps.s[is_])
    out: dict[str, Scored] = {"peak_obs": (po, None), "peak_sim": (psim, None)}
    if po > 0.0:
        out["peak_ratio"] = (psim / po, None)
        out["peak_error_pct"] = (100.0 * (psim - po) / po, None)
    else:
        out["peak_ratio"] = out["peak_error_pct"] = undefined("observed maximum <= 0")
    if ps.t_h is None:
        out["peak_lag_h"] = undefined("no time stamps")
    else:
        pos = np.flatnonzero(ps.valid)
        out["peak_lag_h"] = (float(ps.t_h[pos[is_]] - ps.t_h[pos[io]]), None)
    return out


def peak_timing_core(
    ps: PairedSeries,
    events_obs: list[Event],
    events_sim: list[Event],
    window_h: float,
) -> tuple[PeakTiming, dict[str, str]]:
    """Windowed peak timing (neuralhydrology-style) on prepared data; returns results, reasons."""
    reasons: dict[str, str] = {}
    if ps.t_h is None or not ps.n_valid or not events_obs:
        why = "no observed events" if ps.t_h is not None and ps.n_valid else "no valid data or times"
        for k in ("peak_timing_mae_h", "peak_timing_bias_h", "missed_peaks", "peak_mape"):
            reasons[k] = why
        return PeakTiming(NAN, NAN, 0, NAN, NAN), reasons
    t_h, valid = ps.t_h, ps.valid
    w = steps(window_h, ps.dt_h, minimum=3)
    pos = np.flatnonzero(valid)
    first, last = int(pos[0]), int(pos[-1])
    lags: list[float] = []
    for ev in events_obs:
        p = ev.peak
        if p - w < first or p + w > last or not bool(valid[p - w:p + w + 1].all()):
            continue
        j = p - w + int(np.argmax(ps.sim[p - w:p + w + 1]))
        lags.append(float(t_h[j] - t_h[p]))
    if lags:
        arr = np.asarray(lags)
        mae_h, bias_h = float(np.abs(arr).mean()), float(arr.mean())
    else:
        mae_h = bias_h = NAN
        reasons["peak_timing_mae_h"] = reasons["peak_timing_bias_h"] = (
            "no observed peak has a complete +-window inside the mask"
        )
    tol_h = w * ps.dt_h
    sim_peaks = np.array([t_h[e.peak] for e in events_sim])
    hits = sum(
        1 for e in events_obs if sim_peaks.size and np.abs(sim_peaks - t_h[e.peak]).min() <= tol_h
    )
    missed = 1.0 - hits / len(events_obs)
    rel = [abs(ps.sim[e.peak] - ps.obs[e.peak]) / ps.obs[e.peak] for e in events_obs if ps.obs[e.peak] > 0]
    mape = 100.0 * float(np.mean(rel)) if rel else NAN
    if not rel:
        reasons["peak_mape"] = "no positive observed event peak"
    return PeakTiming(mae_h, bias_h, len(lags), missed, mape), reasons


def time_to_peak_core(ps: PairedSeries, events_obs: list[Event]) -> dict[str, Scored]:
    """Time to peak of the largest observed event (obs and sim) and the mean error over events."""
    keys = ("time_to_peak_obs_h", "time_to_peak_sim_h", "time_to_peak_error_h")
    if ps.t_h is None or not events_obs:
        return {k: undefined("no observed events") for k in keys}
    t_h = ps.t_h
    sim_masked = np.where(ps.valid, ps.sim, -np.inf)

    def ttp(ev: Event) -> tuple[float, float]:
        j = ev.lo + int(np.argmax(sim_masked[ev.lo:ev.hi + 1]))
        return float(t_h[ev.peak] - t_h[ev.start]), float(t_h[j] - t_h[ev.start])

    main = max(events_obs, key=lambda e: ps.obs[e.peak])
    ttp_obs, ttp_sim = ttp(main)
    errors = [s - o for o, s in map(ttp, events_obs)]
    return {
        keys[0]: (ttp_obs, None),
        keys[1]: (ttp_sim, None),
        keys[2]: (float(np.mean(errors)), None),
    }


def event_scores_core(ps: PairedSeries, events_obs: list[Event], n_top: int) -> dict[str, Scored]:
    """Mean NSE, peak ratio and lag over the ``n_top`` largest observed events (padded windows)."""
    keys = ("event_nse", "event_peak_ratio", "event_lag_h")
    if ps.t_h is None or not events_obs:
        return {k: undefined("no observed events") for k in keys}
    top = sorted(events_obs, key=lambda e: ps.obs[e.peak], reverse=True)[:n_top]
    nses, ratios, lags = [], [], []
    for ev in top:
        sl = slice(ev.lo, ev.hi + 1)
        v = ps.valid[sl]
        o, s, t = ps.obs[sl][v], ps.sim[sl][v], ps.t_h[sl][v]
        value, _ = nse_core(o, s)
        if math.isfinite(value):
            nses.append(value)
        io, is_ = int(np.argmax(o)), int(np.argmax(s))
        if o[io] > 0:
            ratios.append(float(s[is_] / o[io]))
        lags.append(float(t[is_] - t[io]))

    def mean_or_nan(xs: list[float], why: str) -> Scored:
        return (float(np.mean(xs)), None) if xs else undefined(why)

    return {
        keys[0]: mean_or_nan(nses, "no event window with a defined NSE"),
        keys[1]: mean_or_nan(ratios, "no positive observed event peak"),
        keys[2]: mean_or_nan(lags, "no event"),
    }


@np.errstate(all="ignore")
def peak_ratio(
    obs: ArrayLike, sim: ArrayLike, mask: ArrayLike | None = None, *, reasons: dict[str, str] | None = None
) -> float:
    """Ratio of maxima over the joint mask, max(s) / max(o); NaN when max(o) <= 0.

    Reference: HydroAgent's whole-window peak definition (docs/metrics.md §4).
    """
    return record(reasons, "peak_ratio", peak_values_core(prepare(obs, sim, mask=mask))["peak_ratio"])


@np.errstate(all="ignore")
def peak_error_pct(
    obs: ArrayLike, sim: ArrayLike, mask: ArrayLike | None = None, *, reasons: dict[str, str] | None = None
) -> float:
    """Relative peak error in percent, 100 * (max s - max o) / max o = 100 * (peak_ratio - 1).

    Reference: docs/metrics.md §4 (whole-window maxima; positive = simulated peak too high).
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "peak_error_pct", peak_values_core(ps)["peak_error_pct"])


@np.errstate(all="ignore")
def peak_lag_h(
    obs: ArrayLike,
    sim: ArrayLike,
    times: TimesLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Lag of the whole-window maxima in hours: t[argmax s] - t[argmax o], positive = late.

    Read from the time stamps, never from the index. Caveat: the two maxima can belong to
    different events; see :func:`peak_timing` for the event-paired version.
    Reference: docs/metrics.md §4.
    """
    ps = prepare(obs, sim, times, mask)
    return record(reasons, "peak_lag_h", peak_values_core(ps)["peak_lag_h"])


@np.errstate(all="ignore")
def peak_timing(
    obs: ArrayLike,
    sim: ArrayLike,
    times: TimesLike,
    mask: ArrayLike | None = None,
    *,
    window_h: float = 12.0,
    detector: EventDetector = DEFAULT_DETECTOR,
) -> PeakTiming:
    """Windowed peak-timing error over the observed events.

    For each observed event peak t_p, the simulated maximum in [t_p - w, t_p + w] gives the lag
    t_sim - t_p; w = ``window_h`` converted to steps, at least 3 steps (12 h for hourly data).
    Peaks within w of either end of the mask or whose window contains a masked point are
    skipped. Returns the mean |lag| (``mae_h``) and mean signed lag (``bias_h``); ``missed_peaks``
    is the fraction of observed event peaks with no simulated event peak (same detector on sim)
    within +-w; ``peak_mape`` = 100 * mean |s_p - o_p| / o_p at the observed peak steps.

    Reference: Kratzert, F. et al. (2019)/neuralhydrology peak-timing and missed-peaks metrics;
    Gauch, M. et al. (2021), HESS 25, 2045-2062, doi:10.5194/hess-25-2045-2021.
    """
    ps = prepare(obs, sim, times, mask)
    assert ps.t_h is not None
    ev_o = find_events(ps.obs, ps.valid, ps.t_h, ps.dt_h, detector)
    ev_s = find_events(ps.sim, ps.valid, ps.t_h, ps.dt_h, detector)
    return peak_timing_core(ps, ev_o, ev_s, window_h)[0]


@np.errstate(all="ignore")
def time_to_peak_h(
    obs: ArrayLike,
    sim: ArrayLike,
    times: TimesLike,
    mask: ArrayLike | None = None,
    *,
    detector: EventDetector = DEFAULT_DETECTOR,
    reasons: dict[str, str] | None = None,
) -> tuple[float, float]:
    """Time to peak of the main (largest observed) event, ``(ttp_obs_h, ttp_sim_h)``.

    TTP_obs = t_peak - t_start, with t_start where the detector's backward walk stopped (before
    padding). TTP_sim uses the same t_start and the simulated maximum inside the observed event's
    padded window, so it can be negative when the simulated peak comes before the observed rise.
    Reference: project convention (docs/metrics.md §4).
    """
    ps = prepare(obs, sim, times, mask)
    assert ps.t_h is not None
    ev = find_events(ps.obs, ps.valid, ps.t_h, ps.dt_h, detector)
    out = time_to_peak_core(ps, ev)
    return (
        record(reasons, "time_to_peak_obs_h", out["time_to_peak_obs_h"]),
        record(reasons, "time_to_peak_sim_h", out["time_to_peak_sim_h"]),
    )
