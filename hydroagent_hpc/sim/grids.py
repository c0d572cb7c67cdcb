"""Raster grids as EF5 reads and writes them: ESRI ASCII and single-band float32 GeoTIFF.

EF5 facts this module follows (see ``docs/ef5-crest-spec.md`` section 5):

* ESRI ASCII: six header lines in a fixed order (ncols, nrows, xllcorner, yllcorner, cellsize,
  NODATA_value); the keyword text is not checked by EF5, only the order. Only corner-referenced
  headers exist in EF5; we also accept ``xllcenter``/``yllcenter`` and convert them, but say so.
  EF5 reads the NODATA_value and every value with ``fscanf("%f")``: each decimal is rounded once,
  straight to float32, here too (held in float64), so values and nodata compare as EF5's floats.
* GeoTIFF: one band, float32, striped; georeferencing from ModelPixelScale + ModelTiepoint;
  nodata from the ``GDAL_NODATA`` tag, read as EF5 reads it (``TifGrid.cpp:134-139``): the tag's text
  through C ``atof`` (the longest number at its start, 0 when there is none), rounded to float32; a
  TIFF without the tag has nodata NaN, which no cell equals: to EF5 a -9999 cell is then data. Cells
  are compared with nodata as floats (EF5's ``float == float``), see :meth:`Grid.valid`.
  Deliberate difference: where EF5 would use such a -9999 cell of a tag-less grid as a value (an
  elevation, flow accumulation, parameter or temperature in the basin), the engine refuses the run
  and names the file, the cell and the fix (:func:`untagged_sentinel_error`).
* Row 0 is the northern edge. A point (lon, lat) falls in column ``int((lon - left) / cellsize)``
  and row ``int((top - lat) / cellsize)``, with EF5's float/double roundings, clamped to the grid.
* Two grids are "co-registered" for EF5 when nrows and ncols agree, whatever their extents.
"""

from __future__ import annotations

import logging
import math
import re
from dataclasses import dataclass
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.limits import current_limits

log = logging.getLogger(__name__)

__all__ = ["Grid", "UNTAGGED_SENTINEL", "read_grid", "read_asc", "read_tif", "untagged_sentinel_error", "write_asc",
           "write_tif"]

_ASC_KEYS = ("ncols", "nrows", "xllcorner", "yllcorner", "cellsize", "nodata_value")

# GeoTIFF tag codes.
_TAG_PIXEL_SCALE = 33550
_TAG_TIEPOINT = 33922
_TAG_GEOKEYS = 34735
_TAG_GDAL_NODATA = 42113


@dataclass
class Grid:
    """A north-up raster. ``data[0]`` is the northern row; nodata cells hold ``nodata``."""

    data: np.ndarray
    xll: float
    yll: float
    cellsize: float
    nodata: float = -9999.0
    path: str = ""

    @property
    def nrows(self) -> int:
        return int(self.data.shape[0])

    @property
    def ncols(self) -> int:
        return int(self.data.shape[1])

    @property
    def top(self) -> float:
        return self.yll + self.nrows * self.cellsize

    @property
    def right(self) -> float:
        return self.xll + self.ncols * self.cellsize

    def valid(self) -> np.ndarray:
        """Boolean mask of cells that are not nodata and are finite.

        Compared as float32, as EF5 compares a ``float`` cell with its ``float noData`` (a GeoTIFF tag
        "-9999.1" and a cell holding float32(-9999.1) are equal there, not as doubles). A NaN nodata (a
        GeoTIFF without a ``GDAL_NODATA`` tag) equals no cell.
        """
        with np.errstate(over="ignore", invalid="ignore"):
            return np.isfinite(self.data) & (self.data.astype(np.float32) != np.float32(self.nodata))

    @property
    def has_nodata(self) -> bool:
        """False when the grid has no nodata value (NaN: a GeoTIFF without, or with a NaN, ``GDAL_NODATA`` tag)."""
        return not math.isnan(self.nodata)

    def untagged_sentinels(self) -> np.ndarray:
        """Cells holding -9999 in a grid with no nodata value: data to EF5, almost surely meant as nodata."""
        if self.has_nodata:
            return np.zeros(self.data.shape, dtype=bool)
        return self.data == UNTAGGED_SENTINEL

    def same_shape(self, other: Grid) -> bool:
        """EF5's ``IsSpatialMatch``: only nrows and ncols are compared."""
        return self.data.shape == other.data.shape

    def locate(self, lon, lat):
        """Column, row and an in-extent flag of points, as EF5's ``GetGridLoc`` (``Grid.h``) computes them.

        EF5 keeps the extent and cell size in double and the point in float: ``float xDiff = lon -
        left`` (a double difference rounded to float), ``float xLoc = xDiff / cellSize`` (double
        division rounded to float), then truncation; the in-extent test compares in double. The
        same roundings here put points on a cell boundary in the same cell as EF5 does.
        """
        lon32 = np.asarray(lon, dtype=np.float32)
        lat32 = np.asarray(lat, dtype=np.float32)
        cs = float(self.cellsize)
        x_diff = (lon32.astype(np.float64) - self.xll).astype(np.float32)
        y_diff = (self.top - lat32.astype(np.float64)).astype(np.float32)
        col = (x_diff.astype(np.float64) / cs).astype(np.float32).astype(np.int64)
        row = (y_diff.astype(np.float64) / cs).astype(np.float32).astype(np.int64)
        lon64, lat64 = lon32.astype(np.float64), lat32.astype(np.float64)
        inside = (lon64 >= self.xll) & (lon64 <= self.right) & (lat64 >= self.yll) & (lat64 <= self.top)
        return np.clip(col, 0, self.ncols - 1), np.clip(row, 0, self.nrows - 1), inside

    def cell_corners(self, cols: np.ndarray, rows: np.ndarray):
        """Upper-left corners (EF5's ``GetRefLoc``) of the given cells: ``(float)x * cellSize + left`` in
        double, stored as float32."""
        cs = float(self.cellsize)
        x = (np.asarray(cols).astype(np.float32).astype(np.float64) * cs + self.xll).astype(np.float32)
        y = (self.top - np.asarray(rows).astype(np.float32).astype(np.float64) * cs).astype(np.float32)
        return x, y


UNTAGGED_SENTINEL = -9999.0  # the nodata value a tag-less GeoTIFF most likely meant


def untagged_sentinel_error(grid: Grid, row: int, col: int, field: str, use: str) -> InputError:
    """The error for a -9999 cell of a grid without nodata that EF5 would use as ``use`` (deliberate)."""
    return InputError(
        f"{grid.path}: the {field} cell at row {row}, col {col} holds -9999 but the grid has no nodata value "
        f"(a GeoTIFF without a GDAL_NODATA tag, or a NaN one); EF5 1.2.3 then takes -9999 as data and would use "
        f"it as {use}", fix=f"add a GDAL_NODATA tag (gdal_edit.py -a_nodata -9999 {grid.path}) or fill the cell")


def read_grid(path: str | Path) -> Grid:
    """Read a grid the way EF5 chooses the reader: ``.asc`` is ESRI ASCII, anything else GeoTIFF."""
    p = Path(path)
    if p.suffix.lower() == ".asc":
        return read_asc(p)
    return read_tif(p)


_NUMBER_RE = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
MIN_CELLSIZE = 1e-12  # any unit: smaller is a corrupt header (and underflows EF5's float32 lengths)
_ASC_ORDER = "ESRI ASCII headers are ncols, nrows, xllcorner, yllcorner, cellsize, NODATA_value in that order"


def _asc_header_value(p: Path, lineno: int, key: str, raw: bytes) -> float:
    """One header number, checked where it is read: a plain finite number, whole and >= 1 for sizes,
    ``>= MIN_CELLSIZE`` for the cell size."""
    text = raw.decode(errors="replace")
    where = f"{p}:{lineno}: {key}"
    if not _NUMBER_RE.match(text):
        raise InputError(f"{where} {text[:30]!r} is not a number", fix=f"write a plain decimal number ({_ASC_ORDER})")
    v = float(text)
    if not math.isfinite(v):
        raise InputError(f"{where} {text[:30]} is not finite (it overflows a double)", fix="write a finite number")
    if key in ("ncols", "nrows") and (v != int(v) or v < 1):
        raise InputError(f"{where} {text[:30]} is not a positive whole number of cells",
                         fix=f"give {key} as the grid's number of {'columns' if key == 'ncols' else 'rows'} (>= 1)")
    if key == "cellsize" and v < MIN_CELLSIZE:
        raise InputError(f"{where} {text[:30]} is not positive" if v <= 0 else f"{where} {text[:30]} is below "
                         f"{MIN_CELLSIZE:g}", fix="give the (positive) width of a square cell; rows run north to south "
                         "by the format, a negative size does not flip them")
    return v


def _bad_value(p: Path, body: bytes) -> InputError:
    """The first data token that is not a number, located by line (header lines are 1-6)."""
    for i, line in enumerate(body.split(b"\n"), start=7):
        for col, tok in enumerate(line.split(), start=1):
            try:
                float(tok)
            except ValueError:
                return InputError(f"{p}:{i}: value {col} of this line, {tok[:30].decode(errors='replace')!r}, "
                                  "is not a number", fix="write a number (use the NODATA_value for missing cells)")
    return InputError(f"{p}: the grid values cannot be read as numbers", fix="rewrite the grid")


def read_asc(path: str | Path) -> Grid:
    """Read an ESRI ASCII grid (six header lines, then nrows x ncols values).

    Every header number is checked on its line; the size is checked against
    :mod:`~hydroagent_hpc.sim.limits` before the values are parsed.
    """
    p = Path(path)
    try:
        text = p.read_bytes()
    except FileNotFoundError:
        raise InputError(f"grid file not found: {p}", fix="check the path in the control file") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise InputError(f"grid file cannot be read: {p} ({exc.strerror})",
                         fix="check the path in the control file") from None
    lines = text.split(b"\n", 6)
    if len(lines) < 7:
        raise InputError(f"{p}: an ESRI ASCII grid needs six header lines and data", fix="rewrite the grid")
    header: dict[str, float] = {}
    centre = False
    for lineno, (line, key) in enumerate(zip(lines[:6], _ASC_KEYS), start=1):
        parts = line.split()
        if len(parts) != 2:
            raise InputError(f"{p}:{lineno}: expected '{key} VALUE', got {line[:60]!r}", fix=_ASC_ORDER)
        word = parts[0].decode(errors="replace").lower()
        if word in ("xllcenter", "yllcenter"):
            centre = True
        header[key] = _asc_header_value(p, lineno, key, parts[1])
    ncols, nrows = int(header["ncols"]), int(header["nrows"])
    current_limits().check_cells(nrows, ncols, f"{p}:1-2 (ncols, nrows)")
    tokens = lines[6].split()
    try:
        values = np.array(tokens, dtype=np.float64)
    except ValueError:
        raise _bad_value(p, lines[6]) from None
    if values.size != ncols * nrows:
        raise InputError(f"{p}: header says {nrows} rows x {ncols} cols = {ncols * nrows} values, found {values.size}",
                         fix="make the data agree with ncols and nrows")
    cs = header["cellsize"]
    xll, yll = header["xllcorner"], header["yllcorner"]
    if centre:
        log.warning("%s: cell-centre header converted to corners (EF5 itself reads only corners)", p)
        xll -= cs / 2.0
        yll -= cs / 2.0
    values = _as_float32(values, tokens)
    nodata = float(_as_float32(np.array([header["nodata_value"]]), [lines[5].split()[1]])[0])
    return Grid(values.reshape(nrows, ncols), xll, yll, cs, nodata, str(p))


def _as_float32(values: np.ndarray, tokens: list[bytes]) -> np.ndarray:
    """The decimal ``tokens`` rounded straight to float32, as EF5's ``fscanf("%f")`` does (``AscGrid.cpp``,
    ``ReadFloatAscGrid``: the NODATA_value and every value), held in float64.

    ``values`` are the tokens as doubles (correctly rounded). Rounding those to float32 is a second
    rounding, and differs from rounding the decimal once exactly when the double falls on a float32
    midpoint while the decimal does not (``1.9999999403953552`` is 2 - 2**-24 + 2.5e-17 as a double
    midpoint: float32 2.0 through the double, 1.9999999 from ``fscanf``; EF5 then truncates the DEM to
    1 m, not 2 m). Those few values are decided again from the exact decimal.
    """
    with np.errstate(over="ignore"):  # beyond float32's range: inf, as fscanf gives
        f32 = values.astype(np.float32)
    exact = f32.astype(np.float64) == values
    if exact.all():
        return f32.astype(np.float64)
    with np.errstate(over="ignore", invalid="ignore"):
        other = np.nextafter(f32, np.where(values > f32, np.float32(np.inf), np.float32(-np.inf)))
        mid = (f32.astype(np.float64) + other.astype(np.float64)) / 2.0
    for i in np.nonzero(~exact & (mid == values))[0]:
        try:
            dec = Fraction(Decimal(tokens[i].decode()))
        except (ArithmeticError, ValueError):
            continue
        if dec != Fraction(float(values[i])):  # off the midpoint: the side of the decimal, not ties-to-even
            f32[i] = max(f32[i], other[i]) if dec > Fraction(float(values[i])) else min(f32[i], other[i])
    return f32.astype(np.float64)


def _tag_numbers(p: Path, name: str, value: object, need: int) -> tuple[float, ...]:
    nums: tuple[float, ...] = ()
    if isinstance(value, (tuple, list)):
        try:
            nums = tuple(float(v) for v in value)
        except (TypeError, ValueError):
            nums = ()
    if len(nums) < need:
        raise InputError(f"{p}: the GeoTIFF {name} tag holds {value!r}, not {need} numbers",
                         fix="write a georeferenced GeoTIFF (hydroagent_hpc.sim.grids.write_tif)")
    if not all(math.isfinite(v) for v in nums[:need]):
        raise InputError(f"{p}: the GeoTIFF {name} tag holds a non-finite value {nums[:need]}",
                         fix="write finite georeferencing (cell size and corner)")
    return nums


def read_tif(path: str | Path) -> Grid:
    """Read a single-band GeoTIFF with ModelPixelScale/ModelTiepoint georeferencing.

    The declared size (ImageLength x ImageWidth) is checked against
    :mod:`~hydroagent_hpc.sim.limits` before any pixel is read; anything the TIFF parser cannot
    make sense of is an :class:`InputError` naming the file.
    """
    import tifffile

    p = Path(path)
    if not p.exists():
        raise InputError(f"grid file not found: {p}", fix="check the path in the control file")
    convert = "EF5 reads every non-.asc grid as float32 GeoTIFF; convert it, or name an ASCII grid *.asc"
    try:
        with tifffile.TiffFile(p) as tf:
            if not len(tf.pages):
                raise InputError(f"{p}: the TIFF holds no image", fix=convert)
            page = tf.pages[0]
            if not isinstance(page, tifffile.TiffPage):
                raise InputError(f"{p}: the first image of the TIFF cannot be read", fix=convert)
            width, height = int(page.imagewidth), int(page.imagelength)
            if width < 1 or height < 1:
                raise InputError(f"{p}: the TIFF declares ImageWidth {width} x ImageLength {height}: an empty grid",
                                 fix="write a grid with at least one cell")
            current_limits().check_cells(height, width, f"{p} (ImageLength x ImageWidth)")
            if int(page.size) != height * width:
                raise InputError(f"{p}: expected one band, got an array of shape {page.shape}",
                                 fix="write a single-band grid")
            tags = page.tags
            scale = tags.get(_TAG_PIXEL_SCALE)
            tie = tags.get(_TAG_TIEPOINT)
            nd = tags.get(_TAG_GDAL_NODATA)
            scale = scale.value if scale is not None else None
            tie = tie.value if tie is not None else None
            nd = nd.value if nd is not None else None
            if scale is None or tie is None:
                raise InputError(f"{p}: GeoTIFF has no ModelPixelScale/ModelTiepoint tags",
                                 fix="write a georeferenced GeoTIFF")
            sx, sy = _tag_numbers(p, "ModelPixelScale", scale, 2)[:2]
            tie_n = _tag_numbers(p, "ModelTiepoint", tie, 5)
            data = page.asarray()
    except InputError:
        raise
    except MemoryError:
        raise InputError(f"{p}: not enough memory to read this GeoTIFF",
                         fix="check the file's size; it may be corrupt") from None
    except Exception as exc:
        raise InputError(f"{p}: not a readable GeoTIFF ({type(exc).__name__}: {str(exc)[:200]})", fix=convert) from None
    if data.ndim != 2:
        raise InputError(f"{p}: expected one band, got an array of shape {data.shape}", fix="write a single-band grid")
    if data.dtype.kind not in "fiub":
        raise InputError(f"{p}: pixel type {data.dtype} is not a real number", fix="write a float32 GeoTIFF")
    if min(sx, sy) < MIN_CELLSIZE:
        raise InputError(f"{p}: the ModelPixelScale tag gives a cell size of {sx} x {sy}, not positive",
                         fix="write a GeoTIFF with a positive cell size")
    if abs(sx - sy) > 1e-9 * max(abs(sx), 1.0):
        raise InputError(f"{p}: cells are not square ({sx} x {sy})", fix="resample to square cells")
    left, top = tie_n[3], tie_n[4]
    # EF5 (TifGrid.cpp:134-139): float noData = atof(tag), or quiet NaN without the tag
    nodata = float("nan") if nd is None else _atof_float32(p, nd)
    nrows = data.shape[0]
    return Grid(data.astype(np.float64), left, top - nrows * sx, sx, nodata, str(p))


# C strtod's accepted forms (atof is strtod without error reporting), after leading white space
_C_SPACE = " \t\n\v\f\r"
_ATOF_RE = re.compile(
    r"[+-]?(?:0[xX](?P<hex>(?:[0-9a-fA-F]+\.?[0-9a-fA-F]*|\.[0-9a-fA-F]+)(?:[pP][+-]?\d+)?)"
    r"|(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan(?:\([0-9A-Za-z_]*\))?)", re.IGNORECASE)


def _atof(text: str) -> float:
    """C ``atof``: the longest number at the start of ``text`` (after white space); 0.0 when there is none."""
    body = text.lstrip(_C_SPACE)
    m = _ATOF_RE.match(body)
    if not m:
        return 0.0
    num = m.group(0)
    if m.group("hex") is not None:
        sign = -1.0 if num.startswith("-") else 1.0
        mant = m.group("hex")
        return sign * float.fromhex("0x" + (mant if "p" in mant.lower() else mant + "p0"))
    return float(num.lower().split("(")[0])


def _atof_float32(p: Path, tag: object) -> float:
    """The ``GDAL_NODATA`` tag as EF5 stores it: ``atof`` of the text, rounded to float32."""
    text = tag.decode("latin-1") if isinstance(tag, bytes) else str(tag)
    text = text.split("\x00", 1)[0]
    with np.errstate(over="ignore"):
        value = float(np.float32(_atof(text)))
    body = text.strip(_C_SPACE)
    m = _ATOF_RE.match(body)
    if m is None or m.end() != len(body):
        log.warning("%s: the GDAL_NODATA tag %r is not a number; EF5 reads it with atof as %r, and so does this "
                    "engine", p, text, value)
    return value


def write_asc(path: str | Path, grid: Grid, fmt: str = "%.6g") -> None:
    """Write an ESRI ASCII grid with a corner-referenced header (what EF5 reads)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = np.where(np.isfinite(grid.data), grid.data, grid.nodata)
    header = (f"ncols {grid.ncols}\nnrows {grid.nrows}\nxllcorner {float(grid.xll)!r}\nyllcorner {float(grid.yll)!r}\n"
              f"cellsize {float(grid.cellsize)!r}\nNODATA_value {float(grid.nodata):g}\n")
    tmp = p.with_name(p.name + ".part")
    with open(tmp, "w") as fh:
        fh.write(header)
        np.savetxt(fh, data, fmt=fmt, delimiter=" ")
    tmp.replace(p)


def _nodata_text(nodata: float) -> str:
    """Nine significant digits: every float32 reads back exactly (-9999 stays "-9999")."""
    with np.errstate(over="ignore"):
        return f"{float(np.float32(nodata)):.9g}"


def write_tif(path: str | Path, grid: Grid, compress: bool = False) -> None:
    """Write a striped single-band float32 GeoTIFF in geographic WGS84 coordinates."""
    import tifffile

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    data = np.where(np.isfinite(grid.data), grid.data, grid.nodata).astype(np.float32)
    geokeys = (1, 1, 0, 3, 1024, 0, 1, 2, 1025, 0, 1, 1, 2048, 0, 1, 4326)
    extratags = [
        (_TAG_PIXEL_SCALE, "d", 3, (float(grid.cellsize), float(grid.cellsize), 0.0), True),
        (_TAG_TIEPOINT, "d", 6, (0.0, 0.0, 0.0, float(grid.xll), float(grid.top), 0.0), True),
        (_TAG_GEOKEYS, "H", len(geokeys), geokeys, True),
        # the exact float32 nodata, so that EF5's atof-to-float gives back the value the cells hold
        (_TAG_GDAL_NODATA, "s", 0, _nodata_text(grid.nodata), True),
    ]
    tmp = p.with_name(p.name + ".part")
    tifffile.imwrite(tmp, data, photometric="minisblack", extratags=extratags,
                     compression="deflate" if compress else None, metadata=None)
    tmp.replace(p)
