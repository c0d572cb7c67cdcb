"""Download CAMELS-US from NCAR and unpack it where :mod:`~.camels` and :mod:`~.attributes` read it.

Source: the CAMELS pages of NCAR's Geoscience Data Exchange (GDEX), dataset ``camels``
(Newman et al. 2015, doi:10.5065/D6MW2F4D; attributes Addor et al. 2017, doi:10.5065/D6G73C3Q),
whose files are served under :data:`OFFICIAL_BASE_URL`:

- ``basin_timeseries_v1p2_metForcing_obsFlow.zip`` (about 3.4 GB): basin-mean Daymet, Maurer and
  NLDAS forcing and USGS streamflow of the 671 basins, ``basin_dataset_public_v1p2/`` inside;
- the attribute tables of ``camels_attributes_v2.0``: ``camels_{clim,geol,hydro,name,soil,topo,vege}.txt``.

Result under ``out``::

    out/basin_dataset_public_v1p2/...      the unpacked time series (HUC-02 sub-folders)
    out/camels_attributes_v2.0/camels_*.txt
    out/camels_download.json               what was fetched: URLs, sizes, SHA-256, time

so ``hydroagent basin from-camels --root out --forcing daymet ...`` finds everything.

Guarantees (each one tested over a loopback server in ``tests/test_datasets_download.py``):

- **nothing half-written**: a file is fetched into ``<name>.part`` and renamed only once it is
  complete (the byte count matches ``Content-Length`` and the SHA-256 matches where one is
  known); an archive is extracted into a temporary folder next to its destination and renamed
  into place; the attribute tables are written into a temporary folder and renamed together;
- **resume**: a leftover ``.part`` is continued with an HTTP ``Range`` request; a server that
  answers with the whole file instead restarts it from byte 0, and a partial file that cannot be
  continued (the server refuses the range, or it is larger than the file) is refused with an
  error naming it (delete it and run again);
- **checks**: every member of the archive is CRC-checked before extraction (a corrupt or
  truncated zip is an error naming the file), member paths that would escape the destination are
  refused, and ``expected_sha256`` (or :data:`KNOWN_SHA256`) is compared when given;
- a finished step is not repeated: an existing complete file or unpacked folder is kept.

HTTP errors (a 404 from a wrong ``--base-url``, say) and network failures are
:class:`DownloadError` with the URL, the status and the fix.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import shutil
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
import zlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from hydroagent_hpc.errors import HydroAgentError
from hydroagent_hpc.sim.manifest import file_sha256

__all__ = ["OFFICIAL_BASE_URL", "TIMESERIES_ZIP", "ATTRIBUTE_FILES", "KNOWN_SHA256", "DownloadError",
           "fetch", "unpack_zip", "download_camels"]

log = logging.getLogger(__name__)

#: Where NCAR serves the CAMELS files (the GDEX ``camels`` dataset); ``--base-url`` replaces it.
OFFICIAL_BASE_URL = "https://gdex.ucar.edu/dataset/camels/file/"
#: The time-series archive (forcing and observed flow, version 1.2).
TIMESERIES_ZIP = "basin_timeseries_v1p2_metForcing_obsFlow.zip"
#: The folder the archive unpacks to.
TIMESERIES_FOLDER = "basin_dataset_public_v1p2"
#: The attribute tables of CAMELS attributes v2.0, fetched one by one.
ATTRIBUTE_FILES = tuple(f"camels_{g}.txt" for g in ("clim", "geol", "hydro", "name", "soil", "topo", "vege"))
ATTRIBUTE_FOLDER = "camels_attributes_v2.0"
#: SHA-256 of the official files where we have checked one ourselves. Empty: no checksum has been
#: verified against NCAR's files yet, so the archive is checked by its own CRCs and the byte count;
#: pass ``expected_sha256`` (``--sha256 NAME=HEX``) to pin one.
KNOWN_SHA256: dict[str, str] = {}

_CHUNK = 1 << 20


class DownloadError(HydroAgentError):
    """A download or unpack that could not complete; the message names the URL or file and the fix."""

    exit_code = 1


@dataclass(frozen=True)
class Fetched:
    """One downloaded file: where from, where to, its size and SHA-256, and whether it was resumed."""

    url: str
    path: Path
    size: int
    sha256: str
    resumed_from: int
    reused: bool


def _open(url: str, start: int, timeout: float) -> Any:
    req = urllib.request.Request(url, headers={"User-Agent": "hydroagent-hpc (CAMELS download)"})
    if start:
        req.add_header("Range", f"bytes={start}-")
    return urllib.request.urlopen(req, timeout=timeout)


def _http_error(url: str, exc: urllib.error.HTTPError, base_hint: str) -> DownloadError:
    fix = (f"check the URL; {base_hint}" if exc.code == 404 else
           "try again later, or use a mirror with --base-url")
    return DownloadError(f"{url}: HTTP {exc.code} {exc.reason}", fix=fix)


def fetch(url: str, dest: Path, *, expected_sha256: str | None = None, timeout: float = 60.0,
          progress: Callable[[int, int | None], None] | None = None) -> Fetched:
    """Download ``url`` to ``dest`` through ``dest.part`` (resumed when present), then rename.

    Returns what was fetched. An existing ``dest`` is taken as complete (it is only ever created by
    the final rename) and checked against ``expected_sha256`` when given.
    """
    if not url.startswith(("http://", "https://")):
        raise DownloadError(f"{url}: not an http(s) URL", fix="give --base-url as http://... or https://...")
    dest = Path(dest)
    base_hint = f"the official base URL is {OFFICIAL_BASE_URL}"
    if dest.is_file():
        digest = file_sha256(dest)
        if expected_sha256 and digest != expected_sha256.lower():
            raise DownloadError(f"{dest}: SHA-256 {digest} is not the expected {expected_sha256}",
                                fix=f"delete {dest} and run again")
        log.info("%s is already complete (%d bytes)", dest, dest.stat().st_size)
        return Fetched(url, dest, dest.stat().st_size, digest, 0, True)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    start = part.stat().st_size if part.is_file() else 0
    try:
        resp = _open(url, start, timeout)
    except urllib.error.HTTPError as exc:
        if exc.code == 416 and start:
            raise DownloadError(f"{part}: the server refuses to continue this partial file at byte {start} "
                                "(HTTP 416: it is as long as or longer than the file on the server)",
                                fix=f"delete {part} and run again") from exc
        raise _http_error(url, exc, base_hint) from exc
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        raise DownloadError(f"{url}: cannot connect ({reason})",
                            fix="check the network (and a proxy), or use a mirror with --base-url") from exc
    with resp:
        status = resp.status
        length = resp.headers.get("Content-Length")
        if start and status == 206:
            content_range = resp.headers.get("Content-Range", "")
            if not content_range.startswith(f"bytes {start}-"):
                raise DownloadError(f"{url}: asked for bytes {start}- of {part}, the server sent '{content_range}'",
                                    fix=f"delete {part} and run again")
            total = int(content_range.rsplit("/", 1)[1]) if content_range.rsplit("/", 1)[1].isdigit() else None
            mode, resumed = "ab", start
            log.info("resuming %s at byte %d", dest.name, start)
        else:
            if start:
                log.warning("%s: the server does not continue partial files (HTTP %d); starting again", url, status)
            total = int(length) if length and length.isdigit() else None
            mode, resumed = "wb", 0
        done = resumed
        with part.open(mode) as f:
            try:
                for block in iter(lambda: resp.read(_CHUNK), b""):
                    f.write(block)
                    done += len(block)
                    if progress is not None:
                        progress(done, total)
            except (OSError, http.client.HTTPException) as exc:
                raise DownloadError(f"{url}: the connection broke after {done} bytes ({exc}); "
                                    f"{part} keeps what arrived", fix="run the same command again to resume") from exc
    if total is not None and done != total:
        raise DownloadError(f"{url}: received {done} of {total} bytes; {part} keeps what arrived",
                            fix="run the same command again to resume")
    digest = file_sha256(part)
    if expected_sha256 and digest != expected_sha256.lower():
        part.unlink()
        raise DownloadError(f"{url}: SHA-256 {digest} is not the expected {expected_sha256} (download deleted)",
                            fix="run again; if it repeats, the file on the server changed: check the source")
    os.replace(part, dest)
    log.info("downloaded %s (%d bytes)", dest, done)
    return Fetched(url, dest, done, digest, resumed, False)


def _safe_members(zf: zipfile.ZipFile, archive: Path) -> list[zipfile.ZipInfo]:
    members = zf.infolist()
    for m in members:
        p = PurePosixPath(m.filename)
        if p.is_absolute() or ".." in p.parts or (p.parts and ":" in p.parts[0]):
            raise DownloadError(f"{archive}: member '{m.filename}' would be written outside the destination",
                                fix="this is not the CAMELS archive; check --base-url")
    return members


def unpack_zip(archive: Path, dest: Path, *, member_root: str | None = None) -> Path:
    """Extract ``archive`` so that ``dest`` appears complete or not at all; returns ``dest``.

    The archive is opened and every member CRC-checked first (a corrupt or truncated zip is a
    :class:`DownloadError` naming it). With ``member_root`` the archive must hold that top folder;
    only its content is extracted and becomes ``dest`` (other top-level entries are skipped). An
    existing ``dest`` is kept as it is. Disk needed: the archive plus its unpacked size (the
    temporary folder is on the same file system, so the final rename copies nothing).
    """
    archive, dest = Path(archive), Path(dest)
    if dest.is_dir():
        log.info("%s is already unpacked", dest)
        return dest
    fix = f"delete {archive} and run again to download it afresh"
    try:
        with zipfile.ZipFile(archive) as zf:
            bad = zf.testzip()
            if bad is not None:
                raise DownloadError(f"{archive}: member '{bad}' fails its CRC check (corrupt archive)", fix=fix)
            members = _safe_members(zf, archive)
            if member_root is not None:
                members = [m for m in members if PurePosixPath(m.filename).parts[:1] == (member_root,)]
                if not members:
                    raise DownloadError(f"{archive}: no '{member_root}/' folder inside (not the CAMELS time-series "
                                        "archive)", fix="check --base-url")
            dest.parent.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
            try:
                zf.extractall(tmp, members=members)
                os.replace(tmp / member_root if member_root else tmp, dest)
            finally:
                shutil.rmtree(tmp, ignore_errors=True)
    except (zipfile.BadZipFile, EOFError) as exc:
        raise DownloadError(f"{archive}: not a readable zip archive ({exc})", fix=fix) from exc
    except zlib.error as exc:
        raise DownloadError(f"{archive}: a member cannot be decompressed ({exc}; corrupt archive)", fix=fix) from exc
    log.info("unpacked %s into %s", archive.name, dest)
    return dest


def _join(base_url: str, name: str) -> str:
    return base_url.rstrip("/") + "/" + name


def download_camels(out: Path, *, base_url: str = OFFICIAL_BASE_URL, timeseries: bool = True,
                    attributes: bool = True, keep_archive: bool = False,
                    expected_sha256: Mapping[str, str] | None = None, timeout: float = 60.0,
                    progress: Callable[[str, int, int | None], None] | None = None) -> dict[str, Any]:
    """Fetch and unpack CAMELS-US into ``out``; returns (and writes to ``camels_download.json``) the record.

    ``base_url`` is the folder holding :data:`TIMESERIES_ZIP` and :data:`ATTRIBUTE_FILES`
    (default :data:`OFFICIAL_BASE_URL`). ``expected_sha256`` maps file names to SHA-256 digests
    (added to :data:`KNOWN_SHA256`). The archive is deleted after a successful unpack unless
    ``keep_archive``; it is fetched into ``out/downloads/``.
    """
    out = Path(out)
    sums = {**KNOWN_SHA256, **(expected_sha256 or {})}
    unknown = set(sums) - {TIMESERIES_ZIP, *ATTRIBUTE_FILES}
    if unknown:
        raise DownloadError(f"checksums given for unknown files {sorted(unknown)}",
                            fix=f"name one of {TIMESERIES_ZIP}, {', '.join(ATTRIBUTE_FILES)}")
    record: dict[str, Any] = {"source": base_url,
                              "dataset": "CAMELS-US (Newman et al. 2015; attributes Addor et al. 2017)",
                              "doi": ["10.5065/D6MW2F4D", "10.5065/D6G73C3Q"], "files": []}

    def note(f: Fetched) -> None:
        record["files"].append({"name": f.path.name, "url": f.url, "bytes": f.size, "sha256": f.sha256,
                                "resumed_from": f.resumed_from, "reused": f.reused})

    def bar(name: str) -> Callable[[int, int | None], None] | None:
        return None if progress is None else (lambda done, total: progress(name, done, total))

    if timeseries:
        folder = out / TIMESERIES_FOLDER
        if folder.is_dir():
            log.info("%s is already unpacked; not downloading %s", folder, TIMESERIES_ZIP)
            record["files"].append({"name": TIMESERIES_ZIP, "reused": True, "unpacked": str(folder)})
        else:
            archive = out / "downloads" / TIMESERIES_ZIP
            got = fetch(_join(base_url, TIMESERIES_ZIP), archive, expected_sha256=sums.get(TIMESERIES_ZIP),
                        timeout=timeout, progress=bar(TIMESERIES_ZIP))
            note(got)
            unpack_zip(archive, folder, member_root=TIMESERIES_FOLDER)
            if not keep_archive:
                archive.unlink()
    if attributes:
        folder = out / ATTRIBUTE_FOLDER
        if folder.is_dir():
            log.info("%s is already complete", folder)
        else:
            staging = out / "downloads" / ATTRIBUTE_FOLDER
            for name in ATTRIBUTE_FILES:
                note(fetch(_join(base_url, name), staging / name, expected_sha256=sums.get(name), timeout=timeout,
                           progress=bar(name)))
            for name in ATTRIBUTE_FILES:
                head = (staging / name).read_bytes()[:200].decode("utf-8", "replace")
                if not head.startswith("gauge_id;"):
                    raise DownloadError(f"{staging / name}: does not start with 'gauge_id;' (not a CAMELS attribute "
                                        f"table; the server sent: {head[:60]!r})",
                                        fix=f"delete {staging} and check --base-url")
            os.replace(staging, folder)
    downloads = out / "downloads"
    if downloads.is_dir() and not any(downloads.iterdir()):
        downloads.rmdir()
    record["finished_utc"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    tmp = out / ".camels_download.json.tmp"
    out.mkdir(parents=True, exist_ok=True)
    tmp.write_text(json.dumps(record, indent=1) + "\n")
    os.replace(tmp, out / "camels_download.json")
    return record
