"""Known-case tests for hydroagent_hpc.metrics (scores, errors, FDC, evaluate, edge cases).

Signatures and events: test_metrics_signatures.py; properties: test_metrics_properties.py;
cross-checks against hydroeval / HydroErr: test_metrics_crosscheck.py. The synthetic series
they share are in tests/helpers/series.py.
"""

from __future__ import annotations

import datetime as dt
import math

import numpy as np
import pytest

from helpers.series import T0, hourly, hydrograph, noisy
from hydroagent_hpc import metrics as m

REQUIRED_KEYS = (
    "NSE", "logNSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta", "KGEprime", "KGEprime_gamma",
    "RMSE", "MAE", "PBIAS", "volume_ratio", "peak_sim", "peak_obs", "peak_ratio",
    "peak_error_pct", "peak_lag_h", "peak_timing_mae_h", "peak_timing_bias_h",
    "time_to_peak_sim_h", "time_to_peak_obs_h", "recession_k_sim", "recession_k_obs",
    "bfi_sim", "bfi_obs", "events_sim", "events_obs", "FHV", "FLV", "FMS", "KGE_high",
    "KGE_low", "n_points", "nse_band",
)


@pytest.fixture(scope="module")
def obs() -> np.ndarray:
    return noisy(hydrograph(), seed=1)


@pytest.fixture(scope="module")
def times() -> np.ndarray:
    return hourly(1440)


# --------------------------------------------------------------------------- known cases


def test_evaluate_returns_required_keys(obs, times):
    res = m.evaluate(obs, noisy(hydrograph(), seed=2), times)
    missing = [k for k in REQUIRED_KEYS if k not in res]
    assert not missing
    assert isinstance(res["reasons"], dict)
    assert res["n_points"] == 1440 and res["dt_h"] == 1.0


def test_perfect_fit(obs, times):
    res = m.evaluate(obs, obs.copy(), times)
    for key in ("NSE", "logNSE", "KGE", "KGE_r", "KGE_alpha", "KGE_beta", "KGEprime",
                "KGEprime_gamma", "volume_ratio", "peak_ratio", "KGE_high", "KGE_low"):
        assert res[key] == pytest.approx(1.0, abs=1e-12), key
    for key in ("RMSE", "MAE", "ME", "PBIAS", "peak_error_pct", "peak_lag_h", "FHV", "FLV", "FMS",
                "peak_timing_mae_h", "peak_timing_bias_h", "time_to_peak_error_h", "missed_peaks"):
        assert res[key] == pytest.approx(0.0, abs=1e-9), key
    assert res["events_obs"] == res["events_sim"] == 4
    assert res["time_to_peak_obs_h"] == res["time_to_peak_sim_h"]
    assert res["recession_k_obs"] == res["recession_k_sim"]
    assert res["bfi_obs"] == res["bfi_sim"]
    assert res["nse_band"] == "very good"
    assert res["reasons"] == {}


def test_mean_prediction(obs, times):
    sim = np.full_like(obs, obs.mean())
    res = m.evaluate(obs, sim, times)
    assert res["NSE"] == pytest.approx(0.0, abs=1e-12)
    # Knoben et al. (2019): the mean-flow benchmark scores KGE = 1 - sqrt(2) (r := 0, alpha = 0).
    assert res["KGE"] == pytest.approx(1 - math.sqrt(2), abs=1e-12)
    assert res["KGE_r"] == 0.0 and res["KGE_alpha"] == 0.0
    assert res["KGE_beta"] == pytest.approx(1.0)
    assert "project convention" in res["reasons"]["KGE_r"]
    assert res["KGEprime"] == pytest.approx(1 - math.sqrt(2), abs=1e-12)
    assert res["KGEprime_gamma"] == 0.0
    assert res["PBIAS"] == pytest.approx(0.0, abs=1e-9)
    assert res["nse_band"] == "unsatisfactory"


def test_zero_flow_simulation(obs, times):
    res = m.evaluate(obs, np.zeros_like(obs), times)
    assert res["KGE"] == pytest.approx(1 - math.sqrt(3), abs=1e-12)
    assert math.isnan(res["KGEprime"]) and "zero mean simulated flow" in res["reasons"]["KGEprime"]
    assert res["PBIAS"] == pytest.approx(-100.0)
    assert res["volume_ratio"] == 0.0
    assert res["events_sim"] == 0


def test_additive_shift(obs, times):
    c = 2.5
    res = m.evaluate(obs, obs + c, times)
    sst = float(((obs - obs.mean()) ** 2).sum())
    assert res["NSE"] == pytest.approx(1 - obs.size * c**2 / sst, rel=1e-12)
    assert res["RMSE"] == pytest.approx(c) and res["MAE"] == pytest.approx(c)
    assert res["KGE_r"] == pytest.approx(1.0) and res["KGE_alpha"] == pytest.approx(1.0)
    assert res["KGE_beta"] == pytest.approx(1 + c / obs.mean())
    assert res["PBIAS"] == pytest.approx(100 * c / obs.mean())
    assert res["peak_error_pct"] == pytest.approx(100 * c / obs.max())


@pytest.mark.parametrize("k", [0.5, 0.9, 1.2, 2.0])
def test_scaled_series(obs, times, k):
    res = m.evaluate(obs, k * obs, times)
    assert res["KGE_r"] == pytest.approx(1.0)
    assert res["KGE_alpha"] == pytest.approx(k) and res["KGE_beta"] == pytest.approx(k)
    assert res["KGE"] == pytest.approx(1 - math.sqrt(2) * abs(k - 1))
    assert res["KGEprime_gamma"] == pytest.approx(1.0)
    assert res["KGEprime"] == pytest.approx(1 - abs(k - 1))
    assert res["PBIAS"] == pytest.approx(100 * (k - 1))
    assert res["volume_ratio"] == pytest.approx(k)
    assert res["peak_ratio"] == pytest.approx(k)
    assert res["FHV"] == pytest.approx(100 * (k - 1))
    assert res["FMS"] == pytest.approx(0.0, abs=1e-9)  # log-slope is scale free
    assert res["FLV"] == pytest.approx(0.0, abs=1e-9)
    assert res["peak_lag_h"] == 0.0
    assert res["recession_k_sim"] == pytest.approx(res["recession_k_obs"])


def test_time_shifted_series_is_late():
    q = hydrograph()
    res = m.evaluate(q, hydrograph(shift=3), hourly(q.size))
    assert res["peak_lag_h"] == 3.0
    assert res["peak_timing_mae_h"] == 3.0 and res["peak_timing_bias_h"] == 3.0
    assert res["time_to_peak_sim_h"] - res["time_to_peak_obs_h"] == 3.0
    assert res["time_to_peak_error_h"] == 3.0
    assert res["missed_peaks"] == 0.0
    assert res["NSE"] < 1.0


def test_spotpy_joint_mask_regression():
    """docs/metrics.md §9: a simulation failing at the flood peak must not be rewarded."""
    o = [1.0, 2.0, 3.0, 4.0, 9.0]
    s = [1.5, 2.5, 3.5, 3.0, np.nan]
    assert m.nse(o, s, min_points=2) == pytest.approx(0.65)
    reasons: dict[str, str] = {}
    assert math.isnan(m.nse(o, s, reasons=reasons))  # project minimum: 10 points
    assert "only 4 valid points" in reasons["NSE"]


def test_series_with_gaps_equals_dropped_points(obs, times):
    sim = noisy(hydrograph(), seed=3)
    o, s = obs.copy(), sim.copy()
    o[[10, 400, 401, 402]] = np.nan
    o[[50, 900]] = -999.0  # EF5 sentinel
    s[[60, 700]] = np.nan
    s[800] = np.inf
    res = m.evaluate(o, s, times)
    keep = np.ones(o.size, bool)
    keep[[10, 400, 401, 402, 50, 900, 60, 700, 800]] = False
    assert res["n_points"] == keep.sum() and res["n_masked"] == 9
    for name, fn in (("NSE", m.nse), ("KGE", m.kge), ("RMSE", m.rmse), ("PBIAS", m.pbias),
                     ("FHV", m.fhv), ("KGE_low", m.kge_low), ("logNSE", m.log_nse)):
        assert res[name] == pytest.approx(fn(obs[keep], sim[keep]), rel=1e-12), name
    assert res["events_obs"] == 4
    assert math.isfinite(res["bfi_obs"]) and math.isfinite(res["recession_k_obs"])


def test_sentinel_threshold():
    o = np.array([1.0, 2.0, -998.0, -997.5, 3.0])
    s = np.ones(5)
    ps = m.prepare(o, s)
    assert ps.valid.tolist() == [True, True, False, True, True]


def test_constant_observations_give_nan_and_reasons(times):
    o = np.full(1440, 3.7)
    res = m.evaluate(o, noisy(hydrograph(), seed=4), times)
    for key in ("NSE", "logNSE", "KGE", "KGEprime", "KGE_alpha", "KGE_high"):
        assert math.isnan(res[key]), key
        assert res["reasons"][key], key
    assert "zero variance" in res["reasons"]["NSE"]
    assert res["events_obs"] == 0
    assert math.isnan(res["time_to_peak_obs_h"]) and math.isnan(res["recession_k_obs"])
    assert res["bfi_obs"] == pytest.approx(1.0)  # no quickflow in a flat hydrograph
    assert math.isfinite(res["RMSE"]) and res["nse_band"] == "undefined"


def test_constant_simulation_equal_to_obs_constant(times):
    res = m.evaluate(np.full(1440, 2.0), np.full(1440, 2.0), times)
    assert math.isnan(res["NSE"]) and math.isnan(res["KGE"])
    assert res["RMSE"] == 0.0 and res["PBIAS"] == 0.0 and res["volume_ratio"] == 1.0


@pytest.mark.parametrize("n_valid", [0, 1])
def test_too_few_points_never_raise(n_valid):
    o = np.full(6, np.nan)
    s = np.arange(6.0)
    o[:n_valid] = 1.0
    res = m.evaluate(o, s, hourly(6))
    assert res["n_points"] == n_valid
    for key in ("NSE", "KGE", "KGEprime", "RMSE", "PBIAS", "peak_lag_h", "bfi_obs", "FMS",
                "peak_timing_mae_h", "time_to_peak_obs_h"):
        assert math.isnan(res[key]), key
        assert key in res["reasons"], key
    if n_valid == 0:
        assert res["reasons"]["NSE"] == "no valid data"


def test_single_time_stamp_and_empty_series():
    res = m.evaluate([1.0], [1.0], hourly(1))
    assert math.isnan(res["dt_h"]) and math.isnan(res["NSE"])
    res = m.evaluate([], [], hourly(0))
    assert res["n_points"] == 0 and math.isnan(res["KGE"])


def test_all_nan_series_has_reason():
    res = m.evaluate(np.full(50, np.nan), np.ones(50), hourly(50))
    assert res["reasons"]["KGE"] == "no valid data"


def test_programmer_errors_raise():
    with pytest.raises(ValueError, match="obs has 3 values, sim has 4"):
        m.evaluate([1, 2, 3], [1, 2, 3, 4], hourly(3))
    with pytest.raises(ValueError, match="times has 5 values"):
        m.evaluate([1, 2, 3], [1, 2, 3], hourly(5))
    with pytest.raises(ValueError, match="boolean"):
        m.evaluate([1, 2, 3], [1, 2, 3], hourly(3), mask=np.array([0, 1, 2]))
    with pytest.raises(ValueError, match="strictly increasing"):
        m.evaluate([1, 2, 3], [1, 2, 3], hourly(3)[::-1])
    with pytest.raises(ValueError, match="one-dimensional"):
        m.nse(np.ones((3, 2)), np.ones((3, 2)))
    with pytest.raises(ValueError, match="obs has 2 values, sim has 1"):
        m.kge([1, 2], [1])


def test_mask_and_warmup_drop_points(obs, times):
    sim = noisy(hydrograph(), seed=5)
    mask = np.ones(obs.size, bool)
    mask[:240] = False
    by_mask = m.evaluate(obs, sim, times, mask=mask)
    by_warmup = m.evaluate(obs, sim, times, warmup_end=times[240])
    by_datetime = m.evaluate(obs, sim, times, warmup_end=dt.datetime(2021, 6, 11, 0, 0))
    assert by_mask["n_points"] == by_warmup["n_points"] == by_datetime["n_points"] == 1200
    assert by_mask["n_masked"] == 240
    assert by_mask["NSE"] == by_warmup["NSE"] == pytest.approx(m.nse(obs[240:], sim[240:]))
    assert by_mask["events_obs"] == 3  # the event at step 200 is in the warm-up


def test_time_step_is_read_from_times(obs):
    sim = noisy(hydrograph(shift=2), seed=6)
    h = m.evaluate(obs, sim, hourly(obs.size))
    q = m.evaluate(obs, sim, hourly(obs.size, step_h=0.25))
    assert h["dt_h"] == 1.0 and q["dt_h"] == 0.25
    assert q["peak_lag_h"] == pytest.approx(h["peak_lag_h"] / 4)
    assert h["bfi_alpha"] == pytest.approx(0.925 ** (1 / 24))
    assert q["bfi_alpha"] == pytest.approx(0.925 ** (1 / 96))
    assert q["NSE"] == h["NSE"]


def test_python_datetimes_accepted(obs):
    sim = noisy(hydrograph(), seed=7)
    stamps = [dt.datetime(2021, 6, 1) + dt.timedelta(hours=i) for i in range(obs.size)]
    a = m.evaluate(obs, sim, stamps)
    b = m.evaluate(obs, sim, hourly(obs.size))
    for key in m.METRIC_KEYS:
        if key != "nse_band":
            assert a[key] == pytest.approx(b[key], nan_ok=True), key


def test_lag_uses_time_stamps_not_index():
    o = np.array([0.0, 1.0, 5.0, 1.0, 2.0, 1.0])
    s = np.array([0.0, 1.0, 1.0, 1.0, 6.0, 1.0])
    t = T0 + np.array([0, 1, 2, 3, 10, 11]).astype("timedelta64[h]")
    assert m.peak_lag_h(o, s, t) == 8.0


def test_pbias_sign_positive_when_simulation_too_high():
    o = np.array([1.0, 2.0, 3.0, 4.0])
    assert m.pbias(o, 1.1 * o) == pytest.approx(10.0)
    assert m.pbias(o, 0.8 * o) == pytest.approx(-20.0)
    assert m.mean_error(o, o + 1) == pytest.approx(1.0)
    assert m.volume_ratio(o, 1.1 * o) == pytest.approx(1 + m.pbias(o, 1.1 * o) / 100)


def test_public_functions_fill_reasons():
    reasons: dict[str, str] = {}
    assert math.isnan(m.pbias([0.0, 0.0], [1.0, 2.0], reasons=reasons))
    assert reasons["PBIAS"] == "non-positive observed volume"
    assert math.isnan(m.peak_ratio([-1.0, 0.0], [1.0, 2.0], reasons=reasons))
    kge, r, _, _ = m.kge_components([1.0, 2.0, 3.0], [2.0, 2.0, 2.0], reasons=reasons)
    assert r == 0.0 and "KGE_r" in reasons
    assert kge == pytest.approx(1 - math.sqrt(2))


@pytest.mark.parametrize(
    ("value", "published", "paper"),
    [
        (0.95, "very good", "very good"),
        (0.81, "very good", "good"),
        (0.80, "good", "good"),
        (0.70, "satisfactory", "satisfactory"),
        (0.50, "unsatisfactory", "unsatisfactory"),
        (-3.0, "unsatisfactory", "unsatisfactory"),
        (float("nan"), "undefined", "undefined"),
    ],
)
def test_nse_band(value, published, paper):
    assert m.nse_band(value) == published
    assert m.nse_band(value, "hydroagent_paper") == paper


def test_nse_band_unknown_table():
    with pytest.raises(ValueError, match="unknown NSE band table"):
        m.nse_band(0.5, "daily")


def test_kge_high_needs_ten_steps():
    reasons: dict[str, str] = {}
    o = np.arange(1.0, 51.0)
    assert math.isnan(m.kge_high(o, o, reasons=reasons))  # top 10 % of 50 = 5 steps
    assert "5 steps" in reasons["KGE_high"]
    o = np.arange(1.0, 201.0)
    assert m.kge_high(o, o) == pytest.approx(1.0)


def test_fdc_signs():
    o = np.linspace(1.0, 100.0, 501)  # quantiles 0.8 and 0.3 fall on sample points
    assert m.fhv(o, 1.2 * o) == pytest.approx(20.0)
    steeper = o**1.5  # log-slope of mid segment is 1.5 times larger
    assert m.fms(o, steeper) == pytest.approx(50.0)
    flat_low = o.copy()
    flat_low[o < np.quantile(o, 0.35)] = o.min()  # simulated low segment is flat
    assert m.flv(o, flat_low) == pytest.approx(100.0)
    assert math.isnan(m.flv(np.ones(o.size), o))

