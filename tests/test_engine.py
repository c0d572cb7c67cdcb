"""The embedded engine's API: overrides, batches, the forcing cache, EF5's input rules, bad input."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from hydroagent_hpc.sim.embedded import EmbeddedSimulator
from hydroagent_hpc.sim.errors import InputError, SimulationError
from hydroagent_hpc.sim.grids import Grid, read_asc, write_asc, write_tif


@pytest.fixture
def tiny(tmp_path, reference_dir) -> Path:
    dst = tmp_path / "tiny"
    shutil.copytree(reference_dir / "tiny", dst, ignore=shutil.ignore_patterns("expected_*"))
    return dst


@pytest.fixture(scope="module")
def dendritic(reference_dir):
    return EmbeddedSimulator(reference_dir / "dendritic" / "control_a.txt", cache_dir=False)


def test_override_equals_control_file_value(tmp_path, reference_dir, dendritic):
    """run({'wm': 1.7}) is exactly the run of a control file that says WM=1.7."""
    text = (reference_dir / "dendritic" / "control_a.txt").read_text().replace("WM=1.0", "WM=1.7")
    for d in ("basic/", "obs/", "params/", "precip\n", "pet\n"):
        text = text.replace(f"={d}", f"={reference_dir / 'dendritic'}/{d}")
    p = tmp_path / "c.txt"
    p.write_text(text)
    direct = EmbeddedSimulator(p, cache_dir=False).run()
    via = dendritic.run({"wm": 1.7})
    assert np.array_equal(direct.discharge, via.discharge)
    assert via.params["wm"] == 1.7 and via.params["b"] == 1.0
    assert not np.allclose(via.discharge, dendritic.run().discharge)


def test_batch_equals_single_runs(dendritic):
    sets = [None, {"wm": 0.5}, {"alpha": 2.0, "beta": 0.8}, {"alpha0": 0.0}, {"under": 3.0, "leaki": 0.5},
            {"th": 30.0}, {"ke": 1.2, "im": 0.2}, {"fc": 0.3, "iwu": 90}]
    batch = dendritic.run_batch(sets)
    for s, r in zip(sets, batch):
        single = dendritic.run(s)
        assert np.array_equal(single.discharge, r.discharge)
        assert np.array_equal(single.soil_moisture, r.soil_moisture)
        assert r.params == single.params
    assert len({float(r.discharge.max()) for r in batch}) == len(sets)


def test_result_fields(dendritic):
    r = dendritic.run()
    n = len(dendritic.steps)
    for arr in (r.discharge, r.observed, r.precip, r.pet, r.soil_moisture, r.fast_flow, r.slow_flow, r.warmup):
        assert arr.shape == (n,)
    assert r.gauge == "outlet" and set(r.gauges) == {"outlet", "inner"}
    assert r.warmup.sum() == 47 and not r.warmup[-1]  # TIME_WARMEND = begin + 48 h, rows from 48 h on
    assert r.missing_precip == 3 and r.wall_time_s > 0
    mask = r.evaluation_mask()
    assert not mask[r.warmup].any() and not mask[np.isnan(r.observed)].any() and not mask[r.observed <= -998].any()
    assert (r.observed <= -998).sum() == 1  # -999 is kept as written, like EF5


def test_forcing_cache_hit_and_invalidation(tiny, tmp_path):
    cache = tmp_path / "cache"
    a = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    entries = sorted(cache.glob("forcing-*.npz"))
    assert len(entries) == 2  # precip and PET
    stamps = [e.stat().st_mtime_ns for e in entries]
    b = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    assert [e.stat().st_mtime_ns for e in sorted(cache.glob("forcing-*.npz"))] == stamps  # read, not rewritten
    assert np.array_equal(a.precip, b.precip) and b.missing_precip == 10
    # Change one forcing file: the key changes, the new value is read.
    f = tiny / "precip" / "rain.2020060108.asc"
    g = read_asc(f)
    g.data[:] = 50.0
    write_asc(f, g)
    c = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    assert len(list(cache.glob("forcing-*.npz"))) == 3
    step = c.steps.index(c.steps[7])
    assert c.precip[step].max() == 50.0 and a.precip[step].max() == 10.0


def test_forcing_cache_skips_reading_unchanged_files_and_sees_a_disguised_edit(tiny, tmp_path, monkeypatch):
    """The content checksum is remembered under the files' stat fingerprint: a second simulator reads no
    forcing file to build its key; an edit of the same size with the old mtime put back still changes
    the file's ctime, so the cache reads it again."""
    import os

    from hydroagent_hpc.sim import cache as fcache

    cache = tmp_path / "cache"
    a = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    assert len(list(cache.glob("forcing-stat-*.key"))) == 2  # precip and PET

    def no_hashing(*args, **kwargs):
        raise AssertionError("the content was hashed although no file changed")

    with monkeypatch.context() as m:
        m.setattr(fcache, "forcing_checksum", no_hashing)
        b = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    assert np.array_equal(a.precip, b.precip)
    f = tiny / "precip" / "rain.2020060108.asc"
    before = f.stat()
    text = f.read_text()
    edited = text.replace(" 10", " 20", 1)
    assert edited != text and len(edited) == len(text)
    f.write_text(edited)
    os.utime(f, ns=(before.st_atime_ns, before.st_mtime_ns))  # the old modification time, the same size
    c = EmbeddedSimulator(tiny / "control_b.txt", cache_dir=cache)
    assert not np.array_equal(a.precip, c.precip)


def test_missing_negative_and_nodata_forcing_are_zero(tiny):
    f = tiny / "precip" / "rain.2020060107.asc"
    g = read_asc(f)
    g.data[0, 0], g.data[0, 1] = -5.0, -9999.0
    write_asc(f, g)
    sim = EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)
    t = [s.hour for s in sim.steps].index(7)
    row = dict(zip(zip(sim.net.rows, sim.net.cols), sim.precip[t]))
    assert row[(0, 0)] == 0.0 and row[(0, 1)] == 0.0 and row[(1, 1)] == 10.0
    assert sim.missing_precip == 10


def test_coarser_forcing_grid_is_sampled_at_cell_corner(tiny):
    """A forcing grid of another shape is sampled at each DEM cell's upper-left corner."""
    base = EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)
    for f in (tiny / "precip").glob("*.asc"):
        g = read_asc(f)
        # 0.02-degree grid covering the DEM with a margin; value = column index + 1 where it rains
        data = np.full((5, 4), float(g.data.max()))
        write_asc(f, Grid(data, -97.52, 34.98, 0.02, -9999.0))
    sim = EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)
    np.testing.assert_array_equal(sim.precip, base.precip)
    r = sim.run()
    np.testing.assert_allclose(r.discharge, base.run().discharge)


def test_shape_mismatch_is_a_clear_error(tiny):
    g = read_asc(tiny / "basic" / "fam.asc")
    write_asc(tiny / "basic" / "fam.asc", Grid(g.data[:-1], g.xll, g.yll, g.cellsize, g.nodata))
    with pytest.raises(InputError, match=r"FAM .* has 5x5 cells but the DEM .* has 6x5"):
        EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)


def test_fam_undercount_is_refused(tiny):
    g = read_asc(tiny / "basic" / "fam.asc")
    g.data[5, 4] = 10  # the outlet really has 29 upstream cells
    write_asc(tiny / "basic" / "fam.asc", g)
    with pytest.raises(InputError, match="overrun"):
        EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)


def test_bad_ddm_code(tiny):
    g = read_asc(tiny / "basic" / "ddm.asc")
    g.data[0, 0] = 3
    write_asc(tiny / "basic" / "ddm.asc", g)
    with pytest.raises(InputError, match="ESRIDDM"):
        EmbeddedSimulator(tiny / "control_a.txt", cache_dir=False)


def test_ascii_parameter_grid_is_refused(tiny):
    dem = read_asc(tiny / "basic" / "dem.asc")
    write_asc(tiny / "params" / "wm.asc", Grid(np.full(dem.data.shape, 100.0), dem.xll, dem.yll, dem.cellsize))
    p = tiny / "control_a.txt"
    p.write_text(p.read_text().replace("GAUGE=Outlet\nWM=", "wm_grid=params/wm.asc\nGAUGE=Outlet\nWM="))
    with pytest.raises(InputError, match="only as GeoTIFF"):
        EmbeddedSimulator(p, cache_dir=False)
    write_tif(tiny / "params" / "wm.tif", Grid(np.full(dem.data.shape, 100.0), dem.xll, dem.yll, dem.cellsize))
    p.write_text(p.read_text().replace("wm.asc", "wm.tif").replace("WM=100.0", "WM=1.0"))
    grid_run = EmbeddedSimulator(p, cache_dir=False).run()
    scalar_run = EmbeddedSimulator(p, cache_dir=False).run({"wm": 1.0})
    assert np.array_equal(grid_run.discharge, scalar_run.discharge)


def test_zero_wm_and_bad_override(dendritic):
    with pytest.raises(SimulationError, match="WM is 0"):
        dendritic.run({"wm": 0.0})
    with pytest.raises(ValueError, match="unknown parameter 'wmm'"):
        dendritic.run({"wmm": 1.0})
    with pytest.raises(ValueError, match="finite"):
        dendritic.run({"wm": float("nan")})


def test_grid_zero_becomes_001(tiny):
    """EF5 replaces an exact 0 in a parameter grid by 0.01 before multiplying."""
    dem = read_asc(tiny / "basic" / "dem.asc")
    write_tif(tiny / "params" / "im.tif", Grid(np.zeros(dem.data.shape), dem.xll, dem.yll, dem.cellsize))
    p = tiny / "control_a.txt"
    p.write_text(p.read_text().replace("GAUGE=Outlet\nWM=", "im_grid=params/im.tif\nGAUGE=Outlet\nWM="))
    sim = EmbeddedSimulator(p, cache_dir=False)
    npar = sim.node_params({"im": 5.0})
    np.testing.assert_allclose(npar.im, 0.05)  # 5 x 0.01, not divided by 100 (a grid is present)


def test_all_forcing_missing_is_an_error(tiny):
    p = tiny / "control_a.txt"
    p.write_text(p.read_text().replace("LOC=precip", "LOC=precipitation"))
    with pytest.raises(InputError, match=r"(?s)none of the 72 .*precipitation.*LOC"):
        EmbeddedSimulator(p, cache_dir=False)


@pytest.mark.parametrize("seed", range(6))
def test_water_balance_closes(seed):
    """The kernel's water balance, on its own: W + P - E = W' + overland + interflow for every cell.

    On a wet step (P > Ep) E is Ep; on a dry one the rain evaporates and the soil gives
    E2 = (Ep - P) W/WM, at most what it holds (W clipped to WM), so W - E2 = W' + interflow.
    Wet and dry cells, soils above capacity and bone-dry ones are all drawn.
    """
    from hydroagent_hpc.sim.kernel import water_balance

    rng = np.random.default_rng(seed)
    n, dt = 2000, [1.0, 24.0, 0.25][seed % 3]
    precip = np.where(rng.random((1, n)) < 0.5, 0.0, rng.gamma(0.8, 4.0, (1, n)))
    pet = rng.uniform(0.0, 0.6, (1, n))
    wm = rng.uniform(5.0, 400.0, n)
    b, im = rng.uniform(0.05, 3.0, n), rng.uniform(0.0, 0.3, n)
    ke, fc = rng.uniform(0.5, 1.5, n), rng.uniform(0.1, 20.0, n)
    w0 = wm * rng.uniform(0.0, 1.3, n)
    w0[:50] = 0.0
    # EF5 holds forcing rates, parameters and soil water in float32, and so does the kernel
    f32 = lambda a: np.asarray(a, dtype=np.float32).astype(np.float64)  # noqa: E731
    precip, pet, wm, b, im, ke, fc, w0 = (f32(a) for a in (precip, pet, wm, b, im, ke, fc, w0))
    w = w0.copy()
    fast, slow, sm = np.zeros(n), np.zeros(n), np.zeros(n)
    water_balance(precip, pet, 0, dt, wm, b, im, ke, fc, w, fast, slow, sm)
    p, ep = precip[0] * dt, pet[0] * dt * ke
    over, inter = fast * dt * 3600.0, slow * dt * 3600.0
    wet = p > ep
    held = np.minimum(w0, wm)
    dry_loss = np.minimum((ep - p) * held / wm, held)
    # closes to float32 rounding of what EF5 stores (W', the two rates, P and Ep*dt): a few ulps
    scale = w0 + p + ep
    gap = np.abs(w0 + np.where(wet, p - ep, -dry_loss) - (w + over + inter))
    np.testing.assert_array_less(gap, 4e-7 * scale + 1e-12)
    assert wet.any() and (~wet).any() and (w0 > wm).any()
    assert np.all(w >= 0.0) and np.all(w <= wm * (1 + 1.2e-7)) and np.all(over >= 0.0) and np.all(inter >= 0.0)
    assert np.all(over[~wet] == 0.0)
    np.testing.assert_allclose(sm, w * 100.0 / wm, rtol=1.2e-7)
