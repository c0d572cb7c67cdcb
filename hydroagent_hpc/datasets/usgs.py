"""Hourly USGS discharge in UTC and m3/s, in EF5's observation format, through ``dataretrieval``.

Fetching: :func:`fetch_continuous` calls ``dataretrieval.waterdata.get_continuous`` (the USGS
Water Data OGC API, collection ``continuous``: instantaneous values, typically every 15
minutes; one ``GET {base}/ogcapi/v1/collections/continuous/items?monitoring_location_id=
USGS-<site>&parameter_code=00060&time=<start>/<end>&limit=...`` per page, following the
``next`` links). The legacy ``nwis.get_iv`` (waterservices.usgs.gov) is deprecated in
dataretrieval 1.4 and being retired by the USGS, so it is not used. Requests at most 365 days
at a time (the service allows three years per call). ``base_url`` redirects every request
through dataretrieval's own setting, ``dataretrieval.configure(WaterdataConfiguration(
base_url=...))`` (no monkeypatching); the tests point it at a loopback server that replays a
recorded response, and a redirected call sends no API key (dataretrieval scopes keys to the
USGS host).

Processing (:func:`to_hourly`), in order:

1. time stamps to UTC (the service sends ``+00:00``; legacy local times with offsets such as
   ``-05:00``/``-06:00`` across a DST change are converted; naive times are taken as UTC);
2. units: ``ft^3/s`` times 0.028316846592 (exact), ``m^3/s`` as is, anything else an error;
3. dropped values: non-numeric, the USGS sentinels (<= -998, e.g. -999999), and values whose
   qualifiers say the sensor did not measure flow (ice, equipment malfunction, maintenance,
   discontinued, seasonal, flood damage; see :data:`REJECT_QUALIFIERS`); estimated values and
   provisional data are kept and counted;
4. duplicate time stamps (several time series, or a repeated row): one value kept, approved
   before provisional, then the first series; conflicting duplicates are counted;
5. hourly means over ``(H-1h, H]`` stamped ``H`` (EF5 stamps mark the end of a step), a plain
   mean of the samples in the hour;
6. gaps: an hour without a kept sample is missing and gets NO row in the CSV (EF5 then reports
   ``nan``; a -999 row would be copied through as a number, ``docs/ef5-crest-spec.md`` section 5).

The CSV is ``Date,Discharge(m3/s)`` then ``YYYY-MM-DD HH:MM,value`` rows (what
:func:`hydroagent_hpc.sim.forcing.read_observations` and EF5 read); a ``<file>.json`` beside
it records the site, window, request URLs and every count above.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from hydroagent_hpc.datasets.camels import check_gauge_id
from hydroagent_hpc.datasets.units import CFS_TO_M3S

log = logging.getLogger(__name__)

__all__ = ["fetch_continuous", "to_hourly", "write_observations", "download_hourly", "REJECT_QUALIFIERS",
           "parse_window"]

# Qualifiers (Water Data API words and legacy NWIS codes) whose values are not flow measurements.
REJECT_QUALIFIERS = frozenset({"ICE", "EQUIPMENT", "EQP", "MAINTENANCE", "MNT", "DISCONTINUED", "DIS", "SEASONAL",
                               "SSN", "FLOOD DAMAGE", "FLD", "MALFUNCTION"})
_UNITS = {"ft^3/s": CFS_TO_M3S, "ft3/s": CFS_TO_M3S, "cfs": CFS_TO_M3S, "m^3/s": 1.0, "m3/s": 1.0}
_CHUNK_DAYS = 365


def parse_window(start: str, end: str) -> tuple[datetime, datetime]:
    """``--start``/``--end`` as UTC hours: a date alone means 00:00 (start) and 23:00 (end)."""
    def one(text: str, is_end: bool) -> datetime:
        t = str(text).strip().replace("T", " ").rstrip("Z")
        try:
            if len(t) == 10:
                d = datetime.fromisoformat(t)
                return d + timedelta(hours=23) if is_end else d
            d = datetime.fromisoformat(t)
        except ValueError:
            raise ValueError(f"{'--end' if is_end else '--start'} {text!r}: write YYYY-MM-DD or 'YYYY-MM-DD HH:00' "
                             "(UTC)") from None
        if d.tzinfo is not None or d.minute or d.second:
            raise ValueError(f"{text!r}: give a whole UTC hour without a time zone, e.g. 2019-03-30 06:00")
        return d
    a, b = one(start, False), one(end, True)
    if b < a:
        raise ValueError(f"--end {b} is before --start {a}")
    return a, b


def _iso(t: datetime) -> str:
    return f"{t:%Y-%m-%dT%H:%M:%S}Z"


def fetch_continuous(site: str, start: datetime, end: datetime, *, base_url: str | None = None,
                     parameter_code: str = "00060"):
    """Instantaneous values of ``site`` between two UTC times, as one DataFrame, and the request URLs."""
    import pandas as pd

    try:
        import dataretrieval
        import httpx
        from dataretrieval import waterdata
        from dataretrieval.exceptions import DataRetrievalError
        from dataretrieval.waterdata import WaterdataConfiguration
    except ImportError as exc:  # an old dataretrieval without the Water Data API or configure()
        raise RuntimeError(f"dataretrieval >= 1.4 is needed for the USGS Water Data API ({exc}); "
                           "pip install -U dataretrieval") from None
    gid = check_gauge_id(site)
    frames, urls = [], []
    t = start
    while t <= end:
        stop = min(end, t + timedelta(days=_CHUNK_DAYS))
        kwargs: dict[str, Any] = dict(monitoring_location_id=f"USGS-{gid}", parameter_code=parameter_code,
                      time=f"{_iso(t)}/{_iso(stop)}")
        configs = [WaterdataConfiguration(base_url=base_url.rstrip("/"))] if base_url else []
        try:
            with dataretrieval.configure(*configs):
                df, md = waterdata.get_continuous(**kwargs)
        except (DataRetrievalError, httpx.HTTPError, RuntimeError) as exc:
            raise ValueError(f"USGS Water Data API, site {gid}, {t:%Y-%m-%d %H:%M}..{stop:%Y-%m-%d %H:%M} UTC: {exc}; "
                             "check the site id, the window and the connection (or --base-url)") from None
        urls.append(str(getattr(md, "url", "")))
        log.info("USGS %s %s..%s: %d values", gid, t, stop, len(df))
        if len(df):
            frames.append(df)
        t = stop + timedelta(seconds=1)
    if not frames:
        return pd.DataFrame(columns=["time", "value", "unit_of_measure", "approval_status", "qualifier"]), urls
    return pd.concat(frames, ignore_index=True), urls


def _qualifiers(q) -> tuple[str, ...]:
    if q is None or (isinstance(q, float) and np.isnan(q)):
        return ()
    if isinstance(q, str):
        text = q.strip().strip("[]")
        return tuple(p.strip().strip("'\"").upper() for p in text.split(",") if p.strip().strip("'\""))
    return tuple(str(x).strip().upper() for x in q)


def to_hourly(df, start: datetime, end: datetime) -> tuple[np.ndarray, np.ndarray, dict]:
    """Hourly means in m3/s for every UTC hour ``start..end`` (NaN = missing) and the counts."""
    import pandas as pd

    hours = pd.date_range(pd.Timestamp(start, tz="UTC"), pd.Timestamp(end, tz="UTC"), freq="1h")
    stats: dict = {"values": int(len(df))}
    if len(df) == 0:
        stats.update(kept=0, hours=len(hours), missing_hours=len(hours))
        return hours.tz_localize(None).to_pydatetime(), np.full(len(hours), np.nan), stats
    raw_t = df["time"]
    if not pd.api.types.is_datetime64_any_dtype(raw_t):
        raw_t = pd.to_datetime(raw_t.astype(str), utc=True, format="ISO8601")
    elif getattr(raw_t.dt, "tz", None) is None:
        log.warning("USGS times without a time zone: taken as UTC")
        raw_t = raw_t.dt.tz_localize("UTC")
    times = raw_t.dt.tz_convert("UTC")
    values = pd.to_numeric(df["value"], errors="coerce").to_numpy(dtype=np.float64)
    units = (df["unit_of_measure"].astype(str).str.strip() if "unit_of_measure" in df
             else pd.Series(["ft^3/s"] * len(df)))
    unknown = sorted(set(units) - set(_UNITS))
    if unknown:
        raise ValueError(f"USGS discharge in unit(s) {unknown}; expected ft^3/s or m^3/s (parameter code 00060)")
    factor = units.map(_UNITS).to_numpy(dtype=np.float64)
    quals = [_qualifiers(q) for q in (df["qualifier"] if "qualifier" in df else [None] * len(df))]
    approval = (df["approval_status"].astype(str) if "approval_status" in df else pd.Series([""] * len(df))).to_numpy()
    counts: dict[str, int] = {}
    for qs in quals:
        for q in qs:
            counts[q] = counts.get(q, 0) + 1
    rejected = np.array([bool(set(qs) & REJECT_QUALIFIERS) for qs in quals])
    sentinel = ~np.isfinite(values) | (values <= -998.0)
    keep = ~rejected & ~sentinel
    stats.update(qualifiers=counts, rejected_by_qualifier=int((rejected & ~sentinel).sum()),
                 missing_or_sentinel=int(sentinel.sum()),
                 approval={str(k): int(v) for k, v in zip(*np.unique(approval, return_counts=True))})
    frame = pd.DataFrame({"time": times.to_numpy(), "q": values * factor,
                          "rank": np.where(np.char.lower(approval.astype(str)) == "approved", 0, 1),
                          "order": np.arange(len(df))})[keep]
    frame = frame.sort_values(["time", "rank", "order"])
    dup = frame.duplicated("time", keep=False)
    stats["duplicate_rows"] = int(frame.duplicated("time").sum())
    stats["conflicting_duplicates"] = int(frame[dup].groupby("time")["q"].nunique().gt(1).sum()) if dup.any() else 0
    frame = frame.drop_duplicates("time", keep="first")
    negative = int((frame["q"] < 0).sum())
    if negative:
        log.warning("%d negative discharge value(s) kept (tidal or reverse flow?)", negative)
    stats["negative_values"] = negative
    series = frame.set_index("time")["q"]
    hourly = series.resample("1h", closed="right", label="right").mean().reindex(hours)
    out = hourly.to_numpy(dtype=np.float64)
    stats.update(kept=int(len(series)), hours=len(hours), missing_hours=int(np.isnan(out).sum()))
    return hours.tz_localize(None).to_pydatetime(), out, stats


def write_observations(path, times, values, meta: dict | None = None) -> Path:
    """EF5 observation CSV (rows only where the value is finite) and ``<path>.json`` with ``meta``."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    rows = ["Date,Discharge(m3/s)"] + [f"{t:%Y-%m-%d %H:%M},{v:.4f}" for t, v in zip(times, values) if np.isfinite(v)]
    tmp = p.with_name(f".{p.name}.{os.getpid()}.part")
    tmp.write_text("\n".join(rows) + "\n")
    os.replace(tmp, p)
    if meta is not None:
        Path(str(p) + ".json").write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return p


def download_hourly(site: str, start: str, end: str, out, *, base_url: str | None = None) -> dict:
    """``hydroagent data usgs``: fetch, convert, resample and write; returns the metadata written."""
    gid = check_gauge_id(site)
    a, b = parse_window(start, end)
    df, urls = fetch_continuous(gid, a - timedelta(hours=1), b, base_url=base_url)
    times, values, stats = to_hourly(df, a, b)
    if stats.get("kept", 0) == 0:
        raise ValueError(f"USGS {gid}: no usable discharge between {a} and {b} UTC "
                         f"({stats['values']} values returned); check the site id and the window")
    import dataretrieval

    meta = {"site": gid, "parameter_code": "00060", "start_utc": f"{a:%Y-%m-%d %H:%M}",
            "end_utc": f"{b:%Y-%m-%d %H:%M}",
            "unit": "m3/s", "conversion": "ft3/s * 0.028316846592", "aggregation": "mean over (H-1h, H], stamped H",
            "missing": "hours without a kept value have no row (EF5 reads nan)", "requests": urls,
            "dataretrieval": getattr(dataretrieval, "__version__", "?"), **stats}
    write_observations(out, times, values, meta)
    log.info("USGS %s: %d of %d hours written to %s", gid, stats["hours"] - stats["missing_hours"], stats["hours"], out)
    return meta
