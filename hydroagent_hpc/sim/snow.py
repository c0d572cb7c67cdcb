"""Snow-17 in front of CREST, as EF5 1.2.3 computes it (``Snow17Model.cpp``), in float32.

Snow-17 (Anderson 1973, 2006) is a temperature-index snow model. Per cell and step of ``dt``
hours, with air temperature ``T`` (degC) and precipitation ``P`` (mm in the step), EF5 does:

* **Form of precipitation** (``Snow17Model.cpp:137,150-165``): all snow when ``T < 1`` degC (a fixed
  threshold, EF5's ``PXTEMP``), else all rain. New snow ``Pn = P * SCF`` joins the ice ``Wi``.
* **Heat deficit from new snow** (``:172-185``): when ``T < 0``, ``dD_snow = -T * Pn / 160``.
* **Antecedent temperature index** (``:138-139,188-199``): ``ATI = T_snow`` when ``Pn > 1.5*dt`` mm, else
  ``ATI += TIPM_dt * (T - ATI)`` with ``TIPM_dt = 1 - (1-TIPM)^(dt/6)``; ``ATI <= 0``.
* **Seasonal melt factor** (``:143-148``): ``mf = (dt/6) * (Sv*(MFMAX-MFMIN) + MFMIN)``. Anderson's
  ``Sv = 0.5 sin(2 pi (n-81)/366) + 0.5`` (``n`` the day of the year); EF5 writes
  ``0.5*sinf((jday - 81*2*M_PI)/366.0) + 0.5`` with ``jday`` = ``tm_yday`` (0 on 1 January) of the
  step's end, i.e. ``sin((jday - 162 pi)/366)``: ``Sv`` stays between 0.008 and 0.31, so the melt
  factor sits near MFMIN all year (:func:`seasonal_variation`).
* **Heat deficit from the air** (``:204-208``): ``dD_T = NMF*(dt/6)*(mf/MFMAX)*(ATI - T_snow)``,
  ``T_snow = min(T, 0)``; ``mf`` already holds one ``dt/6``.
* **Melt** (``:210-252``): rain-on-snow when rain ``> 0.25*dt`` mm:
  ``sigma dt ((T+273)^4 - 273^4) + 0.0125 R T_r + 8.5 UADJ (dt/6) ((0.9 e_sat - 6.11) + 0.00057 Pa T)``
  (each term floored at 0; ``sigma = 6.12e-10`` mm/K^4/h; ``e_sat = 2.7489e8 exp(-4278.63/(T+242.792))``
  mb; ``Pa`` from the DEM, :func:`atmospheric_pressure`); otherwise ``mf (T - MBASE) + 0.0125 R T_r``
  when ``T > MBASE``. Melt beyond the ice takes the ice and the liquid water ``Wq``.
* **Ripeness and outflow** (``:254-335``): ``Qw = melt + rain``, capacity ``Wqx = PLWHC*Wi``,
  ``D += dD_snow + dD_T`` clipped to ``[0, 0.33 Wi]``; with snow, when ``Qw + Wq > D(1+PLWHC) + Wqx``
  the excess ``E = Qw + Wq - Wqx - D(1+PLWHC)`` leaves, ``Wq = Wqx``, ``Wi += D``, ``D = 0``
  (EF5 loses the ``PLWHC*D`` of liquid water Anderson keeps: ``Wq = Wqx + PLWHC*D``); else the
  water refreezes into the deficit. Without snow everything leaves. ``ATI = 0`` when ``D = 0``.
* CREST then receives ``E/dt`` (mm/h) instead of the precipitation (``Simulator.cpp:1355-1364``),
  and EF5's ``Precip`` column prints that mean.

EF5 evaluates this in ``float`` with ``double`` constants (C promotion); :func:`snow17_step`
repeats each rounding (``powf``, ``sinf``, ``expf`` and float32 products, double where a double
literal enters), so thresholds fall on the same side as in EF5.

``physics="textbook"`` (``TEXTBOOK``) changes only what EF5 gets wrong against Anderson's equations:
the seasonal melt-factor expression (with ``n = tm_yday + 1``) and the liquid water kept when a
ripe pack refreezes its deficit (mass conserved). The fixed 1 degC threshold, the rest of the
arithmetic, and what EF5 leaves out of Snow-17 (areal depletion, lagged outflow, ground melt)
stay as in EF5. See ``ef5/README.md``.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["SNOW17_PARAMS", "PHYSICS", "EF5", "TEXTBOOK", "PXTEMP", "LAPSE_RATE", "STATE_NAMES",
           "atmospheric_pressure", "seasonal_variation", "lapse_temperature", "snow17_step", "snow17_run",
           "gauge_average", "gauge_members"]

#: Snow-17 parameters in EF5's order (``Models.tbl``).
SNOW17_PARAMS = ("uadj", "mbase", "mfmax", "mfmin", "tipm", "nmf", "plwhc", "scf")
#: State grids EF5 reads and writes (``snow17_<name>_YYYYMMDD_HHUU.tif``), in EF5's order.
STATE_NAMES = ("ati", "wq", "wi", "deficit")
EF5, TEXTBOOK = "ef5", "textbook"
PHYSICS = (EF5, TEXTBOOK)
PXTEMP = 1.0  # degC: EF5's fixed rain/snow threshold (Snow17Model.cpp:137)
LAPSE_RATE = -0.0065  # degC per m: TempReader.cpp:94, only for a temperature grid with its own DEM

_JIT: dict[str, Any] = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")
_LAZY: dict[str, Callable[..., Any]] = {}  # the numba functions, compiled when first asked for


def _lazy_jit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark ``fn`` for numba; the module drops the plain name and :func:`__getattr__` jits on first use.

    A snow-free simulation never touches Snow-17, so ``hydroagent simulate`` with the C kernel does
    not import numba at all (its import and cache loading cost ~0.7 s per process).
    """
    _LAZY[fn.__name__] = fn
    return fn
F = np.float32
_TWO_PI = 2.0 * math.pi


def atmospheric_pressure(elevation_m) -> np.ndarray:
    """Air pressure (mb) from the DEM elevation (m), float32 as EF5 (``Snow17Model.cpp:33-35``).

    ``Pa = 33.86 (29.9 - 0.335 E + 0.00022 E^2.4)`` with ``E`` in hundreds of metres (Anderson 2006).
    A negative elevation gives NaN (``powf`` of a negative base), as in EF5; the rain-on-snow term
    that uses ``Pa`` is then floored to 0 by ``fmaxf``.
    """
    dem = np.asarray(elevation_m, dtype=np.float32)
    e = (dem.astype(np.float64) / 100.0).astype(np.float32)
    with np.errstate(invalid="ignore"):
        e24 = np.power(e, np.float32(2.4), dtype=np.float32)
    return (33.86 * ((29.9 - 0.335 * e.astype(np.float64)) + 0.00022 * e24.astype(np.float64))).astype(np.float32)


def lapse_temperature(temp, grid_elevation, cell_elevation) -> np.ndarray:
    """Temperature moved from its grid's elevation to the cell's: ``T + (-0.0065)(z_cell - z_grid)``.

    EF5 (``TempReader.cpp:87-96``) does this only when the temperature grid is not the DEM's shape and
    ``[TempForcing] DEM=`` names a GeoTIFF of the temperature grid's shape; float32 arithmetic.
    """
    diff = np.asarray(cell_elevation, dtype=np.float32) - np.asarray(grid_elevation, dtype=np.float32)
    mod = (LAPSE_RATE * diff.astype(np.float64)).astype(np.float32)
    return np.asarray(temp, dtype=np.float32) + mod


@_lazy_jit
def seasonal_variation(jday, textbook):
    """``Sv`` of the seasonal melt factor for ``jday`` = ``tm_yday`` (0-based) of the step's end.

    EF5: ``0.5*sinf((jday - 81*2*pi)/366) + 0.5`` (operator precedence: ``81*2*pi``); textbook:
    ``0.5*sin((n - 81)*2*pi/366) + 0.5`` with ``n = jday + 1``. Returns float32.
    """
    if textbook:
        x = (float(jday) + 1.0 - 81.0) * _TWO_PI / 366.0
    else:
        x = (float(F(jday)) - 81.0 * _TWO_PI) / 366.0
    return F(0.5 * float(np.sin(F(x))) + 0.5)


@_lazy_jit
def snow17_step(precip_rate, temp, jday, dt, uadj, mbase, mfmax, mfmin, tipm, nmf, plwhc, scf, p_atm,
                ati, wq, wi, deficit, textbook):
    """One cell, one step of EF5's ``Snow17Model::SnowBalanceInt`` (module docstring), float32.

    ``precip_rate`` mm/h, ``temp`` degC, ``dt`` hours; states ``ati`` (degC), ``wq``, ``wi``,
    ``deficit`` (mm). Returns ``(outflow mm/h, swe mm, ati, wq, wi, deficit)``.
    """
    six = F(6.0)
    one = F(1.0)
    zero = F(0.0)
    px = F(PXTEMP)
    tipm_dt = F(1.0 - float((one - tipm) ** (dt / six)))
    precip = precip_rate * dt
    sv = seasonal_variation(jday, textbook)
    mf = (dt / six) * ((sv * (mfmax - mfmin)) + mfmin)
    frac_snow = zero
    frac_rain = one
    if temp < px:
        frac_snow = one
        frac_rain = zero
    pn = precip * frac_snow * scf
    wi = wi + pn
    rain = frac_rain * precip
    t_snow = zero
    d_heat_snow = zero
    t_rain = temp
    if temp < zero:
        t_snow = temp
        d_heat_snow = F(float(-(t_snow * pn)) / 160.0)
        t_rain = px
    if float(pn) > 1.5 * float(dt):
        ati = t_snow
    else:
        ati = ati + tipm_dt * (temp - ati)
    if ati > zero:
        ati = zero
    d_heat_t = F(float(nmf) * (float(dt) / 6.0) * float(mf / mfmax) * float(ati - t_snow))
    e_sat = F(2.7489 * 100000000.0 * float(np.exp(F(-4278.63 / (float(temp) + 242.792)))))
    m_ros = zero
    rain_on_snow = float(rain) > 0.25 * float(dt)
    if rain_on_snow:
        m1 = F(6.12e-10) * dt * (F(float(temp) + 273.0) ** F(4.0) - F(273.0) ** F(4.0))
        m1 = max(m1, zero)
        m2 = max(F(0.0125 * float(rain) * float(t_rain)), zero)
        m3 = F(8.5 * float(uadj) * float(dt / six)
               * (((0.9 * float(e_sat)) - 6.11) + (0.00057 * float(p_atm) * float(temp))))
        if not m3 > zero:  # fmaxf: NaN (a negative elevation's pressure) and negatives give 0
            m3 = zero
        m_ros = m1 + m2 + m3
    m_nr = zero
    if not rain_on_snow and temp > mbase:
        m_nr = F(float(mf * (temp - mbase)) + 0.0125 * float(rain) * float(t_rain))
    melt = m_ros + m_nr
    if melt < zero:
        melt = zero
    if melt < wi:
        wi = wi - melt
    else:
        melt = wi + wq
        wi = zero
    qw = melt + rain
    wqx = plwhc * wi
    deficit = deficit + d_heat_snow + d_heat_t
    if deficit <= zero:
        deficit = zero
    elif float(deficit) > 0.33 * float(wi):
        deficit = F(0.33 * float(wi))
    excess = zero
    swe = zero
    if wi > zero:
        one_p = one + plwhc
        if (qw + wq) > ((deficit * one_p) + wqx):
            excess = qw + wq - wqx - (deficit * one_p)
            wq = wqx + plwhc * deficit if textbook else wqx
            wi = wi + deficit
            deficit = zero
        elif qw >= deficit:
            wq = wq + qw - deficit
            wi = wi + deficit
            deficit = zero
        elif qw < deficit:
            wi = wi + qw
            deficit = deficit - qw
        swe = wi + wq
    else:
        excess = qw
        wq = zero
    if deficit == zero:
        ati = zero
    return excess / dt, swe, ati, wq, wi, deficit


def gauge_members(upstream_gauges) -> np.ndarray:
    """[G, G] int64: row g lists gauge g then the gauges upstream of it (EF5's ``gaugeTree``), -1 padded."""
    ng = len(upstream_gauges)
    out = np.full((ng, ng), -1, dtype=np.int64)
    for g, ups in enumerate(upstream_gauges):
        row = [g, *ups]
        out[g, :len(row)] = row
    return out


@_lazy_jit
def _gauge_average_step(values, owner, area, members, partial_val, partial_area, out):
    """EF5's ``GaugeMap::GaugeAverage`` in float32: per-gauge partial sums of ``value*area`` in node order,
    then each gauge adds its own and its upstream gauges' partials (``members`` [G, G], -1 padded)."""
    ng = members.shape[0]
    for g in range(ng):
        partial_val[g] = F(0.0)
        partial_area[g] = F(0.0)
    for i in range(values.size):
        partial_val[owner[i]] += values[i] * area[i]
        partial_area[owner[i]] += area[i]
    for g in range(ng):
        total_val = F(0.0)
        total_area = F(0.0)
        for j in range(ng):
            k = members[g, j]
            if k < 0:
                break
            total_val += partial_val[k]
            total_area += partial_area[k]
        out[g] = total_val / total_area


@_lazy_jit
def gauge_average(values, owner, area, members):
    """:func:`_gauge_average_step` for every step of ``values`` [T, N] (float32); returns [T, G] float32."""
    nt = values.shape[0]
    ng = members.shape[0]
    out = np.zeros((nt, ng), dtype=np.float32)
    pv = np.zeros(ng, dtype=np.float32)
    pa = np.zeros(ng, dtype=np.float32)
    row = np.zeros(ng, dtype=np.float32)
    for t in range(nt):
        _gauge_average_step(values[t], owner, area, members, pv, pa, row)
        out[t] = row
    return out


@_lazy_jit
def snow17_run(precip, temp, jday, dt, params, p_atm, states, owner, area, members, textbook, state_step):
    """Snow-17 over every step and cell (cells are independent; EF5 ``Snow17Model::SnowBalance``).

    ``precip`` [T, N] mm/h (float64 holding float32 values), ``temp`` [T, N] float32 degC, ``jday``
    [T] ``tm_yday`` of each step's end, ``dt`` hours (float32), ``params`` [8, N] float32 in
    :data:`SNOW17_PARAMS` order, ``p_atm`` [N] float32, ``states`` [4, N] float32 (ati, wq, wi,
    deficit; updated in place to the end of the run); ``owner``, ``area`` (float32) and ``members``
    define the gauge averages (:func:`gauge_average`). Returns the outflow CREST receives [T, N]
    (mm/h), the gauge-mean SWE [T, G] (mm, float32 as EF5 averages it) and the states after step
    ``state_step`` [4, N] (the final states if -1).
    """
    nt, n = precip.shape
    ng = members.shape[0]
    out = np.zeros((nt, n))
    swe_mean = np.zeros((nt, ng), dtype=np.float32)
    swe = np.zeros(n, dtype=np.float32)
    pv = np.zeros(ng, dtype=np.float32)
    pa = np.zeros(ng, dtype=np.float32)
    row = np.zeros(ng, dtype=np.float32)
    saved = states.copy()
    for t in range(nt):
        for i in range(n):
            res = snow17_step(F(precip[t, i]), temp[t, i], jday[t], dt, params[0, i], params[1, i], params[2, i],
                              params[3, i], params[4, i], params[5, i], params[6, i], params[7, i], p_atm[i],
                              states[0, i], states[1, i], states[2, i], states[3, i], textbook)
            out[t, i] = res[0]
            swe[i] = res[1]
            states[0, i] = res[2]
            states[1, i] = res[3]
            states[2, i] = res[4]
            states[3, i] = res[5]
        _gauge_average_step(swe, owner, area, members, pv, pa, row)
        swe_mean[t] = row
        if t == state_step:
            saved[:, :] = states
    if state_step < 0:
        saved[:, :] = states
    return out, swe_mean, saved


for _name in _LAZY:  # the plain functions leave the namespace; __getattr__ serves the compiled ones
    del globals()[_name]


def __getattr__(name: str) -> Any:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import numba

    g = globals()
    for key, fn in _LAZY.items():  # all at once: each one's globals must name the others compiled
        if key not in g:
            g[key] = numba.njit(**_JIT)(fn)
    return g[name]
