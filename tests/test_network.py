"""The node numbering is EF5's own, so every double sum (a cell's inflows, the interflow leaks reaching it) and
every float gauge average adds its terms in EF5's order.

EF5 (``BasicGrids.cpp``) walks each basin from its gauge on a stack: it pops a node and tests its neighbours in
direction order E, NE, N, NW, W, SW, S, SE, numbering each upstream neighbour when it pushes it. ``KWRoute::Route``
then routes nodes in decreasing index and adds each outflow into its downstream cell's double sum, so a cell's
three or more inflows add in an order that another numbering changes (ulps in the interflow sums).
"""

from __future__ import annotations

import hashlib

import numpy as np

from conftest import REFERENCE
from hydroagent_hpc.sim.controlfile import Gauge
from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.grids import Grid
from hydroagent_hpc.sim.network import build_network

# ESRI codes: E 1, SE 2, S 4, SW 8, W 16, NW 32, N 64, NE 128
_E, _SE, _S, _SW, _W, _NW, _N, _NE = 1, 2, 4, 8, 16, 32, 64, 128


def _grid(values) -> Grid:
    return Grid(np.array(values, dtype=np.float64), xll=10.0, yll=40.0, cellsize=0.01)


def test_numbering_is_ef5s_depth_first_walk_in_direction_order():
    # gauge at (row 1, col 0) drains west off the grid; (1,1) gathers four cells, (2,0) one
    ddm = _grid([[_S, _S, _SW],
                 [_W, _W, _W],
                 [_N, _W, _NW]])
    fam = _grid([[0, 0, 0],
                 [8, 4, 0],
                 [1, 0, 0]])
    dem = _grid([[30, 30, 30],
                 [10, 20, 30],
                 [20, 30, 30]])
    net = build_network(dem, ddm, fam, [Gauge("g", cellx=0, celly=1)], esriddm=True, selffam=False)
    # EF5: pop the gauge, push E (1,1)=1, N (0,0)=2, S (2,0)=3; pop (2,0): push E (2,1)=4; pop (2,1), (0,0);
    # pop (1,1): push E (1,2)=5, NE (0,2)=6, N (0,1)=7, SE (2,2)=8
    assert list(zip(net.rows.tolist(), net.cols.tolist())) == [
        (1, 0), (1, 1), (0, 0), (2, 0), (2, 1), (1, 2), (0, 2), (0, 1), (2, 2)]
    assert net.down.tolist() == [-1, 0, 0, 0, 3, 1, 1, 1, 1]


def test_golden_basin_numbering_is_the_one_ef5_dumps():
    # (col, row) of each node in EF5's own order, dumped by an instrumented EF5 1.2.3 (KWRoute's node list) for
    # the two-gauge dendritic golden basin: 476 nodes
    sim = EmbeddedSimulator(REFERENCE / "dendritic" / "control_a.txt", cache_dir=False)
    xy = np.stack([sim.net.cols, sim.net.rows], axis=1).astype("<i4")
    assert xy[:6].tolist() == [[20, 23], [21, 23], [20, 22], [19, 23], [19, 22], [18, 23]]
    digest = "8814aa6eaa27a207e72481c6d2aa1b3eb5b19205548975cf72e80b9b2d05048f"
    assert hashlib.sha256(xy.tobytes()).hexdigest() == digest
    assert sim.net.gauge_names == ["outlet", "inner"] and sim.net.upstream_gauges == [[1], []]
