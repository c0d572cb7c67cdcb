"""Goodness-of-fit metrics and hydrograph signatures for CREST/EF5 calibration.

Pure numpy/scipy; imports nothing else from ``hydroagent_hpc``. Formulas, conventions and
edge-case rules are in ``docs/metrics.md``; each function's docstring gives its formula and
literature reference. Every metric works on one joint mask (NaN, +-inf and EF5's -999 sentinel
in either series, plus an optional boolean ``mask`` where True = use) and returns NaN with a
reason, never an exception, when the data do not define it. Public functions run under
``np.errstate(all="ignore")``: an overflow gives NaN with a reason, not a RuntimeWarning.

Modules: ``series`` (mask, time axis), ``scores`` (NSE, KGE family, bands), ``errors``
(RMSE, MAE, ME, PBIAS, volume ratio, RSR),
``fdc`` (FHV, FLV, FMS), ``events`` (event detector), ``peaks`` (peak size and timing),
``signatures`` (baseflow index, recession constant), ``evaluate`` (everything at once).
"""

from hydroagent_hpc.metrics.errors import mae, mean_error, pbias, rmse, rsr, volume_ratio
from hydroagent_hpc.metrics.evaluate import METRIC_KEYS, evaluate
from hydroagent_hpc.metrics.events import Event, EventDetector, detect_events, event_count
from hydroagent_hpc.metrics.fdc import fhv, flv, fms
from hydroagent_hpc.metrics.peaks import (
    PeakTiming,
    peak_error_pct,
    peak_lag_h,
    peak_ratio,
    peak_timing,
    time_to_peak_h,
)
from hydroagent_hpc.metrics.scores import (
    kge,
    kge_components,
    kge_high,
    kge_low,
    kge_prime,
    kge_prime_components,
    log_nse,
    nse,
    nse_band,
)
from hydroagent_hpc.metrics.series import (
    MIN_POINTS,
    MIN_POINTS_NSE,
    MISSING_SENTINEL,
    PairedSeries,
    joint_mask,
    prepare,
)
from hydroagent_hpc.metrics.signatures import (
    BaseflowFilter,
    bfi,
    lyne_hollick_baseflow,
    recession_k,
)

__all__ = [
    "METRIC_KEYS",
    "MIN_POINTS",
    "MIN_POINTS_NSE",
    "MISSING_SENTINEL",
    "BaseflowFilter",
    "Event",
    "EventDetector",
    "PairedSeries",
    "PeakTiming",
    "bfi",
    "detect_events",
    "evaluate",
    "event_count",
    "fhv",
    "flv",
    "fms",
    "joint_mask",
    "kge",
    "kge_components",
    "kge_high",
    "kge_low",
    "kge_prime",
    "kge_prime_components",
    "log_nse",
    "lyne_hollick_baseflow",
    "mae",
    "mean_error",
    "nse",
    "nse_band",
    "pbias",
    "peak_error_pct",
    "peak_lag_h",
    "peak_ratio",
    "peak_timing",
    "prepare",
    "recession_k",
    "rmse",
    "rsr",
    "time_to_peak_h",
    "volume_ratio",
]
