"""The river network EF5 builds from DEM, DDM and FAM: nodes, lengths, areas, slopes, gauges.

Facts (EF5 v1.2.3, ``docs/ef5-crest-spec.md`` section 2a, checked against the golden cases):

* Each gauge cell is located from CELLX/CELLY, or from LAT/LON with EF5's float32 cell lookup;
  with BASINAREA EF5 then searches a window of about 20 km for the cell whose FAM best matches
  the area (in cells). Gauges are processed in descending FAM; the basin is traced upstream from
  each gauge not already reached. Node 0 is the first outlet; every upstream node has a larger
  index than its downstream node, so iterating nodes in reverse index order goes upstream to
  downstream. The numbering is EF5's own (``BasicGrids.cpp``, the basin walk): a depth-first walk
  on a stack that numbers a cell when it is pushed, pushing a cell's upstream neighbours in
  direction order E, NE, N, NW, W, SW, S, SE. EF5 adds each cell's inflows (and the interflow
  leaks reaching it) as doubles in decreasing node index, and sums the float gauge averages in
  node order, so with three or more terms another numbering changes the sums by ulps.
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
from hydroagent_hpc.sim.grids import Grid

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
    values = np.where(valid, raw, 0.0)
    allowed = (0, *_ESRI_TO_D) if esri else tuple(range(9))
    # compared as numbers before any cast: 4.5 or 1e300 must not truncate or wrap into a valid code
    bad = valid & ~np.isin(values, np.array(allowed, dtype=np.float64))
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
    where = f"{g.where}: " if g.where else ""
    if g.cellx is not None and g.celly is not None:
        col, row = g.cellx, g.celly
        if not (0 <= row < dem.nrows and 0 <= col < dem.ncols):
            raise InputError(f"{where}gauge {g.name!r}: CELLX={col}, CELLY={row} is outside the "
                             f"{dem.ncols}x{dem.nrows} grid of {dem.path}",
                             fix="give a zero-based column and row inside the grid")
    else:
        c, r, inside = dem.locate(g.lon, g.lat)
        if not bool(inside):
            raise InputError(f"{where}gauge {g.name!r}: LAT={g.lat}, LON={g.lon} is outside the grid of {dem.path} "
                             f"({dem.xll}..{dem.right}, {dem.yll}..{dem.top})", fix="check the coordinates")
        col, row = int(c), int(r)
        if g.basinarea is not None and g.basinarea > 0:
            row, col = _search_basinarea(g, row, col, dem, fam)
    if not valid[row, col]:
        raise InputError(f"{where}gauge {g.name!r} (col {col}, row {row}) lies in a nodata cell of the DEM, DDM or FAM",
                         fix="move the gauge onto the river network")
    return row, col


def _search_basinarea(g: Gauge, row: int, col: int, dem: Grid, fam: Grid) -> tuple[int, int]:
    """Move a LAT/LON gauge to the cell within ~20 km whose FAM best matches BASINAREA."""
    assert g.basinarea is not None  # the caller searches only for a gauge with a positive BASINAREA
    lat_n = np.float32(dem.top - row * dem.cellsize)
    cell_km2 = float(_area(np.array([lat_n]), dem.cellsize)[0])
    target = g.basinarea / cell_km2
    sn = float(np.float32(dem.cellsize) * _METERS_PER_DEGREE)
    reach = max(2, int(20000.0 / sn))
    r0, r1 = max(0, row - reach + 1), min(dem.nrows, row + reach)
    c0, c1 = max(0, col - reach + 1), min(dem.ncols, col + reach)
    win = fam.data[r0:r1, c0:c1]
    ok = fam.valid()[r0:r1, c0:c1]
    err = np.where(ok, (win - target) ** 2, np.inf)
    # Only the eight rays EF5 searches (row, column and diagonals through the gauge).
    rr, cc = np.mgrid[r0:r1, c0:c1]
    ray = (rr == row) | (cc == col) | (np.abs(rr - row) == np.abs(cc - col))
    err = np.where(ray, err, np.inf)
    best = np.unravel_index(int(np.argmin(err)), err.shape)
    nr, nc = r0 + best[0], c0 + best[1]
    if (nr, nc) != (row, col):
        log.info("gauge %s moved from (%d, %d) to (%d, %d) to match BASINAREA=%g km2", g.name, row, col, nr, nc,
                 g.basinarea)
    return int(nr), int(nc)


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
