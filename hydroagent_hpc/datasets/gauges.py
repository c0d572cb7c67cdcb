"""The paper's 14 USGS gauges (li2026hydroagent, Appendix A Table 2): 4 held out, 10 for training.

``data/paper_gauges.csv`` (facts only, each row naming its sources) has the columns
``gauge_id, split, name, name_source, lat, lon, area_km2, window_start_utc, window_end_utc,
target_nse, source``. Rules the loader enforces (``docs/reference-implementation.md`` section 9):

* ids are 8-digit strings with their leading zeros (a spreadsheet that turned ``01403060``
  into ``1403060`` is caught, as is an id YAML would read as an octal number);
* ``split`` is ``test`` or ``train``; the default file has 4 and 10;
* each window is whole days of hourly steps in UTC, ``00:00`` of the first day to ``23:00`` of
  the last: 60 days (1,440 steps) for 13 gauges; 02338660's is 2018-07-01..2018-08-31, 62 days
  (1,488 steps), in both sources, and is kept as published (:attr:`PaperGauge.days`);
* ``target_nse`` in (0, 1]: 0.8075 for the canonical 02338660, 0.7 elsewhere (the authors'
  YAMLs; the paper text says 0.8075 for every held-out gauge);
* latitude and longitude in the conterminous US, area > 0.

Every error names the file, the line and the fix.
"""

from __future__ import annotations

import csv
import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from hydroagent_hpc.datasets.camels import bad_file, check_gauge_id

log = logging.getLogger(__name__)

__all__ = ["PaperGauge", "DEFAULT_FILE", "COLUMNS", "load_paper_gauges", "paper_gauge"]

DEFAULT_FILE = Path(__file__).resolve().parents[2] / "data" / "paper_gauges.csv"
COLUMNS = ("gauge_id", "split", "name", "name_source", "lat", "lon", "area_km2", "window_start_utc", "window_end_utc",
           "target_nse", "source")


@dataclass(frozen=True)
class PaperGauge:
    gauge_id: str
    split: str  # "test" (held out) or "train"
    name: str
    name_source: str
    lat: float
    lon: float
    area_km2: float
    window_start: datetime  # UTC, naive
    window_end: datetime  # UTC, last hourly step (inclusive)
    target_nse: float
    source: str

    @property
    def days(self) -> int:
        """Length of the window in days (60 for all but 02338660)."""
        return (self.window_end - self.window_start + timedelta(hours=1)).days

    @property
    def held_out(self) -> bool:
        return self.split == "test"

    @property
    def basin_dir(self) -> str:
        """Where campaigns expect the prepared basin: ``data/gauges/<id>``."""
        return f"data/gauges/{self.gauge_id}"


def _float(path, line, key, text, low, high, fix) -> float:
    try:
        v = float(text)
    except ValueError:
        raise bad_file(path, line, f"{key}={text!r} is not a number", fix) from None
    if not low <= v <= high:
        raise bad_file(path, line, f"{key}={v} is outside {low}..{high}", fix)
    return v


def _time(path, line, key, text) -> datetime:
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d %H:%M")
    except ValueError:
        raise bad_file(path, line, f"{key}={text!r} is not a UTC time",
                       "write YYYY-MM-DD HH:MM, e.g. 2018-07-01 00:00") from None


def load_paper_gauges(path=None, *, expect_counts: tuple[int, int] | None = (4, 10)) -> list[PaperGauge]:
    """Read and validate the gauge table (default ``data/paper_gauges.csv``), in file order.

    ``expect_counts`` = (held out, training); ``None`` skips that check (for other tables).
    """
    p = Path(path) if path is not None else DEFAULT_FILE
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{p}: gauge table not found; the repository ships data/paper_gauges.csv") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or tuple(h.strip() for h in rows[0]) != COLUMNS:
        raise bad_file(p, 1, f"header {rows[0] if rows else []} is not the expected one",
                       f"the columns are {', '.join(COLUMNS)}")
    out: list[PaperGauge] = []
    seen: set[str] = set()
    for line, row in enumerate(rows[1:], start=2):
        if not row or not any(c.strip() for c in row):
            continue
        if len(row) != len(COLUMNS):
            raise bad_file(p, line, f"{len(row)} fields where the header has {len(COLUMNS)}",
                           "quote fields that hold commas (names such as \"Bighorn River at Kane, WY\")")
        r = dict(zip(COLUMNS, (c.strip() for c in row)))
        try:
            gid = check_gauge_id(r["gauge_id"])
        except ValueError as exc:
            fix = "restore the leading zeros (a spreadsheet may have dropped them)" if r["gauge_id"].isdigit() else \
                "write the 8-digit USGS id"
            raise bad_file(p, line, str(exc), fix) from None
        if gid in seen:
            raise bad_file(p, line, f"gauge {gid} is listed twice", "keep one row per gauge")
        seen.add(gid)
        if r["split"] not in ("test", "train"):
            raise bad_file(p, line, f"split={r['split']!r}", "write test (held out) or train")
        start, end = _time(p, line, "window_start_utc", r["window_start_utc"]), _time(p, line, "window_end_utc",
                                                                                      r["window_end_utc"])
        span = end - start + timedelta(hours=1)
        if start.hour or start.minute or end.hour != 23 or end.minute or span.days < 1 or span.seconds:
            raise bad_file(p, line,
                           f"window {start:%Y-%m-%d %H:%M} .. {end:%Y-%m-%d %H:%M} is not whole days of hourly steps",
                           "the window runs 00:00 of the first day to 23:00 of the last (UTC)")
        if not r["name"] or not r["source"]:
            raise bad_file(p, line, "name or source is empty", "give the station name and where each fact comes from")
        out.append(PaperGauge(
            gid, r["split"], r["name"], r["name_source"],
            _float(p, line, "lat", r["lat"], 24.0, 50.0, "give the latitude in degrees north (conterminous US)"),
            _float(p, line, "lon", r["lon"], -125.0, -66.0, "give the longitude in degrees east (west is negative)"),
            _float(p, line, "area_km2", r["area_km2"], 1e-3, 1e6, "give the drainage area in km2"),
            start, end, _float(p, line, "target_nse", r["target_nse"], 1e-9, 1.0, "give the target NSE in (0, 1]"),
            r["source"]))
    if expect_counts is not None:
        counts = (sum(g.held_out for g in out), sum(not g.held_out for g in out))
        if counts != tuple(expect_counts):
            raise bad_file(p, 0, f"{counts[0]} held-out and {counts[1]} training gauges, expected "
                                 f"{expect_counts[0]} and {expect_counts[1]}", "restore the missing rows")
    return out


def paper_gauge(gauge_id: str, path=None) -> PaperGauge:
    """One gauge of the table by id (KeyError naming the known ids)."""
    gid = check_gauge_id(gauge_id)
    for g in load_paper_gauges(path):
        if g.gauge_id == gid:
            return g
    raise KeyError(f"{gid} is not one of the paper's gauges; see {DEFAULT_FILE}")
