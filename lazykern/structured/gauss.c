/* The Gaussian kernel's additive sums by a fast Gauss transform in one dimension, within a bound:
   the method, its error bound and the plan (p, h, reach) are in lazykern.structured.gauss, which
   loads this file. */
#include <math.h>
#include <string.h>

#include "combine.h"
#include "lazykern.h"

#define RS2 0.70710678118654752440 /* 1 / sqrt(2) */

/* Hermite functions h_0(t) .. h_{count-1}(t) by their recurrence h_{k+1} = 2t h_k - 2k h_{k-1}. */
static void hermite(double t, int64_t count, double *h) {
    h[0] = exp(-t * t);
    if (count > 1) h[1] = 2.0 * t * h[0];
    for (int64_t k = 1; k + 1 < count; ++k) h[k + 1] = 2.0 * t * h[k] - 2.0 * (double)k * h[k - 1];
}

/* Boxes of width h over sorted values z[0..count), on the grid of origin o: start[q] (start[nb] =
   count) and centre[q]; returns nb. */
static int64_t boxes(const double *z, int64_t count, double o, double h, int64_t *start, double *centre) {
    int64_t nb = 0;
    double current = -1.0;
    for (int64_t s = 0; s < count; ++s) {
        double id = floor((z[s] - o) / h);
        if (nb == 0 || id != current) { start[nb] = s; centre[nb] = o + (id + 0.5) * h; current = id; ++nb; }
    }
    start[nb] = count;
    return nb;
}

/* One dimension. Sources and targets in ascending order are grouped in boxes of width h. A source
   box with more than p sources is summed through its p Hermite moments A_n, a smaller one source by
   source. A target box with more than p targets gathers, from every source box within reach, the p
   Taylor coefficients L_m of the sum about its centre and evaluates them at each target; a smaller
   one sums the source boxes within reach at each target. Entry ord[k] < m is source ord[k], else
   target ord[k] - m; with m < 0 every entry is both. Its buffers are carved from scratch, of
   gauss_scratch(n_tot, p, C) doubles. */
static int64_t gauss_scratch(int64_t n_tot, int64_t p, int64_t C) { return n_tot * (10 + 4 * C) + p * (C + 3) + 3; }

static void gauss_dim(int64_t p, double h, double reach, int64_t n_tot, const int64_t *ord,
                      const double *key, int64_t m, const void *v, int single, int64_t C, double *a, double *b,
                      double *scratch) {
    const int both = m < 0;
    int64_t *src = (int64_t *)scratch, *tgt = src + n_tot;
    double *zs = scratch + 2 * n_tot, *xs = zs + n_tot;
    int64_t ms = 0, ns = 0;
    for (int64_t k = 0; k < n_tot; ++k) {
        if (both || ord[k] < m) { src[ms] = ord[k]; zs[ms++] = key[k]; }
        if (both || ord[k] >= m) { tgt[ns] = both ? ord[k] : ord[k] - m; xs[ns++] = key[k]; }
    }
    if (ms == 0 || ns == 0) {
        for (int64_t i = 0; i < ns; ++i) {
            memset(a + tgt[i] * C, 0, sizeof(double) * C);
            if (b) memset(b + tgt[i] * C, 0, sizeof(double) * C);
        }
        return;
    }
    /* Ties: the expansions run over distinct values, each source value carrying its sources' values
       summed (vu, in sorted order, so that they are also read in sequence) and each target value's
       sums (au, bu) copied to its targets at the end. Discrete inputs, as many UCI columns are, have
       a few hundred distinct values among thousands of points. */
    double *vu = xs + n_tot, *au = vu + n_tot * C, *bu = b ? au + n_tot * C : NULL;
    int64_t *first = (int64_t *)(au + (b ? 2 : 1) * n_tot * C);
    int64_t mu = 0, nu = 0;
    for (int64_t s = 0; s < ms; ++s) {
        if (s + LK_AHEAD < ms) lk_prefetch_value(v, single, src[s + LK_AHEAD], C);
        if (mu == 0 || zs[s] != zs[mu - 1]) {
            zs[mu] = zs[s];
            lk_value_row(v, single, src[s], C, 0, vu + mu * C);
            ++mu;
        } else {
            lk_value_row(v, single, src[s], C, 1, vu + (mu - 1) * C);
        }
    }
    for (int64_t i = 0; i < ns; ++i)
        if (nu == 0 || xs[i] != xs[nu - 1]) { xs[nu] = xs[i]; first[nu++] = i; }
    first[nu] = ns;
    ms = mu;
    ns = nu;
    memset(au, 0, sizeof(double) * (size_t)(ns * C));
    if (bu) memset(bu, 0, sizeof(double) * (size_t)(ns * C));
    const double o = key[0];
    int64_t *sstart = first + ns + 1, *tstart = sstart + ms + 1;
    double *scentre = (double *)(tstart + ns + 1), *tcentre = scentre + ms;
    int64_t *moment = (int64_t *)(tcentre + ns);
    const int64_t nsb = boxes(zs, ms, o, h, sstart, scentre), ntb = boxes(xs, ns, o, h, tstart, tcentre);
    int64_t dense = 0;
    for (int64_t q = 0; q < nsb; ++q) moment[q] = sstart[q + 1] - sstart[q] > p ? dense++ : -1;
    double *mom = (double *)(moment + ms);   /* dense < ms / p boxes: at most ms C doubles */
    memset(mom, 0, sizeof(double) * (size_t)(dense * p * C));
    for (int64_t q = 0; q < nsb; ++q) {   /* A_n = sum_z beta^n / n! v_z, beta = (z - s) / sqrt 2 */
        if (moment[q] < 0) continue;
        double *mq = mom + moment[q] * p * C;
        for (int64_t s = sstart[q]; s < sstart[q + 1]; ++s) {
            double beta = (zs[s] - scentre[q]) * RS2, t = 1.0;
            const double *vs = vu + s * C;
            for (int64_t n = 0; n < p; ++n) {
                #pragma omp simd
                for (int64_t c = 0; c < C; ++c) mq[n * C + c] += t * vs[c];
                t *= beta / (double)(n + 1);
            }
        }
    }
    double *hh = mom + dense * p * C, *L = hh + 2 * p;
    double *sign_fact = L + p * C;   /* (-1)^m / m! */
    sign_fact[0] = 1.0;
    for (int64_t k = 1; k < p; ++k) sign_fact[k] = -sign_fact[k - 1] / (double)k;
    int64_t lo = 0, hi = 0;   /* source boxes within reach of the current target box (dense) */
    int64_t plo = 0, phi = 0; /* ... and of the current target (sparse boxes) */
    for (int64_t q = 0; q < ntb; ++q) {
        const double t = tcentre[q];
        if (tstart[q + 1] - tstart[q] > p) {
            while (lo < nsb && scentre[lo] < t - reach - h / 2) ++lo;
            if (hi < lo) hi = lo;
            while (hi < nsb && scentre[hi] <= t + reach + h / 2) ++hi;
            memset(L, 0, sizeof(double) * p * C);
            for (int64_t r = lo; r < hi; ++r) {
                if (moment[r] >= 0) {   /* L_m += (-1)^m / m! sum_n A_n h_{n+m}((t - s) / sqrt 2) */
                    hermite((t - scentre[r]) * RS2, 2 * p, hh);
                    const double *mr = mom + moment[r] * p * C;
                    for (int64_t mm = 0; mm < p; ++mm)
                        for (int64_t n = 0; n < p; ++n) {
                            const double f = sign_fact[mm] * hh[n + mm];
                            #pragma omp simd
                            for (int64_t c = 0; c < C; ++c) L[mm * C + c] += f * mr[n * C + c];
                        }
                } else {                /* L_m += (-1)^m / m! h_m((t - z) / sqrt 2) v_z */
                    for (int64_t s = sstart[r]; s < sstart[r + 1]; ++s) {
                        hermite((t - zs[s]) * RS2, p, hh);
                        const double *vs = vu + s * C;
                        for (int64_t mm = 0; mm < p; ++mm) {
                            const double f = sign_fact[mm] * hh[mm];
                            #pragma omp simd
                            for (int64_t c = 0; c < C; ++c) L[mm * C + c] += f * vs[c];
                        }
                    }
                }
            }
            for (int64_t i = tstart[q]; i < tstart[q + 1]; ++i) {   /* Horner in y = (x - t) / sqrt 2 */
                const double y = (xs[i] - t) * RS2;
                double *restrict ai = au + i * C, *restrict bi = bu ? bu + i * C : NULL;
                /* the columns innermost: independent chains, so the loops vectorize */
                #pragma omp simd
                for (int64_t c = 0; c < C; ++c) ai[c] = L[(p - 1) * C + c];
                if (bi) {
                    #pragma omp simd
                    for (int64_t c = 0; c < C; ++c) bi[c] = 0.0;
                    for (int64_t mm = p - 2; mm >= 0; --mm)
                        #pragma omp simd
                        for (int64_t c = 0; c < C; ++c) {
                            bi[c] = bi[c] * y + ai[c];
                            ai[c] = ai[c] * y + L[mm * C + c];
                        }
                    #pragma omp simd
                    for (int64_t c = 0; c < C; ++c) bi[c] *= RS2;
                } else {
                    for (int64_t mm = p - 2; mm >= 0; --mm)
                        #pragma omp simd
                        for (int64_t c = 0; c < C; ++c) ai[c] = ai[c] * y + L[mm * C + c];
                }
            }
            continue;
        }
        for (int64_t i = tstart[q]; i < tstart[q + 1]; ++i) {
            const double x = xs[i];
            double *ai = au + i * C, *bi = bu ? bu + i * C : NULL;
            while (plo < nsb && scentre[plo] < x - reach) ++plo;
            if (phi < plo) phi = plo;
            while (phi < nsb && scentre[phi] <= x + reach) ++phi;
            for (int64_t r = plo; r < phi; ++r) {
                if (moment[r] < 0) {
                    for (int64_t s = sstart[r]; s < sstart[r + 1]; ++s) {
                        const double d = x - zs[s], e = exp(-0.5 * d * d);
                        const double *vs = vu + s * C;
                        #pragma omp simd
                        for (int64_t c = 0; c < C; ++c) ai[c] += e * vs[c];
                        if (bi) {
                            #pragma omp simd
                            for (int64_t c = 0; c < C; ++c) bi[c] -= d * e * vs[c];
                        }
                    }
                    continue;
                }
                hermite((x - scentre[r]) * RS2, p + 1, hh);
                const double *mr = mom + moment[r] * p * C;
                for (int64_t n = 0; n < p; ++n) {
                    const double *restrict mn = mr + n * C;
                    const double hv = hh[n], hs = hh[n + 1] * RS2;
                    #pragma omp simd
                    for (int64_t c = 0; c < C; ++c) ai[c] += mn[c] * hv;
                    if (bi) {
                        #pragma omp simd
                        for (int64_t c = 0; c < C; ++c) bi[c] -= mn[c] * hs;
                    }
                }
            }
        }
    }
    for (int64_t q = 0; q < ns; ++q)   /* each distinct target value's sums to its targets */
        for (int64_t i = first[q]; i < first[q + 1]; ++i) {
            lk_value_row(au, 0, q, C, 0, a + tgt[i] * C);
            if (b) lk_value_row(bu, 0, q, C, 0, b + tgt[i] * C);
        }
}

typedef struct {
    int64_t p, n_tot, m;
    double h, reach;
    const int64_t *ord;
    const double *key;
    const void *v;
    int single;
} gauss_problem;

/* One dimension into the work buffer (its targets' sums a and, where the inputs' gradient is
   asked for, b, in the targets' own order), then each target's rows to lk_use_row. */
static void gauss_dimension(const void *problem, int64_t d, const lk_uses *u, double *out, double *work) {
    const gauss_problem *P = problem;
    const int64_t n = u->n, C = u->C;
    double *a = work, *b = u->W ? work + n * C : NULL;
    gauss_dim(P->p, P->h, P->reach, P->n_tot, P->ord + d * P->n_tot, P->key + d * P->n_tot, P->m, P->v, P->single, C, a, b,
              work + (u->W ? 2 : 1) * n * C);
    double dot = 0.0;
    for (int64_t i = 0; i < n; ++i) lk_use_row(u, d, i, a + i * C, b ? b + i * C : NULL, out, &dot);
    if (u->dots) u->dots[d] = dot;
}

/* The additive sums of D dimensions (lk_uses), as lk_matern_additive. */
void lk_gauss_additive(int64_t p, double h, double reach, int64_t D, int64_t n, int64_t m, const int64_t *ord,
                       const double *key, const void *v, int64_t single, int64_t C, const double *scales, double *out,
                       const double *G, double *dots, const double *W, double *point) {
    const int64_t n_tot = m < 0 ? n : n + m;
    const lk_uses u = {D, n, C, scales, G, W, out, dots, point};
    const gauss_problem P = {p, n_tot, m, h, reach, ord, key, v, (int)single};
    lk_each_dimension(gauss_dimension, &P, &u, (W ? 2 : 1) * n * C + gauss_scratch(n_tot, p, C));
}
