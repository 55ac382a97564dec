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

from ..cpu.build import load_source

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

/* One walk of one dimension. k runs over the merged order, ascending when step = +1, descending
   when step = -1. Entry ord[k] < m is source ord[k], else target ord[k] - m; with m < 0 (one set,
   K(X, X)) every entry is both, added before it is read when ascending and after when descending,
   so that each coincident pair is counted once. S holds the moments S_q[c] at q * C + c; tie the
   sources of the current group of equal values (for the derivative at t = 0, nu = 1/2 only). */
static inline __attribute__((always_inline)) void walk(
        const int p, double c, int64_t n_tot, const int64_t *ord, const double *key, int64_t m,
        const double *v, int64_t C, const double *pc, const double *dc, int step,
        double *a, double *b, double *S, double *tie) {
    double w[3];
    double group = NAN;
    const int both = m < 0;
    const int strict = b && dc[0] != 0.0 && (step > 0 || both);
    memset(S, 0, sizeof(double) * (p + 1) * C);
    memset(tie, 0, sizeof(double) * C);
    int64_t k = step > 0 ? 0 : n_tot - 1;
    double last = key[k];
    for (int64_t s = 0; s < n_tot; ++s, k += step) {
        double x = key[k];
        double delta = c * fabs(x - last);
        last = x;
        if (delta > 0.0) {
            w[0] = exp(-delta);
            for (int q = 1; q <= p; ++q) w[q] = w[q - 1] * delta / q;
            for (int q = p; q >= 0; --q) {        /* in place: S_q reads S_r, r <= q, still old */
                double *Sq = S + q * C;
                for (int64_t j = 0; j < C; ++j) {
                    double acc = w[0] * Sq[j];
                    for (int r = 0; r < q; ++r) acc += w[q - r] * S[r * C + j];
                    Sq[j] = acc;
                }
            }
        }
        if (strict && x != group) {
            group = x;
            memset(tie, 0, sizeof(double) * C);
        }
        int64_t e = ord[k];
        int64_t source = both ? e : (e < m ? e : -1), target = both ? e : (e < m ? -1 : e - m);
        for (int pass = 0; pass < 2; ++pass) {
            if (source >= 0 && pass == (both && step < 0)) {
                const double *ve = v + source * C;
                for (int64_t j = 0; j < C; ++j) S[j] += ve[j];
                if (strict) for (int64_t j = 0; j < C; ++j) tie[j] += ve[j];
            }
            if (target >= 0 && pass == !(both && step < 0)) {
                double *ai = a + target * C;
                for (int64_t j = 0; j < C; ++j) {
                    double acc = 0.0;
                    for (int q = 0; q <= p; ++q) acc += pc[q] * S[q * C + j];
                    ai[j] += acc;
                }
                if (b) {
                    double *bi = b + target * C;
                    for (int64_t j = 0; j < C; ++j) {
                        double acc = 0.0;
                        for (int q = 0; q <= p; ++q) acc += dc[q] * S[q * C + j];
                        if (strict) acc -= dc[0] * tie[j];
                        bi[j] += step * c * acc;
                    }
                }
            }
        }
    }
}

static void walks(const int p, double c, int64_t n_tot, const int64_t *ord, const double *key, int64_t m,
                  const double *v, int64_t C, const double *pc, const double *dc, double *a, double *b) {
    double *S = malloc(sizeof(double) * ((p + 1) * C + C));
    walk(p, c, n_tot, ord, key, m, v, C, pc, dc, +1, a, b, S, S + (p + 1) * C);
    walk(p, c, n_tot, ord, key, m, v, C, pc, dc, -1, a, b, S, S + (p + 1) * C);
    free(S);
}

/* For each of D dimensions d: a[d, i, :] = sum_j k(x_i - z_j) v[j, :] and, when b is not NULL,
   b[d, i, :] = sum_j k'(x_i - z_j) v[j, :], from the merged order ord[d, :] of the m sources and
   n targets (or of the n points of one set, m < 0) and their sorted values key[d, :]. a and b
   must be zeroed. */
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
            case 0: walks(0, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
            case 1: walks(1, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
            default: walks(2, c, n_tot, od, kd, m, v, C, pc, dc, ad, bd); break;
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
    a = torch.zeros(dims, n, cols, dtype=torch.float64)
    b = torch.zeros_like(a) if derivative else None
    fn = load_source(_SOURCE, "lk_matern_sums", _ARGTYPES)
    fn(len(pc) - 1, c, dims, n, num_sources, order.data_ptr(), key.data_ptr(), v.data_ptr(), cols,
       coefficients[0].data_ptr(), coefficients[1].data_ptr(), a.data_ptr(), 0 if b is None else b.data_ptr())
    return a, b
