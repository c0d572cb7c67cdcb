"""The compiled time loop: CREST water balance and kinematic-wave routing, as EF5 v1.2.3 does them.

Everything here is a pure function of arrays, compiled with numba (``cache=True``: the first call
in a fresh environment compiles for a few seconds, later processes load the cache).

Water balance (Wang et al. 2011, CREST; EF5 ``CRESTModel::WaterBalanceInt``), per cell and step,
with ``P = precip*dt``, ``Ep = KE*PET*dt`` (mm):

* wet (``P > Ep``): ``Ps = (P-Ep)(1-IM)``, ``Pi = (P-Ep) - Ps``; excess above capacity
  ``max(0, W-WM)`` is set aside and W clipped to WM; with ``Wmm = WM(1+B)`` and
  ``A = Wmm[1-(1-W/WM)^(1/(1+B))]`` the soil fills (``R = Ps-(WM-W)``, ``W'=WM``) when
  ``Ps + A >= Wmm``, else ``I = WM[(1-A/Wmm)^(1+B) - (1-(A+Ps)/Wmm)^(1+B)]`` (capped at Ps),
  ``R = Ps-I``, ``W'=W+I``. Interflow capacity ``FC*dt*(W+W')/(2WM)``; interflow excess is
  ``min(R, cap)`` plus the amount set aside; overland excess ``R - min(R, cap) + Pi``.
* dry: overland 0, interflow ``max(0, W-WM)``, W clipped to WM, ``E2 = (Ep-P)W/WM``,
  ``W' = W-E2`` or 0.
* Excess depths go to routing as rates in mm/s.

Kinematic wave (Chow, Maidment and Mays 1988, section 9.6; EF5 ``KWRoute::RouteInt``): each
solve is ``(dt/dx)Q + alpha Q^beta = (dt/dx)Q_in + alpha Q_old^beta + dt*lateral``, started
from the linearised scheme and refined by at most 10 Newton steps until ``|residual| < 0.01``,
clipped at zero. Hillslope cells route overland unit-width flow (``alpha0``, beta 0.6) and keep
an interflow reservoir that leaks ``LEAKI*IR`` per step; the leak travels ``UNDER*sqrt(slope)``
m/s for one step and lands on one or two cells (precomputed by :func:`interflow_targets`).
Channel cells pass their own excess plus delivered interflow through an overland solve, then a
channel solve with ``alpha``, ``beta``.
"""

from __future__ import annotations

import math
from typing import Any

import numba as nb
import numpy as np

from hydroagent_hpc.sim.record import NODE_FIELDS

__all__ = ["interflow_targets", "water_balance", "run_kernel", "run_batch_kernel"]

#: The rows of the parameter record (:data:`hydroagent_hpc.sim.record.NODE_FIELDS`), written out here so that
#: numba's cache (keyed on this file) is rebuilt when the order changes; checked at import.
_NODE_FIELDS = ("wm", "b", "im", "ke", "fc", "w0", "under", "leaki", "ir0", "alpha", "beta", "alpha0")
if _NODE_FIELDS != NODE_FIELDS:
    raise ImportError(f"hydroagent_hpc.sim.kernel: its parameter record order {_NODE_FIELDS} is not "
                      f"hydroagent_hpc.sim.record.NODE_FIELDS {NODE_FIELDS}; write the same order in both")
_WM, _B, _IM, _KE, _FC, _W0, _UNDER, _LEAKI, _IR0, _ALPHA, _BETA, _ALPHA0 = (
    _NODE_FIELDS.index(k) for k in ("wm", "b", "im", "ke", "fc", "w0", "under", "leaki", "ir0", "alpha", "beta",
                                    "alpha0"))

_JIT: dict[str, Any] = dict(cache=True, nogil=True, fastmath=False, error_model="numpy")


_F32 = np.float32


@nb.njit(**_JIT)
def _fpow(x, y):
    """EF5's ``powf(x, y)``, as the double power rounded to float: ``float32(float64(x) ** float64(y))``.

    That is the correctly rounded float power (but for exact values within about a double ulp of a
    midpoint between floats), the same on every C library. The C library's own ``powf`` is not:
    glibc 2.36's differs from it by one float ulp in about 6 of 10,000 calls on routing arguments,
    which moves a run's discharge by far less than EF5's print precision (tests/test_golden.py,
    the differential sweep). Both kernels use this definition; the C kernel vectorises it with a
    rounding test that keeps it bit for bit (``crest_kernel.c``, :func:`hydroagent_hpc.sim.ckernel.fpow_array`).
    """
    return _F32(np.float64(x) ** np.float64(y))


@nb.njit(**_JIT)
def _kw_solve(q_in, q_old, q_old_pow, lateral, alpha, beta, dt, dx):
    """One implicit kinematic-wave solve, in EF5's own mixed precision (``KWRoute::RouteInt``).

    ``q_in`` (the sum of upstream inflows) is a double in EF5; the previous flow ``q_old``, the
    lateral inflow, ``alpha``, ``beta``, ``dt`` and ``dx`` are float32 there, and so is every
    intermediate EF5 stores in a ``float`` (the start value, the right-hand side, the residual,
    its derivative, each Newton update); ``pow`` of two floats is ``powf`` (:func:`_fpow`), with a
    double it is double. We round at exactly those places. It matters: near zero flow the start value has
    ``((Q_in + Q_old)/2)^(beta-1)`` and a Newton step can clip to 0 and restart from the fallback
    derivative 1, so a float64 solve can land on another root of the stopping test and differ from
    EF5 by far more than rounding.

    ``q_old_pow`` is ``_fpow(q_old, beta)`` carried from the previous step's solve: EF5 recomputes
    the same number from the same float32 state. Returns the new flow and its ``_fpow(., beta)``.
    """
    ab = _F32(alpha * beta)
    d = _F32(dt / dx)
    a = _F32(d * q_in)
    c = _F32(dt * lateral)
    if alpha == 0.0:  # no storage: the start value already meets the test (B = E = 0)
        est = _F32(_F32(a + c) / d)
        if est < 0.0:
            est = _F32(0.0)
        return est, _F32(0.0)  # the power is never used while alpha is 0
    back = _F32(0.0)
    if q_in + q_old > 0.0:
        bd = ((q_in + q_old) / 2.0) ** (np.float64(beta) - 1.0)
        back = _F32(bd) if math.isfinite(bd) else _F32(0.0)
        if not math.isfinite(back):
            back = _F32(0.0)
    b = _F32(_F32(ab * q_old) * back)
    e = _F32(ab * back)
    est = _F32(_F32(_F32(a + b) + c) / _F32(d + e))
    # pow(float, float) is powf in EF5 (its headers bring <math.h>'s float overloads), so the
    # right-hand side and the residual are float arithmetic throughout.
    rhs = _F32(_F32(a + _F32(alpha * q_old_pow)) + c)
    beta64 = np.float64(beta)
    bm1 = beta64 - 1.0
    p = _fpow(est, beta)  # powf in EF5 (float ** float)
    for _ in range(10):
        res = _F32(_F32(d * est) + _F32(alpha * p)) - rhs
        if not math.isfinite(res):
            res = _F32(0.0)
        if abs(res) < 0.01:
            break
        # pow(float, double) is the double pow in EF5
        d1r = d + np.float64(ab) * (np.float64(est) ** bm1)
        d1 = _F32(d1r) if math.isfinite(d1r) else _F32(1.0)
        if not math.isfinite(d1):
            d1 = _F32(1.0)
        est = _F32(est - _F32(res / d1))
        if est < 0.0:
            est = _F32(0.0)
        p = _fpow(est, beta)
    est_pow = p
    if est < 0.0:
        est = _F32(0.0)
        est_pow = _fpow(0.0, beta)
    return est, est_pow


@nb.njit(**_JIT)
def interflow_targets(down, dx, slope, under, channel, step_seconds):
    """Where each hillslope cell's interflow leak lands after one step (EF5 ``InitializeRouting``).

    The leak walks downstream from the cell itself at ``UNDER*sqrt(slope)`` m/s, summing the
    crossing time ``dx/speed`` of each cell passed, and stops at the first channel cell, past the
    outlet (lost), or when the step is used up; then it is split linearly between the last two
    cells by time. Returns ``(target0, target1, share0, share1)`` with -1 for no target.
    """
    n = down.size
    t0 = np.full(n, -1, np.int64)
    t1 = np.full(n, -1, np.int64)
    s0 = np.zeros(n)
    s1 = np.zeros(n)
    cross = np.empty(n, dtype=np.float32)
    step = _F32(step_seconds)
    for i in range(n):
        # EF5: float speed = UNDER * powf(slope, 0.5f); float time = dx / speed
        speed = _F32(_F32(under[i]) * _F32(math.sqrt(np.float64(_F32(slope[i])))))
        cross[i] = _F32(_F32(dx[i]) / speed) if speed > 0.0 else _F32(math.inf)
    for i in range(n):
        prev_s = _F32(0.0)
        cur_s = _F32(0.0)
        cur = i
        prev = -1
        while cur_s < step and cur >= 0 and not channel[cur]:
            prev_s = cur_s
            prev = cur
            cur_s = _F32(cur_s + cross[cur])
            cur = down[cur]
        t0[i] = cur
        t1[i] = prev
        if cur >= 0 and not channel[cur]:
            if cur_s - prev_s > 0.0:
                if math.isinf(cur_s):
                    s0[i] = 0.0
                else:
                    s0[i] = _F32(_F32(step - prev_s) / _F32(cur_s - prev_s))
                s1[i] = 1.0 - s0[i]
        else:
            s0[i] = 1.0
            s1[i] = 0.0
    return t0, t1, s0, s1


@nb.njit(**_JIT)
def water_balance(precip, pet, t, dt_hours, wm, b, im, ke, fc, w, fast, slow, sm):
    """CREST's water balance for every cell over step ``t`` (EF5 ``CRESTModel::WaterBalanceInt``).

    Cells are independent. Per cell, with ``P = precip*dt`` and ``Ep = KE*PET*dt`` (mm):

    * wet (``P > Ep``): ``Ps = (P-Ep)(1-IM)``, ``Pi = (P-Ep) - Ps``; water above capacity
      ``max(0, W-WM)`` is set aside and W clipped to WM; with ``Wmm = WM(1+B)`` and
      ``A = Wmm[1-(1-W/WM)^(1/(1+B))]`` the soil fills when ``Ps + A >= Wmm`` (``R = Ps-(WM-W)``,
      ``W' = WM``), else ``I = WM[(1-W/WM) - (1-(A+Ps)/Wmm)^(1+B)]`` (capped at Ps), ``R = Ps-I``,
      ``W' = W+I``; interflow ``min(R, FC*dt*(W+W')/(2WM))`` plus the amount set aside; overland
      the rest of R plus Pi.
    * dry: no overland excess, interflow ``max(0, W-WM)``, W clipped to WM, ``E2 = (Ep-P)W/WM``,
      ``W' = W-E2`` if ``E2 < W`` else 0.

    Updates in place: ``w`` (mm), ``fast`` and ``slow`` (the overland and interflow excess as
    rates in mm/s) and ``sm`` (soil water in % of WM).

    Precision as EF5's: the arithmetic is double, but EF5 keeps the soil water, the parameters and
    the excess rates in ``float``, and forms ``P``, ``PET*dt``, ``WM(1+B)``, ``W/WM``, ``1-W/WM``,
    ``1/(1+B)``, ``(1-W/WM)^(1/(1+B))`` (``powf``), ``WM-W`` and ``FC*dt`` from floats in float
    arithmetic; we round at those places.
    """
    n = w.size
    dth = _F32(dt_hours)
    step32 = _F32(dt_hours * 3600.0)  # EF5: stepHours * 3600.0f
    for i in range(n):
        p = np.float64(_F32(_F32(precip[t, i]) * dth))
        ep = np.float64(_F32(_F32(pet[t, i]) * dth)) * ke[i]
        wmi = _F32(wm[i])
        wi = _F32(w[i])
        if p > ep:
            ps = (p - ep) * np.float64(_F32(1.0 - _F32(im[i])))
            pi = p - ep - ps
            extra = np.float64(_F32(wi - wmi))
            if extra < 0.0:
                extra = 0.0
            if wi > wmi:
                wi = wmi
            if wi < wmi:
                opb = _F32(1.0 + _F32(b[i]))
                wmm = np.float64(_F32(wmi * opb))
                # pow(float, float) is powf in EF5 (its headers bring <math.h>'s float overloads)
                rel = _fpow(_F32(1.0 - _F32(wi / wmi)), _F32(1.0 / opb))  # float ** float: powf
                a = wmm * np.float64(_F32(1.0 - rel))
                if ps + a >= wmm:
                    r = ps - np.float64(_F32(wmi - wi))
                    if r < 0.0:
                        r = 0.0
                    wo = np.float64(wmi)
                else:
                    infil = wmi * ((1.0 - a / wmm) ** np.float64(opb) - (1.0 - (a + ps) / wmm) ** np.float64(opb))
                    if infil > ps:
                        infil = ps
                    r = ps - infil
                    if r < 0.0:
                        r = 0.0
                    wo = wi + infil
            else:
                r = ps
                wo = np.float64(wmi)
            cap = (wi + wo) / wmi / 2.0 * np.float64(_F32(_F32(fc[i]) * dth))
            inter = r if r <= cap else cap
            over = r - inter + pi
            inter += extra
        else:
            over = 0.0
            inter = np.float64(_F32(wi - wmi))
            if inter < 0.0:
                inter = 0.0
            if wi > wmi:
                wi = wmi
            e2 = (ep - p) * wi / wmi
            if e2 < wi:
                wo = wi - e2
            else:
                wo = 0.0
        w32 = _F32(wo)
        w[i] = w32
        fast[i] = _F32(over / step32)
        slow[i] = _F32(inter / step32)
        sm[i] = _F32(w32 * 100.0 / wmi)


@nb.njit(**_JIT)
def run_kernel(precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauge_nodes, weights,
               state_step):
    """Simulate all steps for one parameter set.

    Each step: :func:`water_balance` over all cells, the area-weighted gauge averages, then the
    kinematic-wave routing from upstream to downstream.
    ``precip``/``pet`` are [T, N] rates in mm/h. Returns discharge [T, G] at the gauge nodes,
    area-weighted soil moisture (% of WM), fast and slow excess (mm/s) [T, G], and the states
    (W, IR, pCQ, pOQ) after step ``state_step`` (or after the last step if it is -1).
    ``par`` is the parameter record [len(NODE_FIELDS), N] (:mod:`hydroagent_hpc.sim.record`).
    """
    wm, b, im, ke, fc, w0 = par[_WM], par[_B], par[_IM], par[_KE], par[_FC], par[_W0]
    leaki, ir0, alpha, beta, alpha0 = par[_LEAKI], par[_IR0], par[_ALPHA], par[_BETA], par[_ALPHA0]
    nt, n = precip.shape
    ng = gauge_nodes.size
    step_s = dt_hours * 3600.0
    dt32 = _F32(step_s)  # EF5: stepHours * 3600.0f
    w = w0.copy()
    # The routing states are float32 in EF5 (KWGridNode::states); the inflow sums are doubles.
    ir = ir0.astype(np.float32)
    pq = pq0.astype(np.float32)
    po = po0.astype(np.float32)
    # q**beta of the previous flows, carried between steps (beta 0.6 for overland flow)
    pq_pow = np.empty(n, np.float32)
    po_pow = np.empty(n, np.float32)
    for i in range(n):
        pq_pow[i] = _fpow(pq[i], _F32(beta[i]) if channel[i] else _F32(0.6))  # powf, as EF5 each step
        po_pow[i] = _fpow(po[i], _F32(0.6))
    fast = np.zeros(n)
    slow = np.zeros(n)
    sm = np.zeros(n)
    in_over = np.zeros(n)
    in_chan = np.zeros(n)
    in_inter = np.zeros(n)
    inc_fast = np.zeros(n)
    q_out = np.zeros((nt, ng))
    sm_out = np.zeros((nt, ng))
    ff_out = np.zeros((nt, ng))
    sf_out = np.zeros((nt, ng))
    st_w = w.copy()
    st_ir = ir.astype(np.float64)
    st_pq = pq.astype(np.float64)
    st_po = po.astype(np.float64)
    beta_over = _F32(0.6)
    # the gauges' nonzero weights, in index order (the sums below add in the same order as a dense loop)
    g_ptr = np.zeros(ng + 1, np.int64)
    for g in range(ng):
        g_ptr[g + 1] = g_ptr[g] + np.count_nonzero(weights[g])
    g_idx = np.empty(g_ptr[ng], np.int64)
    g_w = np.empty(g_ptr[ng])
    j = 0
    for g in range(ng):
        for i in range(n):
            if weights[g, i] != 0.0:
                g_idx[j] = i
                g_w[j] = weights[g, i]
                j += 1
    for t in range(nt):
        # --- water balance, every cell independent ---
        water_balance(precip, pet, t, dt_hours, wm, b, im, ke, fc, w, fast, slow, sm)
        for g in range(ng):
            acc_sm = 0.0
            acc_ff = 0.0
            acc_sf = 0.0
            for j in range(g_ptr[g], g_ptr[g + 1]):
                i = g_idx[j]
                wgt = g_w[j]
                acc_sm += wgt * sm[i]
                acc_ff += wgt * fast[i]
                acc_sf += wgt * slow[i]
            sm_out[t, g] = acc_sm
            ff_out[t, g] = acc_ff
            sf_out[t, g] = acc_sf
        # --- routing, upstream to downstream, rounded where EF5 stores a float ---
        for i in range(n - 1, -1, -1):
            dn = down[i]
            dxi = _F32(dx[i])
            fast_m = _F32(np.float64(_F32(fast[i])) / 1000.0)  # mm to m
            if not channel[i]:
                q, pq_pow[i] = _kw_solve(in_over[i], pq[i], pq_pow[i], fast_m, _F32(alpha0[i]), beta_over, dt32, dxi)
                pq[i] = q
                if dn >= 0:
                    in_over[dn] += q
                inc_fast[i] = q
                ir[i] = _F32(ir[i] + _F32(slow[i]))
                leak = np.float64(_F32(ir[i] * _F32(leaki[i])))
                ir[i] = _F32(np.float64(ir[i]) - leak)
                if ir[i] < 0.0:
                    ir[i] = _F32(0.0)
                k = t0[i]
                if k >= 0:
                    in_inter[k] += leak * s0[i] * area[i] / area[k]
                k = t1[i]
                if k >= 0:
                    in_inter[k] += leak * s1[i] * area[i] / area[k]
            else:
                slow_m = _F32(np.float64(_F32(np.float64(_F32(slow[i])) + in_inter[i])) / 1000.0)
                lateral = _F32(fast_m + slow_m)
                q, po_pow[i] = _kw_solve(in_over[i], po[i], po_pow[i], lateral, _F32(alpha0[i]), beta_over, dt32,
                                         dxi)
                po[i] = q
                qc, pq_pow[i] = _kw_solve(in_chan[i], pq[i], pq_pow[i], q, _F32(alpha[i]), _F32(beta[i]), dt32, dxi)
                pq[i] = qc
                if dn >= 0:
                    in_chan[dn] += qc
                inc_fast[i] = qc
                in_inter[i] = 0.0
        for g in range(ng):
            k = gauge_nodes[g]
            if channel[k]:
                q_out[t, g] = inc_fast[k]
            else:
                q_out[t, g] = inc_fast[k] * dx[k] + in_inter[k] * area[k] / 3.6
        for i in range(n):
            ir[i] = _F32(np.float64(ir[i]) + in_inter[i])
            in_inter[i] = 0.0
            in_over[i] = 0.0
            in_chan[i] = 0.0
        if t == state_step:
            st_w[:] = w
            st_ir[:] = ir
            st_pq[:] = pq
            st_po[:] = po
    if state_step < 0:
        st_w[:] = w
        st_ir[:] = ir
        st_pq[:] = pq
        st_po[:] = po
    return q_out, sm_out, ff_out, sf_out, st_w, st_ir, st_pq, st_po


@nb.njit(parallel=True, **_JIT)
def run_batch_kernel(precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0, s1, gauge_nodes,
                     weights):
    """``run_kernel`` for K parameter sets at once: ``par`` is the batch record [len(NODE_FIELDS), K, N],
    ``channel`` and the interflow targets have a leading axis K.

    The K members run in parallel threads; forcing and geometry are shared. Returns discharge
    [K, T, G] and soil moisture, fast and slow excess, each [K, T, G].
    """
    k_sets = par.shape[1]
    nt = precip.shape[0]
    ng = gauge_nodes.size
    q = np.zeros((k_sets, nt, ng))
    sm = np.zeros((k_sets, nt, ng))
    ff = np.zeros((k_sets, nt, ng))
    sf = np.zeros((k_sets, nt, ng))
    for k in nb.prange(k_sets):
        res = run_kernel(precip, pet, dt_hours, np.ascontiguousarray(par[:, k, :]), channel[k], pq0, po0, down, dx,
                         area, t0[k], t1[k], s0[k], s1[k], gauge_nodes, weights, -1)
        q[k] = res[0]
        sm[k] = res[1]
        ff[k] = res[2]
        sf[k] = res[3]
    return q, sm, ff, sf
