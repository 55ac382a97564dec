r"""Products with one-dimensional half-integer Matérn kernels by two linear recurrences, in C.

For :math:`\nu = p + \tfrac12` (:math:`p = 0, 1, 2`) the one-dimensional Matérn kernel is a
polynomial of degree :math:`p` times an exponential of the scaled distance :math:`u = c\,|t|`
(:math:`c = 1, \sqrt3, \sqrt5`; inputs arrive divided by the lengthscale):

.. math::

    k(t) = \pi(u)\, e^{-u}, \qquad
    \pi(u) = 1,\quad 1 + u,\quad 1 + u + u^2/3 .

Its derivative is :math:`k'(t) = \operatorname{sign}(t)\, c\, (\pi' - \pi)(u)\, e^{-u}`, of the same
form. So both :math:`a_i = \sum_j k(x_i - z_j)\, v_j` and :math:`b_i = \sum_j k'(x_i - z_j)\, v_j`
are combinations of the moments

.. math::

    S_q(i) = \sum_{z_j \le x_i} e^{-u_{ij}}\, \frac{u_{ij}^q}{q!}\, v_j, \qquad
    u_{ij} = c\,(x_i - z_j), \quad q = 0, \dots, p,

and of their mirror images over :math:`z_j > x_i`. Walking the points of both sets in sorted
order, the binomial theorem moves the moments from one point to the next, a gap
:math:`\delta = c\,(x_{(k)} - x_{(k-1)}) \ge 0` apart:

.. math::

    S_q \leftarrow \sum_{r \le q} e^{-\delta} \frac{\delta^{q-r}}{(q-r)!}\, S_r ,

and a source point adds its value to :math:`S_0`. Every coefficient lies in :math:`[0, 1]`
(:math:`e^{-\delta}\delta^k/k! \le 1`), so no state can overflow however short or long the
lengthscale, and a gap too wide for :math:`e^{-\delta}` to be represented zeroes it instead of
forming :math:`0 \cdot \infty`. This is the state-space (Kalman) form of a Matérn process
(Hartikainen & Särkkä 2010) written for exact products instead of filtering: :math:`O((N + M) p)`
per dimension and column, exact up to rounding.

Ties: the merged order puts sources before targets of equal value, so the ascending walk counts a
coincident source (:math:`k(0) = 1`) and the descending walk does not. For :math:`K(X, X)` the
walks go over the one set, each point adding its value before it reads the moments when
ascending and after when descending, which again counts every coincident pair once. The derivative at
:math:`t = 0` is 0 (the convention of the pairwise engines, whose :math:`\sqrt{q + \epsilon}`
has a zero derivative there); only :math:`\nu = \tfrac12` has :math:`(\pi' - \pi)(0) \ne 0`, and its
ascending walk subtracts the coincident sources' part, summed in the walk itself.

Everything accumulates in float64 whatever the inputs' dtype: float32 recurrences lose about
1e-4 relative at :math:`10^6` points.
"""

from __future__ import annotations

import ctypes

import torch
from torch import Tensor

from ..native import load_source

__all__ = ["MATERN_POLYNOMIALS", "matern_sums"]

#: nu -> (c, coefficients of pi(u) times q!, coefficients of (pi' - pi)(u) times q!), q = 0..p:
#: the factors q! turn the moments S_q (which carry u^q / q!) into the polynomials.
MATERN_POLYNOMIALS: dict[float, tuple[float, tuple[float, ...], tuple[float, ...]]] = {
    0.5: (1.0, (1.0,), (-1.0,)),
    1.5: (3.0**0.5, (1.0, 1.0), (0.0, -1.0)),
    2.5: (5.0**0.5, (1.0, 1.0, 2.0 / 3.0), (0.0, -1.0 / 3.0, -2.0 / 3.0)),
}

_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One walk over a block of W columns in sorted order: vs[k] the values of entry k (zero for a
   target), src[k] / tgt[k] whether entry k is a source / a target, gap[k] and decay[k] the scaled
   distance c |key[k] - key[k-1]| and its exp(-gap) (shared by both walks and every block).
   Ascending (step = +1) the outputs are written, descending they are added. An entry that is both
   (one set, K(X, X)) adds its value before it reads the moments when ascending and after when
   descending, so that each coincident pair is counted once; across two sets the merged order puts
   sources first among equal values, which gives the same count. tie: the values of the current
   group of equal keys that the walk has added, subtracted from the derivative, whose value at
   t = 0 is 0 (only nu = 1/2 needs it). */
static inline __attribute__((always_inline)) void walk(
        const int p, const int W, double c, int64_t n_tot, const double *restrict gap,
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
                tie[j] = 0.0;
            }
        }
        const double *restrict vk = vs + k * W;
        const int add_first = step > 0 || !src[k] || !tgt[k];
        if (src[k] && add_first)
            for (int j = 0; j < W; ++j) { S0[j] += vk[j]; tie[j] += vk[j]; }
        if (tgt[k]) {
            double *restrict ak = as + k * W;
            for (int j = 0; j < W; ++j) {
                double value = pc0 * S0[j];
                if (p > 0) value += pc1 * S1[j];
                if (p > 1) value += pc2 * S2[j];
                ak[j] = step > 0 ? value : ak[j] + value;
            }
            if (bs) {
                double *restrict bk = bs + k * W;
                for (int j = 0; j < W; ++j) {
                    double value = dc0 * (strict ? S0[j] - tie[j] : S0[j]);
                    if (p > 0) value += dc1 * S1[j];
                    if (p > 1) value += dc2 * S2[j];
                    bk[j] = step > 0 ? sc * value : bk[j] + sc * value;
                }
            }
        }
        if (src[k] && !add_first)
            for (int j = 0; j < W; ++j) { S0[j] += vk[j]; tie[j] += vk[j]; }
    }
}

/* One block of W columns starting at j0: gather its values into sorted order, walk up and down,
   scatter the outputs back. */
static inline __attribute__((always_inline)) void block(
        const int p, const int W, double c, int64_t n_tot, const int64_t *ord, int64_t m, const double *gap,
        const double *decay, const unsigned char *src, const unsigned char *tgt, const double *v, int64_t C,
        int64_t j0, const double *pc, const double *dc, double *vs, double *as, double *bs, double *a, double *b) {
    const int both = m < 0;
    const int w = C - j0 < W ? (int)(C - j0) : W;
    for (int64_t k = 0; k < n_tot; ++k) {
        double *vk = vs + k * W;
        const double *row = v + ord[k] * C + j0;
        for (int j = 0; j < W; ++j) vk[j] = src[k] && j < w ? row[j] : 0.0;
    }
    walk(p, W, c, n_tot, gap, decay, src, tgt, vs, pc, dc, +1, as, bs);
    walk(p, W, c, n_tot, gap, decay, src, tgt, vs, pc, dc, -1, as, bs);
    for (int64_t k = 0; k < n_tot; ++k) {
        if (!tgt[k]) continue;
        const int64_t i = both ? ord[k] : ord[k] - m;
        for (int j = 0; j < w; ++j) a[i * C + j0 + j] = as[k * W + j];
        if (b) for (int j = 0; j < w; ++j) b[i * C + j0 + j] = bs[k * W + j];
    }
}

/* One dimension, all columns: the gaps and decays once, then blocks of 16, 8, 4, 2 or 1 columns
   (constant widths, so the column loops unroll and vectorize). */
static void dimension(const int p, double c, int64_t n_tot, const int64_t *ord, const double *key, int64_t m,
                      const double *v, int64_t C, const double *pc, const double *dc, double *a, double *b) {
    const int both = m < 0;
    unsigned char *src = malloc(2 * n_tot), *tgt = src + n_tot;
    double *gap = malloc(sizeof(double) * 2 * n_tot), *decay = gap + n_tot;
    double *vs = malloc(sizeof(double) * 16 * n_tot * (b ? 3 : 2));
    double *as = vs + 16 * n_tot, *bs = b ? as + 16 * n_tot : NULL;
    for (int64_t k = 0; k < n_tot; ++k) {
        src[k] = both || ord[k] < m;
        tgt[k] = both || ord[k] >= m;
        gap[k] = k > 0 ? c * fabs(key[k] - key[k - 1]) : 0.0;
        decay[k] = exp(-gap[k]);
    }
    for (int64_t j0 = 0; j0 < C;) {
        const int64_t left = C - j0;
        const int W = left >= 16 ? 16 : left > 4 ? 8 : left > 2 ? 4 : left;
        switch (W) {
            case 16: block(p, 16, c, n_tot, ord, m, gap, decay, src, tgt, v, C, j0, pc, dc, vs, as, bs, a, b); break;
            case 8: block(p, 8, c, n_tot, ord, m, gap, decay, src, tgt, v, C, j0, pc, dc, vs, as, bs, a, b); break;
            case 4: block(p, 4, c, n_tot, ord, m, gap, decay, src, tgt, v, C, j0, pc, dc, vs, as, bs, a, b); break;
            case 2: block(p, 2, c, n_tot, ord, m, gap, decay, src, tgt, v, C, j0, pc, dc, vs, as, bs, a, b); break;
            default: block(p, 1, c, n_tot, ord, m, gap, decay, src, tgt, v, C, j0, pc, dc, vs, as, bs, a, b); break;
        }
        j0 += W;
    }
    free(vs);
    free(gap);
    free(src);
}

/* For each of D dimensions d: a[d, i, :] = sum_j k(x_i - z_j) v[j, :] and, when b is not NULL,
   b[d, i, :] = sum_j k'(x_i - z_j) v[j, :], from the merged order ord[d, :] of the m sources and
   n targets (or of the n points of one set, m < 0) and their sorted values key[d, :]. */
void lk_matern_sums(int64_t p, double c, int64_t D, int64_t n, int64_t m, const int64_t *ord,
                    const double *key, const double *v, int64_t C, const double *pc, const double *dc,
                    double *a, double *b) {
    int64_t n_tot = m < 0 ? n : n + m;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t d = 0; d < D; ++d) {
        const int64_t *od = ord + d * n_tot;
        const double *kd = key + d * n_tot;
        double *ad = a + d * n * C, *bd = b ? b + d * n * C : NULL;
        switch (p) {  /* a constant p for each: the loops over q unroll */
            case 0: dimension(0, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
            case 1: dimension(1, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
            default: dimension(2, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
        }
    }
}
"""

_ARGTYPES = [ctypes.c_int64, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64] + [
    ctypes.c_void_p
] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 4


def matern_sums(
    order: Tensor, key: Tensor, num_sources: int, values: Tensor, derivative: bool, nu: float
) -> tuple[Tensor, Tensor | None]:
    """Per-dimension sums :math:`a_d = K_d V` and, with ``derivative``, :math:`b_d = K'_d V`.

    Args:
        order: ``(D, M + N)`` int64, the merged order of each dimension (an entry below
            ``num_sources`` is that source, else target ``entry - num_sources``), sources first
            among equal values.
        key: ``(D, M + N)`` float64, the sorted values.
        num_sources: ``M``, or ``-1`` when the sources are the targets (``K(X, X)``: ``order``
            is then ``(D, N)``, the order of the one set).
        values: ``(M, C)`` the sources' values (any float dtype; summed in float64).
        derivative: also return ``b``.
        nu: 0.5, 1.5 or 2.5.

    Returns:
        ``(D, N, C)`` float64 tensors ``a`` and ``b`` (``None`` without ``derivative``).

    Example:
        >>> x = torch.tensor([[0.0, 1.0]], dtype=torch.float64)      # sources 0 and 1 ...
        >>> key, order = torch.sort(torch.cat([x, x], 1), stable=True)  # ... and the same as targets
        >>> a, _ = matern_sums(order, key, 2, torch.ones(2, 1), derivative=False, nu=0.5)
        >>> torch.allclose(a[0, :, 0], torch.full((2,), 1 + torch.e ** -1, dtype=torch.float64))
        True
    """
    c, pc, dc = MATERN_POLYNOMIALS[nu]
    dims, total = order.shape
    n, cols = total - max(num_sources, 0), values.shape[-1]
    v = values.detach().to(torch.float64).contiguous()
    order, key = order.contiguous(), key.detach().to(torch.float64).contiguous()
    coefficients = torch.tensor([pc, dc], dtype=torch.float64)
    a = torch.empty(dims, n, cols, dtype=torch.float64)  # every entry is written
    b = torch.empty_like(a) if derivative else None
    fn = load_source(_SOURCE, "lk_matern_sums", _ARGTYPES)
    fn(len(pc) - 1, c, dims, n, num_sources, order.data_ptr(), key.data_ptr(), v.data_ptr(), cols,
       coefficients[0].data_ptr(), coefficients[1].data_ptr(), a.data_ptr(), 0 if b is None else b.data_ptr())
    return a, b
