/* Half-integer Matern kernels' additive sums by two linear recurrences in sorted order: the
   method (moments S_q moved by the binomial theorem, ties, the derivative at 0) is in
   lazykern.structured.recurrences, which loads this file. */
#include <math.h>
#include <string.h>

#include "combine.h"
#include "lazykern.h"

/* One walk over a block of W columns in sorted order: row k of the block is vs + k * ld (zero for
   a target), src[k] / tgt[k] whether entry k is a source / a target, gap[k] and decay[k] the
   scaled distance c |key[k] - key[k-1]| and its exp(-gap) (shared by both walks and every block).
   Ascending (step = +1) the outputs are written, descending they are added. An entry that is both
   (one set, K(X, X)) adds its value before it reads the moments when ascending and after when
   descending, so that each coincident pair is counted once; across two sets the merged order puts
   sources first among equal values, which gives the same count. tie: the values of the current
   group of equal keys that the walk has added, subtracted from the derivative, whose value at
   t = 0 is 0 (only nu = 1/2 needs it). */
LK_INLINE void walk(
        const int p, const int W, double c, int64_t n_tot, int64_t ld, const double *restrict gap,
        const double *restrict decay, const unsigned char *restrict src, const unsigned char *restrict tgt,
        const double *restrict vs, const double *pc, const double *dc, const int step,
        double *restrict as, double *restrict bs) {
    double S0[16] = {0}, S1[16] = {0}, S2[16] = {0}, tie[16] = {0};
    const double pc0 = pc[0], pc1 = p > 0 ? pc[1] : 0.0, pc2 = p > 1 ? pc[2] : 0.0;
    const double dc0 = dc[0], dc1 = p > 0 ? dc[1] : 0.0, dc2 = p > 1 ? dc[2] : 0.0;
    const int strict = bs && dc0 != 0.0;
    const double sc = step * c;
    int64_t k = step > 0 ? 0 : n_tot - 1;
    for (int64_t s = 0; s < n_tot; ++s, k += step) {
        const int64_t hop = step > 0 ? k : k + 1;   /* the gap crossed to reach entry k */
        if (s > 0 && gap[hop] > 0.0) {
            const double delta = gap[hop], w0 = decay[hop], w1 = w0 * delta, w2 = w1 * delta * 0.5;
            /* S_q <- sum_{r <= q} w_{q-r} S_r, highest q first so each reads the old S_r */
            for (int j = 0; j < W; ++j) {
                if (p == 2) S2[j] = w0 * S2[j] + w1 * S1[j] + w2 * S0[j];
                if (p >= 1) S1[j] = w0 * S1[j] + w1 * S0[j];
                S0[j] *= w0;
                if (strict) tie[j] = 0.0;
            }
        }
        const double *restrict vk = vs + k * ld;
        const int add_first = step > 0 || !src[k] || !tgt[k];
        if (src[k] && add_first)
            for (int j = 0; j < W; ++j) { S0[j] += vk[j]; if (strict) tie[j] += vk[j]; }
        if (tgt[k]) {
            double *restrict ak = as + k * ld;
            for (int j = 0; j < W; ++j) {
                double value = pc0 * S0[j];
                if (p > 0) value += pc1 * S1[j];
                if (p > 1) value += pc2 * S2[j];
                ak[j] = step > 0 ? value : ak[j] + value;
            }
            if (bs) {
                double *restrict bk = bs + k * ld;
                for (int j = 0; j < W; ++j) {
                    double value = dc0 * (strict ? S0[j] - tie[j] : S0[j]);
                    if (p > 0) value += dc1 * S1[j];
                    if (p > 1) value += dc2 * S2[j];
                    bk[j] = step > 0 ? sc * value : bk[j] + sc * value;
                }
            }
        }
        if (src[k] && !add_first)
            for (int j = 0; j < W; ++j) { S0[j] += vk[j]; if (strict) tie[j] += vk[j]; }
    }
}

/* Both walks over one block of W columns (a constant, so the column loops unroll and vectorize). */
LK_INLINE void block(
        const int p, const int W, double c, int64_t n_tot, int64_t ld, const double *gap, const double *decay,
        const unsigned char *src, const unsigned char *tgt, const double *vs, const double *pc, const double *dc,
        double *as, double *bs) {
    walk(p, W, c, n_tot, ld, gap, decay, src, tgt, vs, pc, dc, +1, as, bs);
    walk(p, W, c, n_tot, ld, gap, decay, src, tgt, vs, pc, dc, -1, as, bs);
}

typedef struct {
    int64_t p, n_tot;
    double c;
    const double *pc, *dc;
    const void *v;
    int single;
    const int64_t *ord;
    const double *key;
    int64_t m;
} matern_problem;

/* Doubles of work per thread: flags, gaps and decays, and the values, sums and (where asked)
   derivative sums of every column in sorted order. */
static int64_t matern_work(int64_t n_tot, int64_t C, int derivatives) { return n_tot * (3 + (derivatives ? 3 : 2) * C); }

/* One dimension: the gaps and decays once, the values of all C columns gathered into sorted order
   once (rows read in sequence by the walks), blocks of 16, 12, 8, 4, 2 or 1 columns walked, and
   each target's sums handed to lk_use_row as the walk leaves them. */
static void matern_dimension(const void *problem, int64_t d, const lk_uses *u, double *out, double *work) {
    const matern_problem *P = problem;
    const int p = (int)P->p;
    const int64_t n_tot = P->n_tot, C = u->C, m = P->m, both = m < 0;
    const int64_t *ord = P->ord + d * n_tot;
    const double *key = P->key + d * n_tot, c = P->c;
    double *gap = work, *decay = gap + n_tot, *vs = decay + n_tot, *as = vs + n_tot * C;
    double *bs = u->W ? as + n_tot * C : NULL;
    unsigned char *src = (unsigned char *)(bs ? bs + n_tot * C : as + n_tot * C), *tgt = src + n_tot;
    for (int64_t k = 0; k < n_tot; ++k) {
        src[k] = both || ord[k] < m;
        tgt[k] = both || ord[k] >= m;
        gap[k] = k > 0 ? c * fabs(key[k] - key[k - 1]) : 0.0;
        decay[k] = exp(-gap[k]);
        /* the rows arrive in random order: ask for one LK_AHEAD entries ahead while copying this one */
        /* (a target entry ahead gives an address past the values: a prefetch never faults) */
        if (k + LK_AHEAD < n_tot) lk_prefetch_value(P->v, P->single, ord[k + LK_AHEAD], C);
        double *restrict row = vs + k * C;
        if (src[k]) {
            lk_value_row(P->v, P->single, ord[k], C, 0, row);
        } else {
            #pragma omp simd
            for (int64_t j = 0; j < C; ++j) row[j] = 0.0;
        }
    }
    for (int64_t j0 = 0; j0 < C;) {
        const int64_t left = C - j0;
        const int W = left >= 16 ? 16 : left >= 12 ? 12 : left >= 8 ? 8 : left >= 4 ? 4 : left >= 2 ? 2 : 1;
        const double *v0 = vs + j0;
        double *a0 = as + j0, *b0 = bs ? bs + j0 : NULL;
        #define LK_BLOCK(P_, W_) block(P_, W_, c, n_tot, C, gap, decay, src, tgt, v0, P->pc, P->dc, a0, b0)
        #define LK_WIDTHS(P_) switch (W) { \
            case 16: LK_BLOCK(P_, 16); break; case 12: LK_BLOCK(P_, 12); break; case 8: LK_BLOCK(P_, 8); break; \
            case 4: LK_BLOCK(P_, 4); break; case 2: LK_BLOCK(P_, 2); break; default: LK_BLOCK(P_, 1); break; }
        switch (p) {  /* a constant p for each: the loops over q unroll */
            case 0: LK_WIDTHS(0); break;
            case 1: LK_WIDTHS(1); break;
            default: LK_WIDTHS(2); break;
        }
        #undef LK_WIDTHS
        #undef LK_BLOCK
        j0 += W;
    }
    double dot = 0.0;
    for (int64_t k = 0; k < n_tot; ++k)
        if (tgt[k]) {
            if (k + LK_AHEAD < n_tot) lk_prefetch_row(u, both ? ord[k + LK_AHEAD] : ord[k + LK_AHEAD] - m, out);
            lk_use_row(u, d, both ? ord[k] : ord[k] - m, as + k * C, bs ? bs + k * C : NULL, out, &dot);
        }
    if (u->dots) u->dots[d] = dot;
}

/* The additive sums of D dimensions (lk_uses): ord[d, :] the merged order of the m sources and
   n targets (or of the n points of one set, m < 0), key[d, :] their sorted values. */
void lk_matern_additive(int64_t p, double c, const double *pc, const double *dc, int64_t D, int64_t n, int64_t m,
                        const int64_t *ord, const double *key, const void *v, int64_t single, int64_t C,
                        const double *scales,
                        double *out, const double *G, double *dots, const double *W, double *point) {
    const int64_t n_tot = m < 0 ? n : n + m;
    const lk_uses u = {D, n, C, scales, G, W, out, dots, point};
    const matern_problem P = {p, n_tot, c, pc, dc, v, (int)single, ord, key, m};
    lk_each_dimension(matern_dimension, &P, &u, matern_work(n_tot, C, W != NULL));
}
