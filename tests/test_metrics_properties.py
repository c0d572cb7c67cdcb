"""Property tests (hypothesis) for the metrics: bounds, invariances, internal consistency, and
that ``evaluate`` never raises on messy data and never returns a NaN without a reason."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from helpers.series import hourly, quickflow_loop
from hydroagent_hpc import metrics as m
from hydroagent_hpc.metrics.signatures import _quickflow_pass

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])

positive = st.floats(min_value=1e-3, max_value=1e5, allow_nan=False, allow_infinity=False)
flows = st.one_of(st.just(0.0), positive)  # discharge-like: zero or well above underflow


@st.composite
def pairs(draw, elements=flows, min_size=10, max_size=200):
    n = draw(st.integers(min_value=min_size, max_value=max_size))
    o = draw(arrays(np.float64, n, elements=elements))
    s = draw(arrays(np.float64, n, elements=elements))
    return o, s


def spread(x: np.ndarray) -> bool:
    """Non-degenerate spread, so rounding cannot dominate the variance."""
    return bool(np.ptp(x) > 1e-6 * max(float(np.abs(x).max()), 1e-300))


@SETTINGS
@given(pairs())
def test_nse_of_obs_with_itself_is_one(pair):
    o, _ = pair
    assume(spread(o))
    assert m.nse(o, o) == 1.0


@SETTINGS
@given(pairs())
def test_nse_at_most_one(pair):
    o, s = pair
    value = m.nse(o, s)
    assert math.isnan(value) or value <= 1.0
    if spread(o):
        assert not math.isnan(value)


@SETTINGS
@given(pairs(), st.floats(min_value=1e-3, max_value=1e3))
def test_nse_invariant_to_units(pair, c):
    o, s = pair
    assume(spread(o))
    a, b = m.nse(o, s), m.nse(c * o, c * s)
    assert b == pytest.approx(a, rel=1e-6, abs=1e-6)


@SETTINGS
@given(pairs(elements=positive))
def test_kge_components_consistent(pair):
    o, s = pair
    assume(spread(o) and spread(s))
    kge, r, alpha, beta = m.kge_components(o, s)
    assert -1.0 <= r <= 1.0
    assert kge == pytest.approx(1 - math.sqrt((r - 1) ** 2 + (alpha - 1) ** 2 + (beta - 1) ** 2))
    kgep, r2, gamma, beta2 = m.kge_prime_components(o, s)
    assert r2 == r and beta2 == beta
    assert kgep == pytest.approx(1 - math.sqrt((r - 1) ** 2 + (gamma - 1) ** 2 + (beta - 1) ** 2))
    assert gamma == pytest.approx(alpha / beta, rel=1e-9)
    assert beta == pytest.approx(m.volume_ratio(o, s), rel=1e-9)
    assert m.pbias(o, s) == pytest.approx(100 * (beta - 1), rel=1e-9, abs=1e-9)
    assert kge <= 1.0 and kgep <= 1.0


@SETTINGS
@given(pairs(elements=positive))
def test_evaluate_matches_single_functions(pair):
    o, s = pair
    res = m.evaluate(o, s, hourly(o.size))
    for key, fn in (("NSE", m.nse), ("KGE", m.kge), ("KGEprime", m.kge_prime), ("RMSE", m.rmse),
                    ("MAE", m.mae), ("PBIAS", m.pbias), ("logNSE", m.log_nse), ("FHV", m.fhv),
                    ("FLV", m.flv), ("FMS", m.fms), ("KGE_low", m.kge_low),
                    ("KGE_high", m.kge_high), ("peak_ratio", m.peak_ratio)):
        assert res[key] == pytest.approx(fn(o, s), nan_ok=True), key


messy = st.one_of(
    st.floats(min_value=-10.0, max_value=1e4),
    st.sampled_from([np.nan, np.inf, -np.inf, -999.0, 0.0, 1.0]),
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(pairs(elements=messy, min_size=0, max_size=300), st.booleans())
def test_evaluate_never_raises_and_every_nan_has_a_reason(pair, constant_sim):
    o, s = pair
    if constant_sim and o.size:
        s = np.full(o.size, s[0] if s.size else 1.0)
    res = m.evaluate(o, s, hourly(o.size))
    for key in m.METRIC_KEYS:
        value = res[key]
        if isinstance(value, float):
            assert not math.isinf(value), key
            if math.isnan(value):
                assert res["reasons"].get(key), key


@settings(max_examples=40, deadline=None)
@given(
    arrays(np.float64, st.integers(2, 400), elements=st.floats(0.0, 1e3)),
    st.floats(min_value=0.05, max_value=0.9999),
)
def test_closed_form_filter_equals_loop(q, alpha):
    assert np.allclose(_quickflow_pass(q, alpha), quickflow_loop(q, alpha), rtol=1e-8, atol=1e-8)
