"""Regenerate ``tests/data/camels/`` (the small CAMELS-US test subset) from the full shared data.

Usage (from the repository root)::

    python tests/scripts/trim_camels.py [--data ../shared/data] [--out tests/data/camels]

What is kept is the table :data:`TRIM` below and nothing else: whole files are copied byte for byte,
time series keep their header lines and the data rows whose date falls in the window (each kept row
is the source row unchanged), attribute tables keep their header and the rows of the listed gauges.
The result is written to a temporary folder next to ``--out`` and renamed into place, so an
interrupted run never leaves half a subset. ``tests/data/camels/PROVENANCE.md`` describes the result;
``tests/data/SHA256SUMS`` must be refreshed after a regeneration (``cd tests/data && sha256sum ...``,
see ``tests/data/README.md``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Series:
    """A time-series file cut to ``[first, last]`` (inclusive, ISO dates).

    ``kind`` says where the date is: ``forcing`` (4 header lines, date in columns 1-3),
    ``streamflow`` (no header, date in columns 2-4), ``model_output`` (1 header line, columns 1-3).
    """

    path: str
    kind: str
    first: str
    last: str


@dataclass(frozen=True)
class Table:
    """A ``;``-separated attribute table cut to the rows of ``gauges`` (None keeps every row)."""

    path: str
    gauges: tuple[str, ...] | None


@dataclass(frozen=True)
class Copy:
    """A file copied unchanged."""

    path: str


NLDAS_IDS = ("12010000", "03439000")

#: Everything the tests read, relative to the shared ``data/`` folder and to ``tests/data/camels/``.
TRIM: tuple[Series | Table | Copy, ...] = (
    # camels_us_nldas_sample: Naselle (1993-09-29..1998-12-31) and French Broad (the first 15 months)
    Series("camels_us_nldas_sample/basin_mean_forcing/nldas/17/12010000_lump_nldas_forcing_leap.txt",
           "forcing", "1993-09-29", "1998-12-31"),
    Series("camels_us_nldas_sample/usgs_streamflow/17/12010000_streamflow_qc.txt",
           "streamflow", "1993-09-29", "1998-12-31"),
    Series("camels_us_nldas_sample/basin_mean_forcing/nldas/06/03439000_lump_nldas_forcing_leap.txt",
           "forcing", "1993-09-29", "1994-12-31"),
    Series("camels_us_nldas_sample/usgs_streamflow/06/03439000_streamflow_qc.txt",
           "streamflow", "1993-09-29", "1994-12-31"),
    *(Table(f"camels_us_nldas_sample/camels_attributes_v2.0/camels_{g}.txt", NLDAS_IDS)
      for g in ("clim", "geol", "hydro", "name", "soil", "topo", "vege")),
    # camels_us_nh_testdata: 01022500 in the four forcing variants, one year; the full 671-basin tables
    *(Series(f"camels_us_nh_testdata/basin_mean_forcing/{src}/01022500_lump_{tag}_forcing_leap.txt",
             "forcing", "2000-01-01", "2000-12-31")
      for src, tag in (("daymet", "cida"), ("maurer", "maurer"), ("maurer_extended", "maurer"),
                       ("nldas", "nldas"))),
    Series("camels_us_nh_testdata/usgs_streamflow/01022500_streamflow_qc.txt",
           "streamflow", "2000-01-01", "2000-12-31"),
    *(Table(f"camels_us_nh_testdata/camels_attributes_v2.0/camels_{g}.txt", None)
      for g in ("clim", "geol", "hydro", "name", "soil", "topo", "vege")),
    Copy("camels_us_nh_testdata/camels_attributes_v2.0/readme.txt"),
    # camels_us_model_output: 13331500 from water year 2001 to the end of its file (2010-12-31),
    # 01031500 from water year 2013 to the end of its record (2014-12-31, the last 92 days missing)
    Series("camels_us_model_output/13331500/13331500_05_model_output.txt",
           "model_output", "2000-10-01", "2010-12-31"),
    Series("camels_us_model_output/13331500/13331500_streamflow_qc.txt",
           "streamflow", "2000-10-01", "2010-12-31"),
    Series("camels_us_model_output/01031500/01031500_05_model_output.txt",
           "model_output", "2012-10-01", "2014-12-31"),
    Series("camels_us_model_output/01031500/01031500_lump_cida_forcing_leap.txt",
           "forcing", "2012-10-01", "2014-12-31"),
    Series("camels_us_model_output/01031500/01031500_streamflow_qc.txt",
           "streamflow", "2012-10-01", "2014-12-31"),
    # the reference paper's gauges (metadata only, no time series)
    Copy("paper_gauges_metadata/paper_gauges.csv"),
)

_HEADER_LINES = {"forcing": 4, "streamflow": 0, "model_output": 1}
_DATE_COLUMN = {"forcing": 0, "streamflow": 1, "model_output": 0}


def _row_date(line: str, kind: str, where: str) -> dt.date:
    fields = line.split()
    c = _DATE_COLUMN[kind]
    try:
        return dt.date(int(fields[c]), int(fields[c + 1]), int(fields[c + 2]))
    except (IndexError, ValueError) as exc:
        raise ValueError(f"{where}: no year/month/day in columns {c + 1}-{c + 3} ({exc})") from exc


def cut_series(text: str, kind: str, first: str, last: str, where: str = "<text>") -> str:
    """The header lines of ``text`` and its rows dated within ``[first, last]``, unchanged."""
    lo, hi = dt.date.fromisoformat(first), dt.date.fromisoformat(last)
    lines = text.splitlines(keepends=True)
    n = _HEADER_LINES[kind]
    kept = lines[:n]
    for i, line in enumerate(lines[n:], start=n + 1):
        if line.strip() and lo <= _row_date(line, kind, f"{where}:{i}") <= hi:
            kept.append(line)
    if len(kept) == n:
        raise ValueError(f"{where}: no row between {first} and {last}")
    return "".join(kept)


def cut_table(text: str, gauges: tuple[str, ...] | None) -> str:
    """The header of a ``;`` table and the rows whose first field is in ``gauges`` (all if None)."""
    lines = text.splitlines(keepends=True)
    if gauges is None:
        return text
    return "".join(lines[:1] + [ln for ln in lines[1:] if ln.split(";", 1)[0].strip() in gauges])


def build(data: Path, out: Path) -> list[Path]:
    """Write the subset of :data:`TRIM` from ``data`` to ``out`` atomically; returns the files written."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    written: list[Path] = []
    try:
        for item in TRIM:
            src, dst = data / item.path, tmp / item.path
            if not src.is_file():
                raise FileNotFoundError(f"{src} is missing (point --data at the shared data folder)")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if isinstance(item, Copy):
                shutil.copyfile(src, dst)
            else:
                text = src.read_bytes().decode("utf-8")
                if isinstance(item, Series):
                    text = cut_series(text, item.kind, item.first, item.last, where=str(src))
                else:
                    text = cut_table(text, item.gauges)
                dst.write_bytes(text.encode("utf-8"))
            written.append(out / item.path)
        for name in ("camels_us_nldas_sample", "camels_us_nh_testdata"):
            ids = NLDAS_IDS if name == "camels_us_nldas_sample" else ("01022500",)
            (tmp / name / "basins.txt").write_text("".join(f"{g}\n" for g in ids), encoding="utf-8")
        keep = out / "PROVENANCE.md"
        if keep.is_file():
            shutil.copyfile(keep, tmp / "PROVENANCE.md")
        old = out.with_name(f".{out.name}.old")
        if out.exists():
            os.replace(out, old)
        os.replace(tmp, out)
        if old.exists():
            shutil.rmtree(old)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return written


def main(argv: list[str] | None = None) -> int:
    default = Path(os.environ.get("HYDROAGENT_SHARED", ROOT.parent / "shared")) / "data"
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=default, help=f"the full shared data folder (default {default})")
    ap.add_argument("--out", type=Path, default=ROOT / "tests" / "data" / "camels", help="where the subset goes")
    args = ap.parse_args(argv)
    files = build(args.data, args.out)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"{len(files)} files trimmed into {args.out} ({size / 1e6:.2f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
