"""A-priori CREST/KW parameter grids for a synthetic basin, tied to its terrain.

These play the role of the CONUS grids HydroAgent multiplies (``wm_usa``, ``ksat_usa`` ...): each
is a plausible spatial field, so the scalar multipliers an agent tunes act on structured values.
Ranges are close to the EF5 reference case ``dendritic`` (``tests/data/ef5-reference``):

============  ==============  ==============================================================
grid          range           structure
============  ==============  ==============================================================
wm (mm)       70-250          deep soils in flat valley floors, thin on steep slopes
b (-)         0.2-1.5         more heterogeneous infiltration on steeper, rougher ground
im (-)        0.005-0.25      mostly rural (~1 %), one "town" near the outlet
ksat (mm/h)   0.5-15          log-normal soil texture field, sandier uplands
leaki (1/h)   0.02-0.15       follows ksat (well-drained soils drain interflow faster)
alpha (-)     0.8-4.0         channel storage coefficient, larger on gentle slopes
beta (-)      0.5-0.75        around Manning's 0.6
alpha0 (-)    0.3-2.0         overland storage coefficient, gentle slopes and rough cover
============  ==============  ==============================================================

Every grid covers the whole cropped rectangle (no nodata), float32-ready, no exact zeros.
"""

from __future__ import annotations

import numpy as np

from hydroagent_hpc.sim.synth.terrain import Terrain, smooth_field

__all__ = ["GRID_FILES", "make_parameter_grids"]

# Control-file key -> file name under params/ (fc's grid is Ksat, as in HydroAgent's template).
GRID_FILES = {"wm": "wm.tif", "b": "b.tif", "im": "im.tif", "fc": "ksat.tif", "leaki": "leaki.tif",
              "alpha": "alpha.tif", "beta": "beta.tif", "alpha0": "alpha0.tif"}


def _rank(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """Empirical quantile (0..1) of every cell against the basin's cells."""
    ref = np.sort(values[mask])
    return np.searchsorted(ref, values, side="right") / max(ref.size, 1)


def _unit(f: np.ndarray) -> np.ndarray:
    """Squash a standard-normal-ish field to (0, 1)."""
    return 1.0 / (1.0 + np.exp(-1.7 * f))


def make_parameter_grids(rng: np.random.Generator, terrain: Terrain) -> dict[str, np.ndarray]:
    """Grids by control-file parameter name (wm, b, im, fc, leaki, alpha, beta, alpha0)."""
    shape = terrain.shape
    basin = terrain.basin
    scale = max(min(shape) / 6.0, 1.5)
    slope = np.maximum(terrain.slope(), 1e-4)
    steep = _rank(slope, basin)  # 0 = flattest, 1 = steepest
    dem = terrain.dem
    lo, hi = float(dem[basin].min()), float(dem[basin].max())
    height = np.clip((dem - lo) / max(hi - lo, 1e-6), 0.0, 1.0)
    sand = _unit(0.8 * smooth_field(rng, shape, scale) + 1.2 * (height - 0.5))
    rough = _unit(smooth_field(rng, shape, scale))

    deep = 0.55 * (1.0 - steep) + 0.25 * (1.0 - sand) + 0.2 * _unit(smooth_field(rng, shape, scale))
    wm = 70.0 + 180.0 * np.clip(deep, 0.0, 1.0)
    b = 0.2 + 1.3 * np.clip(0.5 * steep + 0.5 * _unit(smooth_field(rng, shape, scale)), 0.0, 1.0)
    # A town: a blob of impervious cover centred on a basin cell near the outlet.
    rr, cc = np.mgrid[0:shape[0], 0:shape[1]]
    gr, gc = terrain.gauge
    near = np.argwhere(basin & ((rr - gr) ** 2 + (cc - gc) ** 2 <= (0.3 * max(shape)) ** 2))
    tr, tc = near[int(rng.integers(len(near)))]
    radius = max(1.0, 0.08 * max(shape))
    town = np.exp(-0.5 * ((rr - tr) ** 2 + (cc - tc) ** 2) / radius ** 2)
    im = 0.005 + 0.02 * _unit(smooth_field(rng, shape, scale)) + 0.22 * town
    ksat = np.exp(np.log(0.5) + (np.log(15.0) - np.log(0.5)) * sand)
    leaki = 0.02 + 0.13 * np.clip(0.7 * sand + 0.3 * _unit(smooth_field(rng, shape, scale)), 0.0, 1.0)
    flat = (slope / np.median(slope[basin])) ** -0.3
    alpha = np.clip(1.6 * flat * np.exp(0.15 * smooth_field(rng, shape, scale)), 0.8, 4.0)
    beta = np.clip(0.6 + 0.05 * smooth_field(rng, shape, scale), 0.5, 0.75)
    alpha0 = np.clip(0.8 * flat * (0.6 + 0.8 * rough), 0.3, 2.0)
    grids = {"wm": wm, "b": b, "im": im, "fc": ksat, "leaki": leaki, "alpha": alpha, "beta": beta, "alpha0": alpha0}
    return {k: np.round(v, 4) for k, v in grids.items()}
