"""``hydroagent data camels``: download, resume, check and unpack CAMELS-US, end to end over a loopback
HTTP server that serves a small archive built here from the tests/data CAMELS subset."""

from __future__ import annotations

import hashlib
import io
import json
import subprocess
import sys
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from conftest import CAMELS, require
from hydroagent_hpc.datasets import attributes, camels
from hydroagent_hpc.datasets.download import (
    ATTRIBUTE_FILES,
    OFFICIAL_BASE_URL,
    TIMESERIES_ZIP,
    DownloadError,
    download_camels,
    fetch,
    unpack_zip,
)

SAMPLE = CAMELS / "camels_us_nldas_sample"
ATTRS = CAMELS / "camels_us_nh_testdata" / "camels_attributes_v2.0"
#: Files of the subset that go into the test archive, relative to SAMPLE.
MEMBERS = ("basin_mean_forcing/nldas/17/12010000_lump_nldas_forcing_leap.txt",
           "usgs_streamflow/17/12010000_streamflow_qc.txt",
           "basin_mean_forcing/nldas/06/03439000_lump_nldas_forcing_leap.txt",
           "usgs_streamflow/06/03439000_streamflow_qc.txt")


def _archive(members: dict[str, bytes], compression: int = zipfile.ZIP_DEFLATED) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


@pytest.fixture(scope="module")
def timeseries_zip() -> bytes:
    return _archive({f"basin_dataset_public_v1p2/{m}": require(SAMPLE / m).read_bytes() for m in MEMBERS})


class Server:
    """A loopback HTTP server over ``files`` ({url path: bytes}) with byte ranges, a request log, and two
    faults on demand: ``cut_after`` (close the connection after that many body bytes, once) and
    ``ignore_range`` (answer a range request with the whole file)."""

    def __init__(self, files: dict[str, bytes]):
        self.files = files
        self.requests: list[tuple[str, str | None]] = []
        self.cut_after: int | None = None
        self.ignore_range = False
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                rng = self.headers.get("Range")
                server.requests.append((self.path, rng))
                body = server.files.get(self.path)
                if body is None:
                    self.send_error(404, "Not Found")
                    return
                start = 0
                if rng and not server.ignore_range:
                    start = int(rng.removeprefix("bytes=").rstrip("-"))
                    if start >= len(body):
                        self.send_response(416)
                        self.send_header("Content-Range", f"bytes */{len(body)}")
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(body) - 1}/{len(body)}")
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(body) - start))
                self.end_headers()
                payload = body[start:]
                if server.cut_after is not None:
                    payload, server.cut_after = payload[:server.cut_after], None
                    self.wfile.write(payload)
                    self.wfile.flush()
                    self.close_connection = True
                    return
                self.wfile.write(payload)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.httpd.server_address[1]}/camels/"

    def __enter__(self) -> Server:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=10)


def _official_layout(timeseries: bytes) -> dict[str, bytes]:
    files = {f"/camels/{TIMESERIES_ZIP}": timeseries}
    files.update({f"/camels/{name}": require(ATTRS / name).read_bytes() for name in ATTRIBUTE_FILES})
    return files


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "hydroagent_hpc.cli", "-q", "data", "camels", *args],
                          capture_output=True, text=True, timeout=120)


def _leftovers(out: Path) -> list[str]:
    return sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.name.endswith(".part") or p.name.startswith("."))


def test_cli_downloads_checks_and_unpacks_then_reuses(tmp_path, timeseries_zip):
    out = tmp_path / "camels_us"
    with Server(_official_layout(timeseries_zip)) as srv:
        proc = _cli("--out", str(out), "--base-url", srv.base)
        assert proc.returncode == 0, proc.stderr
        assert sorted(p for p, _ in srv.requests) == sorted(f"/camels/{n}" for n in (TIMESERIES_ZIP, *ATTRIBUTE_FILES))
        summary = json.loads(proc.stdout)
        assert summary["source"] == srv.base and len(summary["files"]) == 1 + len(ATTRIBUTE_FILES)
        # every file arrives byte for byte where the readers look for it
        for m in MEMBERS:
            assert (out / "basin_dataset_public_v1p2" / m).read_bytes() == (SAMPLE / m).read_bytes(), m
        for name in ATTRIBUTE_FILES:
            assert (out / "camels_attributes_v2.0" / name).read_bytes() == (ATTRS / name).read_bytes(), name
        record = json.loads((out / "camels_download.json").read_text())
        zip_entry = next(f for f in record["files"] if f["name"] == TIMESERIES_ZIP)
        assert zip_entry["sha256"] == hashlib.sha256(timeseries_zip).hexdigest()
        assert zip_entry["bytes"] == len(timeseries_zip) and zip_entry["resumed_from"] == 0
        assert not (out / "downloads").exists() and _leftovers(out) == []  # archive removed, nothing half-written
        f = camels.read_forcing(camels.find_forcing_file(out, "12010000", "nldas"))
        assert f.dates[0].astype(str) == "1993-09-29" and f.area_km2 > 100
        folder = attributes.find_attribute_folder(out)
        assert folder == out / "camels_attributes_v2.0"
        assert attributes.read_attributes(folder, "12010000").area_km2 == pytest.approx(142.18)
        # a second run finds everything complete and asks the server for nothing
        n = len(srv.requests)
        assert _cli("--out", str(out), "--base-url", srv.base).returncode == 0
        assert len(srv.requests) == n


def test_a_broken_download_resumes_with_a_range_request(tmp_path, timeseries_zip):
    dest = tmp_path / "dl" / TIMESERIES_ZIP
    cut = len(timeseries_zip) // 3
    with Server(_official_layout(timeseries_zip)) as srv:
        srv.cut_after = cut
        with pytest.raises(DownloadError, match=r"run the same command again to resume") as err:
            fetch(srv.base + TIMESERIES_ZIP, dest)
        assert f"{cut} " in str(err.value) and not dest.exists()
        assert (dest.parent / (dest.name + ".part")).stat().st_size == cut
        got = fetch(srv.base + TIMESERIES_ZIP, dest)
        assert srv.requests[-1][1] == f"bytes={cut}-" and got.resumed_from == cut
    assert dest.read_bytes() == timeseries_zip and got.sha256 == hashlib.sha256(timeseries_zip).hexdigest()
    assert not (dest.parent / (dest.name + ".part")).exists()


def test_a_server_without_ranges_restarts_and_an_oversized_part_is_refused(tmp_path, timeseries_zip):
    dest = tmp_path / TIMESERIES_ZIP
    part = tmp_path / (TIMESERIES_ZIP + ".part")
    with Server(_official_layout(timeseries_zip)) as srv:
        part.write_bytes(b"stale bytes from another file")
        srv.ignore_range = True
        got = fetch(srv.base + TIMESERIES_ZIP, dest)
        assert got.resumed_from == 0 and dest.read_bytes() == timeseries_zip
        dest.unlink()
        part.write_bytes(timeseries_zip + b"extra")
        srv.ignore_range = False
        with pytest.raises(DownloadError, match=r"HTTP 416") as err:
            fetch(srv.base + TIMESERIES_ZIP, dest)
        assert f"delete {part}" in str(err.value) and not dest.exists()


def test_a_404_names_the_url_and_the_official_base(tmp_path, timeseries_zip):
    out = tmp_path / "camels_us"
    with Server(_official_layout(timeseries_zip)) as srv:
        proc = _cli("--out", str(out), "--base-url", srv.base.replace("/camels/", "/elsewhere/"))
    assert proc.returncode == 1
    assert f"elsewhere/{TIMESERIES_ZIP}: HTTP 404" in proc.stderr and OFFICIAL_BASE_URL in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (out / "basin_dataset_public_v1p2").exists()
    assert not out.exists() or _leftovers(out) == []


def test_a_corrupt_or_foreign_archive_is_an_error_and_unpacks_nothing(tmp_path, timeseries_zip):
    def flipped(data: bytes) -> bytes:
        first = zipfile.ZipFile(io.BytesIO(data)).infolist()[0]
        out = bytearray(data)
        out[first.header_offset + 30 + len(first.filename) + 40] ^= 0xFF  # inside the first member's data
        return bytes(out)

    stored = _archive({"basin_dataset_public_v1p2/a.txt": b"0123456789" * 20}, zipfile.ZIP_STORED)
    cases = {
        "crc": (flipped(stored), r"member 'basin_dataset_public_v1p2/a.txt' fails its CRC check"),
        "deflate": (flipped(timeseries_zip), r"(fails its CRC check|cannot be decompressed)"),
        "truncated": (timeseries_zip[: len(timeseries_zip) // 2], r"not a readable zip archive"),
        "foreign": (_archive({"other/readme.txt": b"x"}), r"no 'basin_dataset_public_v1p2/' folder inside"),
        "escape": (_archive({"basin_dataset_public_v1p2/a.txt": b"x", "../evil.txt": b"x"}),
                   r"outside the destination"),
    }
    for name, (data, message) in cases.items():
        archive = tmp_path / name / TIMESERIES_ZIP
        archive.parent.mkdir()
        archive.write_bytes(data)
        dest = tmp_path / name / "basin_dataset_public_v1p2"
        with pytest.raises(DownloadError, match=message) as err:
            unpack_zip(archive, dest, member_root="basin_dataset_public_v1p2")
        assert str(archive) in str(err.value) and "fix:" in str(err.value), name
        assert not dest.exists() and sorted(p.name for p in archive.parent.iterdir()) == [TIMESERIES_ZIP], name
    assert not (tmp_path / "evil.txt").exists()


def test_a_corrupt_archive_from_the_server_fails_the_command(tmp_path, timeseries_zip):
    out = tmp_path / "camels_us"
    with Server(_official_layout(timeseries_zip[:-100])) as srv:
        proc = _cli("--out", str(out), "--base-url", srv.base, "--timeseries-only")
    assert proc.returncode == 1 and "not a readable zip archive" in proc.stderr and "delete" in proc.stderr
    assert not (out / "basin_dataset_public_v1p2").exists()


def test_checksums_are_enforced(tmp_path, timeseries_zip):
    with Server(_official_layout(timeseries_zip)) as srv:
        right = hashlib.sha256(require(ATTRS / "camels_topo.txt").read_bytes()).hexdigest()
        rec = download_camels(tmp_path / "ok", base_url=srv.base, timeseries=False,
                              expected_sha256={"camels_topo.txt": right})
        assert {f["name"] for f in rec["files"]} == set(ATTRIBUTE_FILES)
        with pytest.raises(DownloadError, match=r"SHA-256 .* is not the expected 0{64}"):
            download_camels(tmp_path / "bad", base_url=srv.base, timeseries=False,
                            expected_sha256={"camels_topo.txt": "0" * 64})
        assert not (tmp_path / "bad" / "camels_attributes_v2.0").exists()
        assert not list((tmp_path / "bad").rglob("camels_topo.txt*"))
        proc = _cli("--out", str(tmp_path / "cli"), "--base-url", srv.base, "--sha256", "camels_topo.txt=abc")
        assert proc.returncode == 2 and "--sha256 'camels_topo.txt=abc'" in proc.stderr
        with pytest.raises(DownloadError, match="unknown files"):
            download_camels(tmp_path / "x", base_url=srv.base, expected_sha256={"camels_topo.csv": right})
