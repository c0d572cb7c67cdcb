"""Tests for the event detector, peak timing, time to peak, recession constant and BFI."""

from __future__ import annotations

import math

import numpy as np
import pytest

from helpers.series import hourly, hydrograph, noisy, quickflow_loop
from hydroagent_hpc import metrics as m
from hydroagent_hpc.metrics.signatures import _quickflow_pass

# --------------------------------------------------------------------------- events


def test_detects_the_four_events():
    q = noisy(hydrograph(), seed=11)
    events = m.detect_events(q, hourly(q.size))
    assert [e.peak for e in events] == pytest.approx([200, 560, 900, 1250], abs=2)
    for e in events:
        assert e.lo <= e.start <= e.peak <= e.end <= e.hi
        assert e.start - e.lo == 12 and e.hi - e.end == 12  # 12 h padding
    assert m.event_count(q, hourly(q.size)) == 4


def test_events_closer_than_separation_merge():
    q = hydrograph(peaks=(300, 330, 800), heights=(50.0, 60.0, 40.0))
    events = m.detect_events(q, hourly(q.size))
    assert [e.peak for e in events] == [330, 800]  # 30 h apart: the higher one is kept


def test_flat_and_short_series_have_no_events():
    t = hourly(500)
    assert m.detect_events(np.full(500, 4.2), t) == []
    assert m.detect_events(np.array([1.0, 5.0]), t[:2]) == []
    assert m.detect_events(np.full(500, np.nan), t) == []


def test_detector_parameters_are_in_hours():
    q_hourly = hydrograph()
    q_15min = np.repeat(q_hourly, 4)
    n_h = m.event_count(q_hourly, hourly(q_hourly.size))
    n_q = m.event_count(q_15min, hourly(q_15min.size, step_h=0.25))
    assert n_h == n_q == 4


def test_gap_stops_event_bounds():
    q = hydrograph()
    mask = np.ones(q.size, bool)
    mask[905:910] = False
    (ev,) = [e for e in m.detect_events(q, hourly(q.size), mask) if abs(e.peak - 900) < 3]
    assert ev.end == 904


# --------------------------------------------------------------------------- peaks and timing


def test_peak_timing_skips_windows_with_gaps():
    q = hydrograph()
    sim = hydrograph(shift=-2)  # simulation early
    t = hourly(q.size)
    full = m.peak_timing(q, sim, t)
    assert full.n_peaks == 4 and full.bias_h == -2.0 and full.mae_h == 2.0
    mask = np.ones(q.size, bool)
    mask[895] = False  # inside the +-12 h window of the peak at 900
    gapped = m.peak_timing(q, sim, t, mask)
    assert gapped.n_peaks == 3


def test_peak_timing_missed_peaks():
    q = hydrograph()
    sim = hydrograph(peaks=(200, 560, 900), heights=(80.0, 40.0, 120.0))
    res = m.peak_timing(q, sim, hourly(q.size))
    assert res.missed_peaks == pytest.approx(0.25)
    assert res.peak_mape > 0


def test_peak_near_record_edge_is_skipped():
    q = hydrograph(peaks=(5, 600), heights=(100.0, 50.0))
    res = m.peak_timing(q, q, hourly(q.size))
    assert res.n_peaks == 1


def test_time_to_peak_from_event_start():
    q = hydrograph(rise=10)
    t = hourly(q.size)
    ttp_obs, ttp_sim = m.time_to_peak_h(q, hydrograph(rise=10, shift=4), t)
    assert 0 < ttp_obs <= 10
    assert ttp_sim - ttp_obs == 4.0


def test_whole_window_peak_metrics():
    o = np.array([1.0, 4.0, 2.0, 1.0])
    s = np.array([1.0, 2.0, 5.0, 1.0])
    assert m.peak_ratio(o, s) == pytest.approx(1.25)
    assert m.peak_error_pct(o, s) == pytest.approx(25.0)
    assert m.peak_lag_h(o, s, hourly(4, step_h=0.5)) == 0.5


# --------------------------------------------------------------------------- recession


@pytest.mark.parametrize("k", [0.01, 0.02, 0.05])
def test_recession_constant_recovers_exponential(k):
    # The falling limb ends at 0.2 * peak, so it lasts ln(5)/k h: >= 24 h needs k <= 0.067 /h.
    q = hydrograph(base=0.0, k=k, heights=(100.0, 80.0, 120.0, 60.0))
    q = np.maximum(q, 1e-9)
    assert m.recession_k(q, hourly(q.size)) == pytest.approx(k, rel=1e-3)


def test_recession_sim_on_observed_segments():
    q = hydrograph(base=0.0, k=0.05)
    sim = hydrograph(base=0.0, k=0.08)
    t = hourly(q.size)
    res = m.evaluate(q, sim, t)
    assert res["recession_k_obs"] == pytest.approx(0.05, rel=1e-3)
    assert res["recession_k_sim"] == pytest.approx(m.recession_k(sim, t, reference=q))
    assert res["recession_k_sim"] > res["recession_k_obs"]


def test_recession_needs_long_falling_limbs():
    q = hydrograph(k=1.0, rise=2)  # recessions last a few hours
    reasons: dict[str, str] = {}
    assert math.isnan(m.recession_k(q, hourly(q.size), reasons=reasons))
    assert "falling limb" in reasons["recession_k"]


# --------------------------------------------------------------------------- baseflow


@pytest.mark.parametrize("alpha", [0.5, 0.925, 0.925 ** (1 / 24), 0.999])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_closed_form_filter_equals_loop(alpha, seed):
    rng = np.random.default_rng(seed)
    q = np.abs(np.cumsum(rng.standard_normal(3000))) + rng.exponential(1.0, 3000)
    q[rng.random(3000) < 0.05] = 0.0
    assert np.allclose(_quickflow_pass(q, alpha), quickflow_loop(q, alpha), rtol=1e-9, atol=1e-9)


def test_baseflow_bounds_and_passes():
    q = noisy(hydrograph(), seed=12)
    b = m.lyne_hollick_baseflow(q, 0.925 ** (1 / 24))
    assert b.shape == q.shape
    assert np.all(b >= -1e-12) and np.all(b <= q + 1e-12)
    b1 = m.lyne_hollick_baseflow(q, 0.925 ** (1 / 24), passes=1)
    assert b.sum() <= b1.sum() + 1e-9  # each pass removes more quickflow


def test_bfi_values():
    t = hourly(1440)
    assert m.bfi(np.full(1440, 3.0), t) == pytest.approx(1.0)
    q = hydrograph()
    value = m.bfi(q, t)
    assert 0.0 < value < 1.0
    # A larger alpha lets quickflow decay more slowly, so less of the flow is baseflow.
    assert m.bfi(q, t, baseflow=m.BaseflowFilter(alpha_daily=0.98)) < value
    with pytest.raises(ValueError, match="passes"):
        m.lyne_hollick_baseflow(q, 0.9, passes=0)


def test_bfi_with_gaps_is_close_to_gap_free():
    q = hydrograph()
    t = hourly(q.size)
    mask = np.ones(q.size, bool)
    mask[100:110] = False
    assert m.bfi(q, t, mask) == pytest.approx(m.bfi(q, t), abs=0.02)


def test_bfi_alpha_adapted_to_time_step():
    q = hydrograph()
    res = m.evaluate(q, q, hourly(q.size, step_h=24.0))
    assert res["bfi_alpha"] == pytest.approx(0.925)
