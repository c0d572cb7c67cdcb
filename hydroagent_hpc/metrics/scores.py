"""Efficiency scores (NSE and KGE families) and NSE performance bands.

Every public function has the signature ``f(obs, sim, mask=None, *, ..., reasons=None)``:
``obs`` and ``sim`` are 1-D arrays of the same length, ``mask`` an optional boolean array
(True = use the point). The joint mask of :func:`hydroagent_hpc.metrics.series.joint_mask` is
applied first (NaN, +-inf and EF5's -999 sentinel in either series are dropped). A metric that is
undefined for the data returns ``nan``; if a ``reasons`` dict is passed, the reason is stored in it
under the metric's key. Standard deviations are population ones (ddof = 0) throughout.

The ``name_core(o, s)`` functions take already-masked arrays and return ``(value, reason)``; they
are what :func:`hydroagent_hpc.metrics.evaluate` calls, so the mask is built only once.
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike

from hydroagent_hpc.metrics.series import (
    MIN_POINTS,
    MIN_POINTS_NSE,
    FloatArray,
    Scored,
    is_constant,
    prepare,
    record,
    too_few,
    undefined,
)

#: Minimum number of high-flow steps for KGE_high (docs/metrics.md §2).
MIN_POINTS_HIGH = 10

#: Moriasi et al. (2015) NSE bands for watershed-scale streamflow, as published (lower bounds,
#: exclusive). The HydroAgent paper quotes different ones; see :func:`nse_band`.
NSE_BANDS_MORIASI_2015: tuple[tuple[float, str], ...] = (
    (0.80, "very good"),
    (0.70, "good"),
    (0.50, "satisfactory"),
)
NSE_BANDS_HYDROAGENT_PAPER: tuple[tuple[float, str], ...] = (
    (0.85, "very good"),
    (0.70, "good"),
    (0.50, "satisfactory"),
)


# --------------------------------------------------------------------------- clean-array cores


def nse_core(o: FloatArray, s: FloatArray, min_points: int = MIN_POINTS_NSE) -> Scored:
    """The core of :func:`nse` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    n = o.size
    if n == 0:
        return undefined("no valid data")
    if n < max(min_points, 2):
        return undefined(too_few(n, max(min_points, 2)))
    if is_constant(o):
        return undefined("zero variance in observations")
    d = o - o.mean()
    sst = float(d @ d)
    if sst == 0.0:
        return undefined("zero variance in observations")
    e = s - o
    return 1.0 - float(e @ e) / sst, None


def _log_inputs(o: FloatArray, s: FloatArray) -> tuple[FloatArray, FloatArray, float] | str:
    """Shared guard and epsilon for log / inverse transforms (eps = 0.01 * mean(o))."""
    if o.size == 0:
        return "no valid data"
    eps = 0.01 * float(o.mean())
    if not eps > 0.0:
        return "non-positive mean observed flow (epsilon = 0.01 * mean undefined)"
    return np.maximum(o, 0.0), np.maximum(s, 0.0), eps


def log_nse_core(o: FloatArray, s: FloatArray, min_points: int = MIN_POINTS_NSE) -> Scored:
    """The core of :func:`log_nse` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    prepared = _log_inputs(o, s)
    if isinstance(prepared, str):
        return undefined(prepared)
    oc, sc, eps = prepared
    return nse_core(np.log(oc + eps), np.log(sc + eps), min_points)


def _moments(o: FloatArray, s: FloatArray) -> tuple[float, float, float, float, float]:
    """Means, population standard deviations and covariance of the pair."""
    mo = float(o.mean())
    ms = float(s.mean())
    do = o - mo
    ds = s - ms
    n = o.size
    so = math.sqrt(float(do @ do) / n)
    ss = math.sqrt(float(ds @ ds) / n)
    cov = float(do @ ds) / n
    return mo, ms, so, ss, cov


def _distance(a: float, b: float, c: float) -> float:
    """Euclidean distance of (a, b, c) from the ideal point (1, 1, 1); NaN if any is NaN.

    ``math.hypot`` avoids the OverflowError of float ``** 2``; NaN is checked first because
    IEEE hypot returns inf when another argument is infinite.
    """
    if math.isnan(a) or math.isnan(b) or math.isnan(c):
        return float("nan")
    return math.hypot(a - 1.0, b - 1.0, c - 1.0)


def kge_components_core(
    o: FloatArray, s: FloatArray, reasons: dict[str, str]
) -> tuple[float, float, float, float, float, float]:
    """KGE-2009 and KGE'-2012 with their components, sharing one pass over the data.

    Returns ``(kge, r, alpha, beta, kge_prime, gamma)``; reasons go into ``reasons`` under
    ``KGE``, ``KGE_r``, ``KGE_alpha``, ``KGE_beta``, ``KGEprime`` and ``KGEprime_gamma``.
    """
    nan = float("nan")
    n = o.size
    if n < MIN_POINTS:
        why = too_few(n, MIN_POINTS)
        for key in ("KGE", "KGE_r", "KGE_alpha", "KGE_beta"):
            reasons[key] = why
        reasons["KGEprime"] = reasons["KGEprime_gamma"] = why
        return nan, nan, nan, nan, nan, nan
    mo, ms, so, ss, cov = _moments(o, s)
    o_const = is_constant(o) or so == 0.0
    s_const = is_constant(s) or ss == 0.0
    if o_const:
        r = nan
        reasons["KGE_r"] = "zero variance in observations"
        alpha = nan
        reasons["KGE_alpha"] = "zero variance in observations"
    else:
        alpha = ss / so if not s_const else 0.0
        if s_const:
            r = 0.0
            reasons["KGE_r"] = (
                "r undefined (constant simulation); set to 0 by project convention"
            )
        else:
            r = cov / so / ss  # two divisions: so * ss may underflow to 0
            if math.isfinite(r):
                r = min(1.0, max(-1.0, r))
            else:
                r = float("nan")
                reasons["KGE_r"] = "correlation not finite (overflow)"
    if mo > 0.0:
        beta = ms / mo
    else:
        beta = nan
        reasons["KGE_beta"] = "non-positive mean observed flow"
    kge = 1.0 - _distance(r, alpha, beta)
    if math.isnan(kge):
        reasons["KGE"] = "; ".join(
            reasons[k] for k in ("KGE_r", "KGE_alpha", "KGE_beta") if k in reasons
        ) or "numerically undefined"
    if o_const:
        gamma = nan
        reasons["KGEprime_gamma"] = "zero variance in observations"
    elif not mo > 0.0:
        gamma = nan
        reasons["KGEprime_gamma"] = "non-positive mean observed flow"
    elif ms == 0.0:
        gamma = nan
        reasons["KGEprime_gamma"] = "zero mean simulated flow (coefficient of variation undefined)"
    elif (so / mo) == 0.0:
        gamma = nan
        reasons["KGEprime_gamma"] = "observed coefficient of variation underflows to 0"
    else:
        gamma = (ss / ms) / (so / mo)
    kge_prime = 1.0 - _distance(r, gamma, beta)
    if math.isnan(kge_prime):
        reasons["KGEprime"] = "; ".join(
            reasons[k] for k in ("KGE_r", "KGEprime_gamma", "KGE_beta") if k in reasons
        ) or "numerically undefined"
    return kge, r, alpha, beta, kge_prime, gamma


def _kge(o: FloatArray, s: FloatArray) -> Scored:
    notes: dict[str, str] = {}
    value = kge_components_core(o, s, notes)[0]
    return value, notes.get("KGE")


def kge_high_core(o: FloatArray, s: FloatArray, quantile: float = 0.9) -> Scored:
    """The core of :func:`kge_high` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    if o.size == 0:
        return undefined("no valid data")
    sel = o >= np.quantile(o, quantile)
    if int(sel.sum()) < MIN_POINTS_HIGH:
        return undefined(
            f"only {int(sel.sum())} steps at or above the {quantile:.0%} observed quantile "
            f"(< {MIN_POINTS_HIGH} required)"
        )
    return _kge(o[sel], s[sel])


def kge_low_core(o: FloatArray, s: FloatArray) -> Scored:
    """The core of :func:`kge_low` on already-masked arrays: ``(value, reason)`` (what ``evaluate`` calls)."""
    prepared = _log_inputs(o, s)
    if isinstance(prepared, str):
        return undefined(prepared)
    oc, sc, eps = prepared
    return _kge(1.0 / (oc + eps), 1.0 / (sc + eps))


# --------------------------------------------------------------------------- public functions


@np.errstate(all="ignore")
def nse(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    min_points: int = MIN_POINTS_NSE,
    reasons: dict[str, str] | None = None,
) -> float:
    """Nash-Sutcliffe efficiency.

    NSE = 1 - sum((s - o)^2) / sum((o - mean(o))^2), range (-inf, 1]; 0 means as good as the
    observed mean. NaN when the observations have zero variance or fewer than ``min_points``
    jointly valid points remain (project default 10; docs/metrics.md §1).

    Reference: Nash, J. E. & Sutcliffe, J. V. (1970), J. Hydrol. 10(3), 282-290,
    doi:10.1016/0022-1694(70)90255-6.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "NSE", nse_core(ps.o, ps.s, min_points))


@np.errstate(all="ignore")
def log_nse(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    min_points: int = MIN_POINTS_NSE,
    reasons: dict[str, str] | None = None,
) -> float:
    """NSE of log flows: NSE(ln(s + eps), ln(o + eps)) with eps = 0.01 * mean(o).

    Negative flows are clamped to 0 before adding eps. Emphasises low flows.

    Reference: Pushpalatha, R. et al. (2012), J. Hydrol. 420-421, 171-182,
    doi:10.1016/j.jhydrol.2011.11.055 (transform and epsilon; hydroeval's default).
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "logNSE", log_nse_core(ps.o, ps.s, min_points))


@np.errstate(all="ignore")
def kge_components(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> tuple[float, float, float, float]:
    """KGE (2009) and its components ``(KGE, r, alpha, beta)``; see :func:`kge`."""
    ps = prepare(obs, sim, mask=mask)
    notes: dict[str, str] = {}
    kge_value, r, alpha, beta, _, _ = kge_components_core(ps.o, ps.s, notes)
    sink = {} if reasons is None else reasons
    return (
        record(sink, "KGE", (kge_value, notes.get("KGE"))),
        record(sink, "KGE_r", (r, notes.get("KGE_r"))),
        record(sink, "KGE_alpha", (alpha, notes.get("KGE_alpha"))),
        record(sink, "KGE_beta", (beta, notes.get("KGE_beta"))),
    )


def kge(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Kling-Gupta efficiency, 2009 form (the project's "KGE").

    KGE = 1 - sqrt((r - 1)^2 + (alpha - 1)^2 + (beta - 1)^2), with r the Pearson correlation,
    alpha = sigma_s / sigma_o (population standard deviations) and beta = mu_s / mu_o.
    Project convention (docs/metrics.md §2): a constant simulation with sigma_o > 0 gets r = 0
    (reason recorded under ``KGE_r``), so the mean-flow simulation scores 1 - sqrt(2) ~ -0.414
    (Knoben et al. 2019) and zero flow 1 - sqrt(3). sigma_o = 0 or mu_o <= 0 gives NaN.

    Reference: Gupta, H. V. et al. (2009), J. Hydrol. 377(1-2), 80-91,
    doi:10.1016/j.jhydrol.2009.08.003.
    """
    return kge_components(obs, sim, mask, reasons=reasons)[0]


@np.errstate(all="ignore")
def kge_prime_components(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> tuple[float, float, float, float]:
    """KGE' (2012) and its components ``(KGEprime, r, gamma, beta)``; see :func:`kge_prime`."""
    ps = prepare(obs, sim, mask=mask)
    notes: dict[str, str] = {}
    _, r, _, beta, kgep, gamma = kge_components_core(ps.o, ps.s, notes)
    sink = {} if reasons is None else reasons
    return (
        record(sink, "KGEprime", (kgep, notes.get("KGEprime"))),
        record(sink, "KGEprime_r", (r, notes.get("KGE_r"))),
        record(sink, "KGEprime_gamma", (gamma, notes.get("KGEprime_gamma"))),
        record(sink, "KGEprime_beta", (beta, notes.get("KGE_beta"))),
    )


def kge_prime(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """Modified Kling-Gupta efficiency KGE' (2012).

    KGE' = 1 - sqrt((r - 1)^2 + (gamma - 1)^2 + (beta - 1)^2), with
    gamma = (sigma_s / mu_s) / (sigma_o / mu_o), the ratio of coefficients of variation, and
    beta = mu_s / mu_o. Same r = 0 convention for a constant simulation as :func:`kge`; gamma is
    NaN when mu_s = 0.

    Reference: Kling, H., Fuchs, M. & Paulin, M. (2012), J. Hydrol. 424-425, 264-277,
    doi:10.1016/j.jhydrol.2012.01.011.
    """
    return kge_prime_components(obs, sim, mask, reasons=reasons)[0]


@np.errstate(all="ignore")
def kge_high(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    quantile: float = 0.9,
    reasons: dict[str, str] | None = None,
) -> float:
    """KGE (2009) on the high-flow steps: those where o >= the 90th percentile of o.

    Time-paired subset of the joint mask; at least 10 steps, else NaN. Project convention
    (docs/metrics.md §2), built on Gupta et al. (2009), doi:10.1016/j.jhydrol.2009.08.003.
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "KGE_high", kge_high_core(ps.o, ps.s, quantile))


@np.errstate(all="ignore")
def kge_low(
    obs: ArrayLike,
    sim: ArrayLike,
    mask: ArrayLike | None = None,
    *,
    reasons: dict[str, str] | None = None,
) -> float:
    """KGE (2009) on inverse flows: KGE(1/(s + eps), 1/(o + eps)), eps = 0.01 * mean(o).

    Negative flows are clamped to 0 first. Emphasises low flows; equals hydroeval's
    ``evaluator(kge, ..., transform='inv')``. References: Pushpalatha et al. (2012),
    doi:10.1016/j.jhydrol.2011.11.055 (transform, eps); Garcia, F. et al. (2017), Hydrol. Sci.
    J. 62(7), 1149-1166, doi:10.1080/02626667.2017.1308511 (KGE on 1/Q for low flows).
    """
    ps = prepare(obs, sim, mask=mask)
    return record(reasons, "KGE_low", kge_low_core(ps.o, ps.s))


def nse_band(value: float, bands: str = "moriasi2015") -> str:
    """Performance rating of an NSE value.

    ``bands="moriasi2015"`` (default) uses the published watershed-scale streamflow bands of
    Moriasi et al. (2015), Trans. ASABE 58(6), 1763-1785: very good > 0.80, good 0.70-0.80,
    satisfactory 0.50-0.70, unsatisfactory <= 0.50 (lower bounds exclusive).
    ``bands="hydroagent_paper"`` uses the bands the HydroAgent paper attributes to Moriasi
    (very good > 0.85). Returns ``"undefined"`` for NaN. The bands were set for daily/monthly
    evaluations and are lenient for hourly event windows.
    """
    if bands == "moriasi2015":
        table = NSE_BANDS_MORIASI_2015
    elif bands == "hydroagent_paper":
        table = NSE_BANDS_HYDROAGENT_PAPER
    else:
        raise ValueError(f"unknown NSE band table {bands!r}; use 'moriasi2015' or 'hydroagent_paper'")
    if value is None or not math.isfinite(float(value)):
        return "undefined"
    for lower, name in table:
        if value > lower:
            return name
    return "unsatisfactory"
