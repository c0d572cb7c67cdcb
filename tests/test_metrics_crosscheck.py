"""Cross-checks against independent implementations on PyPI (test-only dependencies).

hydroeval 0.1.0 and HydroErr 2.0.0 (the ``dev`` extra). Convention differences, written out:

* PBIAS sign: hydroeval's ``pbias`` is 100 * sum(o - s) / sum(o) (positive = under-prediction);
  the project's is 100 * sum(s - o) / sum(o), so ``pbias_project = -hydroeval.pbias``.
* Standard deviation form: the project and hydroeval use population sigma (ddof = 0). HydroErr's
  ``kge_2009`` uses ddof = 1 for alpha, but alpha is a ratio of two sigmas with the same ddof, so
  the factor sqrt(n / (n - 1)) cancels exactly; only rounding differs. ``kge_2012`` uses ddof = 0.
* Masking: hydroeval drops only steps where the *observation* is NaN (a NaN simulation makes the
  result NaN); HydroErr drops NaN/inf rows of either series (joint, like the project) but knows
  nothing of EF5's -999 sentinel. The project masks NaN, +-inf and <= -998 in either series.
* Beta: hydroeval's ``kge`` computes beta as sum(s) / sum(o), identical to mean ratio under a joint
  mask, and equal to the project's ``volume_ratio``.
* Minimum points: the project's NSE needs 10 points by default; the short series here pass
  ``min_points=2`` so the formulas are compared, not the policy.
* Transforms: hydroeval's ``transform='log'`` / ``'inv'`` use eps = 0.01 * mean(o), as the
  project's ``log_nse`` / ``kge_low`` do (the project also clamps negatives, absent here).
* hydroeval has no MAE; its MARE = sum|o - s| / sum(o) equals MAE / mean(o).
* No zero-variance guards in either library; those cases are tested in test_metrics.py only.

:func:`largest_differences` returns the largest absolute difference per library and metric
over the series below (``cd tests && python -c "import test_metrics_crosscheck as c;
print(c.largest_differences())"``).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Iterator

import numpy as np
import pytest

from helpers.series import hydrograph, noisy
from hydroagent_hpc import metrics as m

he = pytest.importorskip("hydroeval", reason="hydroeval (dev extra) not installed")
hr = pytest.importorskip("HydroErr", reason="HydroErr (dev extra) not installed")

#: Relative tolerance for every shared metric (floating-point summation order only).
RTOL = 1e-10
ATOL = 1e-12


def series_pairs() -> Iterator[tuple[str, np.ndarray, np.ndarray]]:
    """Deterministic obs/sim pairs: short and long, random and hydrograph-like, biased and shifted."""
    for seed in range(12):
        rng = np.random.default_rng(seed)
        n = int(rng.choice([10, 17, 50, 365, 1440]))
        o = rng.lognormal(1.0, 1.0, n)
        s = o * rng.lognormal(0.1, 0.4, n)
        yield f"lognormal-{seed}-n{n}", o, s
    for seed, (shift, scale) in enumerate([(0, 1.0), (3, 1.1), (-5, 0.8), (12, 1.5)]):
        o = noisy(hydrograph(), seed=100 + seed)
        s = noisy(hydrograph(shift=shift), seed=200 + seed) * scale
        yield f"hydrograph-shift{shift}-x{scale}", o, s
    o = noisy(hydrograph(), seed=300)
    s = noisy(hydrograph(shift=2), seed=301)
    o[np.random.default_rng(7).random(o.size) < 0.05] = np.nan  # gaps in obs: all three mask them
    yield "hydrograph-obs-gaps", o, s


def he1(fn: Callable, s: np.ndarray, o: np.ndarray, **kw) -> np.ndarray:
    """hydroeval's evaluator for one simulation column -> 1-D array of its outputs."""
    return np.atleast_1d(np.squeeze(he.evaluator(fn, s, o, **kw)))


def hydroeval_pairs(o: np.ndarray, s: np.ndarray) -> dict[str, tuple[float, float]]:
    """metric -> (project value, hydroeval value, converted to the project convention)."""
    kge = he1(he.kge, s, o)
    kgep = he1(he.kgeprime, s, o)
    k_ours = m.kge_components(o, s)
    kp_ours = m.kge_prime_components(o, s)
    return {
        "NSE": (m.nse(o, s, min_points=2), float(he1(he.nse, s, o)[0])),
        "KGE": (k_ours[0], float(kge[0])),
        "KGE_r": (k_ours[1], float(kge[1])),
        "KGE_alpha": (k_ours[2], float(kge[2])),
        "KGE_beta": (k_ours[3], float(kge[3])),
        "KGEprime": (kp_ours[0], float(kgep[0])),
        "KGEprime_r": (kp_ours[1], float(kgep[1])),
        "KGEprime_gamma": (kp_ours[2], float(kgep[2])),
        "KGEprime_beta": (kp_ours[3], float(kgep[3])),
        "RMSE": (m.rmse(o, s), float(he1(he.rmse, s, o)[0])),
        "PBIAS": (m.pbias(o, s), -float(he1(he.pbias, s, o)[0])),  # opposite sign convention
        "volume_ratio": (m.volume_ratio(o, s), float(kge[3])),  # hydroeval beta = sum s / sum o
        "MAE": (m.mae(o, s), float(he1(he.mare, s, o)[0]) * float(np.nanmean(o))),  # MARE*mean(o)
        "logNSE": (m.log_nse(o, s, min_points=2), float(he1(he.nse, s, o, transform="log")[0])),
        "KGE_low": (m.kge_low(o, s), float(he1(he.kge, s, o, transform="inv")[0])),
    }


def hydroerr_pairs(o: np.ndarray, s: np.ndarray) -> dict[str, tuple[float, float]]:
    """metric -> (project value, HydroErr value)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # HydroErr warns when it drops NaN rows
        r09, a09, b09, k09 = hr.kge_2009(s, o, return_all=True)
        r12, g12, b12, k12 = hr.kge_2012(s, o, return_all=True)
        k_ours = m.kge_components(o, s)
        kp_ours = m.kge_prime_components(o, s)
        return {
            "NSE": (m.nse(o, s, min_points=2), float(hr.nse(s, o))),
            "KGE": (k_ours[0], float(k09)),
            "KGE_r": (k_ours[1], float(r09)),
            "KGE_alpha": (k_ours[2], float(a09)),  # ddof = 1 there, cancels in the ratio
            "KGE_beta": (k_ours[3], float(b09)),
            "KGEprime": (kp_ours[0], float(k12)),
            "KGEprime_gamma": (kp_ours[2], float(g12)),
            "KGEprime_beta": (kp_ours[3], float(b12)),
            "r": (k_ours[1], float(hr.pearson_r(s, o))),
            "RMSE": (m.rmse(o, s), float(hr.rmse(s, o))),
            "MAE": (m.mae(o, s), float(hr.mae(s, o))),
            "ME": (m.mean_error(o, s), float(hr.me(s, o))),
        }


def largest_differences() -> dict[str, dict[str, float]]:
    """Largest |project - reference| per library and metric over :func:`series_pairs`."""
    worst: dict[str, dict[str, float]] = {"hydroeval": {}, "HydroErr": {}}
    for _, o, s in series_pairs():
        for lib, pairs in (("hydroeval", hydroeval_pairs(o, s)), ("HydroErr", hydroerr_pairs(o, s))):
            for key, (ours, ref) in pairs.items():
                worst[lib][key] = max(worst[lib].get(key, 0.0), abs(ours - ref))
    return worst


CASES = list(series_pairs())


@pytest.mark.parametrize(("name", "o", "s"), CASES, ids=[c[0] for c in CASES])
def test_against_hydroeval(name, o, s):
    for key, (ours, ref) in hydroeval_pairs(o, s).items():
        assert ours == pytest.approx(ref, rel=RTOL, abs=ATOL), key


@pytest.mark.parametrize(("name", "o", "s"), CASES, ids=[c[0] for c in CASES])
def test_against_hydroerr(name, o, s):
    for key, (ours, ref) in hydroerr_pairs(o, s).items():
        assert ours == pytest.approx(ref, rel=RTOL, abs=ATOL), key


def test_masking_differences_are_as_documented():
    o = noisy(hydrograph(n=200, peaks=(50, 150), heights=(30.0, 20.0)), seed=5)
    s = noisy(hydrograph(n=200, peaks=(52, 150), heights=(25.0, 22.0)), seed=6)
    o_gap, s_gap = o.copy(), s.copy()
    o_gap[[10, 11]] = np.nan
    s_gap[[20, 30]] = np.nan
    keep = np.ones(200, bool)
    keep[[10, 11, 20, 30]] = False
    ours = m.nse(o_gap, s_gap)
    assert ours == pytest.approx(m.nse(o[keep], s[keep]))
    # hydroeval drops obs-NaN rows only, so a NaN simulation poisons its result.
    assert math.isnan(float(he1(he.nse, s_gap, o_gap)[0]))
    assert float(he1(he.nse, s_gap[~np.isnan(s_gap)], o_gap[~np.isnan(s_gap)])[0]) == pytest.approx(ours)
    # HydroErr masks jointly, like the project ...
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert float(hr.nse(s_gap, o_gap)) == pytest.approx(ours)
        # ... but takes EF5's -999 sentinel as a real value.
        o_sent = o.copy()
        o_sent[10] = -999.0
        assert float(hr.nse(s, o_sent)) != pytest.approx(m.nse(o_sent, s))


def test_pbias_sign_convention_against_hydroeval():
    o = np.array([1.0, 2.0, 3.0, 4.0])
    s = 1.2 * o  # too much water
    assert m.pbias(o, s) == pytest.approx(20.0)
    assert float(he1(he.pbias, s, o)[0]) == pytest.approx(-20.0)


def test_kge_2009_ddof_cancels_in_alpha():
    """HydroErr uses ddof = 1; the ratio sigma_s / sigma_o is the same, even at n = 3."""
    o = np.array([1.0, 2.0, 4.0])
    s = np.array([1.5, 1.0, 6.0])
    _, a09, _, _ = hr.kge_2009(s, o, return_all=True)
    assert m.kge_components(o, s)[2] == pytest.approx(float(a09), rel=1e-14)
    assert np.std(s, ddof=1) / np.std(o, ddof=1) == pytest.approx(np.std(s) / np.std(o), rel=1e-14)
