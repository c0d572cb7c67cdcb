/* The CREST water balance and kinematic-wave routing of EF5 1.2.3, in C.
 *
 * The same computation as hydroagent_hpc/sim/kernel.py (the numba kernel; its docstrings give the
 * formulas and references), written in C so that a process needs no JIT to start and so that the
 * arithmetic is C's own: a `float` here is where EF5 keeps a `float`, a `double` where EF5 has a
 * double, fpow (the double power rounded to float; see below) where EF5 calls pow(float, float) and
 * `pow` where it calls pow with a double. Both kernels give bit-identical results
 * (tests/test_ckernel.py); both agree with EF5's printed output (tests/test_golden.py,
 * tests/test_ef5_differential.py).
 *
 * Two things make it faster than a cell-by-cell loop without changing a bit of the result: cells are
 * routed by levels of the river network, every cell of a level at once (see `schedule`), and the
 * float powers of a level are computed together by a vectorised power with an exact rounding test
 * (hak_fpow_array).
 *
 * Built by hydroagent_hpc/sim/ckernel.py with `cc -O2 -fPIC -shared -ffp-contract=off
 * -fno-fast-math -march=native`: no fused multiply-adds and no reassociation outside the power's
 * approximation, so every operation rounds as written, as in EF5's x86-64 build.
 *
 * Array conventions (all C-contiguous): per-node arrays have length n, forcing is [nt][n] in
 * mm/h, gauge outputs are [nt][ng]; node order is upstream-last (routing walks i = n-1 .. 0).
 */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* Lanes of the vectorised power: 8 with AVX-512, 4 with AVX2 and FMA; elsewhere (or with FPOW_W=0) the
 * powers are plain pow calls, which measured faster than the vector code without wide FMA units. The
 * library is built for the machine it runs on (-march=native; see ckernel.py). */
#ifndef FPOW_W
#if defined(__AVX512F__)
#define FPOW_W 8
#elif defined(__AVX2__) && defined(__FMA__)
#define FPOW_W 4
#else
#define FPOW_W 0
#endif
#endif
/* The approximation may fuse multiply-adds (it only has to be within its error bound; the rounding test
 * makes the result exact); everything else is compiled with -ffp-contract=off. */
#if defined(__clang__)
#define FPOW_FAST
#define FPOW_CONTRACT _Pragma("clang fp contract(fast)")
#elif defined(__GNUC__)
#define FPOW_FAST __attribute__((optimize("fp-contract=fast")))
#define FPOW_CONTRACT
#else
#define FPOW_FAST
#define FPOW_CONTRACT
#endif

/* ---- The float power: (float)pow((double)x, (double)y), several at a time --------------------------------
 *
 * Every float power in the kernel is fpow(x, y) = (float)pow((double)x, (double)y): the double power rounded
 * to float. That is the correctly rounded float power except when the exact value lies within about one double
 * ulp of a midpoint between two floats (never seen in 2e7 random trials), so it does not depend on the C
 * library's powf, which is not correctly rounded (glibc 2.36's powf differs from it in about 6 of 10,000 calls,
 * by one float ulp; EF5 calls powf, and agrees with us to its print precision either way).
 *
 * fpow_array computes many at once, faster than pow, with the same results bit for bit, by a rounding test in
 * the manner of Ziv: a vectorised approximation a ~ x^y with relative error below 2^-42 (log2 by the atanh
 * series to s^17 after reducing x to [sqrt(1/2), sqrt(2)) * 2^e, exp2 by Taylor to degree 12 after taking out
 * the nearest integer) is rounded to float only when its last 29 bits (the double bits below float precision)
 * are more than 2^13 double ulps from the float midpoint 2^28, so that the exact value, and pow's value within
 * 0.52 ulp of it, lie between the same two midpoints as a and round to the same float. Every other lane (about
 * 3 in 100,000: near a midpoint, x not a positive normal double, |y| > 16, |log2 x| >= 64, a result outside
 * [2^-125, 2^127)) calls pow itself. tests/test_ckernel.py checks fpow_array against numpy's power on random
 * and special arguments; the kernel tests check whole runs bit for bit against the numba kernel.
 */
#if FPOW_W > 0
typedef double vdbl __attribute__((vector_size(8 * FPOW_W)));
typedef int64_t vi64 __attribute__((vector_size(8 * FPOW_W)));
typedef uint64_t vu64 __attribute__((vector_size(8 * FPOW_W)));
typedef float vflt __attribute__((vector_size(4 * FPOW_W)));

FPOW_FAST static inline __attribute__((always_inline)) vdbl vblend(vi64 m, vdbl a, vdbl b) {
    return (vdbl)((m & (vi64)a) | (~m & (vi64)b));
}

FPOW_FAST static inline __attribute__((always_inline)) vdbl vabs(vdbl a) { return (vdbl)((vi64)a & INT64_MAX); }

/* a ~ x^y (relative error < 2^-42 where *ok); *ok is -1 in lanes where (float)a == (float)pow(x, y). */
FPOW_FAST static inline __attribute__((always_inline)) vdbl pow_approx(vdbl x, vdbl y, vi64 *ok) {
    FPOW_CONTRACT
    vi64 good = (x >= 0x1p-1022) & (x <= DBL_MAX);                                  /* positive normal */
    vdbl e = (vdbl)(((vu64)x >> 52) | 0x4330000000000000ull) - (0x1p52 + 1023.0);  /* exponent, exactly */
    vdbl m = (vdbl)(((vi64)x & 0x000fffffffffffffll) | 0x3ff0000000000000ll);      /* mantissa in [1, 2) */
    vi64 big = m > 1.4142135623730951;
    m = vblend(big, m * 0.5, m);
    e = vblend(big, e + 1.0, e);
    good &= (vabs(e) < 64.0) & (vabs(y) <= 16.0);
    vdbl s = (m - 1.0) / (m + 1.0); /* log2(m) = (2 / ln 2) atanh(s), |s| < 0.172 */
    vdbl s2 = s * s;
    vdbl c = s2 * (1.0 / 17) + 1.0 / 15;
    c = s2 * c + 1.0 / 13;
    c = s2 * c + 1.0 / 11;
    c = s2 * c + 1.0 / 9;
    c = s2 * c + 1.0 / 7;
    c = s2 * c + 1.0 / 5;
    c = s2 * c + 1.0 / 3;
    vdbl s1 = 2.8853900817779268 * s;
    vdbl z = y * (e + (s1 + s1 * (s2 * c))); /* y log2 x */
    good &= vabs(z) < 120.0;
    z = (vdbl)(good & (vi64)z);
    vdbl t = z + 0x1.8p52; /* t - 1.5 * 2^52 is z rounded to an integer, k */
    vi64 k = (vi64)t - (vi64)((vdbl){0} + 0x1.8p52);
    vdbl g = (z - (t - 0x1.8p52)) * 0.6931471805599453; /* 2^(z - k) = e^g, |g| <= ln(2) / 2 */
    vdbl q = g * (1.0 / 479001600) + 1.0 / 39916800;
    q = g * q + 1.0 / 3628800;
    q = g * q + 1.0 / 362880;
    q = g * q + 1.0 / 40320;
    q = g * q + 1.0 / 5040;
    q = g * q + 1.0 / 720;
    q = g * q + 1.0 / 120;
    q = g * q + 1.0 / 24;
    q = g * q + 1.0 / 6;
    q = g * q + 0.5;
    q = g * q + 1.0;
    q = g * q + 1.0;
    vdbl a = (vdbl)((vi64)q + (k << 52)); /* times 2^k */
    vi64 below = ((vi64)a & ((1ll << 29) - 1)) - (1ll << 28); /* from the float midpoint, in double ulps */
    good &= (below > 8192) | (below < -8192);
    good &= (a >= 0x1p-125) & (a < 0x1p127);
    *ok = good;
    return a;
}
#endif

/* out[j] = (float)pow(x[j], y[j]) for j < n, bit for bit (see above). */
#if FPOW_W > 0
FPOW_FAST void hak_fpow_array(long n, const double *x, const double *y, float *out) {
    for (long j = 0; j < n; j += FPOW_W) {
        vdbl xv, yv;
        long w = n - j < FPOW_W ? n - j : FPOW_W;
        if (w == FPOW_W) {
            memcpy(&xv, x + j, sizeof xv);
            memcpy(&yv, y + j, sizeof yv);
        } else {
            for (int l = 0; l < FPOW_W; l++) {
                xv[l] = l < w ? x[j + l] : 1.0;
                yv[l] = l < w ? y[j + l] : 0.0;
            }
        }
        vi64 ok;
        vdbl a = pow_approx(xv, yv, &ok);
#if defined(__clang__) || (defined(__GNUC__) && __GNUC__ >= 9)
        vflt f = __builtin_convertvector(a, vflt);
#else /* GCC 8 (RHEL 8's default) has no __builtin_convertvector */
        vflt f;
        for (int l = 0; l < FPOW_W; l++) f[l] = (float)a[l];
#endif
        int64_t all = -1;
        for (int l = 0; l < FPOW_W; l++) all &= ok[l];
        for (int l = 0; l < w; l++) out[j + l] = all || ok[l] ? f[l] : (float)pow(x[j + l], y[j + l]);
    }
}
#else
void hak_fpow_array(long n, const double *x, const double *y, float *out) {
    for (long j = 0; j < n; j++) out[j] = (float)pow(x[j], y[j]);
}
#endif

/* The lanes the vectorised power uses in this build (0: plain pow). */
int hak_fpow_lanes(void) { return FPOW_W; }

static inline float fpow(double x, double y) { return (float)pow(x, y); }

/* The rest of one kinematic-wave solve after its first power (EF5 KWRoute::RouteInt's Newton loop). */
static float kw_newton(float est, float p, float d, float alpha, float ab, float rhs, float beta, float *pow_out) {
    double bm1 = (double)beta - 1.0;
    for (int itr = 0; itr < 10; itr++) {
        float res = (d * est + alpha * p) - rhs;
        if (!isfinite(res)) res = 0.0f;
        if (fabsf(res) < 0.01) break;
        double d1r = (double)d + (double)ab * pow((double)est, bm1);
        float d1 = isfinite(d1r) ? (float)d1r : 1.0f;
        if (!isfinite(d1)) d1 = 1.0f;
        est = est - res / d1;
        if (est < 0.0f) est = 0.0f;
        p = fpow(est, beta);
    }
    if (est < 0.0f) { /* unreachable after the clip above; kept as EF5 has it */
        est = 0.0f;
        p = fpow(0.0f, beta);
    }
    *pow_out = p;
    return est;
}

/* m independent implicit kinematic-wave solves (EF5 KWRoute::RouteInt), their powers computed together.
 * Solve j: inflow qin[j], previous flow qold[j] and its power qpow[j], lateral inflow lat[j], alpha al[j],
 * beta be[j], cell length dx[j]; writes the new flow q[j] and fpow(q[j], be[j]) to qp[j]. `ws` is scratch. */
typedef struct {
    double *x, *y;
    float *f, *a, *c, *d, *ab, *back, *est, *rhs;
    long *who;
} solve_ws;

static void kw_solve_many(long m, const double *qin, const float *qold, const float *qpow, const float *lat,
                          const float *al, const float *be, const float *dx, float dt, float *q, float *qp,
                          solve_ws *ws) {
    long np = 0;
    for (long j = 0; j < m; j++) {
        float d = dt / dx[j];
        float a = (float)(d * qin[j]);
        float c = dt * lat[j];
        ws->a[j] = a;
        ws->c[j] = c;
        ws->d[j] = d;
        ws->ab[j] = al[j] * be[j];
        ws->back[j] = 0.0f;
        if (al[j] == 0.0f) { /* no storage: the start value already meets the test */
            float est = (a + c) / d;
            q[j] = est < 0.0f ? 0.0f : est;
            qp[j] = 0.0f; /* never used while alpha is 0 */
        } else if (qin[j] + qold[j] > 0.0) {
            ws->x[np] = (qin[j] + qold[j]) / 2.0;
            ws->y[np] = (double)be[j] - 1.0;
            ws->who[np++] = j;
        }
    }
    hak_fpow_array(np, ws->x, ws->y, ws->f);
    for (long k = 0; k < np; k++) ws->back[ws->who[k]] = isfinite(ws->f[k]) ? ws->f[k] : 0.0f;
    np = 0;
    for (long j = 0; j < m; j++) {
        if (al[j] == 0.0f) continue;
        float back = ws->back[j], ab = ws->ab[j];
        float b = (ab * qold[j]) * back;
        float e = ab * back;
        float est = ((ws->a[j] + b) + ws->c[j]) / (ws->d[j] + e);
        ws->est[j] = est;
        ws->rhs[j] = (ws->a[j] + al[j] * qpow[j]) + ws->c[j];
        ws->x[np] = (double)est;
        ws->y[np] = (double)be[j];
        ws->who[np++] = j;
    }
    hak_fpow_array(np, ws->x, ws->y, ws->f);
    for (long k = 0; k < np; k++) {
        long j = ws->who[k];
        q[j] = kw_newton(ws->est[j], ws->f[k], ws->d[j], al[j], ws->ab[j], ws->rhs[j], be[j], &qp[j]);
    }
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
                float rel = fpow((double)(float)(1.0 - (double)(wi / wmi)), (double)(float)(1.0 / (double)opb));
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

/* What the routing reads and writes per cell, in one record. */
typedef struct {
    long down, t0, t1;
    double s0, s1, area, area_t0, area_t1; /* leak shares; the cell's area and its targets' */
    float dx, alpha0, alpha, beta, leaki;
    float pq, po, pq_pow, po_pow, ir; /* routing states */
    int channel;
    long orig; /* the cell's index in the caller's arrays (the record array is in level order) */
} cellrec;

/* Lists in compressed rows: the entries of row i are idx[ptr[i]] .. idx[ptr[i + 1] - 1]. */
typedef struct {
    long *ptr, *idx;
} rows;

/* The routing schedule. EF5 routes cell by cell from upstream (i = n-1) to the outlet (i = 0), each
 * cell adding its outflow to its downstream cell's inflow and its interflow leak to its targets. A cell
 * only reads what cells upstream of it wrote in the same step, so cells are grouped into levels (a cell's
 * level is one more than the highest level among the cells that write to it) and all cells of a level
 * are solved together, their powers vectorised. Every sum is still taken in EF5's order: a cell gathers
 * its inflows from a list of the cells that write to it, in decreasing index, starting from 0, as the
 * sequential loop adds them; so the results are bit-identical to the cell-by-cell loop. */
typedef struct {
    long nlev;
    rows level;                 /* the cells of each level */
    rows over, chan, inter;     /* who writes to each cell: hillslope outflow, channel outflow, leaks */
    uint8_t *inter_which;       /* per inter entry: 0 for the source's first target, 1 for its second */
} schedule;

static int rows_alloc(rows *r, long nrows, long nent) {
    r->ptr = calloc((size_t)nrows + 1, sizeof(long));
    r->idx = malloc((size_t)(nent > 0 ? nent : 1) * sizeof(long));
    return r->ptr && r->idx ? 0 : -1;
}

static void rows_free(rows *r) {
    free(r->ptr);
    free(r->idx);
}

/* Builds the schedule; -1 when out of memory, -2 when a cell writes to a cell that is not downstream
 * of it in the routing order (down, t0 and t1 must be below the cell's own index). */
static int schedule_build(schedule *sc, long n, const cellrec *cell) {
    memset(sc, 0, sizeof *sc);
    long *lev = calloc((size_t)(n > 0 ? n : 1), sizeof(long));
    long nover = 0, nchan = 0, ninter = 0;
    if (!lev) return -1;
    long nlev = n > 0 ? 1 : 0;
    for (long i = n - 1; i >= 0; i--) {
        const cellrec *c = &cell[i];
        long targets[3] = {c->down, c->channel ? -1 : c->t0, c->channel ? -1 : c->t1};
        for (int k = 0; k < 3; k++) {
            long t = targets[k];
            if (t < 0 || (k > 0 && t == i)) continue; /* a leak onto the cell itself is added after the step */
            if (t >= i) {
                free(lev);
                return -2;
            }
            if (lev[t] < lev[i] + 1) lev[t] = lev[i] + 1;
            if (lev[t] + 1 > nlev) nlev = lev[t] + 1;
        }
        if (c->down >= 0) {
            if (c->channel) nchan++;
            else nover++;
        }
        if (!c->channel) ninter += (c->t0 >= 0) + (c->t1 >= 0);
    }
    sc->nlev = nlev;
    int bad = rows_alloc(&sc->level, nlev, n) | rows_alloc(&sc->over, n, nover) | rows_alloc(&sc->chan, n, nchan) |
              rows_alloc(&sc->inter, n, ninter);
    sc->inter_which = malloc((size_t)(ninter > 0 ? ninter : 1));
    if (bad || !sc->inter_which) {
        free(lev);
        return -1;
    }
    /* counts, then offsets, then fill in decreasing source index (the order of EF5's sums) */
    for (long i = 0; i < n; i++) sc->level.ptr[lev[i] + 1]++;
    for (long i = n - 1; i >= 0; i--) {
        const cellrec *c = &cell[i];
        if (c->down >= 0) (c->channel ? sc->chan.ptr : sc->over.ptr)[c->down + 1]++;
        if (!c->channel && c->t0 >= 0) sc->inter.ptr[c->t0 + 1]++;
        if (!c->channel && c->t1 >= 0) sc->inter.ptr[c->t1 + 1]++;
    }
    for (long l = 0; l < nlev; l++) sc->level.ptr[l + 1] += sc->level.ptr[l];
    for (long i = 0; i < n; i++) {
        sc->over.ptr[i + 1] += sc->over.ptr[i];
        sc->chan.ptr[i + 1] += sc->chan.ptr[i];
        sc->inter.ptr[i + 1] += sc->inter.ptr[i];
    }
    long *fill = calloc((size_t)(n > nlev ? n : nlev) + 1, sizeof(long));
    if (!fill) {
        free(lev);
        return -1;
    }
    for (long i = n - 1; i >= 0; i--) { /* within a level: upstream first, as EF5 walks */
        sc->level.idx[sc->level.ptr[lev[i]] + fill[lev[i]]++] = i;
    }
    memset(fill, 0, ((size_t)(n > nlev ? n : nlev) + 1) * sizeof(long));
    long *fill2 = calloc((size_t)n + 1, sizeof(long)), *fill3 = calloc((size_t)n + 1, sizeof(long));
    if (!fill2 || !fill3) {
        free(lev); free(fill); free(fill2); free(fill3);
        return -1;
    }
    for (long i = n - 1; i >= 0; i--) {
        const cellrec *c = &cell[i];
        if (c->down >= 0) {
            if (c->channel) sc->chan.idx[sc->chan.ptr[c->down] + fill2[c->down]++] = i;
            else sc->over.idx[sc->over.ptr[c->down] + fill[c->down]++] = i;
        }
        if (c->channel) continue;
        if (c->t0 >= 0) {
            long e = sc->inter.ptr[c->t0] + fill3[c->t0]++;
            sc->inter.idx[e] = i;
            sc->inter_which[e] = 0;
        }
        if (c->t1 >= 0) {
            long e = sc->inter.ptr[c->t1] + fill3[c->t1]++;
            sc->inter.idx[e] = i;
            sc->inter_which[e] = 1;
        }
    }
    free(lev); free(fill); free(fill2); free(fill3);
    return 0;
}

/* Renumbers the schedule's lists into level order: row p is the list of the cell at position p, and every
 * entry is a position (the lists' order, EF5's order of the sums, is kept). -1 when out of memory. */
static int schedule_to_positions(schedule *sc, long n, const long *pos) {
    rows *lists[3] = {&sc->over, &sc->chan, &sc->inter};
    const long *perm = sc->level.idx;
    uint8_t *which = NULL;
    for (int k = 0; k < 3; k++) {
        rows *r = lists[k], q;
        long nent = r->ptr[n];
        if (rows_alloc(&q, n, nent) != 0) {
            rows_free(&q);
            return -1;
        }
        if (k == 2 && !(which = malloc((size_t)(nent > 0 ? nent : 1)))) {
            rows_free(&q);
            return -1;
        }
        q.ptr[0] = 0;
        for (long p = 0; p < n; p++) {
            long i = perm[p], e0 = r->ptr[i], len = r->ptr[i + 1] - e0;
            for (long e = 0; e < len; e++) {
                q.idx[q.ptr[p] + e] = pos[r->idx[e0 + e]];
                if (k == 2) which[q.ptr[p] + e] = sc->inter_which[e0 + e];
            }
            q.ptr[p + 1] = q.ptr[p] + len;
        }
        rows_free(r);
        *r = q;
    }
    free(sc->inter_which);
    sc->inter_which = which;
    return 0;
}

static void schedule_free(schedule *sc) {
    rows_free(&sc->level);
    rows_free(&sc->over);
    rows_free(&sc->chan);
    rows_free(&sc->inter);
    free(sc->inter_which);
}

/* The interflow that reaches cell i this step: its sources' leaks in decreasing source index, as EF5 adds them. */
static inline double gather_inter(const schedule *sc, long i, const double *leak0, const double *leak1) {
    double inter = 0.0;
    for (long e = sc->inter.ptr[i]; e < sc->inter.ptr[i + 1]; e++) {
        long src = sc->inter.idx[e];
        inter += sc->inter_which[e] ? leak1[src] : leak0[src];
    }
    return inter;
}

/* All steps for one parameter set; see kernel.run_kernel. Returns 0; -1 when out of memory; -2 when the
 * network is not in routing order. */
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
    double *sm = calloc(nn, sizeof(double));
    double *inter_in = calloc(nn, sizeof(double)); /* interflow gathered into hillslope cells this step */
    double *leak0 = calloc(nn, sizeof(double)), *leak1 = calloc(nn, sizeof(double)); /* per source, to t0 / t1 */
    float *outflow = calloc(nn, sizeof(float)); /* this step's outflow of each cell (overland or channel) */
    /* the solves of one level: inputs, outputs and scratch */
    double *s_qin = malloc(nn * sizeof(double)), *s_x = malloc(nn * sizeof(double)), *s_y = malloc(nn * sizeof(double));
    float *sf[16]; /* per-solve float arrays: 8 inputs and outputs, 8 of scratch */
    for (int k = 0; k < 16; k++) sf[k] = malloc(nn * sizeof(float));
    long *s_cell = malloc(nn * sizeof(long)), *s_who = malloc(nn * sizeof(long));
    cellrec *cell = malloc(nn * sizeof(cellrec)), *lc = malloc(nn * sizeof(cellrec));
    long *pos = malloc(nn * sizeof(long));
    schedule sc;
    memset(&sc, 0, sizeof sc);
    /* the gauges' nonzero weights, in index order (the same sums as a dense loop) */
    size_t nz = 0;
    for (long g = 0; g < ng; g++)
        for (long i = 0; i < n; i++) nz += weights[g * n + i] != 0.0;
    long *g_ptr = malloc((size_t)(ng + 1) * sizeof(long));
    long *g_idx = malloc((nz > 0 ? nz : 1) * sizeof(long));
    double *g_w = malloc((nz > 0 ? nz : 1) * sizeof(double));
    int status = -1;
    int scratch_ok = 1;
    for (int k = 0; k < 16; k++) scratch_ok &= sf[k] != NULL;
    if (!w || !fast || !slow || !sm || !inter_in || !leak0 || !leak1 || !outflow || !s_qin || !s_x ||
        !s_y || !scratch_ok || !s_cell || !s_who || !cell || !lc || !pos || !g_ptr || !g_idx || !g_w)
        goto done;
    float *s_qold = sf[0], *s_qpow = sf[1], *s_lat = sf[2], *s_al = sf[3], *s_be = sf[4], *s_dx = sf[5];
    float *s_q = sf[6], *s_qp = sf[7];
    solve_ws ws = {s_x, s_y, sf[8], sf[9], sf[10], sf[11], sf[12], sf[13], sf[14], sf[15], s_who};
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
        c->pq_pow = fpow(c->pq, c->channel ? c->beta : beta_over);
        c->po_pow = fpow(c->po, beta_over);
        st_w[i] = w[i]; /* the states "after step state_step": the initial ones until it is reached */
        st_ir[i] = c->ir;
        st_pq[i] = c->pq;
        st_po[i] = c->po;
    }
    int rc = schedule_build(&sc, n, cell);
    if (rc != 0) {
        status = rc;
        goto done;
    }
    /* the records and every routing array in level order: a level is a contiguous range of positions */
    for (long p = 0; p < n; p++) {
        long i = sc.level.idx[p];
        pos[i] = p;
        lc[p] = cell[i];
        lc[p].orig = i;
    }
    if (schedule_to_positions(&sc, n, pos) != 0) goto done;
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
        for (long l = 0; l < sc.nlev; l++) {
            long first = sc.level.ptr[l], m = sc.level.ptr[l + 1] - first;
            cellrec *cl = lc + first;
            /* overland flow of every cell of the level (a channel cell's own overland store included) */
            long mc = 0;
            for (long j = 0; j < m; j++) {
                long p = first + j;
                cellrec *c = &cl[j];
                double qin = 0.0;
                for (long e = sc.over.ptr[p]; e < sc.over.ptr[p + 1]; e++) qin += outflow[sc.over.idx[e]];
                float fast_m = (float)((double)(float)fast[c->orig] / 1000.0); /* mm to m */
                s_qin[j] = qin;
                s_al[j] = c->alpha0;
                s_be[j] = beta_over;
                s_dx[j] = c->dx;
                if (!c->channel) {
                    s_qold[j] = c->pq;
                    s_qpow[j] = c->pq_pow;
                    s_lat[j] = fast_m;
                } else {
                    double inter = gather_inter(&sc, p, leak0, leak1);
                    float slow_m = (float)((double)(float)((double)(float)slow[c->orig] + inter) / 1000.0);
                    s_qold[j] = c->po;
                    s_qpow[j] = c->po_pow;
                    s_lat[j] = fast_m + slow_m;
                    s_cell[mc++] = j;
                }
            }
            kw_solve_many(m, s_qin, s_qold, s_qpow, s_lat, s_al, s_be, s_dx, dt32, s_q, s_qp, &ws);
            for (long j = 0; j < m; j++) {
                long p = first + j;
                cellrec *c = &cl[j];
                if (c->channel) {
                    c->po_pow = s_qp[j];
                    c->po = s_q[j];
                    continue;
                }
                float q = s_q[j];
                c->pq_pow = s_qp[j];
                c->pq = q;
                outflow[p] = q;
                c->ir = c->ir + (float)slow[c->orig];
                double leak = (double)(c->ir * c->leaki);
                c->ir = (float)((double)c->ir - leak);
                if (c->ir < 0.0f) c->ir = 0.0f;
                leak0[p] = c->t0 >= 0 ? leak * c->s0 * c->area / c->area_t0 : 0.0;
                leak1[p] = c->t1 >= 0 ? leak * c->s1 * c->area / c->area_t1 : 0.0;
            }
            if (mc == 0) continue;
            /* channel flow of the level's channel cells, their overland flow as lateral inflow */
            for (long k = 0; k < mc; k++) {
                long j = s_cell[k], p = first + j;
                cellrec *c = &cl[j];
                double qin = 0.0;
                for (long e = sc.chan.ptr[p]; e < sc.chan.ptr[p + 1]; e++) qin += outflow[sc.chan.idx[e]];
                s_qin[k] = qin;
                s_qold[k] = c->pq;
                s_qpow[k] = c->pq_pow;
                s_lat[k] = s_q[j];
                s_al[k] = c->alpha;
                s_be[k] = c->beta;
                s_dx[k] = c->dx;
            }
            kw_solve_many(mc, s_qin, s_qold, s_qpow, s_lat, s_al, s_be, s_dx, dt32, s_q, s_qp, &ws);
            for (long k = 0; k < mc; k++) {
                cellrec *c = &cl[s_cell[k]];
                c->pq_pow = s_qp[k];
                c->pq = s_q[k];
                outflow[first + s_cell[k]] = s_q[k];
            }
        }
        for (long p = 0; p < n; p++) inter_in[p] = lc[p].channel ? 0.0 : gather_inter(&sc, p, leak0, leak1);
        for (long g = 0; g < ng; g++) {
            long k = (long)gauge_nodes[g], p = pos[k];
            q_out[t * ng + g] = channel[k] ? (double)outflow[p] : (double)outflow[p] * dx[k] + inter_in[p] * area[k] / 3.6;
        }
        for (long p = 0; p < n; p++) lc[p].ir = (float)((double)lc[p].ir + inter_in[p]);
        if (t == state_step || (state_step < 0 && t == nt - 1)) {
            for (long p = 0; p < n; p++) {
                long i = lc[p].orig;
                st_w[i] = w[i];
                st_ir[i] = lc[p].ir;
                st_pq[i] = lc[p].pq;
                st_po[i] = lc[p].po;
            }
        }
    }
    status = 0;
done:
    free(w); free(fast); free(slow); free(sm); free(inter_in); free(leak0); free(leak1);
    free(outflow); free(s_qin); free(s_x); free(s_y); free(s_cell); free(s_who); free(cell); free(lc); free(pos); free(g_ptr);
    free(g_idx); free(g_w);
    for (int k = 0; k < 16; k++) free(sf[k]);
    schedule_free(&sc);
    return status;
}
