"""A hand-made EF5 case small enough to reason about cell by cell (``tests/test_ef5_input_reading.py``).

Every column is its own stream flowing south (ESRI direction 4) off the bottom row; the grids are
ESRI ASCII written from the exact text given, so a test controls every digit EF5 and our engine
parse. Rain differs per column (``col + 1`` mm/h for the first hours), so an outlet moved to another
column or row changes the printed discharge.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from decimal import Decimal
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.embedded import EmbeddedSimulator

NROWS, NCOLS = 6, 5


def asc_text(rows: Sequence[Sequence[object]], *, xll: float, yll: float, cellsize: float,
             nodata: str = "-9999") -> str:
    """An ESRI ASCII grid from the values' exact text (``str`` of each item)."""
    head = (f"ncols {len(rows[0])}\nnrows {len(rows)}\nxllcorner {xll!r}\nyllcorner {yll!r}\n"
            f"cellsize {cellsize!r}\nNODATA_value {nodata}\n")
    return head + "".join(" ".join(str(v) for v in row) + "\n" for row in rows)


def write_case_tif(path: Path, rows: Sequence[Sequence[object]], *, xll: float, yll: float, cellsize: float,
                   nodata_tag: str | None) -> None:
    """A striped float32 GeoTIFF of the values (``float32(float(text))``) with the ``GDAL_NODATA`` tag text
    given verbatim, or without the tag (``None``): what :func:`hydroagent_hpc.sim.grids.write_tif` cannot write."""
    import tifffile

    data = np.array([[float(str(v)) for v in row] for row in rows], dtype=np.float32)
    geokeys = (1, 1, 0, 3, 1024, 0, 1, 2, 1025, 0, 1, 1, 2048, 0, 1, 4326)
    tags = [(33550, "d", 3, (cellsize, cellsize, 0.0), True),
            (33922, "d", 6, (0.0, 0.0, 0.0, xll, yll + len(rows) * cellsize, 0.0), True),
            (34735, "H", len(geokeys), geokeys, True)]
    if nodata_tag is not None:
        tags.append((42113, "s", 0, nodata_tag, True))
    tifffile.imwrite(path, data, photometric="minisblack", extratags=tags, metadata=None, rowsperstrip=1)


def write_tiny_case(folder: Path, gauge: Sequence[str], *, lat0: float = 35.0, lon0: float = -97.5,
                    cellsize: float = 0.01, fam: Callable[[int, int], object] = lambda r, c: r,
                    dem: Callable[[int, int], object] = lambda r, c: 100 - 3 * r,
                    ddm: Callable[[int, int], object] = lambda r, c: 4,
                    pet: Callable[[int, int], object] = lambda r, c: "4.0", pet_nodata: str = "-9999",
                    rain: Callable[[int, int, int], object] | None = None, rain_nodata: str = "-9999",
                    wm_grid: Callable[[int, int], object] | None = None,
                    tif: Mapping[str, str | None] | None = None, hours: int = 36) -> Path:
    """Write the case into ``folder`` (``gauge``: the ``[Gauge outlet]`` lines) and return its control file.

    ``tif`` maps grids ("dem", "ddm", "fam", "rain", "wm") to write as GeoTIFF to their ``GDAL_NODATA`` tag
    text (``None``: no tag); the others are ESRI ASCII. ``wm_grid`` adds a WM parameter grid (always a TIF).
    """
    folder.mkdir(parents=True, exist_ok=True)
    geo = {"xll": lon0, "yll": lat0, "cellsize": cellsize}
    tif = dict(tif or {})
    for sub in ("basic", "precip", "pet", "output"):
        (folder / sub).mkdir(exist_ok=True)
    cells = [[(r, c) for c in range(NCOLS)] for r in range(NROWS)]

    def grid(name: str, path: Path, values: list[list[object]], nodata: str = "-9999") -> str:
        if name in tif:
            write_case_tif(path.with_suffix(".tif"), values, nodata_tag=tif[name], **geo)
            return path.with_suffix(".tif").name
        path.write_text(asc_text(values, nodata=nodata, **geo))
        return path.name

    basic = {name: grid(name, folder / "basic" / f"{name}.asc", [[fn(r, c) for r, c in row] for row in cells])
             for name, fn in (("dem", dem), ("ddm", ddm), ("fam", fam))}
    for h in range(1, hours + 1):
        values = [[(rain(h, r, c) if rain else f"{(c + 1) * (1.0 if h <= 8 else 0.0):.1f}") for r, c in row]
                  for row in cells]
        grid("rain", folder / "precip" / f"rain.202006{1 + h // 24:02d}{h % 24:02d}.asc", values, rain_nodata)
    if wm_grid is not None:
        tif.setdefault("wm", "-9999")
        grid("wm", folder / "basic" / "wm.tif", [[wm_grid(r, c) for r, c in row] for row in cells])
    ext = "tif" if "rain" in tif else "asc"
    for day in (1, 2, 3):
        (folder / "pet" / f"PET.202006{day:02d}.asc").write_text(
            asc_text([[pet(r, c) for r, c in row] for row in cells], nodata=pet_nodata, **geo))
    end_day, end_hour = 1 + hours // 24, hours % 24
    control = folder / "control.txt"
    control.write_text("\n".join([
        "[Basic]", f"DEM=basic/{basic['dem']}", f"DDM=basic/{basic['ddm']}", f"FAM=basic/{basic['fam']}",
        "PROJ=geographic", "ESRIDDM=true", "SELFFAM=false", "",
        "[PrecipForcing RAIN]", f"TYPE={ext.upper()}", "UNIT=mm/h", "FREQ=1h", "LOC=precip",
        f"NAME=rain.YYYYMMDDHH.{ext}", "",
        "[PETForcing PET]", "TYPE=ASC", "UNIT=mm/d", "FREQ=1d", "LOC=pet", "NAME=PET.YYYYMMDD.asc", "",
        "[Gauge outlet]", *gauge, "OUTPUTTS=TRUE", "",
        "[Basin B]", "GAUGE=outlet", "",
        "[CrestParamSet CP]", "GAUGE=outlet", "WM=100.0 B=0.5 IM=5.0 KE=0.8 FC=5.0 IWU=50.0",
        *(["WM_GRID=basic/wm.tif"] if wm_grid is not None else []), "",
        "[KWParamSet KP]", "GAUGE=outlet", "UNDER=0.5 LEAKI=0.1 TH=2 ISU=0.0 ALPHA=1.5 BETA=0.6 ALPHA0=1.0", "",
        "[Task RUN]", "STYLE=SIMU", "MODEL=CREST", "ROUTING=KW", "BASIN=B", "PRECIP=RAIN", "PET=PET",
        "OUTPUT=output", "PARAM_SET=CP", "ROUTING_PARAM_SET=KP", "TIMESTEP=1h", "TIME_BEGIN=202006010000",
        f"TIME_END=202006{end_day:02d}{end_hour:02d}00", "",
        "[Execute]", "TASK=RUN", ""]))
    return control


def below_midpoint(n: int) -> str:
    """A decimal just under the float32 midpoint below the whole number ``n`` (``1 <= n < 2**23``), close
    enough that its double *is* that midpoint: through the double it rounds (ties to even) to ``n``, read
    straight to float (``fscanf("%f")``, EF5) to the float below ``n``, which truncates to ``n - 1``."""
    below = float(np.nextafter(np.float32(n), np.float32(0)))
    mid = Decimal(below) + (Decimal(n) - Decimal(below)) / 2
    text = f"{mid - Decimal('1e-17'):.25f}".rstrip("0")
    assert float(text) == float(mid) and Decimal(text) < mid
    return text


def cell_centre(row: int, col: int, *, lat0: float = 35.0, lon0: float = -97.5,
                cellsize: float = 0.01) -> tuple[float, float]:
    """(lat, lon) of a cell's centre, rounded to 6 decimals (as a user would write it)."""
    lat = lat0 + (NROWS - row - 0.5) * cellsize
    lon = lon0 + (col + 0.5) * cellsize
    return float(np.round(lat, 6)), float(np.round(lon, 6))


def _dem_with_midpoints(r: int, c: int) -> object:
    """Whole metres on even rows, a decimal just under the float midpoint below the next whole metre on odd
    rows: EF5 truncates those to one metre less than a reader that rounds through double does."""
    return (20, below_midpoint(17), 14, below_midpoint(11), 8, below_midpoint(5))[r]


# name -> ([Gauge] lines, write_tiny_case keywords, the cell (row, col) EF5 1.2.3 placed the gauge in, as its
# log says: "Gauge outlet (lat, lon; row, col): FAM n"). BASINAREA values are whole multiples of a cell's area
# (0.01 degrees at 35.025 N: 1.00124 km2; 0.1 degrees at 60.25 N: 60.6705 km2), chosen to hit each rule.
CASES: dict[str, tuple[list[str], dict, tuple[int, int]]] = {
    # every cell of row 3 has FAM 3 = the target: EF5 keeps the gauge's own cell (a tie never moves it)
    "basinarea-ties": (["LAT=35.025", "LON=-97.475", "BASINAREA=3.0037"], {}, (3, 2)),
    # CELLX/CELLY gauges are searched too: FAM 5 first found at distance 2 to the south-east
    "basinarea-cellxy": (["CELLX=2", "CELLY=3", "BASINAREA=5.0062"], {}, (5, 4)),
    # FAM r + 10 c; the best cell (3, 0) lies west in column 0, which EF5's "testX > 0" never reaches
    "basinarea-column0": (["LAT=35.025", "LON=-97.485", "BASINAREA=3.0037"], {"fam": lambda r, c: r + 10 * c},
                          (1, 1)),
    # target 22.49 cells at the gauge's LAT (60.25 N, the cell centre): FAM 22 to the north wins; the
    # area at the cell's north edge (60.3 N) would make it 22.52 and keep FAM 23 (rain grows southwards, so
    # the printed basin-average precipitation shows which cell is the outlet)
    "basinarea-latitude": (["LAT=60.25", "LON=10.25", "BASINAREA=1364.48"],
                           {"lat0": 60.0, "lon0": 10.0, "cellsize": 0.1, "fam": lambda r, c: r + 10 * c,
                            "rain": lambda h, r, c: f"{(r + 1) * (1.0 if h <= 8 else 0.0):.1f}"}, (2, 2)),
    # DEM values whose double is a float midpoint (item: ASCII values are read straight to float)
    "asc-float-midpoints": (["CELLX=2", "CELLY=5"], {"dem": _dem_with_midpoints}, (5, 2)),
    # NODATA_value 9999.0001 is 9999 as a float: EF5 reads the rain cells holding 9999 as nodata
    "asc-nodata-as-float": (["CELLX=2", "CELLY=5"], {
        "rain_nodata": "9999.0001",
        "rain": lambda h, r, c: "9999" if (r < 3 and 2 <= h <= 4) else f"{(c + 1) * (1.0 if h <= 8 else 0.0):.1f}"},
        (5, 2)),
    # PET NODATA_value 9999 in two basin cells: EF5 has no nodata test for PET and uses 9999 mm/d there
    "pet-positive-nodata": (["CELLX=2", "CELLY=5"], {"pet_nodata": "9999",
                                                     "pet": lambda r, c: "9999" if r in (1, 2) else "4.0"}, (5, 2)),
    # negative PET and a negative PET nodata read 0, as in EF5 (agreement pinned)
    "pet-negative": (["CELLX=2", "CELLY=5"], {"pet": lambda r, c: ("-9999", "-3.5", "4.0")[min(r, 2)]}, (5, 2)),
}


def write_named_case(name: str, folder: Path) -> Path:
    gauge, kwargs, _ = CASES[name]
    return write_tiny_case(folder, gauge, **kwargs)


def _dem_below(row: int, value: object) -> Callable[[int, int], object]:
    return lambda r, c: value if (r, c) == (row, 2) else 100 - 3 * r


_TAGLESS_BASIC = {"dem": None, "ddm": None, "fam": None}

# GeoTIFF nodata as EF5 reads it (TifGrid.cpp:134-139): name -> ([Gauge] lines, write_tiny_case keywords, the
# gauge's cell). EF5 1.2.3 ran each one; its ts.outlet.crest.csv is recorded.
TIF_CASES: dict[str, tuple[list[str], dict, tuple[int, int]]] = {
    # no GDAL_NODATA tag anywhere: -9999 in column 0 of the DEM and FAM (off the basin) and in rain cells of the
    # basin: to EF5 data, unused or read as 0 rain (value > 0 fails): agreement pinned
    "tif-untagged-off-basin": (["CELLX=2", "CELLY=5"], {
        "tif": {**_TAGLESS_BASIC, "rain": None},
        "dem": lambda r, c: -9999 if c == 0 else 100 - 3 * r, "fam": lambda r, c: -9999 if c == 0 else r,
        "rain": lambda h, r, c: "-9999" if (r < 3 and 2 <= h <= 4) else f"{(c + 1) * (1.0 if h <= 8 else 0.0):.1f}"},
        (5, 2)),
    # tag "-9999.1" is float -9999.0996 to EF5 and so are the DDM cells of column 0: nodata (a float comparison),
    # skipped by EF5's direction check; compared as doubles they were a bad direction code
    "tif-tag-as-float": (["CELLX=2", "CELLY=5"], {"tif": {"ddm": "-9999.1"},
                                                  "ddm": lambda r, c: "-9999.1" if c == 0 else 4}, (5, 2)),
}

# Cases our engine refuses: name -> ([Gauge] lines, keywords, a regex of our InputError, what EF5 1.2.3 did: "ran"
# (a tag-less grid's -9999 cell taken as data, silently) or the line it refused the case with).
TIF_REFUSED: dict[str, tuple[list[str], dict, str, str]] = {
    # tag "none": atof gives 0, so the DEM 0 under the gauge is nodata to EF5, which gives the gauge FAM -9999
    # (its log: "Gauge outlet (...; 5, 2): FAM -9999") and aborts sizing its node array
    "tif-tag-not-a-number": (["CELLX=2", "CELLY=5"], {"tif": {"dem": "none"}, "dem": _dem_below(5, 0)},
                             r"gauge 'outlet' \(col 2, row 5\) lies in a nodata cell", "std::length_error"),
    "tif-untagged-ddm": (["CELLX=2", "CELLY=5"],
                         {"tif": _TAGLESS_BASIC, "ddm": lambda r, c: -9999 if r == c == 0 else 4},
                         r"ddm\.tif: the DDM cell at row 0, col 0 holds -9999", "Bad DDM value -9999 at (0, 0)"),
    "tif-untagged-dem-in-basin": (["CELLX=2", "CELLY=5"], {"tif": _TAGLESS_BASIC, "dem": _dem_below(0, -9999)},
                                  r"dem\.tif: the DEM cell at row 0, col 2 holds -9999", "ran"),
    "tif-untagged-dem-below-outlet": (["CELLX=2", "CELLY=4"], {"tif": _TAGLESS_BASIC, "dem": _dem_below(5, -9999)},
                                      r"dem\.tif: the DEM cell at row 5, col 2 holds -9999", "ran"),
    "tif-untagged-fam-in-basin": (["CELLX=2", "CELLY=5"], {"tif": _TAGLESS_BASIC,
                                                           "fam": lambda r, c: -9999 if (r, c) == (2, 2) else r},
                                  r"fam\.tif: the FAM cell at row 2, col 2 holds -9999", "ran"),
    "tif-untagged-wm": (["CELLX=2", "CELLY=5"], {"tif": {"wm": None},
                                                 "wm_grid": lambda r, c: -9999 if (r, c) == (1, 2) else 1.0},
                        r"wm\.tif: the WM parameter cell at row 1, col 2 holds -9999", "ran"),
}


def write_tif_case(name: str, folder: Path) -> Path:
    gauge, kwargs = (TIF_CASES[name][:2] if name in TIF_CASES else TIF_REFUSED[name][:2])
    return write_tiny_case(folder, gauge, **kwargs)


def gauge_cell(sim: EmbeddedSimulator) -> tuple[int, int]:
    """(row, col) of the first gauge's cell in the simulator's network."""
    node = int(sim.net.gauge_nodes[0])
    return int(sim.net.rows[node]), int(sim.net.cols[node])


def check_against_fresh_ef5(control: Path, name: str, tmp_path: Path) -> None:
    """Run the real EF5 binary (``$HYDROAGENT_EF5``) and our engine on ``control`` and assert that every printed
    column agrees within EF5's print precision; skips when no binary is configured."""
    import os

    import pytest

    from hydroagent_hpc.bench.differential import compare_control

    if not os.environ.get("HYDROAGENT_EF5"):
        pytest.skip("HYDROAGENT_EF5 is not set: no real EF5 binary (build one with ../shared/scripts/build-ef5.sh)")
    work = tmp_path / "ef5-runs"
    work.mkdir()
    result = compare_control(control, name, work)
    assert result.ok, f"{name}: " + "; ".join(result.failures)
