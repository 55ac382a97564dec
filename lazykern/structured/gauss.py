r"""Products with one-dimensional Gaussian kernels by a fast Gauss transform, in C, with a bound.

:math:`a_i = \sum_j e^{-(x_i - z_j)^2/2}\, v_j` (inputs divided by the lengthscale) and its
derivative sums :math:`b_i = \sum_j k'(x_i - z_j)\, v_j`, :math:`k'(t) = -t\,e^{-t^2/2}`, in
:math:`O((N + M)\,p)` per dimension and column (Greengard & Strain 1991, in one dimension).

Sources and targets are grouped in boxes of width :math:`h` on one grid. With the Hermite
functions :math:`h_n(t) = (-1)^n \frac{d^n}{dt^n} e^{-t^2}`, a source box of centre :math:`s` and a
target box of centre :math:`t`, :math:`\beta = (z - s)/\sqrt2`, :math:`y = (x - t)/\sqrt2` and
:math:`c = (t - s)/\sqrt2`, Taylor's theorem gives

.. math::

    e^{-(x - z)^2/2} = \sum_{n, m \ge 0} \frac{(-1)^m}{m!\, n!}\, h_{n+m}(c)\, \beta^n y^m .

A source box keeps its Hermite moments :math:`A_n = \sum_j \beta_j^n v_j / n!`, :math:`n < p`; a
target box gathers :math:`L_m = \frac{(-1)^m}{m!} \sum_{\text{boxes}} \sum_{n < p} A_n\, h_{n+m}(c)`,
:math:`m < p`, from the source boxes within reach and evaluates :math:`\sum_m L_m y^m` (and its
derivative) at each of its targets by Horner's rule. Boxes with at most :math:`p` points are summed
point by point instead: a small source box enters :math:`L_m` through :math:`h_m((t - z)/\sqrt2)`
for each of its sources, a small target box sums each source box at each target (directly, or
through :math:`\sum_n A_n h_n((x - s)/\sqrt2)`).

Error, for every target: Cramér's inequality :math:`|h_n(t)| \le K\, 2^{n/2} \sqrt{n!}\,
e^{-t^2/2}` (:math:`K < 1.0865`) bounds each dropped term of the double series by
:math:`K (h/2)^{n+m} \sqrt{(n+m)!} / (n!\, m!)` per unit of :math:`|v_j|` (:math:`2m/h` times that
for the derivative), and boxes beyond reach hold only sources more than :math:`R` from the target,
each of whose terms is below :math:`R\,e^{-R^2/2}`. :func:`gauss_plan` picks :math:`p`, :math:`h`
and :math:`R` so that each part is at most ``tol / 2``:

.. math::

    |\hat a_i - a_i|,\ |\hat b_i - b_i| \;\le\; \mathrm{tol} \sum_j |v_j| .
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch
from torch import Tensor

from ..native import load_source
from .combine import COMBINE_SOURCE, USES_ARGTYPES, reduce

__all__ = ["gauss_plan", "gauss_reduce"]

#: Cramér's constant, rounded up: |H_n(t)| e^{-t^2/2} <= K 2^{n/2} sqrt(n!) for every n and t.
_CRAMER = 1.0865
#: Box widths tried by :func:`gauss_plan` (in lengthscales): wider boxes need more terms, narrower
#: ones put more boxes within reach of each target.
_WIDTHS = (0.125, 0.25, 0.5, 1.0, 2.0)
#: Points per lengthscale assumed where the data's is not given: 64 points in a box of half a lengthscale.
_DENSITY = 128.0


def _truncation_bound(p: int, h: float) -> float:
    """The largest truncation error of the expansions for ``p`` terms in boxes of width ``h``, per
    unit of :math:`|v_j|`, for the values and the derivatives (see the module docstring). The
    double series is summed over 60 more orders than kept, as one tensor (a plan is made once per
    bound and density, but a Python loop over its terms took most of a second)."""
    n, k = torch.meshgrid(torch.arange(p + 60, dtype=torch.float64), torch.arange(p + 60, dtype=torch.float64),
                          indexing="ij")
    outside = (n >= p) | (k >= p)
    log_terms = (math.log(_CRAMER) + (n + k) * math.log(h / 2) + 0.5 * torch.lgamma(n + k + 1)
                 - torch.lgamma(n + 1) - torch.lgamma(k + 1))  # log of K (h/2)^(n+k) sqrt((n+k)!) / (n! k!)
    terms = torch.where(outside, log_terms.exp(), 0.0)
    value, slope = float(terms.sum()), float((2 * k / h * terms).sum())
    direct = sum(_CRAMER * (h / 2) ** q * math.sqrt((q + 1) / math.factorial(q)) for q in range(p, p + 60))
    return max(value, slope, direct)


@functools.lru_cache(maxsize=None)
def _terms(tol: float, h: float) -> int:
    """The fewest terms whose truncation error in boxes of width ``h`` is within ``tol / 2``."""
    p = 1
    while _truncation_bound(p, h) > tol / 2:
        p += 1
    return p


@functools.lru_cache(maxsize=None)
def gauss_plan(tol: float, density: float = _DENSITY) -> tuple[int, float, float]:
    r"""``(p, h, reach)``: terms, box width and the reach ``R + h/2`` of the box centres a target
    sums, for the error bound ``tol`` (per unit of :math:`\sum_j |v_j|`): of the box widths
    ``_WIDTHS``, the one of least work per point when there are ``density`` points per
    lengthscale. Each point costs :math:`2p` (its moments, its Horner steps) and each pair of boxes
    within reach :math:`p^2`, shared by the points of a box: dense data takes narrow boxes and
    few terms, sparse data wide boxes.

    Example:
        >>> p, h, reach = gauss_plan(1e-10)
        >>> 8 <= p <= 40 and reach > 7
        True
        >>> gauss_plan(1e-10, density=1e5)[1] < gauss_plan(1e-10, density=10.0)[1]
        True
    """
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    cutoff = 1.0
    while cutoff * math.exp(-cutoff * cutoff / 2) > tol / 2:
        cutoff += 0.01
    best = None
    for h in _WIDTHS:
        p = _terms(tol, h)
        cost = 2 * p + p * p * (2 * (cutoff + h) / h + 1) / max(1.0, density * h)
        if best is None or cost < best[0]:
            best = (cost, p, h, cutoff + h / 2)
    return best[1], best[2], best[3]


def _density(key: Tensor) -> float:
    """Points per lengthscale of sorted rows ``key`` (inputs divided by the lengthscale), rounded
    down to a power of two so that a training loop's plans come from a few cached ones."""
    spread = float((key[:, -1] - key[:, 0]).max()) if key.shape[-1] > 1 else 0.0
    return 2.0 ** math.floor(math.log2(max(1.0, key.shape[-1] / max(spread, 1e-300))))


_SOURCE = COMBINE_SOURCE + r"""
#include <math.h>
#include <string.h>

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
"""

_ARGTYPES = [ctypes.c_int64, ctypes.c_double, ctypes.c_double] + USES_ARGTYPES


def gauss_reduce(order: Tensor, key: Tensor, num_sources: int, values: Tensor, tol: float, scales: Tensor,
                 **uses) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    """The reductions of :func:`lazykern.structured.combine.reduce` of the Gaussian kernel's sums
    :math:`a_d = K_d V` and :math:`b_d = K'_d V`, each within ``tol`` times :math:`\\sum_j |v_j|`
    of the exact sums.

    Args and returns as :func:`lazykern.structured.recurrences.matern_reduce`, with ``tol`` the bound.

    Example:
        >>> x = torch.linspace(0, 30, 400, dtype=torch.float64)[None]
        >>> key, order = torch.sort(torch.cat([x, x], 1), stable=True)
        >>> out, _, _ = gauss_reduce(order, key, 400, torch.ones(400, 1), 1e-10, torch.ones(1), out=True)
        >>> exact = torch.exp(-0.5 * (x[0, :, None] - x[0, None, :]) ** 2).sum(1)
        >>> bool((out[:, 0] - exact).abs().max() <= 1e-10 * 400)
        True
    """
    fn = load_source(_SOURCE, "lk_gauss_additive", _ARGTYPES)
    return reduce(fn, gauss_plan(tol, _density(key)), order, key, num_sources, values, scales, **uses)
