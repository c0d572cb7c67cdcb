"""``hydroagent data usgs``: dataretrieval against a loopback server replaying a recorded Water Data response.

The server is a real HTTP server on 127.0.0.1 (bounded: it serves the two recorded pages and
answers anything else with 400/404); dataretrieval is redirected to it with its own setting,
``dataretrieval.configure(WaterdataConfiguration(base_url=...))``, which the command exposes as
``--base-url``. Values in the pages are authored (tests/data/usgs/README.md).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import numpy as np
import pandas as pd
import pytest

from hydroagent_hpc.datasets.usgs import download_hourly, parse_window, to_hourly
from hydroagent_hpc.sim.forcing import read_observations

DATA = Path(__file__).parent / "data" / "usgs"
USGS_HOST = "https://api.waterdata.usgs.gov"
CFS = 0.028316846592


class _Replay:
    """Serve page 1 for the first request and page 2 for its ``cursor``; record every request."""

    def __init__(self):
        self.requests: list[str] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):
                outer.requests.append(self.path)
                url = urlsplit(self.path)
                q = parse_qs(url.query)
                if url.path != "/ogcapi/v1/collections/continuous/items":
                    return self._send(404, {"code": "NotFound", "description": f"no collection at {url.path}"})
                if q.get("monitoring_location_id") != ["USGS-07144100"] or q.get("parameter_code") != ["00060"]:
                    return self._send(400, {"code": "InvalidParameterValue", "description": "unexpected query"})
                page = "page2" if "cursor" in q else "page1"
                text = (DATA / f"continuous_07144100_{page}.json").read_text().replace(USGS_HOST, outer.base_url)
                self._send(200, json.loads(text))

            def _send(self, status, body):
                raw = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/geo+json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self):
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


EXPECTED_CFS = {6: 115.0, 7: (200 + 220 + 230) / 3, 8: 315.0, 10: 510.0, 11: 615.0}  # hour 9 is a gap


def test_cli_writes_hourly_utc_m3s_from_the_replayed_service(tmp_path):
    out = tmp_path / "USGS_07144100_1h_UTC.csv"
    with _Replay() as srv:
        proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "data", "usgs", "--site", "07144100",
                               "--start", "2019-03-30 06:00", "--end", "2019-03-30 11:00", "--out", str(out),
                               "--base-url", srv.base_url], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        first, second = (urlsplit(r) for r in srv.requests)
    q = parse_qs(first.query)
    assert q["time"] == ["2019-03-30T05:00:00Z/2019-03-30T11:00:00Z"]  # one hour early: hour 06 averages (05, 06]
    assert "cursor" in parse_qs(second.query)  # the next link was followed, on the same (loopback) host
    lines = out.read_text().splitlines()
    assert lines[0] == "Date,Discharge(m3/s)"
    assert [ln.split(",")[0] for ln in lines[1:]] == [f"2019-03-30 {h:02d}:00" for h in (6, 7, 8, 10, 11)]
    obs = read_observations(out)  # what the simulator (and EF5) read
    for h, cfs in EXPECTED_CFS.items():
        assert obs[datetime(2019, 3, 30, h)] == pytest.approx(cfs * CFS, abs=6e-5)
    meta = json.loads(Path(str(out) + ".json").read_text())
    assert meta["values"] == 22 and meta["rejected_by_qualifier"] == 1 and meta["missing_or_sentinel"] == 2
    assert meta["duplicate_rows"] == 1 and meta["conflicting_duplicates"] == 1
    assert meta["hours"] == 6 and meta["missing_hours"] == 1
    assert meta["qualifiers"] == {"ICE": 1, "ESTIMATED": 1}
    assert meta["approval"] == {"Approved": 17, "Provisional": 5}
    summary = json.loads(proc.stdout)
    assert summary["site"] == "07144100" and summary["missing_hours"] == 1


def test_an_error_answer_of_the_service_fails_cleanly(tmp_path):
    with _Replay() as srv:
        proc = subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "data", "usgs", "--site", "01403060",
                               "--start", "2019-03-30", "--end", "2019-03-30", "--out", str(tmp_path / "x.csv"),
                               "--base-url", srv.base_url], capture_output=True, text=True, timeout=120)
    assert proc.returncode != 0 and not (tmp_path / "x.csv").exists()
    assert "Traceback" not in proc.stderr and "error: USGS Water Data API, site 01403060" in proc.stderr
    assert "400" in proc.stderr


def test_library_call_matches_the_cli(tmp_path):
    with _Replay() as srv:
        meta = download_hourly("07144100", "2019-03-30 06:00", "2019-03-30 11:00", tmp_path / "o.csv",
                               base_url=srv.base_url)
    assert meta["kept"] == 18 and meta["unit"] == "m3/s"
    assert len(meta["requests"]) == 1 and meta["requests"][0].startswith("http://127.0.0.1:")


def _frame(times, values, unit="ft^3/s", qual=None, approval="Approved"):
    n = len(times)
    return pd.DataFrame({"time": times, "value": values, "unit_of_measure": [unit] * n,
                         "approval_status": [approval] * n, "qualifier": qual or [None] * n})


def test_local_times_with_offsets_across_dst_become_utc():
    # Legacy NWIS-style local stamps: 01:45 CST (-06:00) and 03:00 CDT (-05:00) are 07:45 and 08:00 UTC;
    # the local clock jumps, UTC does not.
    df = _frame(["2019-03-10T01:30:00-06:00", "2019-03-10T01:45:00-06:00", "2019-03-10T03:00:00-05:00",
                 "2019-03-10T03:15:00-05:00"], ["10", "20", "30", "40"])
    times, q, stats = to_hourly(df, datetime(2019, 3, 10, 8), datetime(2019, 3, 10, 9))
    assert list(times) == [datetime(2019, 3, 10, 8), datetime(2019, 3, 10, 9)]
    # (07:00, 08:00] holds 07:30, 07:45, 08:00
    assert q[0] == pytest.approx(20 * CFS) and q[1] == pytest.approx(40 * CFS)
    assert stats["duplicate_rows"] == 0


def test_same_instant_written_in_two_offsets_is_one_value():
    df = _frame(["2019-11-03T01:30:00-05:00", "2019-11-03T00:30:00-06:00"], ["10", "10"])  # both 06:30 UTC
    _, q, stats = to_hourly(df, datetime(2019, 11, 3, 7), datetime(2019, 11, 3, 7))
    assert stats["duplicate_rows"] == 1 and stats["conflicting_duplicates"] == 0 and q[0] == pytest.approx(10 * CFS)


def test_metric_units_pass_and_unknown_units_fail():
    _, q, _ = to_hourly(_frame(["2019-01-01T01:00:00Z"], ["2.5"], unit="m^3/s"), datetime(2019, 1, 1, 1),
                        datetime(2019, 1, 1, 1))
    assert q[0] == 2.5
    with pytest.raises(ValueError, match="unit"):
        to_hourly(_frame(["2019-01-01T01:00:00Z"], ["2.5"], unit="ft"), datetime(2019, 1, 1, 1),
                  datetime(2019, 1, 1, 1))


def test_qualifier_strings_from_other_clients_are_understood():
    df = _frame(["2019-01-01T00:30:00Z", "2019-01-01T00:45:00Z"], ["5", "7"], qual=["['Ice', 'e']", "e"])
    _, q, stats = to_hourly(df, datetime(2019, 1, 1, 1), datetime(2019, 1, 1, 1))
    assert q[0] == pytest.approx(7 * CFS) and stats["rejected_by_qualifier"] == 1


def test_window_parsing():
    assert parse_window("2019-03-30", "2019-05-28") == (datetime(2019, 3, 30), datetime(2019, 5, 28, 23))
    for bad in (("2019-03-30 06:30", "2019-03-31"), ("30/03/2019", "2019-03-31"), ("2019-03-31", "2019-03-30")):
        with pytest.raises(ValueError):
            parse_window(*bad)


def test_empty_answer_gives_all_missing_hours():
    times, q, stats = to_hourly(_frame([], []), datetime(2019, 1, 1), datetime(2019, 1, 1, 2))
    assert len(times) == 3 and np.isnan(q).all() and stats["missing_hours"] == 3
