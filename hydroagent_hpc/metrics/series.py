"""Input handling shared by every metric: the joint evaluation mask and the time axis.

Conventions (docs/metrics.md §1):

* A point is used only when **both** series are valid there: finite, not EF5's missing
  sentinel (any value <= -998, EF5 copies the -999 of its observation files through), inside
  the caller's ``mask`` (``True`` = use this point) and at or after ``warmup_end``.
* ``times`` gives the time step; it is never assumed. The step ``dt_h`` is the median spacing in
  hours; lags and durations are always read from the time stamps themselves.
* Data problems (gaps, too few points, constant series) never raise: metrics return NaN and a
  reason. Programmer errors (length mismatch, wrong dtype, times not increasing) raise
  ``ValueError`` with a message naming the offending sizes.
"""

from __future__ import annotations

import datetime as _dt
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

logger = logging.getLogger(__name__)

FloatArray = NDArray[np.float64]
BoolArray = NDArray[np.bool_]
TimesLike = NDArray[np.datetime64] | Sequence[_dt.datetime] | Sequence[np.datetime64]

#: Values at or below this are EF5's ``-999`` "no data" marker.
MISSING_SENTINEL: float = -998.0

#: A metric value with the reason it is NaN (``None`` when the value is defined).
Scored = tuple[float, str | None]

NAN = float("nan")

#: Minimum number of jointly valid points for NSE-type scores (project convention, docs/metrics.md §1).
MIN_POINTS_NSE = 10
#: Minimum number of points for correlation, KGE and the error/bias scores.
MIN_POINTS = 2


def too_few(n: int, need: int) -> str:
    """Reason text for a metric computed on fewer than ``need`` points."""
    return "no valid data" if n == 0 else f"only {n} valid points (< {need} required)"


def is_constant(x: FloatArray) -> bool:
    """Exact constancy test (max == min); the mean of a constant array need not be exact."""
    return bool(x.max() == x.min())


def undefined(reason: str) -> Scored:
    """Return ``(nan, reason)``: the uniform way a metric reports that it is undefined."""
    return NAN, reason


def as_series(x: ArrayLike, name: str) -> FloatArray:
    """Return ``x`` as a 1-D float64 array; raise ``ValueError`` if it is not one-dimensional."""
    arr = np.asarray(x, dtype=np.float64)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be one-dimensional, got shape {arr.shape}")
    return arr


def valid_points(q: FloatArray) -> BoolArray:
    """True where ``q`` is finite and not EF5's ``-999`` sentinel."""
    return np.isfinite(q) & (q > MISSING_SENTINEL)


def as_hours(times: TimesLike, n: int | None = None) -> FloatArray:
    """Convert time stamps to float hours since the first stamp.

    Accepts a ``numpy.datetime64`` array or a sequence of ``datetime.datetime`` /
    ``numpy.datetime64``. Raises ``ValueError`` when the length differs from ``n``, when a stamp
    is NaT or when the stamps are not strictly increasing (a caller bug, not a data gap).
    """
    t = np.asarray(times)
    if t.dtype.kind != "M":
        try:
            t = np.asarray(times, dtype="datetime64[us]")
        except (TypeError, ValueError) as exc:
            raise ValueError(f"times must be datetime64 or datetime values: {exc}") from exc
    if t.ndim != 1:
        raise ValueError(f"times must be one-dimensional, got shape {t.shape}")
    if n is not None and t.size != n:
        raise ValueError(f"times has {t.size} values but the series have {n}")
    if t.size == 0:
        return np.zeros(0)
    if np.isnat(t).any():
        raise ValueError("times contains NaT")
    hours = (t - t[0]) / np.timedelta64(1, "h")
    hours = np.asarray(hours, dtype=np.float64)
    if hours.size > 1 and not np.all(np.diff(hours) > 0):
        raise ValueError("times must be strictly increasing")
    return hours


def single_series(q: ArrayLike, times: TimesLike,
                  mask: ArrayLike | None) -> tuple[FloatArray, BoolArray, FloatArray, float]:
    """One discharge series ready for signature metrics: values, usable points, hours, step.

    Usable = finite, not EF5's -999 sentinel and, when ``mask`` (boolean, True = use) is given,
    selected by it. The step ``dt_h`` is the median spacing of ``times`` in hours.
    """
    qa = as_series(q, "q")
    t_h = as_hours(times, qa.size)
    valid = valid_points(qa)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_ or m.shape != qa.shape:
            raise ValueError(f"mask must be a boolean array of shape {qa.shape}")
        valid &= m
    dt_h = float(np.median(np.diff(t_h))) if t_h.size > 1 else float("nan")
    return qa, valid, t_h, dt_h


def as_datetime64(value: np.datetime64 | _dt.datetime) -> np.datetime64:
    """Return a single time stamp as ``numpy.datetime64`` (microsecond resolution)."""
    return np.datetime64(value).astype("datetime64[us]")


@dataclass(frozen=True)
class PairedSeries:
    """Observed and simulated series with their joint mask, built once per evaluation.

    ``obs``/``sim`` keep full length (invalid points included) so that event detection and
    time lags can use positions; ``o``/``s`` are the jointly valid values in time order.
    """

    obs: FloatArray
    sim: FloatArray
    valid: BoolArray
    o: FloatArray
    s: FloatArray
    t_h: FloatArray | None
    dt_h: float

    @property
    def n_valid(self) -> int:
        return int(self.o.size)

    @property
    def n_masked(self) -> int:
        return int(self.obs.size - self.o.size)


def joint_mask(
    obs: FloatArray,
    sim: FloatArray,
    mask: ArrayLike | None = None,
) -> BoolArray:
    """Joint evaluation mask: True where both series are valid and ``mask`` (if given) is True.

    ``mask`` must be a boolean array of the same length (True = use this point), so that an
    index array is never silently misread as a mask.
    """
    valid = valid_points(obs) & valid_points(sim)
    if mask is not None:
        m = np.asarray(mask)
        if m.dtype != np.bool_:
            raise ValueError(f"mask must be a boolean array (True = use), got dtype {m.dtype}")
        if m.shape != valid.shape:
            raise ValueError(f"mask has shape {m.shape} but the series have {valid.shape}")
        valid &= m
    return valid


def prepare(
    obs: ArrayLike,
    sim: ArrayLike,
    times: TimesLike | None = None,
    mask: ArrayLike | None = None,
    warmup_end: np.datetime64 | _dt.datetime | None = None,
) -> PairedSeries:
    """Validate inputs and build the :class:`PairedSeries` used by every metric.

    Raises ``ValueError`` for programmer errors only (length mismatch names both lengths).
    """
    o_full = as_series(obs, "obs")
    s_full = as_series(sim, "sim")
    if o_full.size != s_full.size:
        raise ValueError(
            f"obs and sim differ in length: obs has {o_full.size} values, sim has {s_full.size}"
        )
    valid = joint_mask(o_full, s_full, mask)
    t_h: FloatArray | None = None
    dt_h = NAN
    if times is not None:
        t_h = as_hours(times, o_full.size)
        if t_h.size > 1:
            dt_h = float(np.median(np.diff(t_h)))
        if warmup_end is not None:
            t0 = np.asarray(times).astype("datetime64[us]")[0] if t_h.size else None
            if t0 is not None:
                cut_h = (as_datetime64(warmup_end) - t0) / np.timedelta64(1, "h")
                valid &= t_h >= float(cut_h)
    elif warmup_end is not None:
        raise ValueError("warmup_end needs times")
    return PairedSeries(
        obs=o_full,
        sim=s_full,
        valid=valid,
        o=o_full[valid],
        s=s_full[valid],
        t_h=t_h,
        dt_h=dt_h,
    )


def record(reasons: dict[str, str] | None, key: str, scored: Scored) -> float:
    """Store ``scored``'s reason under ``key`` in ``reasons`` (if given) and return the value.

    +-inf becomes NaN (docs/metrics.md §1: never -inf), and a NaN always gets a reason.
    """
    value, reason = scored
    if not math.isfinite(value):
        if reason is None:
            reason = "non-finite result (overflow)" if math.isinf(value) else "numerically undefined"
        value = NAN
    if reason is not None:
        if reasons is not None:
            reasons[key] = reason
        logger.debug("%s: %s", key, reason)
    return float(value)
