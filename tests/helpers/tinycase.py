"""A hand-made EF5 case small enough to reason about cell by cell (``tests/test_ef5_input_reading.py``).

Every column is its own stream flowing south (ESRI direction 4) off the bottom row; the grids are
ESRI ASCII written from the exact text given, so a test controls every digit EF5 and our engine
parse. Rain differs per column (``col + 1`` mm/h for the first hours), so an outlet moved to another
column or row changes the printed discharge.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from decimal import Decimal
from pathlib import Path

import numpy as np

NROWS, NCOLS = 6, 5


def asc_text(rows: Sequence[Sequence[object]], *, xll: float, yll: float, cellsize: float,
             nodata: str = "-9999") -> str:
    """An ESRI ASCII grid from the values' exact text (``str`` of each item)."""
    head = (f"ncols {len(rows[0])}\nnrows {len(rows)}\nxllcorner {xll!r}\nyllcorner {yll!r}\n"
            f"cellsize {cellsize!r}\nNODATA_value {nodata}\n")
    return head + "".join(" ".join(str(v) for v in row) + "\n" for row in rows)


def write_tiny_case(folder: Path, gauge: Sequence[str], *, lat0: float = 35.0, lon0: float = -97.5,
                    cellsize: float = 0.01, fam: Callable[[int, int], object] = lambda r, c: r,
                    dem: Callable[[int, int], object] = lambda r, c: 100 - 3 * r,
                    pet: Callable[[int, int], object] = lambda r, c: "4.0", pet_nodata: str = "-9999",
                    rain: Callable[[int, int, int], object] | None = None, rain_nodata: str = "-9999",
                    hours: int = 36) -> Path:
    """Write the case into ``folder`` (``gauge``: the ``[Gauge outlet]`` lines) and return its control file."""
    folder.mkdir(parents=True, exist_ok=True)
    geo = {"xll": lon0, "yll": lat0, "cellsize": cellsize}
    for sub in ("basic", "precip", "pet", "output"):
        (folder / sub).mkdir(exist_ok=True)
    cells = [[(r, c) for c in range(NCOLS)] for r in range(NROWS)]
    (folder / "basic" / "dem.asc").write_text(asc_text([[dem(r, c) for r, c in row] for row in cells], **geo))
    (folder / "basic" / "ddm.asc").write_text(asc_text([[4] * NCOLS for _ in cells], **geo))
    (folder / "basic" / "fam.asc").write_text(asc_text([[fam(r, c) for r, c in row] for row in cells], **geo))
    for h in range(1, hours + 1):
        values = [[(rain(h, r, c) if rain else f"{(c + 1) * (1.0 if h <= 8 else 0.0):.1f}") for r, c in row]
                  for row in cells]
        (folder / "precip" / f"rain.202006{1 + h // 24:02d}{h % 24:02d}.asc").write_text(
            asc_text(values, nodata=rain_nodata, **geo))
    for day in (1, 2, 3):
        (folder / "pet" / f"PET.202006{day:02d}.asc").write_text(
            asc_text([[pet(r, c) for r, c in row] for row in cells], nodata=pet_nodata, **geo))
    end_day, end_hour = 1 + hours // 24, hours % 24
    control = folder / "control.txt"
    control.write_text("\n".join([
        "[Basic]", "DEM=basic/dem.asc", "DDM=basic/ddm.asc", "FAM=basic/fam.asc", "PROJ=geographic",
        "ESRIDDM=true", "SELFFAM=false", "",
        "[PrecipForcing RAIN]", "TYPE=ASC", "UNIT=mm/h", "FREQ=1h", "LOC=precip", "NAME=rain.YYYYMMDDHH.asc", "",
        "[PETForcing PET]", "TYPE=ASC", "UNIT=mm/d", "FREQ=1d", "LOC=pet", "NAME=PET.YYYYMMDD.asc", "",
        "[Gauge outlet]", *gauge, "OUTPUTTS=TRUE", "",
        "[Basin B]", "GAUGE=outlet", "",
        "[CrestParamSet CP]", "GAUGE=outlet", "WM=100.0 B=0.5 IM=5.0 KE=0.8 FC=5.0 IWU=50.0", "",
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
