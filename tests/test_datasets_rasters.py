"""Clip-to-basin for local rasters: exact windows, georeferencing, masks, ASCII and GeoTIFF, on generated grids."""

from __future__ import annotations

import numpy as np
import pytest

from hydroagent_hpc.datasets.rasters import basin_bbox, clip_file, clip_grid, clip_series, mask_to_basin
from hydroagent_hpc.sim.errors import InputError
from hydroagent_hpc.sim.grids import Grid, read_asc, read_grid, read_tif, write_asc, write_tif


def _conus_like() -> Grid:
    """20 x 30 cells of 0.1 deg from (-100, 30); value = 100*row + col, row 0 north."""
    rr, cc = np.mgrid[0:20, 0:30]
    return Grid((100 * rr + cc).astype(np.float64), -100.0, 30.0, 0.1, -9999.0)


def test_window_covers_the_box_with_whole_cells_and_keeps_values_in_place():
    g = _conus_like()
    c = clip_grid(g, (-99.25, 30.55, -98.45, 31.05))
    # columns floor(7.5)=7 .. ceil(15.5)-1=15; rows floor(9.5)=9 .. ceil(14.5)-1=14
    assert c.data.shape == (6, 9)
    assert c.xll == pytest.approx(-99.3) and c.top == pytest.approx(31.1) and c.yll == pytest.approx(30.5)
    assert np.array_equal(c.data, g.data[9:15, 7:16])
    # every clipped cell centre finds the same value in the source grid (georeferencing is exact)
    rr, cc = np.mgrid[0:6, 0:9]
    x, y = c.xll + (cc + 0.5) * c.cellsize, c.top - (rr + 0.5) * c.cellsize
    col, row, inside = g.locate(x, y)
    assert inside.all() and np.array_equal(g.data[row, col], c.data)


def test_edges_on_cell_boundaries_padding_and_clamping():
    g = _conus_like()
    c = clip_grid(g, (-99.0, 30.5, -98.0, 31.0))  # exactly on boundaries: no extra cell
    assert c.data.shape == (5, 10)
    p = clip_grid(g, (-99.0, 30.5, -98.0, 31.0), pad_cells=2)
    assert p.data.shape == (9, 14) and p.xll == pytest.approx(-99.2)
    edge = clip_grid(g, (-100.5, 31.5, -99.75, 32.5), pad_cells=1)  # hangs over the north-west corner
    assert edge.xll == pytest.approx(-100.0) and edge.top == pytest.approx(32.0) and edge.data[0, 0] == 0.0
    with pytest.raises(InputError, match="does not overlap"):
        clip_grid(g, (-80.0, 40.0, -79.0, 41.0))
    with pytest.raises(ValueError, match="west < east"):
        clip_grid(g, (-98.0, 30.5, -99.0, 31.0))


@pytest.mark.parametrize("suffix", [".tif", ".asc"])
def test_clip_file_round_trips_both_formats_with_scaling(tmp_path, suffix):
    g = _conus_like()
    g.data[10, 10] = -9999.0
    src = tmp_path / f"et20180701{suffix}"
    (write_tif if suffix == ".tif" else write_asc)(src, g)
    out = clip_file(src, tmp_path / "clip" / src.name, (-99.05, 30.75, -98.85, 31.05), pad_cells=0, scale=0.01)
    back = read_grid(tmp_path / "clip" / src.name)
    assert back.data.shape == out.data.shape == (4, 3)  # rows 9..12, columns 9..11
    assert back.xll == pytest.approx(-99.1) and back.top == pytest.approx(31.1) and back.cellsize == pytest.approx(0.1)
    assert back.data[0, 0] == pytest.approx(g.data[9, 9] * 0.01, rel=1e-6)  # 0.01 mm/day -> mm/day
    assert back.data[1, 1] == -9999.0  # nodata is not scaled
    reader = read_tif if suffix == ".tif" else read_asc
    assert reader(tmp_path / "clip" / src.name).nodata == -9999.0


def test_mask_keeps_only_cells_whose_centre_is_in_the_basin():
    g = _conus_like()
    c = clip_grid(g, (-99.5, 30.5, -99.0, 31.0))  # 5 x 5 cells of 0.1
    dem_data = np.full((10, 10), -9999.0)  # a finer (0.05 deg) basin DEM over the same box
    dem_data[:, :5] = 50.0  # the western half is basin
    dem = Grid(dem_data, -99.5, 30.5, 0.05, -9999.0)
    m = mask_to_basin(c, dem)
    assert np.array_equal(m.data[:, :2], c.data[:, :2]) and (m.data[:, 3:] == -9999.0).all()


def test_basin_bbox_and_a_series_of_hourly_files(small_basin_dir, tmp_path):
    west, south, east, north = basin_bbox(small_basin_dir)
    dem = read_grid(small_basin_dir / "basic" / "dem.asc")
    assert dem.xll <= west < east <= dem.right and dem.yll <= south < north <= dem.top
    big = Grid(np.arange(400 * 600, dtype=np.float64).reshape(400, 600), round(west - 2.0, 6), round(south - 1.5, 6),
               0.01, -9999.0)
    src = tmp_path / "mrms"
    for hour in ("00", "01", "02"):
        write_tif(src / f"GaugeCorr_QPE_01H_00.00_20180701-{hour}0000.grib2.tif", big)
    out = clip_series(src, "GaugeCorr_QPE_01H_*.tif", tmp_path / "clipped", (west, south, east, north))
    assert len(out) == 3 and all(p.exists() for p in out)
    c = read_tif(out[0])
    assert c.xll <= west and c.right >= east and c.yll <= south and c.top >= north  # covers the basin, plus a margin
    assert c.ncols * c.nrows < 0.05 * big.data.size
    with pytest.raises(InputError, match="no files match"):
        clip_series(src, "nothing_*.tif", tmp_path / "x", (west, south, east, north))
