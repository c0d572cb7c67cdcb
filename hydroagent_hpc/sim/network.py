"""The river network EF5 builds from DEM, DDM and FAM: nodes, lengths, areas, slopes, gauges.

Facts (EF5 v1.2.3, ``docs/ef5-crest-spec.md`` section 2a, checked against the golden cases):

* Each gauge cell is located from LAT/LON with EF5's float32 cell lookup (LAT/LON win when
  CELLX/CELLY are given too), else from CELLX/CELLY; with BASINAREA, however the gauge was placed,
  EF5 then searches the eight rays of about 20 km around it for the cell whose FAM best matches the
  area in cells (:func:`_search_basinarea` has the exact rules). Gauges are processed in descending
  FAM; the basin is traced upstream from each gauge not already reached. Node 0 is the first outlet;
  every upstream node has a larger index than its downstream node, so iterating nodes in reverse
  index order goes upstream to downstream. The numbering is EF5's own (``BasicGrids.cpp``, the basin
  walk): a depth-first walk on a stack that numbers a cell when it is pushed, pushing a cell's
  upstream neighbours in direction order E, NE, N, NW, W, SW, S, SE. EF5 adds each cell's inflows
  (and the interflow leaks reaching it) as doubles in decreasing node index, and sums the float
  gauge averages in node order, so with three or more terms another numbering changes the sums by
  ulps.
* Geographic lengths: one degree of latitude is 110 574 m (``metersSN = cellsize * 110574``,
  float32); east-west lengths are ``metersSN * cos(lat)`` with ``lat`` the cell's **north edge**
  and pi taken as 3.1415926; diagonals by Pythagoras. Cell area (km2) is
  ``metersSN * metersSN * cos(lat) / 1e6``. Each rounded where EF5 rounds (``lat / 180`` is a float
  division, the diagonal squares the unrounded double east-west length, the area divides a double
  product), so lengths, areas and slopes are EF5's floats bit for bit; a one-ulp length or area
  changes routed flows by ulps that a Newton stopping test can amplify to a printed 0.01-0.02.
* Slope of an upstream node: ``max(1, trunc(DEM_up) - trunc(DEM_down)) / dx`` (DEM read as float32,
  truncated to whole metres). The gauge (outlet) node: ``max(1, DEM - trunc(DEM_next)) / dx`` when the cell it
  drains to is on the grid with data, otherwise ``1 / dx_NS``.
* A node's FAM value ``fac`` is what the channel threshold TH compares against (``fac > TH``).
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass

import numpy as np

from hydroagent_hpc.sim.controlfile import Gauge
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import UNTAGGED_SENTINEL, Grid, untagged_sentinel_error

log = logging.getLogger(__name__)

__all__ = ["Network", "build_network", "flow_offsets", "cycle_cells"]

# Direction index d (1..8) = E, NE, N, NW, W, SW, S, SE (TauDEM / EF5 internal order).
_DCOL = np.array([0, 1, 1, 0, -1, -1, -1, 0, 1])
_DROW = np.array([0, 0, -1, -1, -1, 0, 1, 1, 1])
_ESRI_TO_D = {1: 1, 128: 2, 64: 3, 32: 4, 16: 5, 8: 6, 4: 7, 2: 8}
_METERS_PER_DEGREE = np.float32(110574.0)
_PI = 3.1415926


@dataclass
class Network:
    """Nodes of the basin(s), ordered so that ``down[i] < i`` (``-1`` = leaves the domain)."""

    rows: np.ndarray  # int64 [N]
    cols: np.ndarray  # int64 [N]
    down: np.ndarray  # int64 [N]
    dx: np.ndarray  # float64 [N] length to the downstream cell (m)
    area: np.ndarray  # float64 [N] cell area (km2)
    slope: np.ndarray  # float64 [N]
    fac: np.ndarray  # float64 [N] flow accumulation (FAM value)
    owner: np.ndarray  # int64 [N] index of the nearest gauge at or downstream of the node
    gauge_names: list[str]  # gauges in processing order (descending FAM)
    gauge_nodes: np.ndarray  # int64 [G] node index of each gauge
    upstream_gauges: list[list[int]]  # for each gauge, the gauges upstream of it
    shape: tuple[int, int]

    @property
    def n(self) -> int:
        return int(self.rows.size)

    def gauge_weights(self) -> np.ndarray:
        """[G, N] area weights: row g averages a per-node field over the area upstream of gauge g.

        EF5's ``GaugeAverage``: sum(value * area) / sum(area) over nodes owned by g or by any
        gauge upstream of g.
        """
        g = len(self.gauge_names)
        w = np.zeros((g, self.n))
        for gi in range(g):
            members = [gi, *self.upstream_gauges[gi]]
            sel = np.isin(self.owner, members)
            w[gi, sel] = self.area[sel]
            w[gi] /= w[gi].sum()
        return w


def flow_offsets(ddm: Grid, esri: bool) -> np.ndarray:
    """Direction index 1..8 per cell (0 = no direction), from ESRI or TauDEM codes."""
    raw = ddm.data
    valid = ddm.valid()
    d = np.zeros(raw.shape, dtype=np.int64)
    values = np.where(valid | np.isinf(raw), raw, 0.0)
    allowed = (0, *_ESRI_TO_D) if esri else tuple(range(9))
    # compared as numbers before any cast: 4.5 or 1e300 must not truncate or wrap into a valid code
    # an infinite value (1e300 in an ASCII grid reads as float inf, as EF5's fscanf gives) is a bad code too
    bad = (valid | np.isinf(raw)) & ~np.isin(values, np.array(allowed, dtype=np.float64))
    codes = np.where(bad, 0.0, values).astype(np.int64)
    if esri:
        for code, di in _ESRI_TO_D.items():
            d[codes == code] = di
        kind = "ESRI codes 1, 2, 4, ..., 128"
    else:
        ok = (codes >= 1) & (codes <= 8)
        d[ok] = codes[ok]
        kind = "TauDEM codes 1..8"
    if bad.any():
        r, c = np.argwhere(bad)[0]
        if not ddm.has_nodata and raw[r, c] == UNTAGGED_SENTINEL:
            # EF5 refuses it too ("Bad DDM value -9999", BasicGrids.cpp CheckESRIDDM/CheckSimpleDDM)
            raise untagged_sentinel_error(ddm, int(r), int(c), "DDM", f"a flow direction, and refuses it (not one of "
                                          f"the {kind})")
        raise InputError(f"{ddm.path}: flow direction {raw[r, c]:g} at row {r}, col {c} is not one of the {kind}",
                         fix="set ESRIDDM=true for ESRI codes or false for TauDEM codes, or fix the grid")
    return d


def _cos_lat(lat_north: np.ndarray) -> np.ndarray:
    """``cos(TORADIANS(y))`` as EF5 evaluates it: ``#define TORADIANS(x) (x) / 180 * 3.1415926`` with ``y`` a
    float, so ``y / 180`` is a float division and only the product with pi and the cosine are double."""
    lat = np.asarray(lat_north, dtype=np.float32)
    # the C library's cos, as EF5's (numpy's own vectorised cos need not round the same); one call per row
    uniq, inv = np.unique(lat, return_inverse=True)
    cos = np.array([math.cos(float(v) * _PI) for v in (uniq / np.float32(180.0)).astype(np.float32)])
    return cos[inv].reshape(lat.shape)


def _lengths(lat_north: np.ndarray, cellsize: float, d: np.ndarray) -> np.ndarray:
    """EF5 ``GeographicProjection::GetLen``: ``metersSNPerCell`` is a double holding the float product
    ``cellSize * 110574``; the east-west length ``metersSN * cos`` is double, rounded to float on return, and
    the diagonal ``sqrt(pow(metersSN * cos, 2.0) + pow(metersSN, 2.0))`` squares that double unrounded."""
    sn = np.float64(np.float32(np.float32(cellsize) * _METERS_PER_DEGREE))
    ew64 = sn * _cos_lat(lat_north)
    ew = ew64.astype(np.float32)
    diag = np.sqrt(ew64 * ew64 + sn * sn).astype(np.float32)
    out = np.where(np.isin(d, (3, 7)), np.float32(sn), np.where(np.isin(d, (1, 5)), ew, diag))
    return out.astype(np.float64)


def _area(lat_north: np.ndarray, cellsize: float) -> np.ndarray:
    """EF5 ``GeographicProjection::GetArea``: ``float lenEW = metersSN * cos(..)``, then
    ``(lenEW * metersSN) / 1000000`` in double (metersSN is a double), rounded to float once on return."""
    sn = np.float64(np.float32(np.float32(cellsize) * _METERS_PER_DEGREE))
    ew = (sn * _cos_lat(lat_north)).astype(np.float32)
    return ((ew.astype(np.float64) * sn) / 1e6).astype(np.float32).astype(np.float64)


def _locate_gauge(g: Gauge, dem: Grid, fam: Grid, valid: np.ndarray) -> tuple[int, int]:
    """The gauge's cell as EF5's ``CarveBasin`` (``BasicGrids.cpp:660-812``) finds it.

    LAT/LON, when given, win over CELLX/CELLY (EF5 projects every gauge whose LAT is set); the cell is
    looked up in the FAM's geometry. With BASINAREA, whichever way the gauge was placed, EF5 then
    searches the rays around that cell (:func:`_search_basinarea`).
    """
    where = f"{g.where}: " if g.where else ""
    if g.lat is not None and g.lon is not None:
        if g.cellx is not None or g.celly is not None:
            log.warning("%sgauge %s: LAT/LON given with CELLX/CELLY; the cell comes from LAT/LON, as in EF5",
                        where, g.name)
        c, r, inside = fam.locate(g.lon, g.lat)
        if not bool(inside):
            raise InputError(f"{where}gauge {g.name!r}: LAT={g.lat}, LON={g.lon} is outside the grid of {fam.path} "
                             f"({fam.xll}..{fam.right}, {fam.yll}..{fam.top})", fix="check the coordinates")
        col, row = int(c), int(r)
        lat = np.float32(g.lat)
    elif g.cellx is not None and g.celly is not None:
        if g.lat is not None or g.lon is not None:
            raise InputError(f"{where}gauge {g.name!r}: only one of LAT and LON is given; EF5 would place the gauge "
                             f"with the other one uninitialised", fix="give both LAT and LON, or neither")
        col, row = g.cellx, g.celly
        if not (0 <= row < dem.nrows and 0 <= col < dem.ncols):
            raise InputError(f"{where}gauge {g.name!r}: CELLX={col}, CELLY={row} is outside the "
                             f"{dem.ncols}x{dem.nrows} grid of {dem.path}",
                             fix="give a zero-based column and row inside the grid")
        lat = fam.cell_corners(np.array([col]), np.array([row]))[1][0]
    else:  # the [Gauge] reader guarantees one of the two
        raise InputError(f"{where}gauge {g.name!r} has no location", fix="give LAT and LON, or CELLX and CELLY")
    if g.basinarea is not None:
        row, col = _search_basinarea(g, row, col, lat, dem, fam, valid)
    if not valid[row, col]:
        raise InputError(f"{where}gauge {g.name!r} (col {col}, row {row}) lies in a nodata cell of the DEM, DDM or FAM",
                         fix="move the gauge onto the river network")
    if fam.data[row, col] < 0:
        # EF5 sizes its node list from the gauge's FAM and aborts (std::length_error) before its basin walk's own
        # test (BasicGrids.cpp: a gauge on FAM < 0 is "located in a no data grid cell")
        raise InputError(f"{where}gauge {g.name!r} (col {col}, row {row}): the flow accumulation there is negative "
                         f"({fam.data[row, col]:g} in {fam.path}); EF5 aborts on such a gauge cell",
                         fix="move the gauge onto the river network, or fix the FAM grid")
    return row, col


# EF5's search order at each distance: E, SE, S, SW, W, NW, N, NE as (drow, dcol)
_SEARCH_RAYS = ((0, 1), (1, 1), (1, 0), (1, -1), (0, -1), (-1, -1), (-1, 0), (-1, 1))


def _search_basinarea(g: Gauge, row: int, col: int, lat: np.float32, dem: Grid, fam: Grid,
                      valid: np.ndarray) -> tuple[int, int]:
    """Move a gauge with BASINAREA to the cell whose FAM best matches it, exactly as EF5 1.2.3 does.

    EF5 (``BasicGrids.cpp:678-812``): the target is ``BASINAREA * areaFactor`` in float, with
    ``areaFactor = float(1.0 / GetArea(lon, lat))`` taken at the gauge's own LAT (LAT/LON gauges) or at
    its cell's upper-left corner (CELLX/CELLY gauges), *not* at the cell's north edge in general; the
    error of a cell is ``float(pow(float(FAM) - target, 2.0))``. Candidates are the gauge's cell, then
    for ``dist = 1 .. maxDist - 1`` (``maxDist = int(20000 / metersSN)``, at least 2) the cells ``dist``
    away E, SE, S, SW, W, NW, N, NE, in that order; a candidate replaces the best so far only with a
    strictly smaller error, so ties keep the earlier cell. A step west or north must stay at column or
    row ``> 0`` (EF5 tests ``> 0``, not ``>= 0``), so column 0 and row 0 are reached only along the
    gauge's own column or row. Cells with nodata (in the DEM, DDM or FAM: EF5's ``FixFAM``) are skipped.
    """
    assert g.basinarea is not None  # the caller searches only for a gauge with BASINAREA
    nrows, ncols = fam.data.shape
    cell_km2 = np.float32(_area(np.array([lat], dtype=np.float32), dem.cellsize)[0])
    factor = np.float32(1.0 / float(cell_km2))
    target = np.float32(np.float32(g.basinarea) * factor)
    sn = float(np.float32(np.float32(dem.cellsize) * _METERS_PER_DEGREE))
    max_dist = max(2, int(20000.0 / sn))
    # beyond the grid's larger side every ray has left the grid: no more candidates
    dist = np.arange(1, min(max_dist, max(nrows, ncols) + 1), dtype=np.int64)
    rays = np.array(_SEARCH_RAYS, dtype=np.int64)
    dr = np.broadcast_to(rays[None, :, 0], (dist.size, 8)).ravel()
    dc = np.broadcast_to(rays[None, :, 1], (dist.size, 8)).ravel()
    rr = row + np.repeat(dist, 8) * dr
    cc = col + np.repeat(dist, 8) * dc
    # EF5's bounds: a step south or east must stay below nrows/ncols, a step north or west above 0
    inside = (np.where(dr > 0, rr < nrows, True) & np.where(dr < 0, rr > 0, True)
              & np.where(dc > 0, cc < ncols, True) & np.where(dc < 0, cc > 0, True))
    rr, cc = np.concatenate(([row], rr[inside])), np.concatenate(([col], cc[inside]))
    fam32 = fam.data[rr, cc].astype(np.float32)
    diff = (fam32 - target).astype(np.float32)
    err = (diff.astype(np.float64) ** 2).astype(np.float32)
    ok = valid[rr, cc] & ~np.isnan(err)
    ok[0] = True  # the gauge's own cell is the starting best whatever it holds
    if np.isnan(err[0]):
        return row, col  # nothing compares smaller than NaN: EF5 never moves such a gauge
    best = int(np.argmin(np.where(ok, err, np.inf)))  # the first of equal errors, as EF5's strict test keeps
    nr, nc = int(rr[best]), int(cc[best])
    if (nr, nc) != (row, col):
        log.info("gauge %s moved from (%d, %d) to (%d, %d) to match BASINAREA=%g km2", g.name, row, col, nr, nc,
                 g.basinarea)
    return nr, nc


def build_network(dem: Grid, ddm: Grid, fam: Grid, gauges: list[Gauge], esriddm: bool, selffam: bool) -> Network:
    """Trace every gauge's basin upstream and compute the node geometry."""
    for name, grid in (("DDM", ddm), ("FAM", fam)):
        if not dem.same_shape(grid):
            raise InputError(f"the {name} ({grid.path}) has {grid.nrows}x{grid.ncols} cells but the DEM ({dem.path}) "
                             f"has {dem.nrows}x{dem.ncols}", fix="give DEM, DDM and FAM the same rows and columns")
    if not gauges:
        raise InputError("the basin has no gauges", fix="add GAUGE= lines to the [Basin] section")
    valid = dem.valid() & ddm.valid() & fam.valid()
    d = flow_offsets(ddm, esriddm)
    nrows, ncols = dem.data.shape
    # Downstream cell of each grid cell (flat index), -1 if off-grid, nodata or no direction.
    rr, cc = np.mgrid[0:nrows, 0:ncols]
    tr, tc = rr + _DROW[d], cc + _DCOL[d]
    inside = (d > 0) & (tr >= 0) & (tr < nrows) & (tc >= 0) & (tc < ncols)
    target = np.where(inside, tr * ncols + tc, -1)
    target = np.where(inside & valid.ravel()[np.clip(target, 0, None)].reshape(nrows, ncols), target, -1)
    flat_valid = valid.ravel()
    tflat = np.where(flat_valid, target.ravel(), -1)
    on_cycle = cycle_cells(tflat)
    # Upstream adjacency (CSR) over valid cells.
    src = np.nonzero(tflat >= 0)[0]
    dst = tflat[src]
    # a cell's upstream neighbours in EF5's walk order: by the direction from the cell to the neighbour
    # (E, NE, N, NW, W, SW, S, SE), the reverse of the neighbour's own flow direction
    back = (d.ravel()[src] + 3) % 8 + 1
    order = np.lexsort((back, dst))
    src, dst = src[order], dst[order]
    start = np.searchsorted(dst, np.arange(nrows * ncols + 1))

    located = []
    for g in gauges:
        r, c = _locate_gauge(g, dem, fam, valid)
        located.append((g, r * ncols + c))
    located.sort(key=lambda t: -fam.data.ravel()[t[1]])  # descending FAM, stable
    seen: dict[int, str] = {}
    for g, cell in located:
        if cell in seen:
            raise InputError(f"gauges {seen[cell]!r} and {g.name!r} share the cell "
                             f"(col {cell % ncols}, row {cell // ncols})",
                             fix="remove one of them or move it")
        seen[cell] = g.name
    gauge_at = {cell: gi for gi, (_, cell) in enumerate(located)}
    if on_cycle.size:
        _refuse_or_warn_cycles(ddm, on_cycle, located, ncols)

    node_of = np.full(nrows * ncols, -1, dtype=np.int64)
    cells: list[int] = []
    down: list[int] = []
    owner: list[int] = []
    upstream_gauges: list[list[int]] = [[] for _ in located]
    gauge_nodes = np.full(len(located), -1, dtype=np.int64)
    for gi, (_g, cell) in enumerate(located):
        if node_of[cell] >= 0:
            continue  # reached from a downstream gauge already
        node_of[cell] = len(cells)
        cells.append(cell)
        down.append(-1)
        owner.append(gi)
        gauge_nodes[gi] = node_of[cell]
        # EF5's walk: pop a node, then number and push its upstream neighbours (numbered when pushed)
        stack = [int(node_of[cell])]
        while stack:
            head = stack.pop()
            here = cells[head]
            ug = gauge_at.get(here)
            if ug is not None and down[head] >= 0:
                # a gauge met on the walk (EF5 checks when it pops the node): every gauge downstream of it
                # gains it as an upstream gauge, in the order met, and its upstream cells count to it
                gauge_nodes[ug] = head
                k = owner[head]
                while True:
                    upstream_gauges[k].append(ug)
                    nxt = down[gauge_nodes[k]]
                    if nxt < 0:
                        break
                    k = owner[nxt]
                owner[head] = ug
            for up in src[start[here]:start[here + 1]]:
                if node_of[up] >= 0:
                    continue
                node_of[up] = len(cells)
                cells.append(int(up))
                down.append(head)
                owner.append(owner[head])
                stack.append(len(cells) - 1)

    cells_a = np.array(cells, dtype=np.int64)
    down_a = np.array(down, dtype=np.int64)
    rows, cols = cells_a // ncols, cells_a % ncols
    lat_north = (np.float64(dem.top) - rows.astype(np.float64) * dem.cellsize).astype(np.float32)
    dirs = d.ravel()[cells_a]
    # EF5 holds the DEM as float (an ASCII grid is read with fscanf "%f") and truncates those floats to long
    dem_v = dem.data.ravel()[cells_a].astype(np.float32).astype(np.float64)
    dem_t = np.trunc(dem_v)
    is_root = down_a < 0
    # Upstream nodes: length along the direction from the node to its downstream cell.
    dx = _lengths(lat_north, dem.cellsize, dirs)
    drop = np.where(is_root, 0.0, dem_t - dem_t[np.clip(down_a, 0, None)])
    # Roots: the cell they drain to, if on the grid with data, else a north-south length.
    tcell = target.ravel()[cells_a]
    root_in = is_root & (tcell >= 0)
    # deliberate: a -9999 cell of a DEM or FAM without nodata is data to EF5, which would take it as the
    # elevation (of a basin cell, or the cell an outlet drains to) or flow accumulation of a basin cell
    for grid, field, use, used in ((dem, "DEM", "an elevation", np.concatenate([cells_a, tcell[root_in]])),
                                   (fam, "FAM", "a flow accumulation", cells_a)):
        hit = used[grid.untagged_sentinels().ravel()[used]]
        if hit.size:
            r, c = divmod(int(hit[0]), ncols)
            raise untagged_sentinel_error(grid, r, c, field, use)
    # float DEMDiff = DEM (float) - outsideHeight (long): one float rounding
    t_dem = np.trunc(dem.data.ravel()[np.clip(tcell, 0, None)].astype(np.float32).astype(np.float64))
    drop = np.where(root_in, (dem_v - t_dem).astype(np.float32).astype(np.float64), drop)
    sn = float(np.float32(np.float32(dem.cellsize) * _METERS_PER_DEGREE))
    dx = np.where(is_root & ~root_in, sn, dx)
    drop = np.where(is_root & ~root_in, 1.0, drop)
    slope = (np.maximum(drop, 1.0).astype(np.float32) / dx.astype(np.float32)).astype(np.float64)
    area = _area(lat_north, dem.cellsize)
    fac = fam.data.ravel()[cells_a].astype(np.float64)

    for gi, (g, _cell) in enumerate(located):
        n_up = int(np.sum(_count_upstream(down_a, int(gauge_nodes[gi]))))
        fam_v = fac[gauge_nodes[gi]]
        expect = n_up if selffam else n_up - 1
        if fam_v + 0.5 < expect:
            raise InputError(f"gauge {g.name!r}: FAM={fam_v:g} but {n_up} cells drain to it "
                             f"(SELFFAM={'true' if selffam else 'false'} expects {expect}); "
                             f"EF5 would overrun its node array",
                             fix="recompute the FAM from the DDM, or set SELFFAM to match how it counts")
        if abs(fam_v - expect) > 0.5:
            log.warning("gauge %s: FAM=%g but %d upstream cells were traced (SELFFAM=%s)", g.name, fam_v, n_up, selffam)
    return Network(rows, cols, down_a, dx, area, slope, fac, np.array(owner, dtype=np.int64),
                   [g.name for g, _ in located], gauge_nodes, upstream_gauges, (nrows, ncols))


def cycle_cells(target: np.ndarray) -> np.ndarray:
    """Flat indices of the cells that lie on a flow-direction cycle (``target``: next cell or -1).

    Pointer doubling: after ``k`` rounds ``jump`` is the cell ``2**k`` steps downstream (-1 once
    the path has left the grid or the valid cells). A path without a cycle leaves within N steps,
    so after ``ceil(log2 N)`` rounds only cells on or draining into a cycle still point anywhere;
    of those, the cells on a cycle are the ones some such cell reaches after that many steps
    (every cycle is reached from itself). O(N log N), about 20 gathers for a million cells.
    """
    n = target.size
    jump = target.astype(np.int64, copy=True)
    for _ in range(max(1, int(np.ceil(np.log2(max(n, 2))))) + 1):
        jump = np.where(jump >= 0, jump[np.clip(jump, 0, None)], -1)
    stuck = np.nonzero(jump >= 0)[0]
    if stuck.size == 0:
        return stuck
    # cells reached from stuck cells after n steps are on cycles: walk each cycle once from there
    on = np.zeros(n, dtype=bool)
    for start in np.unique(jump[stuck]):
        if on[start]:
            continue
        cur = int(start)
        while not on[cur]:
            on[cur] = True
            cur = int(target[cur])
    return np.nonzero(on)[0]


def _refuse_or_warn_cycles(ddm: Grid, cells: np.ndarray, located: list, ncols: int) -> None:
    """A cycle through a gauge makes EF5 trace the loop as the basin: refused. Elsewhere it cuts the
    cells on and above it off from every gauge: warned."""
    r, c = divmod(int(cells[0]), ncols)
    members = set(cells.tolist())
    hit = [(g, cell) for g, cell in located if cell in members]
    if hit:
        g, cell = hit[0]
        gr, gc = divmod(int(cell), ncols)
        raise InputError(f"{ddm.path}: the flow directions form a cycle through gauge {g.name!r} (col {gc}, row {gr}): "
                         f"{cells.size} cells drain into each other", fix="fix the DDM (every path must leave the grid "
                         "or reach a sink); recompute it from the DEM")
    log.warning("%s: the flow directions form a cycle of %d cell(s) (first at col %d, row %d); the cells on it and "
                "above it drain to no gauge", ddm.path, cells.size, c, r)


def _count_upstream(down: np.ndarray, node: int) -> np.ndarray:
    """Boolean mask of nodes at or upstream of ``node`` (down[i] < i makes one pass enough)."""
    inside = np.zeros(down.size, dtype=bool)
    inside[node] = True
    for i in range(node + 1, down.size):
        if down[i] >= 0 and inside[down[i]]:
            inside[i] = True
    return inside
