"""Clip CONUS rasters (MRMS hourly QPE, daily PET, a-priori parameter grids) to a basin.

The paper's gauges are built from CONUS-wide GeoTIFFs; a basin needs only the cells around it.
:func:`clip_grid` cuts the window of whole source cells that covers a bounding box, so values
are never resampled and the georeferencing stays exact:

* columns ``floor((west - xll)/cs) .. ceil((east - xll)/cs) - 1`` and rows
  ``floor((top - north)/cs) .. ceil((top - south)/cs) - 1`` (row 0 is north, as in
  :mod:`hydroagent_hpc.sim.grids`), widened by ``pad_cells`` and clamped to the grid, with a
  tolerance of 1e-9 cell for edges that fall on a cell boundary;
* the clip's lower-left corner is ``(xll + c0*cs, top - (r0 + nrows)*cs)``, cell size unchanged.

:func:`basin_bbox` gives the extent of a basin's DEM cells that hold data (the basin, not the
rectangle around it); :func:`mask_to_basin` sets clipped cells whose centre falls outside the
basin's cells to nodata (optional: EF5 samples forcing at DEM cell corners, so a forcing clip
should keep a margin rather than be masked). :func:`clip_file` reads a GeoTIFF or ESRI ASCII
grid with :func:`~hydroagent_hpc.sim.grids.read_grid` and writes the clip in the same format
(``.asc`` ASCII, else float32 GeoTIFF), optionally scaling units (e.g. MRMS mm/h as is, or a
PET product in 0.01 mm/day to mm/day with ``scale=0.01``); :func:`clip_series` does a folder.
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np

from hydroagent_hpc.sim.controlfile import parse_control
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import UNTAGGED_SENTINEL, Grid, read_grid, write_asc, write_tif

log = logging.getLogger(__name__)

__all__ = ["clip_grid", "basin_bbox", "mask_to_basin", "clip_file", "clip_series"]

_EPS = 1e-9


def _check_bbox(bbox) -> tuple[float, float, float, float]:
    try:
        west, south, east, north = (float(v) for v in bbox)
    except (TypeError, ValueError):
        raise ValueError(f"bbox {bbox!r}: give (west, south, east, north) in the grid's coordinates") from None
    if not (west < east and south < north) or not all(map(math.isfinite, (west, south, east, north))):
        raise ValueError(f"bbox {bbox!r}: needs west < east and south < north")
    return west, south, east, north


def clip_grid(grid: Grid, bbox, pad_cells: int = 0) -> Grid:
    """The window of whole cells of ``grid`` covering ``bbox`` = (west, south, east, north), plus a margin."""
    west, south, east, north = _check_bbox(bbox)
    cs = grid.cellsize
    c0 = math.floor((west - grid.xll) / cs + _EPS) - pad_cells
    c1 = math.ceil((east - grid.xll) / cs - _EPS) + pad_cells
    r0 = math.floor((grid.top - north) / cs + _EPS) - pad_cells
    r1 = math.ceil((grid.top - south) / cs - _EPS) + pad_cells
    c0, r0 = max(c0, 0), max(r0, 0)
    c1, r1 = min(c1, grid.ncols), min(r1, grid.nrows)
    if c1 <= c0 or r1 <= r0:
        raise InputError(f"{grid.path or 'grid'}: the box {bbox} does not overlap the grid "
                         f"({grid.xll}..{grid.right}, {grid.yll}..{grid.top})",
                         fix="check the basin's coordinates and that the raster covers it")
    data = grid.data[r0:r1, c0:c1].copy()
    top = grid.top - r0 * cs
    return Grid(data, grid.xll + c0 * cs, top - data.shape[0] * cs, cs, grid.nodata, grid.path)


def basin_bbox(basin_dir_or_control) -> tuple[float, float, float, float]:
    """(west, south, east, north) of the DEM cells holding data in a basin folder (or control file)."""
    p = Path(basin_dir_or_control)
    control = p / "control.txt" if p.is_dir() else p
    dem = read_grid(parse_control(control).basic.dem)
    rows, cols = np.nonzero(dem.valid())
    if rows.size == 0:
        raise InputError(f"{dem.path}: the DEM has no data cells", fix="check the basin's DEM")
    cs = dem.cellsize
    return (dem.xll + cols.min() * cs, dem.top - (rows.max() + 1) * cs, dem.xll + (cols.max() + 1) * cs,
            dem.top - rows.min() * cs)


def mask_to_basin(clipped: Grid, dem: Grid) -> Grid:
    """``clipped`` with nodata wherever a cell's centre is outside the DEM's data cells."""
    rr, cc = np.mgrid[0:clipped.nrows, 0:clipped.ncols]
    x = clipped.xll + (cc + 0.5) * clipped.cellsize
    y = clipped.top - (rr + 0.5) * clipped.cellsize
    c, r, inside = dem.locate(x, y)
    keep = inside & dem.valid()[r, c]
    return Grid(np.where(keep, clipped.data, clipped.nodata), clipped.xll, clipped.yll, clipped.cellsize,
                clipped.nodata, clipped.path)


def clip_file(src, dst, bbox, *, pad_cells: int = 1, mask: Grid | None = None, scale: float = 1.0) -> Grid:
    """Clip one raster file to ``bbox`` and write it (format from ``dst``'s suffix); returns the clip."""
    grid = read_grid(src)
    if not grid.has_nodata:
        # a GeoTIFF without a GDAL_NODATA tag has no nodata (EF5: NaN); the clip marks masked cells with -9999
        # and says so in its tag (the source's own -9999 cells then become nodata too)
        grid = Grid(grid.data, grid.xll, grid.yll, grid.cellsize, UNTAGGED_SENTINEL, grid.path)
    out = clip_grid(grid, bbox, pad_cells)
    if scale != 1.0:
        valid = out.valid()
        out = Grid(np.where(valid, out.data * scale, out.nodata), out.xll, out.yll, out.cellsize, out.nodata, out.path)
    if mask is not None:
        out = mask_to_basin(out, mask)
    d = Path(dst)
    d.parent.mkdir(parents=True, exist_ok=True)
    if d.suffix.lower() == ".asc":
        write_asc(d, out)
    else:
        write_tif(d, out, compress=True)
    return out


def clip_series(src_dir, pattern: str, dst_dir, bbox, *, pad_cells: int = 1, scale: float = 1.0,
                suffix: str | None = None) -> list[Path]:
    """Clip every ``src_dir/pattern`` file (e.g. ``GaugeCorr_QPE_01H_*.tif``) into ``dst_dir``, same names."""
    files = sorted(Path(src_dir).glob(pattern))
    if not files:
        raise InputError(f"no files match {pattern} in {src_dir}", fix="check the folder and the pattern")
    out = []
    for f in files:
        target = Path(dst_dir) / (f.stem + suffix if suffix else f.name)
        clip_file(f, target, bbox, pad_cells=pad_cells, scale=scale)
        out.append(target)
    log.info("clipped %d files from %s into %s", len(out), src_dir, dst_dir)
    return out
