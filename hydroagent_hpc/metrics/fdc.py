"""Flow-duration-curve signatures FHV, FLV and FMS (Yilmaz et al. 2008).

Each series is sorted **independently** in descending (exceedance) order over the joint mask;
values <= 0 are replaced by 1e-6 before logarithms. Signs as published: FHV > 0 means simulated
high flows too high; FMS > 0 means the simulated mid-segment is too steep; FLV > 0 means the
simulated low-flow segment rises *less* above its own minimum than the observed one. Segment
sizes are rounded counts of the valid points (top 2 % of 1,440 hourly values is 29 points:
read these as diagnostics).

Reference: Yilmaz, K. K., Gupta, H. V. & Wagener, T. (2008), Water Resour. Res. 44, W09417,
doi:10.1029/2007WR006716.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics.series import FloatArray, Scored, prepare, record, undefined

#: Replacement for non-positive flows before logarithms (docs/metrics.md §7).
LOG_FLOOR = 1e-6


def _descending(x: FloatArray) -> FloatArray:
    return np.sort(x)[::-1]


def fhv_core(o: FloatArray, s: FloatArray, h: float = 0.02) -> Scored:
    """The core of :func:`fhv` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    n_seg = int(np.round(h * o.size))
    if n_seg < 1:
        return undefined(f"{o.size} valid points give an empty top-{h:.0%} segment")
    os_ = _descending(o)[:n_seg]
    ss_ = _descending(s)[:n_seg]
    total = float(os_.sum())
    if not total > 0.0:
        return undefined("non-positive observed high-flow volume")
    return 100.0 * float((ss_ - os_).sum()) / total, None


def flv_core(o: FloatArray, s: FloatArray, low: float = 0.3) -> Scored:
    """The core of :func:`flv` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    start = int(np.round((1.0 - low) * o.size))
    if o.size - start < 2:
        return undefined(f"{o.size} valid points give fewer than 2 in the low-flow segment")
    ol = np.log(np.maximum(_descending(o)[start:], LOG_FLOOR))
    sl = np.log(np.maximum(_descending(s)[start:], LOG_FLOOR))
    obs_term = float((ol - ol.min()).sum())
    sim_term = float((sl - sl.min()).sum())
    if obs_term == 0.0:
        return undefined("observed low-flow segment is flat (zero denominator)")
    return -100.0 * (sim_term - obs_term) / obs_term, None


def fms_core(o: FloatArray, s: FloatArray, lower: float = 0.2, upper: float = 0.7) -> Scored:
    """The core of :func:`fms` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < 2:
        return undefined("no valid data" if o.size == 0 else "only 1 valid point")
    # Exceedance probability p is the (1 - p) non-exceedance quantile (linear interpolation).
    qs = np.array([1.0 - lower, 1.0 - upper])
    ol = np.log(np.maximum(np.quantile(o, qs), LOG_FLOOR))
    sl = np.log(np.maximum(np.quantile(s, qs), LOG_FLOOR))
    obs_slope = float(ol[0] - ol[1])
    if obs_slope == 0.0:
        return undefined("observed mid-segment of the FDC is flat (zero denominator)")
    return 100.0 * (float(sl[0] - sl[1]) - obs_slope) / obs_slope, None


@np.errstate(all="ignore")
def fhv(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    h: float = 0.02,
    reasons: dict[str, str] | None = None,
) -> float:
    """Percent bias of the FDC high-flow segment (top ``h`` = 2 % of exceedance).

    FHV = 100 * sum_h(s_h - o_h) / sum_h(o_h), both series sorted independently, descending.
    Reference: Yilmaz et al. (2008), eq. A3, doi:10.1029/2007WR006716.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "FHV", fhv_core(ps.o, ps.s, h))


@np.errstate(all="ignore")
def flv(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    low: float = 0.3,
    reasons: dict[str, str] | None = None,
) -> float:
    """Percent bias of the FDC low-flow segment (bottom ``low`` = 30 %), in log space.

    FLV = -100 * [sum(ln s_l - ln s_L) - sum(ln o_l - ln o_L)] / sum(ln o_l - ln o_L), with L
    the minimum of each segment; flows <= 0 become 1e-6. Sign as published: FLV < 0 when the
    simulated low-flow segment spans more (log) flow above its minimum than the observed one,
    FLV = 100 when the simulated segment is flat. Reference: Yilmaz et al. (2008), eq. A4,
    doi:10.1029/2007WR006716.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "FLV", flv_core(ps.o, ps.s, low))


@np.errstate(all="ignore")
def fms(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    lower: float = 0.2,
    upper: float = 0.7,
    reasons: dict[str, str] | None = None,
) -> float:
    """Percent bias of the FDC mid-segment slope between exceedance 0.2 and 0.7.

    FMS = 100 * [(ln s_0.2 - ln s_0.7) - (ln o_0.2 - ln o_0.7)] / (ln o_0.2 - ln o_0.7), where
    q_p is the flow exceeded with probability p (the (1 - p) quantile, linear interpolation).
    Signed difference over the observed slope, as in docs/metrics.md §7. Reference: Yilmaz et al.
    (2008), eq. A2, doi:10.1029/2007WR006716.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "FMS", fms_core(ps.o, ps.s, lower, upper))
