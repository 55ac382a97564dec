r"""Products with one-dimensional Gaussian kernels by a fast Gauss transform, in C, with a bound.

:math:`a_i = \sum_j e^{-(x_i - z_j)^2/2}\, v_j` (inputs divided by the lengthscale) and its
derivative sums :math:`b_i = \sum_j k'(x_i - z_j)\, v_j`, :math:`k'(t) = -t\,e^{-t^2/2}`, in
:math:`O((N + M)\,p)` per dimension and column (Greengard & Strain 1991, in one dimension, without
the translation to local expansions: a target sums a few boxes' expansions directly).

The sources are grouped in boxes of width :math:`h` with centres :math:`s`. With Hermite
functions :math:`h_n(t) = (-1)^n \frac{d^n}{dt^n} e^{-t^2}`, the generating function of the
Hermite polynomials gives, for :math:`\alpha = (x - s)/\sqrt2` and :math:`\beta = (z - s)/\sqrt2`,

.. math::

    e^{-(x - z)^2/2} = \sum_{n \ge 0} h_n(\alpha)\, \frac{\beta^n}{n!}, \qquad
    a_i = \sum_{\text{boxes}} \sum_{n < p} h_n(\alpha_i)\, A_n, \quad
    A_n = \sum_{z_j \in \text{box}} \frac{\beta_j^n}{n!}\, v_j,

and :math:`\partial_x h_n(\alpha) = -h_{n+1}(\alpha)/\sqrt2` for the derivative. A box with at most
:math:`p` sources is summed directly instead (exactly). Error, for every target: Cramér's
inequality :math:`|h_n(t)| \le K\, 2^{n/2} \sqrt{n!}\, e^{-t^2/2}` (:math:`K < 1.0865`) bounds the
truncated series by :math:`K \sum_{n \ge p} (h/2)^n \sqrt{(n + 1)/n!}` per unit of :math:`|v_j|`
(the :math:`\sqrt{n+1}` covers the derivative), and boxes whose centres are more than
:math:`R + h/2` from the target are skipped, each of their terms below :math:`R\,e^{-R^2/2}`.
:func:`gauss_plan` picks :math:`p` and :math:`R` so that each part is at most ``tol / 2``:

.. math::

    |\hat a_i - a_i|,\ |\hat b_i - b_i| \;\le\; \mathrm{tol} \sum_j |v_j| .
"""

from __future__ import annotations

import ctypes
import functools
import math

import torch
from torch import Tensor

from ..cpu.build import load_source

__all__ = ["gauss_plan", "gauss_sums"]

#: Cramér's constant, rounded up: |H_n(t)| e^{-t^2/2} <= K 2^{n/2} sqrt(n!) for every n and t.
_CRAMER = 1.0865
#: Box widths tried by :func:`gauss_plan` (in lengthscales): wider boxes need more terms, narrower
#: ones put more boxes within reach of each target.
_WIDTHS = (0.5, 1.0, 1.5, 2.0, 3.0)


@functools.lru_cache(maxsize=None)
def gauss_plan(tol: float) -> tuple[int, float, float]:
    """``(p, h, reach)``: terms, box width and the reach ``R + h/2`` of the box centres a target
    sums, for the error bound ``tol`` (per unit of :math:`\\sum_j |v_j|`), the cheapest of
    :data:`_WIDTHS` by terms times boxes within reach.

    Example:
        >>> p, h, reach = gauss_plan(1e-10)
        >>> 10 <= p <= 40 and reach > 7
        True
    """
    if not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be in (0, 1), got {tol!r}")
    cutoff = 1.0
    while cutoff * math.exp(-cutoff * cutoff / 2) > tol / 2:
        cutoff += 0.01
    best = None
    for h in _WIDTHS:
        p, tail = 0, float("inf")
        while tail > tol / 2:
            p += 1
            # the tail from p on; its terms fall faster than geometrically past the first
            tail = _CRAMER * sum((h / 2) ** n * math.sqrt((n + 1) / math.factorial(n)) for n in range(p, p + 60))
        reach = cutoff + h / 2
        cost = p * (2 * reach / h + 1)
        if best is None or cost < best[0]:
            best = (cost, p, h, reach)
    return best[1], best[2], best[3]


_SOURCE = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* One dimension: sources in ascending order are grouped in boxes of width h; each target sums the
   boxes whose centres lie within reach, directly (at most p sources) or by p Hermite terms. Entry
   ord[k] < m is source ord[k], else target ord[k] - m; with m < 0 every entry is both. */
static void gauss_dim(int64_t p, double h, double reach, int64_t n_tot, const int64_t *ord,
                      const double *key, int64_t m, const double *v, int64_t C, double *a, double *b) {
    const double rs2 = 0.70710678118654752440; /* 1 / sqrt(2) */
    const int both = m < 0;
    int64_t *src = malloc(sizeof(int64_t) * n_tot);
    double *zs = malloc(sizeof(double) * n_tot);
    int64_t ms = 0;
    for (int64_t k = 0; k < n_tot; ++k)
        if (both || ord[k] < m) { src[ms] = ord[k]; zs[ms] = key[k]; ++ms; }
    if (ms == 0) { free(zs); free(src); return; }
    int64_t *start = malloc(sizeof(int64_t) * (ms + 1)), *moment = malloc(sizeof(int64_t) * ms);
    double *centre = malloc(sizeof(double) * ms);
    int64_t nb = 0, dense = 0;
    double z0 = zs[0], current = -1.0;
    for (int64_t s = 0; s < ms; ++s) {
        double id = floor((zs[s] - z0) / h);
        if (nb == 0 || id != current) { start[nb] = s; centre[nb] = z0 + (id + 0.5) * h; current = id; ++nb; }
    }
    start[nb] = ms;
    for (int64_t q = 0; q < nb; ++q) moment[q] = start[q + 1] - start[q] > p ? dense++ : -1;
    double *mom = calloc((size_t)(dense > 0 ? dense : 1) * p * C, sizeof(double));
    for (int64_t q = 0; q < nb; ++q) {
        if (moment[q] < 0) continue;
        double *mq = mom + moment[q] * p * C;
        for (int64_t s = start[q]; s < start[q + 1]; ++s) {
            double beta = (zs[s] - centre[q]) * rs2, t = 1.0;
            const double *vs = v + src[s] * C;
            for (int64_t k = 0; k < p; ++k) {
                for (int64_t c = 0; c < C; ++c) mq[k * C + c] += t * vs[c];
                t *= beta / (double)(k + 1);
            }
        }
    }
    double *hh = malloc(sizeof(double) * (p + 1));
    int64_t lo = 0, hi = 0;
    for (int64_t k = 0; k < n_tot; ++k) {
        if (!both && ord[k] < m) continue;
        int64_t i = both ? ord[k] : ord[k] - m;
        double x = key[k];
        double *ai = a + i * C, *bi = b ? b + i * C : NULL;
        while (lo < nb && centre[lo] < x - reach) ++lo;
        while (hi < nb && centre[hi] <= x + reach) ++hi;
        for (int64_t q = lo; q < hi; ++q) {
            if (moment[q] < 0) {
                for (int64_t s = start[q]; s < start[q + 1]; ++s) {
                    double t = x - zs[s], e = exp(-0.5 * t * t);
                    const double *vs = v + src[s] * C;
                    for (int64_t c = 0; c < C; ++c) ai[c] += e * vs[c];
                    if (bi) for (int64_t c = 0; c < C; ++c) bi[c] -= t * e * vs[c];
                }
                continue;
            }
            double alpha = (x - centre[q]) * rs2;
            hh[0] = exp(-alpha * alpha);
            if (p >= 1) hh[1] = 2.0 * alpha * hh[0];
            for (int64_t k2 = 1; k2 < p; ++k2) hh[k2 + 1] = 2.0 * alpha * hh[k2] - 2.0 * (double)k2 * hh[k2 - 1];
            const double *mq = mom + moment[q] * p * C;
            for (int64_t c = 0; c < C; ++c) {
                double acc = 0.0, accb = 0.0;
                for (int64_t k2 = 0; k2 < p; ++k2) { acc += mq[k2 * C + c] * hh[k2]; accb += mq[k2 * C + c] * hh[k2 + 1]; }
                ai[c] += acc;
                if (bi) bi[c] -= accb * rs2;
            }
        }
    }
    free(hh); free(mom); free(centre); free(moment); free(start); free(zs); free(src);
}

void lk_gauss_sums(int64_t p, double h, double reach, int64_t D, int64_t n, int64_t m, const int64_t *ord,
                   const double *key, const double *v, int64_t C, double *a, double *b) {
    int64_t n_tot = m < 0 ? n : n + m;
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t d = 0; d < D; ++d)
        gauss_dim(p, h, reach, n_tot, ord + d * n_tot, key + d * n_tot, m, v, C, a + d * n * C,
                  b ? b + d * n * C : NULL);
}
"""

_ARGTYPES = [ctypes.c_int64, ctypes.c_double, ctypes.c_double, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64] + [
    ctypes.c_void_p
] * 3 + [ctypes.c_int64] + [ctypes.c_void_p] * 2


def gauss_sums(
    order: Tensor, key: Tensor, num_sources: int, values: Tensor, derivative: bool, tol: float
) -> tuple[Tensor, Tensor | None]:
    """Per-dimension sums :math:`a_d = K_d V` and, with ``derivative``, :math:`b_d = K'_d V` of the
    Gaussian kernel, within ``tol`` times :math:`\\sum_j |v_j|` of the exact sums.

    Args and returns as :func:`lazykern.structured.recurrences.matern_sums`, with ``tol`` the bound.

    Example:
        >>> x = torch.linspace(0, 30, 400, dtype=torch.float64)[None]
        >>> key, order = torch.sort(torch.cat([x, x], 1), stable=True)
        >>> a, _ = gauss_sums(order, key, 400, torch.ones(400, 1), derivative=False, tol=1e-10)
        >>> exact = torch.exp(-0.5 * (x[0, :, None] - x[0, None, :]) ** 2).sum(1)
        >>> bool((a[0, :, 0] - exact).abs().max() <= 1e-10 * 400)
        True
    """
    p, h, reach = gauss_plan(tol)
    dims, total = order.shape
    n, cols = total - max(num_sources, 0), values.shape[-1]
    v = values.detach().to(torch.float64).contiguous()
    order, key = order.contiguous(), key.detach().to(torch.float64).contiguous()
    a = torch.zeros(dims, n, cols, dtype=torch.float64)
    b = torch.zeros_like(a) if derivative else None
    fn = load_source(_SOURCE, "lk_gauss_sums", _ARGTYPES)
    fn(p, h, reach, dims, n, num_sources, order.data_ptr(), key.data_ptr(), v.data_ptr(), cols, a.data_ptr(),
       0 if b is None else b.data_ptr())
    return a, b
