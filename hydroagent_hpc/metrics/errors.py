"""Error, bias and volume scores: RMSE, MAE, ME, PBIAS, volume ratio, RSR.

Same calling convention as :mod:`hydroagent_hpc.metrics.scores`: ``f(obs, sim, mask=None, *,
reasons=None)`` on the joint mask; ``name_core(o, s) -> (value, reason)`` on masked arrays. Sign
convention (docs/metrics.md §3): ME and PBIAS are **positive when the simulation is too high**.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics.series import (
    MIN_POINTS,
    FloatArray,
    Scored,
    is_constant,
    prepare,
    record,
    too_few,
    undefined,
)


def rmse_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`rmse` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < MIN_POINTS:
        return undefined(too_few(o.size, MIN_POINTS))
    e = s - o
    return math.sqrt(float(e @ e) / e.size), None


def mae_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`mae` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < MIN_POINTS:
        return undefined(too_few(o.size, MIN_POINTS))
    return float(np.abs(s - o).mean()), None


def me_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`mean_error` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < MIN_POINTS:
        return undefined(too_few(o.size, MIN_POINTS))
    return float((s - o).mean()), None


def pbias_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`pbias` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < MIN_POINTS:
        return undefined(too_few(o.size, MIN_POINTS))
    total = float(o.sum())
    if not total > 0.0:
        return undefined("non-positive observed volume")
    return 100.0 * float((s - o).sum()) / total, None


def volume_ratio_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`volume_ratio` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size < MIN_POINTS:
        return undefined(too_few(o.size, MIN_POINTS))
    total = float(o.sum())
    if not total > 0.0:
        return undefined("non-positive observed volume")
    return float(s.sum()) / total, None


def rsr_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`rsr` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    rmse_value, why = rmse_core(o, s)
    if why is not None:
        return undefined(why)
    sigma = float(o.std())
    if is_constant(o) or sigma == 0.0:
        return undefined("zero variance in observations")
    return rmse_value / sigma, None


# --------------------------------------------------------------------------- public functions


# --------------------------------------------------------------------------- public functions


@np.errstate(all="ignore")
def rmse(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Root mean square error, RMSE = sqrt(mean((s - o)^2)), in the units of the series.

    Reference: e.g. Moriasi, D. N. et al. (2007), Trans. ASABE 50(3), 885-900.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "RMSE", rmse_core(ps.o, ps.s))


@np.errstate(all="ignore")
def mae(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Mean absolute error, MAE = mean(|s - o|).

    Reference: Legates, D. R. & McCabe, G. J. (1999), Water Resour. Res. 35(1), 233-241.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "MAE", mae_core(ps.o, ps.s))


@np.errstate(all="ignore")
def mean_error(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Mean error, ME = mean(s - o); positive means the simulation is too high.

    Reference: Legates & McCabe (1999), Water Resour. Res. 35(1), 233-241.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "ME", me_core(ps.o, ps.s))


@np.errstate(all="ignore")
def pbias(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Percent bias, **project sign**: PBIAS = 100 * sum(s - o) / sum(o).

    **Positive means the simulation is too high** (too much water), consistent with
    ``volume_ratio > 1`` and ME > 0. This is the opposite sign of Moriasi et al. (2007) and of
    hydroeval's ``pbias`` (100 * sum(o - s) / sum(o)). NaN when sum(o) <= 0.

    Reference: Gupta, H. V., Sorooshian, S. & Yapo, P. O. (1999), J. Hydrol. Eng. 4(2), 135-143
    (sign flipped here); Moriasi, D. N. et al. (2015), Trans. ASABE 58(6), 1763-1785.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "PBIAS", pbias_core(ps.o, ps.s))


@np.errstate(all="ignore")
def volume_ratio(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Volume ratio VR = sum(s) / sum(o) over the joint mask (= KGE's beta); NaN if sum(o) <= 0.

    Equals 1 + PBIAS/100 with the project sign. Reference: docs/metrics.md §3 (spotpy's
    ``volume_error`` is VR - 1; HydroErr's ``ve`` is a different quantity).
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "volume_ratio", volume_ratio_core(ps.o, ps.s))


@np.errstate(all="ignore")
def rsr(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """RMSE-observations standard deviation ratio, RSR = RMSE / sigma_o (population sigma).

    Reference: Moriasi, D. N. et al. (2007), Trans. ASABE 50(3), 885-900.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "RSR", rsr_core(ps.o, ps.s))
