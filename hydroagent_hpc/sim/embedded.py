"""The embedded engine: an in-process, EF5-compatible CREST + kinematic-wave simulator.

``EmbeddedSimulator(control)`` loads everything that does not depend on the parameters once
(grids, river network, forcing, observations; forcing through an on-disk cache keyed by the
files' content) and then ``run(params)`` costs only the compiled time loop. ``run_batch`` runs
many parameter sets in one call, in parallel threads over shared forcing.

Where EF5 misbehaves, this engine stops with a clear error instead (documented in
``ef5/README.md``): parameter grids that EF5 would silently fail to load (``.asc``), IWU or ISU
grids (which EF5 ignores for the initial state), a FAM that undercounts the basin (EF5 writes
past its node array), WM = 0, non-finite discharge (EF5 prints a shifted row), and a forcing
FREQ finer than TIMESTEP (EF5 would skip files). Any fixed step works, hourly or daily
(``TIMESTEP=1d`` with daily forcing in ``mm/d``).

With ``SNOW=SNOW17`` the task's ``[TempForcing]`` is read once and Snow-17
(:mod:`hydroagent_hpc.sim.snow`) runs in front of CREST on each run: its outflow replaces the
precipitation (and EF5's Precip column), and each gauge gets the mean temperature and SWE.
``snow_physics="ef5"`` (default) keeps EF5's arithmetic, ``"textbook"`` corrects what EF5 gets
wrong against Anderson's Snow-17 (``ef5/README.md``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

import hydroagent_hpc.sim.cache as fcache
import hydroagent_hpc.sim.snow as snow17
from hydroagent_hpc.params import PARAM_NAMES, SNOW_NAMES, ParamValues, check_values
from hydroagent_hpc.sim.controlfile import (
    CREST_PARAMS,
    KW_PARAMS,
    SNOW17_PARAMS,
    ControlFile,
    duration_seconds,
    parse_control,
    parse_duration,
)
from hydroagent_hpc.sim.errors import InputError, SimulationError
from hydroagent_hpc.sim.forcing import (
    check_frequency,
    count_steps,
    load_forcing,
    load_temperature,
    read_observations,
    step_times,
)
from hydroagent_hpc.sim.grids import Grid, read_grid, read_tif, untagged_sentinel_error
from hydroagent_hpc.sim.kernels import kernel
from hydroagent_hpc.sim.limits import Limits, current_limits
from hydroagent_hpc.sim.network import Network, build_network
from hydroagent_hpc.sim.outputs import STATE_GRIDS
from hydroagent_hpc.sim.record import NodeParams, stack_batch
from hydroagent_hpc.types import GaugeSeries, SimulationResult

log = logging.getLogger(__name__)

__all__ = ["EmbeddedSimulator", "NodeParams"]

#: Part of the parameter-grid cache key: raise it when the sampling of a grid at the cells changes.
_GRID_CACHE_VERSION = 2  # 2: a tag-less GeoTIFF has no nodata (EF5); its -9999 cells refused


class EmbeddedSimulator:
    """One basin and task, loaded once; ``run(params)`` many times.

    ``params`` (in :meth:`run`) are multiplier overrides by name: each replaces that scalar for
    every gauge of the task's parameter sets; unnamed ones keep the control file's values. With
    Snow-17 the names of :data:`~hydroagent_hpc.params.SNOW_NAMES` are accepted too.
    ``snow_physics`` is ``"ef5"`` (EF5's arithmetic, default) or ``"textbook"`` (module docstring).
    """

    backend = "embedded"

    def __init__(self, control: str | Path | ControlFile, task: str | None = None,
                 cache_dir: str | Path | None | bool = None, snow_physics: str = snow17.EF5) -> None:
        t_load = time.perf_counter()
        if snow_physics not in snow17.PHYSICS:
            raise InputError(f"snow_physics={snow_physics!r} is unknown",
                             fix=f"use one of: {', '.join(snow17.PHYSICS)}")
        self.snow_physics = snow_physics
        self._cache_dir = cache_dir
        self.control = control if isinstance(control, ControlFile) else parse_control(control)
        cf = self.control
        self.task = cf.task(task)
        tk = self.task
        if tk.style != "simu":
            raise InputError(f"task {tk.name!r}: STYLE={tk.style.upper()} is not supported by the embedded engine",
                             fix="use STYLE=SIMU (calibration is done by hydroagent's own agents and optimizers)")
        if tk.model != "crest":
            raise InputError(f"task {tk.name!r}: MODEL={tk.model.upper()} is not supported", fix="use MODEL=CREST")
        if (tk.routing or "").lower() != "kw" or not tk.routing_param_set:
            raise InputError(f"task {tk.name!r}: the embedded engine needs ROUTING=KW with ROUTING_PARAM_SET",
                             fix="add ROUTING=KW and ROUTING_PARAM_SET=NAME to the task")
        self.crest_set = cf.param_sets[tk.param_set]
        self.kw_set = cf.param_sets[tk.routing_param_set]
        if self.crest_set.kind != "crest" or self.kw_set.kind != "kw":
            raise InputError(f"task {tk.name!r}: PARAM_SET must name a [CrestParamSet] and ROUTING_PARAM_SET a "
                             f"[KWParamSet]", fix="swap or correct the two names")
        self.snow_set = cf.param_sets[tk.snow_param_set] if tk.snow and tk.snow_param_set else None
        self.has_snow = self.snow_set is not None
        for ps, name in ((self.crest_set, "iwu"), (self.kw_set, "isu")):
            if name in ps.grids:
                raise InputError(f"[{ps.kind}paramset {ps.name}] has {name}_grid: EF5 ignores it for the initial state",
                                 fix=f"remove {name}_grid and give {name.upper()} as a scalar")
        limits = current_limits()
        n_steps = self._check_window(limits)
        basic = cf.basic
        self.dem = read_grid(basic.dem)
        _check_geographic(self.dem)
        ddm, fam = read_grid(basic.ddm), read_grid(basic.fam)
        gauges = [cf.gauges[g] for g in cf.basins[tk.basin]]
        self.net: Network = build_network(self.dem, ddm, fam, gauges, basic.esriddm, basic.selffam)
        self.weights = self.net.gauge_weights()
        # forcing [T, N] twice, plus one forcing's per-file samples while it loads; outputs [T, G]; step times
        limits.check_memory(n_steps * (24.0 * self.net.n + 64.0 * len(gauges) + 100.0),
                            f"{cf.path}: task {tk.name!r}: {n_steps:,} steps x {self.net.n:,} basin cells of forcing")
        self.steps = step_times(tk.time_begin, tk.time_end, tk.timestep)
        self.dt_hours = (self.steps[1] - self.steps[0]).total_seconds() / 3600.0 if len(self.steps) > 1 else \
            (self.steps[0] - tk.time_begin).total_seconds() / 3600.0
        self.times = np.array(self.steps, dtype="datetime64[m]")
        warm = tk.time_warmend or tk.time_begin
        self.warmup = np.array([t < warm for t in self.steps])
        rows, cols = self.net.rows, self.net.cols
        for f in (cf.precip[tk.precip], cf.pet[tk.pet]):
            check_frequency(f, tk.timestep)
        self.precip, self.missing_precip = self._forcing(cf.precip[tk.precip], rows, cols, cache_dir)
        self.pet, self.missing_pet = self._forcing(cf.pet[tk.pet], rows, cols, cache_dir)
        self.precip_mean = self.precip @ self.weights.T  # [T, G]
        self.pet_mean = self.pet @ self.weights.T
        self.temp: np.ndarray | None = None
        self.missing_temp = 0
        if self.has_snow:
            assert tk.temp is not None  # the parser requires TEMP with SNOW
            tf = cf.temp[tk.temp]
            check_frequency(tf, tk.timestep)
            tseries = load_temperature(tf, self.steps, tk.time_begin, self.dem, rows, cols)
            self.temp, self.missing_temp = tseries.values, len(tseries.missing)
            self._members = snow17.gauge_members(self.net.upstream_gauges)
            self._area32 = self.net.area.astype(np.float32)
            self.temp_mean = snow17.gauge_average(self.temp, self.net.owner, self._area32, self._members)
            self.jday = np.array([t.timetuple().tm_yday - 1 for t in self.steps], dtype=np.int64)  # C tm_yday
            self.p_atm = snow17.atmospheric_pressure(self.dem.data[rows, cols])
        self.observed = {}
        for gname in self.net.gauge_names:
            g = cf.gauges[gname]
            series = np.full(len(self.steps), np.nan)
            if g.obs is not None:
                obs = read_observations(g.obs)
                for i, t in enumerate(self.steps):
                    v = obs.get(t)
                    if v is not None:
                        series[i] = v
                if obs and not np.isfinite(series).any():
                    log.warning("%s: none of its %d observations falls on a step of task %r (%s..%s); gauge %s has "
                                "nothing to be scored against", g.obs, len(obs), tk.name, _fmt_time(self.steps[0]),
                                _fmt_time(self.steps[-1]), gname)
            self.observed[gname] = series
        self.primary = next((g for g in self.net.gauge_names if cf.gauges[g].obs is not None), self.net.gauge_names[0])
        self._grid_values = {**self._param_grids(self.crest_set), **self._param_grids(self.kw_set)}
        self._snow_grids = self._param_grids(self.snow_set) if self.snow_set is not None else {}
        self._scalars = self._gauge_scalars()
        self._states = self._load_states()
        self.load_time_s = time.perf_counter() - t_load

    # ----------------------------------------------------------------- loading
    def _check_window(self, limits: Limits) -> int:
        """Count the steps from the task alone and refuse a window beyond HYDROAGENT_MAX_STEPS (before any
        list of steps or forcing array exists)."""
        tk, cf = self.task, self.control
        where = f"{cf.path}:{tk.lines.get('timestep', tk.line)}"
        try:
            n = count_steps(tk.time_begin, tk.time_end, tk.timestep)
        except InputError as exc:
            raise InputError(f"{where}: {exc.message}", fix=exc.fix) from None
        if n == 0:
            raise InputError(f"{where}: task {tk.name!r}: no step of TIMESTEP={tk.timestep} fits between "
                             "TIME_BEGIN and TIME_END", fix="widen the window or shorten TIMESTEP")
        limits.check_steps(n, f"{where}: task {tk.name!r}, TIMESTEP={tk.timestep} from {_fmt_time(tk.time_begin)} "
                              f"to {_fmt_time(tk.time_end)}")
        if tk.states is not None and tk.time_state is not None:
            begin, state = tk.time_begin, tk.time_state
            count, unit = parse_duration(tk.timestep)
            if state == begin or (state - begin) % timedelta(seconds=duration_seconds(count, unit)):
                log.warning("%s:%d: TIME_STATE=%s is not the end of a step of TIMESTEP=%s; no state grids will be "
                            "written", cf.path, tk.lines.get("time_state", tk.line), f"{state:%Y%m%d%H%M}",
                            tk.timestep)
        return n

    def _forcing(self, f, rows, cols, cache_dir):
        tk = self.task
        key_parts = (rows.tobytes(), cols.tobytes(), str(self.dem.data.shape), str(self.dem.xll), str(self.dem.yll),
                     str(self.dem.cellsize))
        if cache_dir is not False:
            key = fcache.make_key(f, self.steps, tk.time_begin, key_parts, cache_dir)
            hit = fcache.load(key, (len(self.steps), rows.size), cache_dir)
            if hit is not None:
                return hit
        series = load_forcing(f, self.steps, tk.time_begin, self.dem, rows, cols)
        if cache_dir is not False:
            fcache.store(key, series.values, len(series.missing), cache_dir)
        return series.values, len(series.missing)

    def _param_grids(self, ps) -> dict[str, np.ndarray]:
        """Each grid of parameter set ``ps`` sampled at the basin's cells (NaN off the grid), from the
        cache when the grid files are unchanged (:func:`hydroagent_hpc.sim.cache.file_identity`)."""
        for name, path in ps.grids.items():
            if Path(path).suffix.lower() == ".asc":
                raise InputError(f"[{ps.kind}paramset {ps.name}] {name}_grid={path}: EF5 reads parameter grids only as "
                                 "GeoTIFF and silently skips the run for an .asc grid",
                                 fix="convert the grid to a float32 GeoTIFF (hydroagent_hpc.sim.grids.write_tif)")
        if not ps.grids:
            return {}
        key = None
        if self._cache_dir is not False:
            names = list(ps.grids)
            key = fcache.file_identity([ps.grids[n] for n in names], (
                _GRID_CACHE_VERSION, *names, self.net.rows.tobytes(), self.net.cols.tobytes(), self.dem.data.shape,
                repr((self.dem.xll, self.dem.yll, self.dem.cellsize))))
            hit = fcache.load_arrays("paramgrids", key, self._cache_dir)
            if hit is not None and all(n in hit and f"{n}.holes" in hit for n in names):
                for name in names:
                    self._warn_holes(ps.grids[name], name, int(hit[f"{name}.holes"]))
                return {name: hit[name] for name in names}
        out: dict[str, np.ndarray] = {}
        holes_of: dict[str, np.ndarray] = {}
        for name, path in ps.grids.items():
            grid = read_tif(path)
            self._refuse_untagged(grid, f"{name.upper()} parameter")
            out[name] = self._sample_param(grid)
            inside = self._inside(grid)
            holes = int((inside & (~np.isfinite(out[name]) | (out[name] == grid.nodata))).sum())
            holes_of[f"{name}.holes"] = np.int64(holes)
            self._warn_holes(path, name, holes)
        if key is not None:
            fcache.store_arrays("paramgrids", key, {**out, **holes_of}, self._cache_dir)
        return out

    def _warn_holes(self, path, name: str, holes: int) -> None:
        if holes:
            log.warning("%s: %d of the basin's %d cells hold nodata or a non-finite value in this %s grid; the run "
                        "uses them as they are (nodata times the scalar, then EF5's clamps; a non-finite cell "
                        "falls back to the scalar). Fill the grid to silence this", path, holes, self.net.n,
                        name.upper())

    def _inside(self, grid: Grid) -> np.ndarray:
        """Which basin cells fall on ``grid`` (all of them when it has the DEM's rows and columns)."""
        if grid.same_shape(self.dem):
            return np.ones(self.net.n, dtype=bool)
        x, y = self.dem.cell_corners(self.net.cols, self.net.rows)
        return np.asarray(grid.locate(x, y)[2], dtype=bool)

    def _refuse_untagged(self, grid: Grid, field: str) -> None:
        """Deliberate: a basin cell read from a grid without nodata (a GeoTIFF without a ``GDAL_NODATA``
        tag) that holds -9999 is refused; EF5 would multiply the parameter by -9999 there."""
        if grid.has_nodata:
            return
        rows, cols = self.net.rows, self.net.cols
        if grid.same_shape(self.dem):
            r, c, hit = rows, cols, np.ones(rows.size, dtype=bool)
        else:
            x, y = self.dem.cell_corners(cols, rows)
            c, r, hit = grid.locate(x, y)
        bad = np.nonzero(hit & grid.untagged_sentinels()[r, c])[0]
        if bad.size:
            raise untagged_sentinel_error(grid, int(r[bad[0]]), int(c[bad[0]]), field, "a parameter multiplier")

    def _sample_param(self, grid: Grid) -> np.ndarray:
        rows, cols = self.net.rows, self.net.cols
        if grid.same_shape(self.dem):
            v = grid.data[rows, cols].copy()
            hit = np.ones(rows.size, dtype=bool)
        else:
            x, y = self.dem.cell_corners(cols, rows)
            c, r, hit = grid.locate(x, y)
            v = grid.data[r, c].copy()
        v[v == 0] = 0.01  # EF5 replaces exact zeros before multiplying
        return np.where(hit, v, np.nan)  # NaN = outside the grid: the scalar is used unmultiplied

    def _gauge_scalars(self) -> list[dict[str, float]]:
        """Scalars for each gauge, inherited from the nearest downstream gauge that has them."""
        net, cf = self.net, self.control
        out: list[dict[str, float]] = []
        for gi, gname in enumerate(net.gauge_names):
            vals: dict[str, float] = {}
            down_node = net.down[net.gauge_nodes[gi]]
            for ps in (self.crest_set, self.kw_set, *([self.snow_set] if self.snow_set is not None else [])):
                if gname in ps.values:
                    vals.update(ps.values[gname])
                elif down_node >= 0:
                    names = {"crest": CREST_PARAMS, "kw": KW_PARAMS, "snow17": SNOW17_PARAMS}[ps.kind]
                    vals.update({k: out[net.owner[down_node]][k] for k in names})
                else:
                    raise InputError(f"{cf.path}:{ps.line}: independent gauge {gname!r} has no entry in "
                                     f"[{ps.kind}paramset {ps.name}]",
                                     fix=f"add GAUGE={gname} with its parameter values to that section")
            out.append(vals)
        return out

    def _load_states(self) -> dict[str, np.ndarray]:
        tk = self.task
        if tk.states is None:
            return {}
        stamp = tk.time_begin.strftime("%Y%m%d_%H%M")
        found = {}
        files = [(key, f"{name}_{stamp}.tif") for key, name in STATE_GRIDS.items()]
        if self.has_snow:
            files += [(f"snow_{k}", f"snow17_{k}_{stamp}.tif") for k in snow17.STATE_NAMES]
        for key, fname in files:
            p = tk.states / fname
            if p.exists():
                g = read_tif(p)
                v = self._sample_param_raw(g)
                found[key] = v
                log.info("initial state %s from %s", key, p)
        return found

    def _sample_param_raw(self, grid: Grid) -> np.ndarray:
        rows, cols = self.net.rows, self.net.cols
        if grid.same_shape(self.dem):
            return grid.data[rows, cols].astype(np.float64)
        x, y = self.dem.cell_corners(cols, rows)
        c, r, hit = grid.locate(x, y)
        return np.where(hit, grid.data[r, c], np.nan)

    # ----------------------------------------------------------------- parameters
    @property
    def base_params(self) -> dict[str, float]:
        """The control file's scalars at the primary gauge, in EF5 order."""
        gi = self.net.gauge_names.index(self.primary)
        return {k: self._scalars[gi][k] for k in PARAM_NAMES}

    @property
    def base_snow_params(self) -> dict[str, float]:
        """The Snow-17 scalars at the primary gauge (empty without snow)."""
        if not self.has_snow:
            return {}
        gi = self.net.gauge_names.index(self.primary)
        return {k: self._scalars[gi][k] for k in SNOW_NAMES}

    def snow_params(self, overrides: Mapping[str, float] | None = None) -> np.ndarray:
        """Per-node Snow-17 parameters [8, N] (float32, :data:`SNOW17_PARAMS` order), as EF5 distributes them.

        Scalar of the cell's gauge (overrides replace it everywhere) times the ``*_grid`` value (an exact 0 in
        the grid becomes 0.01; cells outside the grid keep the scalar): ``Snow17Model::InitializeParameters``.
        """
        over = check_values(overrides or {}, "run parameters", snow=True)
        owner = self.net.owner
        out = np.empty((len(SNOW17_PARAMS), self.net.n), dtype=np.float32)
        for j, k in enumerate(SNOW17_PARAMS):
            v = np.array([{**s, **over}[k] for s in self._scalars], dtype=np.float32)[owner]
            g = self._snow_grids.get(k)
            if g is not None:
                v = np.where(np.isnan(g), v, v * np.nan_to_num(g, nan=1.0).astype(np.float32)).astype(np.float32)
            out[j] = v
        tipm, mfmax = out[SNOW17_PARAMS.index("tipm")], out[SNOW17_PARAMS.index("mfmax")]
        if np.any((tipm < 0.0) | (tipm > 1.0)):
            raise SimulationError("TIPM is outside [0, 1] at some cells: Snow-17 raises 1-TIPM to a fractional power "
                                  "(NaN in EF5)", fix="give TIPM (and its grid) values in [0, 1]")
        if np.any(mfmax <= 0.0):
            raise SimulationError("MFMAX is <= 0 at some cells: Snow-17 divides by MFMAX",
                                  fix="give MFMAX (and its grid) a positive value")
        if np.any(out < 0.0, axis=1)[[j for j, k in enumerate(SNOW17_PARAMS) if k != "mbase"]].any():
            raise SimulationError("a Snow-17 parameter other than MBASE is negative at some cells",
                                  fix="give UADJ, MFMAX, MFMIN, TIPM, NMF, PLWHC and SCF values >= 0")
        return out

    def _snow_states0(self) -> np.ndarray:
        """Initial Snow-17 states [4, N] (ati, wq, wi, deficit): 0, or the STATES grids where they have data."""
        st = np.zeros((len(snow17.STATE_NAMES), self.net.n), dtype=np.float32)
        for j, k in enumerate(snow17.STATE_NAMES):
            v = self._states.get(f"snow_{k}")
            if v is not None:
                st[j] = np.where(np.isnan(v) | (v == -9999.0), st[j], v).astype(np.float32)
        return st

    def run_snow(self, params: Mapping[str, float] | None = None, state_step: int = -1):
        """Snow-17 alone: (outflow [T, N] mm/h that CREST receives, gauge-mean SWE [T, G] mm, states [4, N])."""
        assert self.temp is not None, "run_snow needs a task with SNOW=SNOW17"
        states = self._snow_states0()
        return snow17.snow17_run(self.precip, self.temp, self.jday, np.float32(self.dt_hours), self.snow_params(params),
                                 self.p_atm, states, self.net.owner, self._area32, self._members,
                                 self.snow_physics == snow17.TEXTBOOK, state_step)

    def _snow_mean(self, values: np.ndarray) -> np.ndarray:
        """Gauge means of a per-node field [T, N] as EF5 sums them (float32): the Precip column with snow."""
        return snow17.gauge_average(values.astype(np.float32), self.net.owner, self._area32, self._members)

    def node_params(self, overrides: Mapping[str, float] | None = None) -> NodeParams:
        """Per-node effective parameters for a set of multiplier overrides (Snow-17 names are ignored here)."""
        over = {k: v for k, v in check_values(overrides or {}, "run parameters", snow=self.has_snow).items()
                if k in PARAM_NAMES}
        owner = self.net.owner
        scal = {k: np.array([{**s, **over}[k] for s in self._scalars])[owner] for k in PARAM_NAMES}
        # EF5 holds every parameter as float32 (scalar x grid multiplied in float32) and derives the
        # initial soil water in float32 too; with IWU = 100 that W0 can exceed WM by an ulp, and
        # EF5 only prints that ("greater than WM") without clipping, so the first dry step drains
        # the ulp as interflow. Near-zero flows matter: the kinematic-wave start value has
        # ((Q_in + Q_old)/2)^(beta-1), so 0 and 1e-12 route differently.
        eff = {}
        for k in PARAM_NAMES:
            v = scal[k].astype(np.float32)
            g = self._grid_values.get(k)
            if g is not None:
                v = np.where(np.isnan(g), v, v * np.nan_to_num(g, nan=1.0).astype(np.float32))
            eff[k] = v
        if "im" not in self._grid_values:
            eff["im"] = (eff["im"] / np.float64(100.0)).astype(np.float32)
        w0 = ((eff["iwu"] * eff["wm"]) / np.float64(100.0)).astype(np.float32).astype(np.float64)
        eff = {k: v.astype(np.float64) for k, v in eff.items()}
        wm = np.where(eff["wm"] < 0.0, 100.0, eff["wm"])
        if np.any(wm == 0.0):
            raise SimulationError("WM is 0 at some cells: CREST divides by WM", fix="give WM a positive multiplier")
        w0 = np.maximum(w0, 0.0)
        b = np.where(eff["b"] < 0.0, 1.0, np.where(np.isnan(eff["b"]), 0.0, eff["b"]))
        fc = np.where(eff["fc"] < 0.0, 1.0, eff["fc"])
        ir0 = scal["isu"].astype(np.float64).copy()
        if "w" in self._states:
            w0 = np.where(np.isnan(self._states["w"]), w0, self._states["w"])
        if "ir" in self._states:
            ir0 = np.where(np.isnan(self._states["ir"]), ir0, self._states["ir"])
        return NodeParams.of(
            self.net.fac > eff["th"], wm=wm, b=b, im=np.clip(eff["im"], 0.0, 1.0), ke=eff["ke"], fc=fc, w0=w0,
            under=eff["under"], leaki=np.clip(eff["leaki"], 0.0, 1.0), ir0=ir0,
            alpha=np.where(eff["alpha"] < 0.0, 1.0, eff["alpha"]), beta=np.where(eff["beta"] < 0.0, 0.6, eff["beta"]),
            alpha0=np.where(eff["alpha0"] < 0.0, 1.0, eff["alpha0"]))

    def _validated(self, params: Mapping[str, float] | None) -> ParamValues:
        """The one check of a parameter set from outside (names, finite numbers); a record passes as it is."""
        return check_values(params or {}, "run parameters", snow=self.has_snow)

    def _flow_states(self):
        n = self.net.n
        pq = self._states.get("pq", np.zeros(n))
        po = self._states.get("po", np.zeros(n))
        return np.nan_to_num(pq), np.nan_to_num(po)

    # ----------------------------------------------------------------- running
    def _state_step(self) -> int:
        tk = self.task
        if tk.states is not None and tk.time_state is not None and tk.time_state in self.steps:
            return self.steps.index(tk.time_state)
        return -1

    def run(self, params: Mapping[str, float] | None = None, keep_states: bool = False) -> SimulationResult:
        """Simulate once. ``params``: multiplier overrides by name (see class docstring), validated here unless
        they are a :class:`~hydroagent_hpc.params.ParamValues` (validated already)."""
        t0 = time.perf_counter()
        params = self._validated(params)
        npar = self.node_params(params)
        step_s = self.dt_hours * 3600.0
        kern = kernel()
        tg = kern.interflow_targets(self.net.down, self.net.dx, self.net.slope, npar.under, npar.channel, step_s)
        pq0, po0 = self._flow_states()
        state_step = self._state_step() if keep_states else -1
        precip, snow = self.precip, None
        if self.has_snow:
            precip, swe, snow_states = self.run_snow(params, state_step)
            snow = (self._snow_mean(precip), swe)
        q, sm, ff, sf, *states = kern.run_kernel(
            precip, self.pet, self.dt_hours, npar.values, npar.channel, pq0, po0, self.net.down, self.net.dx,
            self.net.area, *tg, self.net.gauge_nodes, self.weights, state_step)
        info: dict[str, object] = {}
        if keep_states:
            st = dict(zip(("w", "ir", "pq", "po"), states))
            if self.has_snow:
                st.update({f"snow_{k}": snow_states[j] for j, k in enumerate(snow17.STATE_NAMES)})
            info = {"states": st, "state_step": state_step}
        return self._result(q, sm, ff, sf, params, time.perf_counter() - t0, info, snow)

    def run_batch(self, param_sets: Sequence[Mapping[str, float] | None]) -> list[SimulationResult]:
        """Simulate many parameter sets in one compiled call (threads over the sets)."""
        if not param_sets:
            return []
        sets = [self._validated(p) for p in param_sets]
        precip, snow = self.precip, None
        if self.has_snow:
            snow_sets = {self.snow_params(p).tobytes() for p in sets}
            if len(snow_sets) > 1:  # each member has its own melt: one run each
                return [self.run(p) for p in sets]
            precip, swe, _ = self.run_snow(sets[0])
            snow = (self._snow_mean(precip), swe)
        t0 = time.perf_counter()
        nps = [self.node_params(p) for p in sets]
        step_s = self.dt_hours * 3600.0
        kern = kernel()
        tgs = [kern.interflow_targets(self.net.down, self.net.dx, self.net.slope, p.under, p.channel, step_s)
               for p in nps]
        par, channel = stack_batch(nps)
        pq0, po0 = self._flow_states()
        q, sm, ff, sf = kern.run_batch_kernel(
            precip, self.pet, self.dt_hours, par, channel, pq0, po0, self.net.down, self.net.dx, self.net.area,
            *(np.stack([t[j] for t in tgs]) for j in range(4)), self.net.gauge_nodes, self.weights)
        wall = (time.perf_counter() - t0) / len(sets)
        return [self._result(q[k], sm[k], ff[k], sf[k], p, wall, {"batch_size": len(sets)}, snow)
                for k, p in enumerate(sets)]

    def _result(self, q, sm, ff, sf, params: ParamValues, wall, info, snow=None) -> SimulationResult:
        """``params``: the run's validated overrides. ``snow``: (gauge-mean Snow-17 outflow [T, G], which EF5
        prints as Precip, and SWE [T, G]) or None."""
        if not np.all(np.isfinite(q)):
            bad = int(np.argmax(~np.isfinite(q).all(axis=1)))
            gauge = self.net.gauge_names[int(np.argmax(~np.isfinite(q[bad])))]
            used = {**self.base_params, **self.base_snow_params, **params}
            raise SimulationError(f"{self.control.path}: non-finite discharge at gauge {gauge!r}, step "
                                  f"{self.steps[bad]:%Y-%m-%d %H:%M}, with parameters {used} (overrides: "
                                  f"{dict(params or {})})",
                                  fix="check the parameter values (EF5 would print a shifted row here)")
        gauges = {}
        precip_mean = self.precip_mean if snow is None else snow[0]
        for gi, gname in enumerate(self.net.gauge_names):
            extra = {} if snow is None else {"temperature": self.temp_mean[:, gi], "swe": snow[1][:, gi]}
            gauges[gname] = GaugeSeries(q[:, gi], self.observed[gname], precip_mean[:, gi], self.pet_mean[:, gi],
                                        sm[:, gi], ff[:, gi], sf[:, gi], **extra)
        used = {**self.base_params, **self.base_snow_params, **params}
        return SimulationResult(self.times, self.primary, gauges, self.warmup, used, wall,
                                self.missing_precip, self.missing_pet, self.backend, info)

    def output_gauges(self) -> list[str]:
        """Gauges with OUTPUTTS on, in the order the basin lists them."""
        cf = self.control
        return [g for g in cf.basins[self.task.basin] if cf.gauges[g].outputts]

    def expected_fam(self) -> dict[str, float]:
        return {g: float(self.net.fac[self.net.gauge_nodes[i]]) for i, g in enumerate(self.net.gauge_names)}

    def describe(self) -> dict[str, object]:
        """Sizes and timings for logs and benchmarks."""
        return {"nodes": self.net.n, "steps": len(self.steps), "gauges": list(self.net.gauge_names),
                "dt_hours": self.dt_hours, "load_time_s": self.load_time_s,
                "missing_precip": self.missing_precip, "primary": self.primary, "snow": self.has_snow,
                "snow_physics": self.snow_physics if self.has_snow else None, "missing_temp": self.missing_temp,
                "begin": f"{self.task.time_begin:%Y-%m-%d %H:%M}", "end": f"{self.task.time_end:%Y-%m-%d %H:%M}"}


def _fmt_time(t: datetime) -> str:
    return f"{t:%Y-%m-%d %H:%M}"


# PROJ=geographic: the DEM must be in degrees on the globe. EF5 computes lengths in float32 from
# the cell size, so a cell below 1e-6 degrees (0.1 m) has no usable length.
_GEO_CELLSIZE = (1e-6, 10.0)


def _check_geographic(dem: Grid) -> None:
    """Refuse a DEM whose cell size or extent cannot be degrees of longitude and latitude."""
    fix = "PROJ=geographic needs a DEM in degrees (WGS84 longitude/latitude); reproject it, or check the header"
    lo, hi = _GEO_CELLSIZE
    if not lo <= dem.cellsize <= hi:
        raise InputError(f"{dem.path}: cellsize {dem.cellsize:g} is not a geographic cell size (PROJ=geographic "
                         f"expects {lo:g} to {hi:g} degrees)", fix=fix)
    eps = 1e-6
    if dem.yll < -90.0 - eps or dem.top > 90.0 + eps or dem.xll < -180.0 - eps or dem.right > 360.0 + eps:
        raise InputError(f"{dem.path}: the grid spans longitude {dem.xll:g}..{dem.right:g}, latitude {dem.yll:g}.."
                         f"{dem.top:g}, which is not on the globe (PROJ=geographic)", fix=fix)
