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
 * routed by levels (the overland solves by levels of the hillslope network, then the channel solves by
 * levels of the channel network, several steps at once; see `schedule`), every cell of a level at once,
 * and the float powers and the solves of a level are computed together on vector lanes, the powers by an
 * approximation with an exact rounding test (hak_fpow_array). A batch of parameter sets on one basin
 * (hak_run_batch) solves the level of every member together.
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
 * the manner of Ziv: a vectorised approximation a ~ x^y with relative error below 2^-42 is rounded to float only
 * when its last 29 bits (the double bits below float precision) are more than 2^13 double ulps from the float
 * midpoint 2^28, so that the exact value, and pow's value within 0.52 ulp of it, lie between the same two
 * midpoints as a and round to the same float. Every other lane (about 3 in 100,000: near a midpoint, x not a
 * positive normal double, |y| > 16, |log2 x| >= 64, a result outside [2^-125, 2^127)) calls pow itself. The
 * approximation: with AVX-512, log2 and exp2 from 16-entry tables held in registers and short polynomials (no
 * division); elsewhere, or built with FPOW_NO_TABLES, log2 by the atanh series to s^17 after reducing x to
 * [sqrt(1/2), sqrt(2)) * 2^e and exp2 by Taylor to degree 12 after taking out the nearest integer.
 * tests/test_ckernel.py checks fpow_array against the C library's pow on random and special arguments, and every
 * build variant's runs bit for bit against the native build; the kernel tests check whole runs bit for bit
 * against the numba kernel.
 */
#if FPOW_W > 0
typedef double vdbl __attribute__((vector_size(8 * FPOW_W)));
typedef int64_t vi64 __attribute__((vector_size(8 * FPOW_W)));
typedef uint64_t vu64 __attribute__((vector_size(8 * FPOW_W)));
typedef float vflt __attribute__((vector_size(4 * FPOW_W)));
typedef int32_t vi32 __attribute__((vector_size(4 * FPOW_W)));

FPOW_FAST static inline __attribute__((always_inline)) vdbl vblend(vi64 m, vdbl a, vdbl b) {
    return (vdbl)((m & (vi64)a) | (~m & (vi64)b));
}

FPOW_FAST static inline __attribute__((always_inline)) vdbl vabs(vdbl a) { return (vdbl)((vi64)a & INT64_MAX); }

#if FPOW_W == 8 && defined(__AVX512F__) && !defined(FPOW_NO_TABLES)
#include <immintrin.h>
/* With AVX-512: log2 and exp2 by 16-entry tables looked up in registers (vpermt2pd: no memory gathers, which are
 * slow on some cores), so both polynomials are short and the log needs no division. Tables computed in 300-bit
 * arithmetic and rounded: c_j = 1 / (1 + (j + 1/2) / 16), -log2(c_j), 2^(j/16). */
static const double FPOW_C[16] = {
    0x1.f07c1f07c1f08p-1, 0x1.d41d41d41d41dp-1, 0x1.bacf914c1bad0p-1, 0x1.a41a41a41a41ap-1,
    0x1.8f9c18f9c18fap-1, 0x1.7d05f417d05f4p-1, 0x1.6c16c16c16c17p-1, 0x1.5c9882b931057p-1,
    0x1.4e5e0a72f0539p-1, 0x1.4141414141414p-1, 0x1.3521cfb2b78c1p-1, 0x1.29e4129e4129ep-1,
    0x1.1f7047dc11f70p-1, 0x1.15b1e5f75270dp-1, 0x1.0c9714fbcda3bp-1, 0x1.0410410410410p-1};
static const double FPOW_L[16] = {
    0x1.6bad3758efd81p-5, 0x1.08c588cda79e5p-3, 0x1.acf5e2db4ec91p-3, 0x1.24407ab0e073ap-2,
    0x1.6e221cd9d0cddp-2, 0x1.b47ebf73882a1p-2, 0x1.f7a8568cb06cep-2, 0x1.1bf311e95d00ep-1,
    0x1.3abb3faa02168p-1, 0x1.5848226989d34p-1, 0x1.74b1fd64e0754p-1, 0x1.900e6160002cep-1,
    0x1.aa708f58014d4p-1, 0x1.c3e9ca2e1a055p-1, 0x1.dc899ab3ff56cp-1, 0x1.f45e08bcf0656p-1};
static const double FPOW_T[16] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0};

static inline __attribute__((always_inline)) vdbl lookup16(const double *tab, vi64 j) {
    return (vdbl)_mm512_permutex2var_pd(_mm512_loadu_pd(tab), (__m512i)j, _mm512_loadu_pd(tab + 8));
}

/* a ~ x^y (relative error < 2^-42 where *ok); *ok is -1 in lanes where (float)a == (float)pow(x, y). log2 x =
 * e + log2(c_j^-1) + log2(1 + r), r = m c_j - 1 (|r| < 1/32, m in [1, 2) with leading bits j), the last by its
 * series to r^8; 2^z = 2^(k/16) e^g with k = round(16 z), g = (z - k/16) ln 2 (|g| < 0.022), e^g by Taylor to
 * degree 6. */
FPOW_FAST static inline __attribute__((always_inline)) vdbl pow_approx(vdbl x, vdbl y, vi64 *ok) {
    FPOW_CONTRACT
    vi64 good = (x >= 0x1p-1022) & (x <= DBL_MAX);                                  /* positive normal */
    vdbl e = (vdbl)(((vu64)x >> 52) | 0x4330000000000000ull) - (0x1p52 + 1023.0);  /* exponent, exactly */
    vdbl m = (vdbl)(((vi64)x & 0x000fffffffffffffll) | 0x3ff0000000000000ll);      /* mantissa in [1, 2) */
    vi64 j = (vi64)(((vu64)x >> 48) & 15);
    good &= (vabs(e) < 64.0) & (vabs(y) <= 16.0);
    vdbl r = m * lookup16(FPOW_C, j) - 1.0;
    vdbl r2 = r * r, r4 = r2 * r2;
    vdbl p12 = r * -0x1.71547652b82fep-1 + 0x1.71547652b82fep+0;
    vdbl p34 = r * -0x1.71547652b82fep-2 + 0x1.ec709dc3a03fdp-2;
    vdbl p56 = r * -0x1.ec709dc3a03fdp-3 + 0x1.2776c50ef9bfep-2;
    vdbl p78 = r * -0x1.71547652b82fep-3 + 0x1.a61762a7aded9p-3;
    vdbl p14 = r2 * p34 + p12, p58 = r2 * p78 + p56;
    vdbl z = y * ((e + lookup16(FPOW_L, j)) + r * (r4 * p58 + p14)); /* y log2 x */
    good &= vabs(z) < 120.0;
    z = (vdbl)(good & (vi64)z);
    vdbl t = z * 16.0 + 0x1.8p52; /* t - 1.5 * 2^52 is 16 z rounded to an integer, k */
    vi64 k = (vi64)t - (vi64)((vdbl){0} + 0x1.8p52);
    vdbl g = (z - (t - 0x1.8p52) * 0.0625) * 0x1.62e42fefa39efp-1;
    vdbl g2 = g * g, g4 = g2 * g2;
    vdbl e01 = g + 1.0, e23 = g * (1.0 / 6) + 0.5, e45 = g * (1.0 / 120) + 1.0 / 24;
    vdbl q = g4 * (g2 * (1.0 / 720) + e45) + (g2 * e23 + e01);
    vdbl a = (vdbl)((vi64)(lookup16(FPOW_T, k & 15) * q) + ((k >> 4) << 52)); /* times 2^(k/16) */
    vi64 below = ((vi64)a & ((1ll << 29) - 1)) - (1ll << 28); /* from the float midpoint, in double ulps */
    good &= (below > 8192) | (below < -8192);
    good &= (a >= 0x1p-125) & (a < 0x1p127);
    *ok = good;
    return a;
}
#else
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
    /* 1/3 + s2/5 + ... + s2^7/17 by Estrin's scheme (a shorter dependency chain than Horner's) */
    vdbl s4 = s2 * s2;
    vdbl p01 = s2 * (1.0 / 5) + 1.0 / 3, p23 = s2 * (1.0 / 9) + 1.0 / 7;
    vdbl p45 = s2 * (1.0 / 13) + 1.0 / 11, p67 = s2 * (1.0 / 17) + 1.0 / 15;
    vdbl p03 = s4 * p23 + p01, p47 = s4 * p67 + p45;
    vdbl c = (s4 * s4) * p47 + p03;
    vdbl s1 = 2.8853900817779268 * s;
    vdbl z = y * (e + (s1 + s1 * (s2 * c))); /* y log2 x */
    good &= vabs(z) < 120.0;
    z = (vdbl)(good & (vi64)z);
    vdbl t = z + 0x1.8p52; /* t - 1.5 * 2^52 is z rounded to an integer, k */
    vi64 k = (vi64)t - (vi64)((vdbl){0} + 0x1.8p52);
    vdbl g = (z - (t - 0x1.8p52)) * 0.6931471805599453; /* 2^(z - k) = e^g, |g| <= ln(2) / 2 */
    /* sum of g^i / i! for i <= 12, by Estrin's scheme */
    vdbl g2 = g * g, g4 = g2 * g2;
    vdbl e01 = g + 1.0, e23 = g * (1.0 / 6) + 0.5, e45 = g * (1.0 / 120) + 1.0 / 24;
    vdbl e67 = g * (1.0 / 5040) + 1.0 / 720, e89 = g * (1.0 / 362880) + 1.0 / 40320;
    vdbl eab = g * (1.0 / 39916800) + 1.0 / 3628800;
    vdbl e03 = g2 * e23 + e01, e47 = g2 * e67 + e45, e8b = g2 * eab + e89;
    vdbl e07 = g4 * e47 + e03, e8c = g4 * (1.0 / 479001600) + e8b;
    vdbl q = (g4 * g4) * e8c + e07;
    vdbl a = (vdbl)((vi64)q + (k << 52)); /* times 2^k */
    vi64 below = ((vi64)a & ((1ll << 29) - 1)) - (1ll << 28); /* from the float midpoint, in double ulps */
    good &= (below > 8192) | (below < -8192);
    good &= (a >= 0x1p-125) & (a < 0x1p127);
    *ok = good;
    return a;
}
#endif
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
        if (all && w == FPOW_W) {
            memcpy(out + j, &f, sizeof f);
            continue;
        }
        for (int l = 0; l < w; l++) out[j + l] = ok[l] ? f[l] : (float)pow(x[j + l], y[j + l]);
    }
}

/* fpow of every lane (bit for bit, as hak_fpow_array). */
FPOW_FAST static vflt fpow_lanes_of(vdbl x, vdbl y) {
    vi64 ok;
    vdbl a = pow_approx(x, y, &ok);
    vflt f = __builtin_convertvector(a, vflt);
    int64_t all = -1;
    for (int l = 0; l < FPOW_W; l++) all &= ok[l];
    if (!all)
        for (int l = 0; l < FPOW_W; l++)
            if (!ok[l]) f[l] = (float)pow(x[l], y[l]);
    return f;
}
#else
void hak_fpow_array(long n, const double *x, const double *y, float *out) {
    for (long j = 0; j < n; j++) out[j] = (float)pow(x[j], y[j]);
}
#endif

/* ---- The double power, several at a time: bit for bit the C library's pow ------------------------------------
 *
 * dpow_array(n, x, y, out): out[j] = pow(x[j], y[j]), as the C library computes it. With AVX-512 (and the float
 * power's register tables), 8 at a time by a double-double approximation of x^y, relative error below about 2^-66,
 * kept only when it lies more than 0.02 double ulp from the midpoint between two doubles: then the exact value and
 * glibc's pow (since 2.28 within 0.52 ulp in all, of which at most 0.0095 ulp is its own approximation error when
 * |y log x| <= 64; correctly rounded in older versions) round to the same double, the one kept. Every other lane
 * (about 4 in 100: near a midpoint, a result that is a power of two, x not a positive normal, |y| > 16,
 * |y log x| > 64) calls pow. Without those tables every element calls pow.
 *
 * ln x = e ln 2 - ln c_j + ln(1 + r), r = m c_j - 1 exactly as a double-double (|r| < 1/32), ln(1 + r) by its
 * series with r and r^2/2 in double-double and r^3 (1/3 - r/4 + ... - r^9/12) in double; e^z = 2^(k/16) e^g with
 * k = round(16 z / ln 2), g in double-double (|g| < 0.022), e^g - 1 by Taylor to g^8; the constants -ln c_j and
 * 2^(j/16) as double-doubles from 16-entry tables (rounded from 400-bit arithmetic).
 */
#if FPOW_W == 8 && defined(__AVX512F__) && !defined(FPOW_NO_TABLES)
#define DPOW_TABLES 1
static const double DPOW_LH[16] = {
    0x1.f829b0e7832f8p-6, 0x1.6f0d28ae56b4ep-4, 0x1.29552f81ff521p-3, 0x1.9525a9cf456b6p-3,
    0x1.fb9186d5e3e29p-3, 0x1.2e8e2bae11d31p-2, 0x1.5d1bdbf5809cap-2, 0x1.89a3386c1425bp-2,
    0x1.b44f77bcc8f64p-2, 0x1.dd46a04c1c4a1p-2, 0x1.02552a5a5d0ffp-1, 0x1.154c3d2f4d5eap-1,
    0x1.2795e1289b11bp-1, 0x1.393e0d3562a1ap-1, 0x1.4a4f85db03ebbp-1, 0x1.5ad404c359f2dp-1};
static const double DPOW_LL[16] = {
    0x1.33e3f04f1ef25p-60, -0x1.20db323097324p-59, 0x1.301771c407dc0p-57, -0x1.26fb3e2b1d1dap-57,
    0x1.355519b0de535p-57, -0x1.1e99b72bd7bf2p-57, -0x1.7dc9c7c23801fp-56, 0x1.2d38c40881e0bp-57,
    -0x1.a0892a8b38eedp-61, -0x1.19d95b62e2476p-62, 0x1.e9c695d7ee800p-57, 0x1.98f33a3965e29p-57,
    0x1.ade0fcf6e5a1dp-55, -0x1.38eef67f2483ap-55, -0x1.d76102e1644f2p-55, 0x1.eca6aa97c08e7p-55};
static const double DPOW_TH[16] = {
    0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0,
    0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0};
static const double DPOW_TL[16] = {
    0x0.0p+0, 0x1.8a62e4adc610bp-54, -0x1.19041b9d78a76p-55, 0x1.9b07eb6c70573p-54,
    0x1.6f46ad23182e4p-55, 0x1.ada0911f09ebcp-55, 0x1.d4397afec42e2p-56, 0x1.6324c054647adp-54,
    -0x1.bdd3413b26456p-54, -0x1.41577ee04992fp-55, 0x1.6e9f156864b27p-54, 0x1.c7c46b071f2bep-56,
    0x1.7a1cd345dcc81p-54, 0x1.11065895048ddp-55, 0x1.2ed02d75b3707p-55, -0x1.e9c23179c2893p-54};

static inline __attribute__((always_inline)) vdbl vfma(vdbl a, vdbl b, vdbl c) {
    return (vdbl)_mm512_fmadd_pd((__m512d)a, (__m512d)b, (__m512d)c);
}

/* hi + lo = a + b exactly (Knuth's two-sum) */
static inline __attribute__((always_inline)) vdbl two_sum(vdbl a, vdbl b, vdbl *lo) {
    vdbl s = a + b, bb = s - a;
    *lo = (a - (s - bb)) + (b - bb);
    return s;
}

/* a ~ x^y as R + err (relative error < ~2^-66 where *ok); *ok is -1 in lanes where R == pow(x, y). Compiled
 * without contraction: every two-sum and product error is exact as written, the fused ones by vfma. */
static inline __attribute__((always_inline)) vdbl dpow_approx(vdbl x, vdbl y, vi64 *ok) {
    vi64 good = (x >= 0x1p-1022) & (x <= DBL_MAX) & (vabs(y) <= 16.0);
    vdbl e = (vdbl)(((vu64)x >> 52) | 0x4330000000000000ull) - (0x1p52 + 1023.0);
    vdbl m = (vdbl)(((vi64)x & 0x000fffffffffffffll) | 0x3ff0000000000000ll);
    vi64 j = (vi64)(((vu64)x >> 48) & 15);
    /* r = m c_j - 1 as rh + rl, exactly */
    vdbl c = lookup16(FPOW_C, j);
    vdbl ph = m * c;
    vdbl pl = vfma(m, c, -ph);
    vdbl a = ph - 1.0; /* exact: ph is within 1/32 of 1 */
    vdbl rh = a + pl;
    vdbl rl = pl - (rh - a);
    /* ln(1 + r) = (rh - h2) + (rl - l2 + t): h2 + l2 = r^2 / 2, t = r^3 (1/3 - r/4 + ... - r^9/12) */
    vdbl s2h = rh * rh;
    vdbl s2l = vfma(rh, rh, -s2h);
    vdbl h2 = s2h * 0.5;
    vdbl l2 = s2l * 0.5 + rh * rl;
    vdbl r2 = s2h, r4 = s2h * s2h;
    vdbl q01 = rh * -0x1.0000000000000p-2 + 0x1.5555555555555p-2;
    vdbl q23 = rh * -0x1.5555555555555p-3 + 0x1.999999999999ap-3;
    vdbl q45 = rh * -0x1.0000000000000p-3 + 0x1.2492492492492p-3;
    vdbl q67 = rh * -0x1.999999999999ap-4 + 0x1.c71c71c71c71cp-4;
    vdbl q89 = rh * -0x1.5555555555555p-4 + 0x1.745d1745d1746p-4;
    vdbl q03 = r2 * q23 + q01, q47 = r2 * q67 + q45;
    vdbl q = (r4 * r4) * q89 + (r4 * q47 + q03);
    vdbl t = (rh * r2) * q;
    vdbl A = rh - h2; /* |rh| >= |h2|: fast two-sum */
    vdbl Aerr = (rh - A) - h2;
    /* ln x = (e ln2h + LH_j) + A + (LL_j + e ln2l + Aerr + rl - l2 + t); ln2h is short, so e ln2h is exact */
    const double ln2h = 0x1.62e42fefa3800p-1, ln2l = 0x1.ef35793c76730p-45;
    vdbl Bl, Cl;
    vdbl Bh = two_sum(e * ln2h, lookup16(DPOW_LH, j), &Bl);
    vdbl Ch = two_sum(Bh, A, &Cl);
    vdbl lo = ((Cl + Bl) + (lookup16(DPOW_LL, j) + e * ln2l)) + (((Aerr + rl) - l2) + t);
    vdbl xh = Ch + lo;
    vdbl xl = lo - (xh - Ch);
    /* z = y ln x */
    vdbl zh = y * xh;
    vdbl zl = vfma(y, xh, -zh) + y * xl;
    good &= vabs(zh) <= 64.0;
    zh = (vdbl)(good & (vi64)zh);
    zl = (vdbl)(good & (vi64)zl);
    /* k = round(16 z / ln 2); g = z - k ln2/16 as gh + gl (k ln2h/16 exact, the difference exact) */
    vdbl kd = zh * 0x1.71547652b82fep+4 + 0x1.8p52;
    vi64 k = (vi64)kd - (vi64)((vdbl){0} + 0x1.8p52);
    kd = kd - 0x1.8p52;
    vdbl gh = zh - kd * (ln2h / 16);
    vdbl gl = zl - kd * (ln2l / 16);
    vdbl g = gh + gl;
    gl = gl - (g - gh);
    gh = g;
    /* e^g - 1 = gh + (gl + gl gh + gh^2 (1/2 + gh/6 + ... + gh^6/8!)) */
    vdbl g2 = gh * gh;
    vdbl e01 = gh * (1.0 / 6) + 0.5, e23 = gh * (1.0 / 120) + 1.0 / 24, e45 = gh * (1.0 / 5040) + 1.0 / 720;
    vdbl e03 = g2 * e23 + e01, e46 = g2 * (1.0 / 40320) + e45;
    vdbl pq = (gl + gl * gh) + g2 * ((g2 * g2) * e46 + e03);
    /* 2^(j/16) (1 + gh + pq), j = k mod 16, as Sh + lo2 */
    vi64 kj = k & 15;
    vdbl th = lookup16(DPOW_TH, kj), tl = lookup16(DPOW_TL, kj);
    vdbl qh = th * gh;
    vdbl qe = vfma(th, gh, -qh);
    vdbl Sh = th + qh; /* |th| >= |qh|: fast two-sum */
    vdbl Sl = qh - (Sh - th);
    vdbl lo2 = Sl + (qe + ((th * pq + tl) + tl * gh));
    vdbl R = Sh + lo2;
    vdbl err = lo2 - (R - Sh); /* x^y 2^-(k >> 4) ~ R + err */
    /* keep R when R + err is more than 0.02 ulp(R) from a midpoint, and R is not a power of two */
    vi64 mant = (vi64)R & 0x000fffffffffffffll;
    vdbl ulp = (vdbl)(((vi64)R & 0x7ff0000000000000ll) - (52ll << 52));
    vdbl dist = vabs(vabs(err) - 0.5 * ulp);
    good &= (dist > 0.02 * ulp) & (mant != 0);
    *ok = good;
    return (vdbl)((vi64)R + ((k >> 4) << 52));
}

/* out[j] = pow(x[j], y[j]) for j < n, bit for bit (see above). The lanes that must call pow are listed as the
 * vectors go (a compress store, no branch) and called after. */
void hak_dpow_array(long n, const double *x, const double *y, double *out) {
    long redo[64];
    long nredo = 0, j = 0;
    const __m512i lane = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
    for (; j + 8 <= n; j += 8) {
        vdbl xv, yv;
        memcpy(&xv, x + j, sizeof xv);
        memcpy(&yv, y + j, sizeof yv);
        vi64 ok;
        vdbl a = dpow_approx(xv, yv, &ok);
        memcpy(out + j, &a, sizeof a);
        __mmask8 bad = _mm512_testn_epi64_mask((__m512i)ok, (__m512i)ok);
        _mm512_mask_compressstoreu_epi64(redo + nredo, bad, _mm512_add_epi64(lane, _mm512_set1_epi64(j)));
        nredo += __builtin_popcount((unsigned)bad);
        if (nredo > 56) { /* room for one more vector's lanes */
            for (long r = 0; r < nredo; r++) out[redo[r]] = pow(x[redo[r]], y[redo[r]]);
            nredo = 0;
        }
    }
    for (long r = 0; r < nredo; r++) out[redo[r]] = pow(x[redo[r]], y[redo[r]]);
    for (; j < n; j++) out[j] = pow(x[j], y[j]);
}
#else
void hak_dpow_array(long n, const double *x, const double *y, double *out) {
    for (long j = 0; j < n; j++) out[j] = pow(x[j], y[j]);
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

__attribute__((unused)) static void kw_solve_many_scalar(long m, const double *qin, const float *qold, const float *qpow, const float *lat,
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

#if FPOW_W > 0
static inline vflt vfblend(vi32 m, vflt a, vflt b) { return (vflt)((m & (vi32)a) | (~m & (vi32)b)); }
static inline vdbl vdblend(vi64 m, vdbl a, vdbl b) { return (vdbl)((m & (vi64)a) | (~m & (vi64)b)); }
#define TO_DBL(v) __builtin_convertvector((v), vdbl)
#define TO_FLT(v) __builtin_convertvector((v), vflt)

/* The same solves, FPOW_W at a time: every operation of kw_solve_many (the float and double roundings, the order
 * of each sum) on whole vectors, the branches as masks; a lane whose first residual is not yet below the tolerance
 * (0.1-1.2 % of solves) finishes its Newton iterations in kw_newton. */
static void kw_solve_many_vec(long m, const double *qin, const float *qold, const float *qpow, const float *lat,
                              const float *al, const float *be, const float *dx, float dt, float *q, float *qp,
                              float *backs) {
    /* Two passes: first every solve's first power, into `backs`, then the rest. A pass-1 vector is a short chain
     * of its own, so the core overlaps several of them; in one pass the second power waited on the first.
     * 1.02-1.06x at 10,000 cells, bit-identical. `backs` has room for a whole vector past m. */
    for (long j = 0; j < m; j += FPOW_W) {
        long w = m - j < FPOW_W ? m - j : FPOW_W;
        vdbl vqin = {0};
        vflt vqold = {0}, val = {0}, vbe = {0};
        if (w == FPOW_W) {
            memcpy(&vqin, qin + j, sizeof vqin);
            memcpy(&vqold, qold + j, sizeof vqold);
            memcpy(&val, al + j, sizeof val);
            memcpy(&vbe, be + j, sizeof vbe);
        } else {
            for (long l = 0; l < w; l++) {
                vqin[l] = qin[j + l]; vqold[l] = qold[j + l]; val[l] = al[j + l]; vbe[l] = be[j + l];
            }
        }
        vi64 store64 = TO_DBL(val) != 0.0;
        vdbl sum = vqin + TO_DBL(vqold);
        vi64 first = store64 & (sum > 0.0);
        vflt back = fpow_lanes_of(vdblend(first, sum / 2.0, (vdbl){0} + 1.0), vdblend(first, TO_DBL(vbe) - 1.0, (vdbl){0}));
        back = vfblend((vi32)__builtin_convertvector(first, vi32) & (back - back == 0.0f), back, (vflt){0});
        memcpy(backs + j, &back, sizeof back); /* backs has room for whole vectors */
    }
    for (long j = 0; j < m; j += FPOW_W) {
        long w = m - j < FPOW_W ? m - j : FPOW_W;
        vdbl vqin = {0};
        vflt vqold = {0}, vqpow = {0}, vlat = {0}, val = {0}, vbe = {0}, vdx, back;
        memcpy(&back, backs + j, sizeof back);
        for (int l = 0; l < FPOW_W; l++) vdx[l] = 1.0f;
        if (w == FPOW_W) {
            memcpy(&vqin, qin + j, sizeof vqin);
            memcpy(&vqold, qold + j, sizeof vqold);
            memcpy(&vqpow, qpow + j, sizeof vqpow);
            memcpy(&vlat, lat + j, sizeof vlat);
            memcpy(&val, al + j, sizeof val);
            memcpy(&vbe, be + j, sizeof vbe);
            memcpy(&vdx, dx + j, sizeof vdx);
        } else { /* padding lanes: no storage, nothing flows */
            for (long l = 0; l < w; l++) {
                vqin[l] = qin[j + l]; vqold[l] = qold[j + l]; vqpow[l] = qpow[j + l]; vlat[l] = lat[j + l];
                val[l] = al[j + l]; vbe[l] = be[j + l]; vdx[l] = dx[j + l];
            }
        }
        vflt d = dt / vdx;
        vflt a = TO_FLT(TO_DBL(d) * vqin);
        vflt c = dt * vlat;
        vflt ab = val * vbe;
        vi32 store = val != 0.0f;
        vi64 store64 = TO_DBL(val) != 0.0;
        vflt b = (ab * vqold) * back;
        vflt e = ab * back;
        vflt est = ((a + b) + c) / (d + e);
        vflt rhs = (a + val * vqpow) + c;
        vflt p = fpow_lanes_of(vdblend(store64, TO_DBL(est), (vdbl){0} + 1.0), TO_DBL(vbe));
        vflt res = (d * est + val * p) - rhs;
        res = vfblend(res - res == 0.0f, res, (vflt){0}); /* not finite: 0 */
        vi64 done = TO_DBL((vflt)((vi32)res & 0x7fffffff)) < 0.01; /* fabsf(res) < 0.01, in double */
        vflt est0 = (a + c) / d;
        est0 = vfblend(est0 < 0.0f, (vflt){0}, est0);
        vi32 newton = store & ~(__builtin_convertvector(done, vi32) & ~(est < 0.0f));
        vflt qv = vfblend(store, est, est0), pv = vfblend(store, p, (vflt){0}); /* qp: never used while alpha is 0 */
        int32_t any = 0;
        for (int l = 0; l < FPOW_W; l++) any |= newton[l];
        if (w == FPOW_W) {
            memcpy(q + j, &qv, sizeof qv);
            memcpy(qp + j, &pv, sizeof pv);
        } else {
            for (long l = 0; l < w; l++) {
                q[j + l] = qv[l];
                qp[j + l] = pv[l];
            }
        }
        if (any)
            for (long l = 0; l < w; l++)
                if (newton[l]) q[j + l] = kw_newton(est[l], p[l], d[l], val[l], ab[l], rhs[l], vbe[l], &qp[j + l]);
    }
}
#endif

/* The solves of a level: FPOW_W lanes at a time where the power is vectorised, else one by one. */
static void kw_solve_many(long m, const double *qin, const float *qold, const float *qpow, const float *lat,
                          const float *al, const float *be, const float *dx, float dt, float *q, float *qp,
                          solve_ws *ws) {
#if FPOW_W > 0
    kw_solve_many_vec(m, qin, qold, qpow, lat, al, be, dx, dt, q, qp, ws->f);
#else
    kw_solve_many_scalar(m, qin, qold, qpow, lat, al, be, dx, dt, q, qp, ws);
#endif
}

/* CREST's water balance of cell i over one step (EF5 CRESTModel::WaterBalanceInt), pr and pe the step's forcing.
 * A cell that infiltrates into an unsaturated soil needs powers, which the caller computes together with other
 * cells': first the float power rel = fpow(x, y) of its relative deficit (with known = 0 such a cell writes
 * nothing, stores x[0] and y[0] and returns 1), then, unless the rain fills the soil, the two double powers
 * pow(x[k], y[k]) of the infiltration (known = 1, rel given: stores x[0..1], y[0..1], returns 2), and with
 * known = 2 (rel and the powers pw[0..1] given) it is done. Every other cell is done at once and returns 0. */
static inline __attribute__((always_inline)) int wb_cell(long i, const double *pr, const double *pe, float dth,
                                                         float step32, const double *wm, const double *b,
                                                         const double *im, const double *ke, const double *fc,
                                                         double *w, double *fast, double *slow, double *sm,
                                                         int known, float rel_known, const double *pw,
                                                         double *x, double *y) {
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
            if (!known) {
                *x = (double)(float)(1.0 - (double)(wi / wmi));
                *y = (double)(float)(1.0 / (double)opb);
                return 1;
            }
            float rel = rel_known; /* fpow((float)(1 - wi / wmi), (float)(1 / opb)) */
            double a = wmm * (double)(float)(1.0 - (double)rel);
            if (ps + a >= wmm) {
                r = ps - (double)(wmi - wi);
                if (r < 0.0) r = 0.0;
                wo = (double)wmi;
            } else {
                if (known < 2) {
                    x[0] = 1.0 - a / wmm;
                    x[1] = 1.0 - (a + ps) / wmm;
                    y[0] = y[1] = (double)opb;
                    return 2;
                }
                double infil = (double)wmi * (pw[0] - pw[1]); /* pow(x[0], opb) - pow(x[1], opb) */
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
    /* +-0 divided by the (positive) step is the same zero: most cells have no excess, and skip the division */
    fast[i] = over == 0.0 ? over : (float)(over / (double)step32);
    slow[i] = inter == 0.0 ? inter : (float)(inter / (double)step32);
    sm[i] = (float)((double)w32 * 100.0 / (double)wmi);
    return 0;
}

/* Scratch of the water balance: the cells waiting for their float power, its arguments and results (n each);
 * those then waiting for their double powers, and theirs (2 n). */
typedef struct {
    double *x, *y;
    float *rel;
    long *who;
    double *x2, *y2, *pw;
    float *rel2;
    long *who2;
} wb_ws;

/* CREST's water balance for every cell over step t (EF5 CRESTModel::WaterBalanceInt): every cell that needs no
 * power first (whole vectors of cells without rain on vector lanes), then the powers of the others together
 * (hak_fpow_array, bit for bit fpow), then those cells. */
static void water_balance(const double *precip, const double *pet, long t, long n, double dt_hours,
                          const double *wm, const double *b, const double *im, const double *ke, const double *fc,
                          double *w, double *fast, double *slow, double *sm, wb_ws *ws) {
    float dth = (float)dt_hours;
    float step32 = (float)(dt_hours * 3600.0);
    const double *pr = precip + t * n, *pe = pet + t * n;
    long np = 0, i = 0;
#if FPOW_W > 0
    /* FPOW_W cells at a time where none of them takes rain (the evaporation branch, 74-93 % of cell-steps): the
     * same operations on whole vectors, so their two divisions go FPOW_W at a time */
    const vflt vdth = (vflt){0} + dth;
    const vdbl vstep = (vdbl){0} + (double)step32;
    for (; i + FPOW_W <= n; i += FPOW_W) {
        vdbl vpr, vpe, vke, vwm, vw;
        memcpy(&vpr, pr + i, sizeof vpr);
        memcpy(&vpe, pe + i, sizeof vpe);
        memcpy(&vke, ke + i, sizeof vke);
        vdbl p = TO_DBL(TO_FLT(vpr) * vdth);
        vdbl ep = TO_DBL(TO_FLT(vpe) * vdth) * vke;
        vi64 wet = p > ep;
        int64_t any = 0;
        for (int l = 0; l < FPOW_W; l++) any |= wet[l];
        if (any) {
            for (long c = i; c < i + FPOW_W; c++)
                if (wb_cell(c, pr, pe, dth, step32, wm, b, im, ke, fc, w, fast, slow, sm, 0, 0.0f, NULL, ws->x + np,
                            ws->y + np))
                    ws->who[np++] = c;
            continue;
        }
        memcpy(&vwm, wm + i, sizeof vwm);
        memcpy(&vw, w + i, sizeof vw);
        vflt wmi = TO_FLT(vwm), wi = TO_FLT(vw);
        vdbl inter = TO_DBL(wi - wmi);
        inter = vdblend(inter < 0.0, (vdbl){0}, inter);
        wi = vfblend(wi > wmi, wmi, wi);
        vdbl wid = TO_DBL(wi), wmid = TO_DBL(wmi);
        vdbl e2 = (ep - p) * wid / wmid;
        vdbl wo = vdblend(e2 < wid, wid - e2, (vdbl){0});
        vflt w32 = TO_FLT(wo);
        vdbl w32d = TO_DBL(w32);
        vdbl sl = vdblend(inter == 0.0, inter, TO_DBL(TO_FLT(inter / vstep)));
        vdbl smv = TO_DBL(TO_FLT(w32d * 100.0 / wmid));
        vdbl zero = (vdbl){0};
        memcpy(w + i, &w32d, sizeof w32d);
        memcpy(fast + i, &zero, sizeof zero);
        memcpy(slow + i, &sl, sizeof sl);
        memcpy(sm + i, &smv, sizeof smv);
    }
#endif
    for (; i < n; i++)
        if (wb_cell(i, pr, pe, dth, step32, wm, b, im, ke, fc, w, fast, slow, sm, 0, 0.0f, NULL, ws->x + np,
                    ws->y + np))
            ws->who[np++] = i;
    hak_fpow_array(np, ws->x, ws->y, ws->rel);
    long np2 = 0;
    for (long k = 0; k < np; k++) {
        if (wb_cell(ws->who[k], pr, pe, dth, step32, wm, b, im, ke, fc, w, fast, slow, sm, 1, ws->rel[k], NULL,
                    ws->x2 + 2 * np2, ws->y2 + 2 * np2)) {
            ws->who2[np2] = ws->who[k];
            ws->rel2[np2++] = ws->rel[k];
        }
    }
    hak_dpow_array(2 * np2, ws->x2, ws->y2, ws->pw);
    for (long k = 0; k < np2; k++)
        wb_cell(ws->who2[k], pr, pe, dth, step32, wm, b, im, ke, fc, w, fast, slow, sm, 2, ws->rel2[k],
                ws->pw + 2 * k, NULL, NULL);
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

/* Lists in compressed rows: the entries of row i are idx[ptr[i]] .. idx[ptr[i + 1] - 1]. */
typedef struct {
    long *ptr, *idx;
} rows;

/* The routing schedule, shared by the members of a batch (they share the network and the channel cells).
 *
 * EF5 routes cell by cell from upstream (i = n-1) to the outlet (i = 0): each cell solves its overland store
 * (and, for a channel cell, then its channel store), adds its outflow to its downstream cell's inflow and its
 * interflow leak to its targets. What each solve reads splits the work into two phases:
 *
 * - a hillslope cell's leak depends only on its interflow store and this step's slow excess, not on any
 *   routing of the step, so every leak is computed before the routing;
 * - an overland solve reads the outflow of the hillslope cells that drain into it (and, on a channel cell,
 *   the leaks that reach it), so the overland solves are grouped into levels of the hillslope network
 *   (a cell's level is one more than the highest level of the hillslope cells draining into it);
 * - a channel solve reads its own cell's overland result and the outflow of the channel cells upstream, so
 *   after every overland solve the channel solves run by levels of the channel network;
 * - nothing of a step's overland phase reads the channel phase of the step before, so the overland phases
 *   of a block of WF_STEPS steps run first (keeping each channel cell's lateral inflow per step), and then
 *   the block's channel solves run as a wavefront: level l of step s beside level l - 1 of step s + 1 and
 *   so on, since a channel solve needs its upstream cells' outflow of the same step (lower levels, earlier
 *   diagonals) and its own state of the step before (the previous diagonal). A basin's 60-170 channel
 *   levels of 2-10 cells then fill the power's lanes.
 *
 * All solves of a level (of every member) run together, their powers vectorised. Every sum is still taken in
 * EF5's order: a cell gathers its inflows from a list of the cells that write to it, in decreasing index,
 * starting from 0, as the sequential loop adds them; so the results are bit-identical to the cell-by-cell
 * loop.
 *
 * Positions order the cells by overland level and, within a level, hillslope cells before channel cells
 * (rows 2 l and 2 l + 1 of `level`); channel indices (ci) order the channel cells by channel level. The routing
 * state lives in arrays of slots, s = p K + k for position p of member k (K members), or ci K + k for the
 * channel stores: a level's solves of every member are one contiguous range of slots, which the solves read
 * and write in place, and the work around them runs over whole arrays. */
typedef struct {
    long nlev, nlev_c;
    rows level;   /* positions of overland level l: hillslope cells level.ptr[2 l] .. level.ptr[2 l + 1] - 1, then
                   * channel cells up to level.ptr[2 l + 2] - 1 */
    rows level_c; /* the channel cells of each channel level, as positions; entry ci is channel cell ci */
    rows over;    /* per position, the positions whose hillslope outflow drains into it */
    rows chan;    /* per channel cell ci, the channel cells (ci) whose outflow drains into it */
    long *perm;   /* perm[p]: the cell at position p */
    long *ci_of;  /* ci_of[p]: the channel index of position p, or -1 */
    long *lev;    /* lev[i]: cell i's overland level */
} schedule;

static int rows_alloc(rows *r, long nrows, long nent) {
    r->ptr = calloc((size_t)nrows + 1, sizeof(long));
    r->idx = malloc((size_t)(nent > 0 ? nent : 1) * sizeof(long));
    return r->ptr && r->idx ? 0 : -1;
}

static void rows_free(rows *r) {
    free(r->ptr);
    free(r->idx);
    r->ptr = r->idx = NULL;
}

/* Fills `r` (nrows rows) with key[i] as the row of item i, items taken in decreasing i and written as
 * map[i] (or i when map is NULL); items with key < 0 are left out. -1 when out of memory. */
static int rows_by_key(rows *r, long nrows, long n, const long *key, const long *map) {
    long nent = 0;
    for (long i = 0; i < n; i++) nent += key[i] >= 0;
    if (rows_alloc(r, nrows, nent) != 0) return -1;
    for (long i = 0; i < n; i++)
        if (key[i] >= 0) r->ptr[key[i] + 1]++;
    for (long k = 0; k < nrows; k++) r->ptr[k + 1] += r->ptr[k];
    long *fill = calloc((size_t)nrows + 1, sizeof(long));
    if (!fill) return -1;
    for (long i = n - 1; i >= 0; i--)
        if (key[i] >= 0) r->idx[r->ptr[key[i]] + fill[key[i]]++] = map ? map[i] : i;
    free(fill);
    return 0;
}

/* Builds the shared schedule from the network (down, channel); pos[i] receives cell i's position. -1 when out
 * of memory, -2 when a cell drains to a cell that is not downstream of it in the routing order. */
static int schedule_build(schedule *sc, long n, const int64_t *down, const uint8_t *channel, long *pos) {
    memset(sc, 0, sizeof *sc);
    size_t nn = (size_t)(n > 0 ? n : 1);
    long *lev = calloc(nn, sizeof(long)), *levc = calloc(nn, sizeof(long)), *key = calloc(nn, sizeof(long));
    sc->ci_of = malloc(nn * sizeof(long));
    int status = -1;
    if (!lev || !levc || !key || !sc->ci_of) goto out;
    long nlev = n > 0 ? 1 : 0, nlevc = 0;
    for (long i = n - 1; i >= 0; i--) {
        long t = (long)down[i];
        if (t < 0) continue;
        if (t >= i) {
            status = -2;
            goto out;
        }
        if (!channel[i]) { /* overland outflow into t's overland store */
            if (lev[t] < lev[i] + 1) lev[t] = lev[i] + 1;
            if (lev[t] + 1 > nlev) nlev = lev[t] + 1;
        } else if (levc[t] < levc[i] + 1) {
            levc[t] = levc[i] + 1;
        }
    }
    for (long i = 0; i < n; i++)
        if (channel[i] && levc[i] + 1 > nlevc) nlevc = levc[i] + 1;
    sc->nlev = nlev;
    sc->nlev_c = nlevc;
    /* positions: by overland level, hillslope cells first, upstream first within each part, as EF5 walks */
    for (long i = 0; i < n; i++) key[i] = 2 * lev[i] + (channel[i] != 0);
    if (rows_by_key(&sc->level, 2 * nlev, n, key, NULL) != 0) goto out;
    sc->perm = sc->level.idx;
    for (long p = 0; p < n; p++) pos[sc->perm[p]] = p;
    for (long i = 0; i < n; i++) key[i] = channel[i] ? levc[i] : -1;
    if (rows_by_key(&sc->level_c, nlevc, n, key, pos) != 0) goto out;
    /* who drains into each cell, by position of the target, in decreasing source index */
    for (long i = 0; i < n; i++) key[i] = down[i] >= 0 && !channel[i] ? pos[down[i]] : -1;
    if (rows_by_key(&sc->over, n, n, key, pos) != 0) goto out;
    /* channel cells by channel index, and who drains into each, in the same indices */
    const long nch = sc->level_c.ptr[nlevc];
    for (long p = 0; p < n; p++) sc->ci_of[p] = -1;
    for (long ci = 0; ci < nch; ci++) sc->ci_of[sc->level_c.idx[ci]] = ci;
    for (long i = 0; i < n; i++) {
        key[i] = down[i] >= 0 && channel[i] ? sc->ci_of[pos[down[i]]] : -1; /* -1 too below a hillslope cell */
        levc[i] = channel[i] ? sc->ci_of[pos[i]] : -1; /* levc, done with, maps a cell to its channel index */
    }
    if (rows_by_key(&sc->chan, nch > 0 ? nch : 1, n, key, levc) != 0) goto out;
    status = 0;
out:
    sc->lev = lev;
    free(levc);
    free(key);
    return status;
}

static void schedule_free(schedule *sc) {
    rows_free(&sc->level);
    rows_free(&sc->level_c);
    rows_free(&sc->over);
    rows_free(&sc->chan);
    free(sc->lev);
    free(sc->ci_of);
    sc->perm = sc->lev = sc->ci_of = NULL;
}

/* The interflow lists of every member, one row per slot (K members, slot p K + k): the leaks that reach the
 * slot, in decreasing source index (the order of EF5's sums), each as an index j N + s into the leak array
 * (N = n K slots; the leak of slot s towards its target j, 0 or 1). Targets t0, t1 are [K][n], by cell index. A
 * leak is computed when its source's overland solve is, so a target other than the source itself must be at a
 * higher overland level (it is downstream of the source on the hillslope, as interflow_targets finds it). -3
 * when one is not, -1 when out of memory. */
static int leaks_build(rows *inter, long nk, long n, const int64_t *t0, const int64_t *t1, const uint8_t *channel,
                       const schedule *sc, const long *pos) {
    const long ns = n * nk;
    long nent = 0;
    for (long k = 0; k < nk; k++) {
        const int64_t *a0 = t0 + k * n, *a1 = t1 + k * n;
        for (long i = 0; i < n; i++) {
            if (channel[i]) continue;
            for (int j = 0; j < 2; j++) {
                long t = j == 0 ? (long)a0[i] : (long)a1[i];
                if (t >= n || (t >= 0 && t != i && sc->lev[t] <= sc->lev[i])) return -3;
                nent += t >= 0;
            }
        }
    }
    if (rows_alloc(inter, ns, nent) != 0) return -1;
    for (long k = 0; k < nk; k++) {
        const int64_t *a0 = t0 + k * n, *a1 = t1 + k * n;
        for (long i = 0; i < n; i++) {
            if (channel[i]) continue;
            if (a0[i] >= 0) inter->ptr[pos[a0[i]] * nk + k + 1]++;
            if (a1[i] >= 0) inter->ptr[pos[a1[i]] * nk + k + 1]++;
        }
    }
    for (long s = 0; s < ns; s++) inter->ptr[s + 1] += inter->ptr[s];
    long *fill = calloc((size_t)(ns > 0 ? ns : 1), sizeof(long));
    if (!fill) return -1;
    for (long k = 0; k < nk; k++) {
        const int64_t *a0 = t0 + k * n, *a1 = t1 + k * n;
        for (long i = n - 1; i >= 0; i--) { /* decreasing source index: the order of EF5's sums */
            if (channel[i]) continue;
            for (int j = 0; j < 2; j++) {
                long t = j == 0 ? (long)a0[i] : (long)a1[i];
                if (t < 0) continue;
                long row = pos[t] * nk + k;
                inter->idx[inter->ptr[row] + fill[row]++] = j * ns + pos[i] * nk + k;
            }
        }
    }
    free(fill);
    return 0;
}

/* The interflow that reaches slot s this step: its sources' leaks in decreasing source index, as EF5 adds them. */
static inline double gather_inter(const rows *inter, long s, const double *leak) {
    double sum = 0.0;
    for (long e = inter->ptr[s]; e < inter->ptr[s + 1]; e++) sum += leak[inter->idx[e]];
    return sum;
}

/* mm to m, as EF5 converts a float excess: (float)((double)x / 1000.0); a zero is the same zero without the
 * division (most cells have no excess). */
static inline float mm_to_m(float x) { return x == 0.0f ? x : (float)((double)x / 1000.0); }

/* After the overland solves of m hillslope slots: each slot's interflow store takes this step's slow excess
 * (`slow`, float mm) and leaks towards its targets (EF5 CRESTModel's interflow leak). A missing target (has0,
 * has1 zero) gets no leak. FPOW_W slots at a time where the power is vectorised: every lane rounds as the scalar
 * code does (the divisions are the cost, and whole vectors of them are about as fast as one). */
static void hillslope_leaks(long m, const float *restrict slow, float *restrict ir, const float *restrict leaki,
                            const double *restrict s0, const double *restrict s1, const double *restrict area,
                            const double *restrict area_t0, const double *restrict area_t1,
                            const int64_t *restrict has0, const int64_t *restrict has1, double *restrict leak0,
                            double *restrict leak1) {
    long j = 0;
#if FPOW_W > 0
    for (; j + FPOW_W <= m; j += FPOW_W) {
        vflt r, sl, lk;
        vdbl a0, a1, ar, at0, at1;
        vi64 h0, h1;
        memcpy(&r, ir + j, sizeof r);
        memcpy(&sl, slow + j, sizeof sl);
        memcpy(&lk, leaki + j, sizeof lk);
        memcpy(&a0, s0 + j, sizeof a0);
        memcpy(&a1, s1 + j, sizeof a1);
        memcpy(&ar, area + j, sizeof ar);
        memcpy(&at0, area_t0 + j, sizeof at0);
        memcpy(&at1, area_t1 + j, sizeof at1);
        memcpy(&h0, has0 + j, sizeof h0);
        memcpy(&h1, has1 + j, sizeof h1);
        r = r + sl;
        vdbl leak = TO_DBL(r * lk);
        r = TO_FLT(TO_DBL(r) - leak);
        r = vfblend(r < 0.0f, (vflt){0}, r);
        vdbl l0 = vdblend(h0, leak * a0 * ar / at0, (vdbl){0});
        vdbl l1 = vdblend(h1, leak * a1 * ar / at1, (vdbl){0});
        memcpy(ir + j, &r, sizeof r);
        memcpy(leak0 + j, &l0, sizeof l0);
        memcpy(leak1 + j, &l1, sizeof l1);
    }
#endif
    for (; j < m; j++) {
        float r = ir[j] + slow[j];
        double leak = (double)(r * leaki[j]);
        r = (float)((double)r - leak);
        ir[j] = r < 0.0f ? 0.0f : r;
        leak0[j] = has0[j] ? leak * s0[j] * area[j] / area_t0[j] : 0.0;
        leak1[j] = has1[j] ? leak * s1[j] * area[j] / area_t1[j] : 0.0;
    }
}

/* Steps whose channel solves run together as one wavefront (see hak_run_batch). */
#ifndef WF_STEPS
#define WF_STEPS 32
#endif

/* The routing state and constants of every member, by slot (see schedule). */
typedef struct {
    /* per slot p K + k */
    float *oq, *opow;   /* the overland store: pq of a hillslope cell, po of a channel cell; and its power */
    float *ir, *leaki, *alpha0, *dx, *beta_over;
    double *s0, *s1, *area, *area_t0, *area_t1; /* the leak's shares and areas (a missing target's area: 1) */
    int64_t *has0, *has1;                       /* whether the leak's targets exist (-1) or not (0) */
    double *leak;                               /* [2][slots]: this step's leak towards target 0, then 1 */
    double *inter_in;                           /* the interflow that reached the slot this step */
    rows inter;                                 /* the leaks reaching each slot (leaks_build) */
    /* per channel slot ci K + k */
    float *cq, *cpow, *calpha, *cbeta, *cdx; /* the channel store (pq), its power, and its parameters */
    float *lat, *out; /* [WF_STEPS][channel slots]: the block's lateral inflow and channel outflow */
    /* per member, by cell index: [K][n] */
    double *w, *fast, *slow, *sm;
    /* the solves' inputs and scratch */
    double *qin;
    float *qlat, *fscr;
    wb_ws wb; /* the water balance's scratch */
} routing;

static void routing_free(routing *r) {
    void *all[] = {r->oq, r->opow, r->ir, r->leaki, r->alpha0, r->dx, r->beta_over, r->s0, r->s1, r->area,
                   r->area_t0, r->area_t1, r->has0, r->has1, r->leak, r->inter_in, r->cq, r->cpow, r->calpha,
                   r->cbeta, r->cdx, r->lat, r->out, r->w, r->fast, r->slow, r->sm, r->qin, r->qlat, r->fscr,
                   r->wb.x, r->wb.y, r->wb.rel, r->wb.who, r->wb.x2, r->wb.y2, r->wb.pw, r->wb.rel2, r->wb.who2};
    for (size_t k = 0; k < sizeof all / sizeof all[0]; k++) free(all[k]);
    rows_free(&r->inter);
}

/* Allocates the arrays of `r` for nk members of n cells and nch channel cells; -1 when out of memory. */
static int routing_alloc(routing *r, long nk, long n, long nch) {
    memset(r, 0, sizeof *r);
    size_t ns = (size_t)(n > 0 ? n : 1) * (size_t)(nk > 0 ? nk : 1);
    size_t nc = (size_t)(nch > 0 ? nch : 1) * (size_t)(nk > 0 ? nk : 1);
    size_t pad = ns + 16; /* room for a whole vector past the end (the solves' scratch) */
    float **f_slot[] = {&r->oq, &r->opow, &r->ir, &r->leaki, &r->alpha0, &r->dx, &r->beta_over};
    double **d_slot[] = {&r->s0, &r->s1, &r->area, &r->area_t0, &r->area_t1, &r->inter_in, &r->w, &r->fast,
                         &r->slow, &r->sm, &r->qin};
    float **f_chan[] = {&r->cq, &r->cpow, &r->calpha, &r->cbeta, &r->cdx};
    int ok = 1;
    for (size_t k = 0; k < sizeof f_slot / sizeof f_slot[0]; k++)
        ok &= (*f_slot[k] = malloc(ns * sizeof(float))) != NULL;
    for (size_t k = 0; k < sizeof d_slot / sizeof d_slot[0]; k++)
        ok &= (*d_slot[k] = calloc(ns, sizeof(double))) != NULL;
    for (size_t k = 0; k < sizeof f_chan / sizeof f_chan[0]; k++)
        ok &= (*f_chan[k] = malloc(nc * sizeof(float))) != NULL;
    ok &= (r->has0 = malloc(ns * sizeof(int64_t))) != NULL;
    ok &= (r->has1 = malloc(ns * sizeof(int64_t))) != NULL;
    ok &= (r->leak = calloc(2 * ns, sizeof(double))) != NULL;
    ok &= (r->lat = malloc((size_t)WF_STEPS * nc * sizeof(float))) != NULL;
    ok &= (r->out = malloc((size_t)WF_STEPS * nc * sizeof(float))) != NULL;
    ok &= (r->qlat = malloc(pad * sizeof(float))) != NULL;
    ok &= (r->fscr = malloc(pad * sizeof(float))) != NULL;
    size_t nn = (size_t)(n > 0 ? n : 1);
    ok &= (r->wb.x = malloc(nn * sizeof(double))) != NULL;
    ok &= (r->wb.y = malloc(nn * sizeof(double))) != NULL;
    ok &= (r->wb.rel = malloc(nn * sizeof(float))) != NULL;
    ok &= (r->wb.who = malloc(nn * sizeof(long))) != NULL;
    ok &= (r->wb.x2 = malloc(2 * nn * sizeof(double))) != NULL;
    ok &= (r->wb.y2 = malloc(2 * nn * sizeof(double))) != NULL;
    ok &= (r->wb.pw = malloc(2 * nn * sizeof(double))) != NULL;
    ok &= (r->wb.rel2 = malloc(nn * sizeof(float))) != NULL;
    ok &= (r->wb.who2 = malloc(nn * sizeof(long))) != NULL;
    return ok ? 0 : -1;
}

/* All steps for K parameter sets on one network; see kernel.run_kernel for one. Per-member arrays are
 * [K][n] (parameters, initial states, interflow targets and shares, final states) or [K][nt][ng] (outputs);
 * the forcing, the network (channel, down, dx, area), the initial flows and the gauges are shared. The
 * members' solves of each routing level run together, so a small basin fills the power's lanes; every member's
 * results are bit for bit those of a run on its own. Returns 0; -1 when out of memory; -2 when the network is
 * not in routing order. */
static inline __attribute__((always_inline)) int run_batch(long nk, long nt, long n, long ng, const double *precip,
                                                           const double *pet, double dt_hours,
                  const double *wm, const double *b, const double *im, const double *ke, const double *fc,
                  const double *w0, const double *leaki, const double *alpha, const double *beta,
                  const double *alpha0, const uint8_t *channel, const double *ir0, const double *pq0,
                  const double *po0, const int64_t *down, const double *dx, const double *area, const int64_t *t0,
                  const int64_t *t1, const double *s0, const double *s1, const int64_t *gauge_nodes,
                  const double *weights, long state_step, double *q_out, double *sm_out, double *ff_out,
                  double *sf_out, double *st_w, double *st_ir, double *st_pq, double *st_po) {
    double step_s = dt_hours * 3600.0;
    float dt32 = (float)step_s;
    const float beta_over = 0.6f;
    size_t nn = (size_t)(n > 0 ? n : 1);
    const long ns = n * nk; /* slots */
    int status = -1;
    long *pos = malloc(nn * sizeof(long));
    /* the scalar solves' scratch (kw_solve_many_scalar) */
    size_t kn = nn * (size_t)(nk > 0 ? nk : 1);
    double *s_x = malloc(kn * sizeof(double)), *s_y = malloc(kn * sizeof(double));
    float *sf[8];
    for (int k = 0; k < 8; k++) sf[k] = malloc((kn + 16) * sizeof(float));
    long *s_who = malloc(kn * sizeof(long));
    schedule sc;
    memset(&sc, 0, sizeof sc);
    routing R;
    memset(&R, 0, sizeof R);
    /* the gauges' nonzero weights, in index order (the same sums as a dense loop) */
    size_t nz = 0;
    for (long g = 0; g < ng; g++)
        for (long i = 0; i < n; i++) nz += weights[g * n + i] != 0.0;
    long *g_ptr = malloc((size_t)(ng + 1) * sizeof(long));
    long *g_idx = malloc((nz > 0 ? nz : 1) * sizeof(long));
    double *g_w = malloc((nz > 0 ? nz : 1) * sizeof(double));
    int scratch_ok = 1;
    for (int k = 0; k < 8; k++) scratch_ok &= sf[k] != NULL;
    if (!pos || !s_x || !s_y || !scratch_ok || !s_who || !g_ptr || !g_idx || !g_w) goto done;
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
    int rc = schedule_build(&sc, n, down, channel, pos);
    if (rc != 0) {
        status = rc;
        goto done;
    }
    const long nch = sc.level_c.ptr[sc.nlev_c]; /* channel cells, in channel level order (ci) */
    const long ncs = nch * nk;                  /* channel slots */
    const long *ci_pos = sc.level_c.idx;
    const long *perm = sc.perm;
    if (routing_alloc(&R, nk, n, nch) != 0) goto done;
    solve_ws ws = {s_x, s_y, R.fscr, sf[0], sf[1], sf[2], sf[3], sf[4], sf[5], sf[6], s_who};
    rc = leaks_build(&R.inter, nk, n, t0, t1, channel, &sc, pos);
    if (rc != 0) {
        status = rc;
        goto done;
    }
    for (long p = 0; p < n; p++) {
        const long i = perm[p];
        for (long k = 0; k < nk; k++) {
            const long s = p * nk + k, o = k * n;
            long a0 = (long)t0[o + i], a1 = (long)t1[o + i];
            R.s0[s] = s0[o + i];
            R.s1[s] = s1[o + i];
            R.area[s] = area[i];
            R.has0[s] = a0 >= 0 ? -1 : 0;
            R.has1[s] = a1 >= 0 ? -1 : 0;
            R.area_t0[s] = a0 >= 0 ? area[a0] : 1.0;
            R.area_t1[s] = a1 >= 0 ? area[a1] : 1.0;
            R.dx[s] = (float)dx[i];
            R.alpha0[s] = (float)alpha0[o + i];
            R.leaki[s] = (float)leaki[o + i];
            R.beta_over[s] = beta_over;
            R.ir[s] = (float)ir0[o + i];
            R.oq[s] = (float)(channel[i] ? po0[i] : pq0[i]);
            R.opow[s] = fpow(R.oq[s], beta_over);
            st_w[o + i] = w0[o + i]; /* the states "after step state_step": the initial ones until it is reached */
            st_ir[o + i] = R.ir[s];
            st_pq[o + i] = (float)pq0[i];
            st_po[o + i] = (float)po0[i];
        }
    }
    for (long ci = 0; ci < nch; ci++) {
        const long i = perm[ci_pos[ci]];
        for (long k = 0; k < nk; k++) {
            const long c = ci * nk + k, o = k * n;
            R.cq[c] = (float)pq0[i];
            R.calpha[c] = (float)alpha[o + i];
            R.cbeta[c] = (float)beta[o + i];
            R.cdx[c] = (float)dx[i];
            R.cpow[c] = fpow(R.cq[c], R.cbeta[c]);
        }
    }
    memcpy(R.w, w0, (size_t)ns * sizeof(double));
    for (long tb = 0; tb < nt; tb += WF_STEPS) {
        const long nb = nt - tb < WF_STEPS ? nt - tb : WF_STEPS;
        for (long t = tb; t < tb + nb; t++) {
            for (long k = 0; k < nk; k++) {
                const size_t o = (size_t)k * nn, og = ((size_t)k * (size_t)nt + (size_t)t) * (size_t)ng;
                double *sm = R.sm + o, *fast = R.fast + o, *slow = R.slow + o;
                water_balance(precip, pet, t, n, dt_hours, wm + o, b + o, im + o, ke + o, fc + o, R.w + o, fast,
                              slow, sm, &R.wb);
                for (long g = 0; g < ng; g++) {
                    double acc_sm = 0.0, acc_ff = 0.0, acc_sf = 0.0;
                    for (long j = g_ptr[g]; j < g_ptr[g + 1]; j++) {
                        long i = g_idx[j];
                        acc_sm += g_w[j] * sm[i];
                        acc_ff += g_w[j] * fast[i];
                        acc_sf += g_w[j] * slow[i];
                    }
                    sm_out[og + g] = acc_sm;
                    ff_out[og + g] = acc_ff;
                    sf_out[og + g] = acc_sf;
                }
            }
            /* overland flow, by levels of the hillslope network (a channel cell's own overland store included):
             * the level's slots [h0, e1) are its hillslope slots [h0, h1), then its channel slots */
            for (long l = 0; l < sc.nlev; l++) {
                const long p0 = sc.level.ptr[2 * l], p1 = sc.level.ptr[2 * l + 1], p2 = sc.level.ptr[2 * l + 2];
                const long h0 = p0 * nk, h1 = p1 * nk, m = (p2 - p0) * nk;
                if (m == 0) continue;
                for (long p = p0; p < p2; p++) {
                    const long i = perm[p], q0 = sc.over.ptr[p], q1 = sc.over.ptr[p + 1];
                    for (long k = 0; k < nk; k++) {
                        const long s = p * nk + k, j = s - h0;
                        double qin = 0.0;
                        for (long e = q0; e < q1; e++) qin += R.oq[sc.over.idx[e] * nk + k];
                        R.qin[j] = qin;
                        float fast_m = mm_to_m((float)R.fast[k * n + i]);
                        if (p < p1) {
                            R.qlat[j] = fast_m;
                        } else {
                            double inter = gather_inter(&R.inter, s, R.leak);
                            R.qlat[j] = fast_m + mm_to_m((float)((double)(float)R.slow[k * n + i] + inter));
                        }
                    }
                }
                kw_solve_many(m, R.qin, R.oq + h0, R.opow + h0, R.qlat, R.alpha0 + h0, R.beta_over + h0, R.dx + h0,
                              dt32, R.oq + h0, R.opow + h0, &ws);
                /* the hillslope cells' interflow leaks: their targets are downstream on the hillslope, at a higher
                 * level, or the cell itself (added after the step); a channel cell's overland result is its
                 * channel's lateral inflow */
                float *slow_f = R.qlat;
                for (long p = p0; p < p1; p++)
                    for (long k = 0; k < nk; k++) slow_f[p * nk + k - h0] = (float)R.slow[k * n + perm[p]];
                hillslope_leaks(h1 - h0, slow_f, R.ir + h0, R.leaki + h0, R.s0 + h0, R.s1 + h0, R.area + h0,
                                R.area_t0 + h0, R.area_t1 + h0, R.has0 + h0, R.has1 + h0, R.leak + h0,
                                R.leak + ns + h0);
            }
            float *lat = R.lat + (t - tb) * ncs;
            for (long ci = 0; ci < nch; ci++) /* the channel's lateral inflow */
                for (long k = 0; k < nk; k++) lat[ci * nk + k] = R.oq[ci_pos[ci] * nk + k];
            for (long p = 0; p < n; p++) { /* the interflow that reached each cell joins its store */
                const int ch = channel[perm[p]];
                for (long k = 0; k < nk; k++) {
                    const long s = p * nk + k;
                    double in = ch ? 0.0 : gather_inter(&R.inter, s, R.leak);
                    R.inter_in[s] = in;
                    R.ir[s] = (float)((double)R.ir[s] + in);
                }
            }
            for (long k = 0; k < nk; k++) {
                const size_t o = (size_t)k * nn, og = ((size_t)k * (size_t)nt + (size_t)t) * (size_t)ng;
                for (long g = 0; g < ng; g++) {
                    long i = (long)gauge_nodes[g], s = pos[i] * nk + k;
                    if (!channel[i]) q_out[og + g] = (double)R.oq[s] * dx[i] + R.inter_in[s] * area[i] / 3.6;
                }
                if (t == state_step || (state_step < 0 && t == nt - 1)) {
                    for (long p = 0; p < n; p++) { /* a channel cell's pq: after its channel solve, below */
                        const long i = perm[p], s = p * nk + k;
                        st_w[o + i] = R.w[o + i];
                        st_ir[o + i] = R.ir[s];
                        if (!channel[i]) st_pq[o + i] = R.oq[s];
                        else st_po[o + i] = R.oq[s];
                    }
                }
            }
        }
        /* channel flow of the block's steps by a wavefront: level l of step s with level l - 1 of step s + 1
         * and so on (a solve needs its upstream cells' outflow of the same step and its own state of the step
         * before: both on earlier diagonals); the diagonal's levels are one contiguous range of channel slots */
        for (long d = 0; d < nb + sc.nlev_c - 1; d++) {
            long lmin = d - nb + 1 > 0 ? d - nb + 1 : 0, lmax = d < sc.nlev_c - 1 ? d : sc.nlev_c - 1;
            const long c0 = sc.level_c.ptr[lmin] * nk, m = sc.level_c.ptr[lmax + 1] * nk - c0;
            for (long l = lmin; l <= lmax; l++) {
                const float *out = R.out + (d - l) * ncs, *lat = R.lat + (d - l) * ncs;
                for (long ci = sc.level_c.ptr[l]; ci < sc.level_c.ptr[l + 1]; ci++) {
                    const long q0 = sc.chan.ptr[ci], q1 = sc.chan.ptr[ci + 1];
                    for (long k = 0; k < nk; k++) {
                        const long c = ci * nk + k;
                        double qin = 0.0;
                        for (long e = q0; e < q1; e++) qin += out[sc.chan.idx[e] * nk + k];
                        R.qin[c - c0] = qin;
                        R.qlat[c - c0] = lat[c];
                    }
                }
            }
            kw_solve_many(m, R.qin, R.cq + c0, R.cpow + c0, R.qlat, R.calpha + c0, R.cbeta + c0, R.cdx + c0, dt32,
                          R.cq + c0, R.cpow + c0, &ws);
            for (long l = lmin; l <= lmax; l++) {
                float *out = R.out + (d - l) * ncs;
                const long a = sc.level_c.ptr[l] * nk, z = sc.level_c.ptr[l + 1] * nk;
                memcpy(out + a, R.cq + a, (size_t)(z - a) * sizeof(float));
            }
        }
        for (long k = 0; k < nk; k++) {
            const size_t o = (size_t)k * nn;
            for (long t = tb; t < tb + nb; t++) {
                const float *out = R.out + (t - tb) * ncs;
                const size_t og = ((size_t)k * (size_t)nt + (size_t)t) * (size_t)ng;
                for (long g = 0; g < ng; g++) {
                    long i = (long)gauge_nodes[g];
                    if (channel[i]) q_out[og + g] = (double)out[sc.ci_of[pos[i]] * nk + k];
                }
                if (t == state_step || (state_step < 0 && t == nt - 1))
                    for (long ci = 0; ci < nch; ci++) st_pq[o + perm[ci_pos[ci]]] = out[ci * nk + k];
            }
        }
    }
    status = 0;
done:
    routing_free(&R);
    free(pos); free(s_x); free(s_y); free(s_who); free(g_ptr); free(g_idx); free(g_w);
    for (int k = 0; k < 8; k++) free(sf[k]);
    schedule_free(&sc);
    return status;
}

/* The parameter record (hydroagent_hpc/sim/record.py, NODE_FIELDS: the one definition of the order; ckernel.py
 * builds its ctypes.Structure from that and refuses a library whose hak_node_params_fields() or
 * hak_node_params_size() disagree). Each field points to the field's [K][n] block of the record (UNDER is used
 * only by hak_interflow_targets, which the caller runs first). */
#define HAK_NODE_FIELDS(X) X(wm) X(b) X(im) X(ke) X(fc) X(w0) X(under) X(leaki) X(ir0) X(alpha) X(beta) X(alpha0)
typedef struct {
#define HAK_FIELD(name) const double *name;
    HAK_NODE_FIELDS(HAK_FIELD)
#undef HAK_FIELD
} hak_node_params;

/* The record's field names in the struct's order, each followed by a space. */
const char *hak_node_params_fields(void) {
#define HAK_NAME(name) #name " "
    return HAK_NODE_FIELDS(HAK_NAME);
#undef HAK_NAME
}

long hak_node_params_size(void) { return (long)sizeof(hak_node_params); }

/* All steps for K parameter sets on one network (run_batch); a single run (K = 1) gets its own copy of the code,
 * compiled for one member. */
int hak_run_batch(long nk, long nt, long n, long ng, const double *precip, const double *pet, double dt_hours,
                  const hak_node_params *par, const uint8_t *channel, const double *pq0, const double *po0,
                  const int64_t *down, const double *dx, const double *area, const int64_t *t0, const int64_t *t1,
                  const double *s0, const double *s1, const int64_t *gauge_nodes, const double *weights,
                  long state_step, double *q_out, double *sm_out, double *ff_out, double *sf_out, double *st_w,
                  double *st_ir, double *st_pq, double *st_po) {
#define RUN_BATCH_ARGS nt, n, ng, precip, pet, dt_hours, par->wm, par->b, par->im, par->ke, par->fc, par->w0, \
    par->leaki, par->alpha, par->beta, par->alpha0, channel, par->ir0, pq0, po0, down, dx, area, t0, t1, s0, s1, \
    gauge_nodes, weights, state_step, q_out, sm_out, ff_out, sf_out, st_w, st_ir, st_pq, st_po
    if (nk == 1) return run_batch(1, RUN_BATCH_ARGS);
    return run_batch(nk, RUN_BATCH_ARGS);
#undef RUN_BATCH_ARGS
}

/* All steps for one parameter set: hak_run_batch with one member (per-member arrays are [n], outputs [nt][ng]). */
int hak_run(long nt, long n, long ng, const double *precip, const double *pet, double dt_hours,
            const hak_node_params *par, const uint8_t *channel, const double *pq0, const double *po0,
            const int64_t *down, const double *dx, const double *area, const int64_t *t0, const int64_t *t1,
            const double *s0, const double *s1, const int64_t *gauge_nodes, const double *weights, long state_step,
            double *q_out, double *sm_out, double *ff_out, double *sf_out,
            double *st_w, double *st_ir, double *st_pq, double *st_po) {
    return hak_run_batch(1, nt, n, ng, precip, pet, dt_hours, par, channel, pq0, po0, down, dx, area, t0, t1, s0,
                         s1, gauge_nodes, weights, state_step, q_out, sm_out, ff_out, sf_out, st_w, st_ir, st_pq,
                         st_po);
}
