"""Synthetic terrain for twin basins: a DEM, D8 flow directions and flow accumulation.

The DEM is a valley that falls towards the middle of the southern edge (a regional gradient, a
meandering valley axis with side slopes) plus multi-scale smooth noise, on a grid about twice the
requested basin. Depressions are filled and D8 directions derived with pyflwdir's
``fill_depressions`` (priority flood, Wang and Liu 2006; every edge cell may drain off the grid;
each cell drains to the neighbour the flood reached it from, so flats drain too); accumulation is
pyflwdir's ``accuflux``. The gauge is the cell whose upstream cell count is closest to the
requested area; up to eight DEMs are drawn until one is within 6 %. The grid is then cropped to
the basin's bounding box plus one cell.

Outputs follow EF5's conventions: row 0 is north, ESRI D8 codes (1 = E, 2 = SE, 4 = S, ...,
128 = NE), FAM counts upstream cells *excluding* the cell itself (``SELFFAM=false``), nodata
(-9999) outside the basin except the cell the gauge drains into, which keeps its values so that
the gauge's slope is a real drop.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np
import pyflwdir
from scipy.ndimage import gaussian_filter

log = logging.getLogger(__name__)

__all__ = ["TerrainStyle", "TERRAIN_STYLES", "Terrain", "make_terrain", "cell_km", "smooth_field", "NODATA"]

NODATA = -9999.0
_KM_PER_DEGREE = 110.574  # EF5's metres per degree of latitude, in km
# ESRI code -> (drow, dcol); pyflwdir uses the same codes (0 = pit, 247 = nodata, 255 = missing).
_D8 = {1: (0, 1), 2: (1, 1), 4: (1, 0), 8: (1, -1), 16: (0, -1), 32: (-1, -1), 64: (-1, 0), 128: (-1, 1)}


@dataclass(frozen=True)
class TerrainStyle:
    """Relief of a terrain type: down-valley gradient, valley side slopes, roughness."""

    gradient_m_per_km: float  # fall of the valley floor towards the outlet
    side_ratio: float  # side-slope gradient as a fraction of the valley gradient
    roughness: float  # amplitude of the noise relative to the valley's total fall
    base_m: float  # elevation of the outlet


TERRAIN_STYLES = {
    "plains": TerrainStyle(1.0, 0.3, 0.06, 380.0),
    "piedmont": TerrainStyle(2.5, 0.35, 0.07, 180.0),
    "hills": TerrainStyle(4.0, 0.35, 0.06, 20.0),
    "mountains": TerrainStyle(6.0, 0.5, 0.08, 1100.0),
}


@dataclass(frozen=True)
class Terrain:
    """A basin on a cropped, north-up grid (row 0 = north)."""

    dem: np.ndarray  # filled elevation (m) everywhere on the crop (for parameter grids, storms)
    ddm: np.ndarray  # ESRI D8 codes, -9999 outside the basin
    fam: np.ndarray  # upstream cells excluding self, -9999 outside the basin
    basin: np.ndarray  # bool, cells draining to the gauge (gauge included)
    gauge: tuple[int, int]  # (row, col) of the outlet cell
    xll: float
    yll: float
    cellsize: float
    target_cells: float  # requested area in cells

    @property
    def cells(self) -> int:
        return int(self.basin.sum())

    @property
    def shape(self) -> tuple[int, int]:
        return self.dem.shape

    @property
    def top(self) -> float:
        return self.yll + self.dem.shape[0] * self.cellsize

    def masked_dem(self) -> np.ndarray:
        """The DEM with nodata outside the basin (except the cell below the gauge)."""
        return np.where(self.ddm != NODATA, self.dem, NODATA)

    def slope(self) -> np.ndarray:
        """Local terrain slope (m/m) from the filled DEM, central differences."""
        lat = self.yll + self.dem.shape[0] * self.cellsize / 2.0
        dy, dx = cell_km(self.cellsize, lat)
        gy, gx = np.gradient(self.dem, dy * 1000.0, dx * 1000.0)
        return np.hypot(gx, gy)


def cell_km(cellsize_deg: float, lat: float) -> tuple[float, float]:
    """North-south and east-west size of a cell in km (EF5's 110 574 m per degree)."""
    dy = cellsize_deg * _KM_PER_DEGREE
    return dy, dy * math.cos(math.radians(lat))


def smooth_field(rng: np.random.Generator, shape: tuple[int, int], scale_cells: float) -> np.ndarray:
    """Zero-mean, unit-variance Gaussian random field with correlation length ``scale_cells``."""
    pad = int(3 * scale_cells) + 2
    noise = rng.standard_normal((shape[0] + 2 * pad, shape[1] + 2 * pad))
    f = gaussian_filter(noise, sigma=max(scale_cells, 0.5), mode="wrap")[pad:pad + shape[0], pad:pad + shape[1]]
    f = f - f.mean()
    return f / (f.std() + 1e-12)


def _fractal(rng: np.random.Generator, shape: tuple[int, int], scale_cells: float, octaves: int = 4) -> np.ndarray:
    out = np.zeros(shape)
    amp, total = 1.0, 0.0
    for k in range(octaves):
        s = scale_cells / 2 ** k
        if s < 0.7:
            break
        out += amp * smooth_field(rng, shape, s)
        total += amp ** 2
        amp *= 0.7
    return out / math.sqrt(total)


def _raw_dem(rng, nrows, ncols, dy, dx, style: TerrainStyle) -> np.ndarray:
    """Valley surface falling to the middle of the southern edge, plus noise (m)."""
    rr, cc = np.mgrid[0:nrows, 0:ncols]
    y = (nrows - 1 - rr + 0.5) * dy  # km north of the southern edge
    x = (cc + 0.5) * dx
    width, length = ncols * dx, nrows * dy
    meander = 0.12 * width * smooth_field(rng, (nrows, 1), max(nrows / 4.0, 1.0))
    meander -= meander[-1, 0]  # the axis reaches the outlet at the middle of the southern edge
    axis = width / 2.0 + meander * np.clip(y / (0.2 * length), 0.0, 1.0)
    g = style.gradient_m_per_km
    z = g * y + g * style.side_ratio * np.abs(x - axis)
    fall = g * length
    z += style.roughness * fall * _fractal(rng, (nrows, ncols), max(min(nrows, ncols) / 8.0, 1.0), octaves=5)
    return style.base_m + z - z.min()


def make_terrain(rng: np.random.Generator, *, area_km2: float, cellsize_deg: float, lat: float, lon: float,
                 style: TerrainStyle, tolerance: float = 0.06, attempts: int = 8) -> Terrain:
    """Draw DEMs until one holds a basin within ``tolerance`` of ``area_km2`` (best of ``attempts``).

    The gauge cell's centre is placed at (``lat``, ``lon``) to within half a cell.
    """
    dy, dx = cell_km(cellsize_deg, lat)
    target = area_km2 / (dy * dx)
    best = None
    grow = 2.2
    for attempt in range(attempts):
        length = math.sqrt(grow * area_km2 * 1.3)
        nrows = max(6, int(round(length / dy)))
        ncols = max(6, int(round(grow * area_km2 / length / dx)))
        raw = _raw_dem(rng, nrows, ncols, dy, dx, style)
        filled, d8 = pyflwdir.dem.fill_depressions(raw.astype(np.float64), outlets="edge", nodata=NODATA)
        flw = pyflwdir.from_array(d8, ftype="d8", check_ftype=False)
        upa = flw.accuflux(np.ones(d8.shape, dtype=np.float64))
        # Candidate gauges drain to a cell inside the grid (never an edge pit).
        ok = np.isin(d8, list(_D8))
        rr, cc = np.mgrid[0:nrows, 0:ncols]
        dr = np.zeros_like(rr)
        dc = np.zeros_like(cc)
        for code, (a, b) in _D8.items():
            dr[d8 == code], dc[d8 == code] = a, b
        ok &= (rr + dr >= 0) & (rr + dr < nrows) & (cc + dc >= 0) & (cc + dc < ncols)
        err = np.where(ok, np.abs(upa / target - 1.0), np.inf)
        k = int(np.argmin(err))
        e = float(err.flat[k])
        if best is None or e < best[0]:
            best = (e, filled, d8, flw, upa, k)
        log.debug("terrain attempt %d: %dx%d grid, best basin %.0f cells for %.0f wanted (%.1f%%)",
                  attempt, nrows, ncols, upa.flat[k], target, 100 * e)
        if e <= tolerance:
            break
        if upa[ok].max() < target:
            grow *= 1.25
    assert best is not None  # the loop ran at least once
    e, filled, d8, flw, upa, k = best
    basin = flw.basins(idxs=np.array([k])) > 0
    r0, c0 = divmod(k, d8.shape[1])
    code = int(d8.flat[k])
    below = (r0 + _D8[code][0], c0 + _D8[code][1])
    rows = np.nonzero(basin.any(axis=1))[0]
    cols = np.nonzero(basin.any(axis=0))[0]
    ra, rb = max(rows[0] - 1, 0), min(rows[-1] + 2, d8.shape[0])
    ca, cb = max(cols[0] - 1, 0), min(cols[-1] + 2, d8.shape[1])
    keep = basin.copy()
    keep[below] = True
    fam_all = upa - 1.0
    ddm = np.where(keep, d8.astype(np.float64), NODATA)
    fam = np.where(keep, fam_all, NODATA)
    # The cell below the gauge keeps its values; if it is an edge pit give it an off-grid direction.
    if ddm[below] == 0:
        ddm[below] = float(code)
    crop = (slice(ra, rb), slice(ca, cb))
    gauge = (int(r0 - ra), int(c0 - ca))
    cs = cellsize_deg
    nrows = rb - ra
    # Place the gauge cell's centre on (lat, lon), snapped to a whole number of cells.
    xll = round(math.floor((lon - (gauge[1] + 0.5) * cs) / cs + 0.5) * cs, 10)
    top = round(math.floor((lat + (gauge[0] + 0.5) * cs) / cs + 0.5) * cs, 10)
    yll = round(float(top - int(nrows) * cs), 10)
    return Terrain(np.round(filled[crop], 2), ddm[crop], fam[crop], basin[crop], gauge, float(xll), float(yll),
                   float(cs), float(target))
