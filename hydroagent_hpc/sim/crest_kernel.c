/* The CREST water balance and kinematic-wave routing of EF5 1.2.3, in C.
 *
 * The same computation as hydroagent_hpc/sim/kernel.py (the numba kernel; its docstrings give the
 * formulas and references), written in C so that a process needs no JIT to start and so that the
 * arithmetic is C's own: a `float` here is where EF5 keeps a `float`, a `double` where EF5 has a
 * double, `powf` where EF5 calls pow(float, float) and `pow` where it calls pow with a double.
 * Both kernels give bit-identical results (tests/test_ckernel.py); both agree with EF5's printed
 * output (tests/test_golden.py, tests/test_ef5_differential.py).
 *
 * Built by hydroagent_hpc/sim/ckernel.py with `cc -O2 -fPIC -shared -ffp-contract=off
 * -fno-fast-math`: no fused multiply-adds and no reassociation, so every operation rounds as
 * written, as in EF5's x86-64 build.
 *
 * Array conventions (all C-contiguous): per-node arrays have length n, forcing is [nt][n] in
 * mm/h, gauge outputs are [nt][ng]; node order is upstream-last (routing walks i = n-1 .. 0).
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One implicit kinematic-wave solve (EF5 KWRoute::RouteInt); writes powf(new flow, beta) to *pow_out. */
static float kw_solve(double q_in, float q_old, float q_old_pow, float lateral, float alpha, float beta,
                      float dt, float dx, float *pow_out) {
    float ab = alpha * beta;
    float d = dt / dx;
    float a = (float)(d * q_in);
    float c = dt * lateral;
    if (alpha == 0.0f) { /* no storage: the start value already meets the test */
        float est = (a + c) / d;
        if (est < 0.0f) est = 0.0f;
        *pow_out = 0.0f; /* never used while alpha is 0 */
        return est;
    }
    float back = 0.0f;
    if (q_in + q_old > 0.0) {
        double bd = pow((q_in + q_old) / 2.0, (double)beta - 1.0);
        back = isfinite(bd) ? (float)bd : 0.0f;
        if (!isfinite(back)) back = 0.0f;
    }
    float b = (ab * q_old) * back;
    float e = ab * back;
    float est = ((a + b) + c) / (d + e);
    float rhs = (a + alpha * q_old_pow) + c;
    double bm1 = (double)beta - 1.0;
    float p = powf(est, beta);
    for (int itr = 0; itr < 10; itr++) {
        float res = (d * est + alpha * p) - rhs;
        if (!isfinite(res)) res = 0.0f;
        if (fabsf(res) < 0.01) break;
        double d1r = (double)d + (double)ab * pow((double)est, bm1);
        float d1 = isfinite(d1r) ? (float)d1r : 1.0f;
        if (!isfinite(d1)) d1 = 1.0f;
        est = est - res / d1;
        if (est < 0.0f) est = 0.0f;
        p = powf(est, beta);
    }
    if (est < 0.0f) { /* unreachable after the clip above; kept as EF5 has it */
        est = 0.0f;
        p = powf(0.0f, beta);
    }
    *pow_out = p;
    return est;
}

/* CREST's water balance for every cell over step t (EF5 CRESTModel::WaterBalanceInt). */
static void water_balance(const double *precip, const double *pet, long t, long n, double dt_hours,
                          const double *wm, const double *b, const double *im, const double *ke, const double *fc,
                          double *w, double *fast, double *slow, double *sm) {
    float dth = (float)dt_hours;
    float step32 = (float)(dt_hours * 3600.0);
    const double *pr = precip + t * n, *pe = pet + t * n;
    for (long i = 0; i < n; i++) {
        double p = (double)((float)pr[i] * dth);
        double ep = (double)((float)pe[i] * dth) * ke[i];
        float wmi = (float)wm[i];
        float wi = (float)w[i];
        double over, inter, wo;
        if (p > ep) {
            double ps = (p - ep) * (double)(float)(1.0 - (double)(float)im[i]);
            double pi = p - ep - ps;
            double extra = (double)(wi - wmi);
            if (extra < 0.0) extra = 0.0;
            if (wi > wmi) wi = wmi;
            double r;
            if (wi < wmi) {
                float opb = (float)(1.0 + (double)(float)b[i]);
                double wmm = (double)(wmi * opb);
                float rel = powf((float)(1.0 - (double)(wi / wmi)), (float)(1.0 / (double)opb));
                double a = wmm * (double)(float)(1.0 - (double)rel);
                if (ps + a >= wmm) {
                    r = ps - (double)(wmi - wi);
                    if (r < 0.0) r = 0.0;
                    wo = (double)wmi;
                } else {
                    double infil = (double)wmi * (pow(1.0 - a / wmm, (double)opb) - pow(1.0 - (a + ps) / wmm, (double)opb));
                    if (infil > ps) infil = ps;
                    r = ps - infil;
                    if (r < 0.0) r = 0.0;
                    wo = (double)wi + infil;
                }
            } else {
                r = ps;
                wo = (double)wmi;
            }
            double cap = ((double)wi + wo) / (double)wmi / 2.0 * (double)((float)fc[i] * dth);
            inter = r <= cap ? r : cap;
            over = r - inter + pi;
            inter += extra;
        } else {
            over = 0.0;
            inter = (double)(wi - wmi);
            if (inter < 0.0) inter = 0.0;
            if (wi > wmi) wi = wmi;
            double e2 = (ep - p) * (double)wi / (double)wmi;
            wo = e2 < (double)wi ? (double)wi - e2 : 0.0;
        }
        float w32 = (float)wo;
        w[i] = w32;
        fast[i] = (float)(over / (double)step32);
        slow[i] = (float)(inter / (double)step32);
        sm[i] = (float)((double)w32 * 100.0 / (double)wmi);
    }
}

/* Where each hillslope cell's interflow leak lands after one step (EF5 InitializeRouting). */
void hak_interflow_targets(long n, const int64_t *down, const double *dx, const double *slope, const double *under,
                           const uint8_t *channel, double step_seconds, int64_t *t0, int64_t *t1, double *s0,
                           double *s1) {
    float *cross = (float *)malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    float step = (float)step_seconds;
    for (long i = 0; i < n; i++) {
        float speed = (float)under[i] * (float)sqrt((double)(float)slope[i]);
        cross[i] = speed > 0.0f ? (float)dx[i] / speed : INFINITY;
    }
    for (long i = 0; i < n; i++) {
        float prev_s = 0.0f, cur_s = 0.0f;
        long cur = i, prev = -1;
        while (cur_s < step && cur >= 0 && !channel[cur]) {
            prev_s = cur_s;
            prev = cur;
            cur_s = cur_s + cross[cur];
            cur = (long)down[cur];
        }
        t0[i] = cur;
        t1[i] = prev;
        s0[i] = 0.0;
        s1[i] = 0.0;
        if (cur >= 0 && !channel[cur]) {
            if (cur_s - prev_s > 0.0f) {
                s0[i] = isinf(cur_s) ? 0.0 : (double)((step - prev_s) / (cur_s - prev_s));
                s1[i] = 1.0 - s0[i];
            }
        } else {
            s0[i] = 1.0;
            s1[i] = 0.0;
        }
    }
    free(cross);
}

/* What the routing loop reads and writes per cell, in one record (the loop walks cells in order;
 * one or two cache lines per cell instead of one line from each of two dozen arrays). */
typedef struct {
    long down, t0, t1;
    double s0, s1, area, area_t0, area_t1; /* leak shares; the cell's area and its targets' */
    float dx, alpha0, alpha, beta, leaki;
    float pq, po, pq_pow, po_pow, ir; /* routing states */
    int channel;
} cellrec;

/* All steps for one parameter set; see kernel.run_kernel. Returns 0, or -1 when out of memory. */
int hak_run(long nt, long n, long ng, const double *precip, const double *pet, double dt_hours,
            const double *wm, const double *b, const double *im, const double *ke, const double *fc,
            const double *w0, const double *leaki, const double *alpha, const double *beta, const double *alpha0,
            const uint8_t *channel, const double *ir0, const double *pq0, const double *po0, const int64_t *down,
            const double *dx, const double *area, const int64_t *t0, const int64_t *t1, const double *s0,
            const double *s1, const int64_t *gauge_nodes, const double *weights, long state_step,
            double *q_out, double *sm_out, double *ff_out, double *sf_out,
            double *st_w, double *st_ir, double *st_pq, double *st_po) {
    double step_s = dt_hours * 3600.0;
    float dt32 = (float)step_s;
    const float beta_over = 0.6f;
    size_t nn = (size_t)(n > 0 ? n : 1);
    double *w = malloc(nn * sizeof(double)), *fast = calloc(nn, sizeof(double)), *slow = calloc(nn, sizeof(double));
    double *sm = calloc(nn, sizeof(double)), *in_over = calloc(nn, sizeof(double)), *in_chan = calloc(nn, sizeof(double));
    double *in_inter = calloc(nn, sizeof(double)), *inc_fast = calloc(nn, sizeof(double));
    cellrec *cell = malloc(nn * sizeof(cellrec));
    /* the gauges' nonzero weights, in index order (the same sums as a dense loop) */
    size_t nz = 0;
    for (long g = 0; g < ng; g++)
        for (long i = 0; i < n; i++) nz += weights[g * n + i] != 0.0;
    long *g_ptr = malloc((size_t)(ng + 1) * sizeof(long));
    long *g_idx = malloc((nz > 0 ? nz : 1) * sizeof(long));
    double *g_w = malloc((nz > 0 ? nz : 1) * sizeof(double));
    int status = -1;
    if (!w || !fast || !slow || !sm || !in_over || !in_chan || !in_inter || !inc_fast || !cell || !g_ptr || !g_idx ||
        !g_w)
        goto done;
    g_ptr[0] = 0;
    for (long g = 0, j = 0; g < ng; g++) {
        for (long i = 0; i < n; i++) {
            if (weights[g * n + i] != 0.0) {
                g_idx[j] = i;
                g_w[j] = weights[g * n + i];
                j++;
            }
        }
        g_ptr[g + 1] = j;
    }
    for (long i = 0; i < n; i++) {
        cellrec *c = &cell[i];
        c->down = (long)down[i];
        c->t0 = (long)t0[i];
        c->t1 = (long)t1[i];
        c->s0 = s0[i];
        c->s1 = s1[i];
        c->area = area[i];
        c->area_t0 = c->t0 >= 0 ? area[c->t0] : 1.0;
        c->area_t1 = c->t1 >= 0 ? area[c->t1] : 1.0;
        c->dx = (float)dx[i];
        c->alpha0 = (float)alpha0[i];
        c->alpha = (float)alpha[i];
        c->beta = (float)beta[i];
        c->leaki = (float)leaki[i];
        c->channel = channel[i] != 0;
        w[i] = w0[i];
        c->ir = (float)ir0[i];
        c->pq = (float)pq0[i];
        c->po = (float)po0[i];
        c->pq_pow = powf(c->pq, c->channel ? c->beta : beta_over);
        c->po_pow = powf(c->po, beta_over);
        st_w[i] = w[i]; /* the states "after step state_step": the initial ones until it is reached */
        st_ir[i] = c->ir;
        st_pq[i] = c->pq;
        st_po[i] = c->po;
    }
    for (long t = 0; t < nt; t++) {
        water_balance(precip, pet, t, n, dt_hours, wm, b, im, ke, fc, w, fast, slow, sm);
        for (long g = 0; g < ng; g++) {
            double acc_sm = 0.0, acc_ff = 0.0, acc_sf = 0.0;
            for (long j = g_ptr[g]; j < g_ptr[g + 1]; j++) {
                long i = g_idx[j];
                acc_sm += g_w[j] * sm[i];
                acc_ff += g_w[j] * fast[i];
                acc_sf += g_w[j] * slow[i];
            }
            sm_out[t * ng + g] = acc_sm;
            ff_out[t * ng + g] = acc_ff;
            sf_out[t * ng + g] = acc_sf;
        }
        for (long i = n - 1; i >= 0; i--) {
            cellrec *c = &cell[i];
            long dn = c->down;
            float fast_m = (float)((double)(float)fast[i] / 1000.0); /* mm to m */
            if (!c->channel) {
                float qp;
                float q = kw_solve(in_over[i], c->pq, c->pq_pow, fast_m, c->alpha0, beta_over, dt32, c->dx, &qp);
                c->pq_pow = qp;
                c->pq = q;
                if (dn >= 0) in_over[dn] += q;
                inc_fast[i] = q;
                c->ir = c->ir + (float)slow[i];
                double leak = (double)(c->ir * c->leaki);
                c->ir = (float)((double)c->ir - leak);
                if (c->ir < 0.0f) c->ir = 0.0f;
                if (c->t0 >= 0) in_inter[c->t0] += leak * c->s0 * c->area / c->area_t0;
                if (c->t1 >= 0) in_inter[c->t1] += leak * c->s1 * c->area / c->area_t1;
            } else {
                float slow_m = (float)((double)(float)((double)(float)slow[i] + in_inter[i]) / 1000.0);
                float lateral = fast_m + slow_m;
                float op, qp;
                float q = kw_solve(in_over[i], c->po, c->po_pow, lateral, c->alpha0, beta_over, dt32, c->dx, &op);
                c->po_pow = op;
                c->po = q;
                float qc = kw_solve(in_chan[i], c->pq, c->pq_pow, q, c->alpha, c->beta, dt32, c->dx, &qp);
                c->pq_pow = qp;
                c->pq = qc;
                if (dn >= 0) in_chan[dn] += qc;
                inc_fast[i] = qc;
                in_inter[i] = 0.0;
            }
        }
        for (long g = 0; g < ng; g++) {
            long k = (long)gauge_nodes[g];
            q_out[t * ng + g] = channel[k] ? inc_fast[k] : inc_fast[k] * dx[k] + in_inter[k] * area[k] / 3.6;
        }
        for (long i = 0; i < n; i++) {
            cell[i].ir = (float)((double)cell[i].ir + in_inter[i]);
            in_inter[i] = 0.0;
            in_over[i] = 0.0;
            in_chan[i] = 0.0;
        }
        if (t == state_step || (state_step < 0 && t == nt - 1)) {
            for (long i = 0; i < n; i++) {
                st_w[i] = w[i];
                st_ir[i] = cell[i].ir;
                st_pq[i] = cell[i].pq;
                st_po[i] = cell[i].po;
            }
        }
    }
    status = 0;
done:
    free(w); free(fast); free(slow); free(sm); free(in_over); free(in_chan); free(in_inter); free(inc_fast);
    free(cell); free(g_ptr); free(g_idx); free(g_w);
    return status;
}
