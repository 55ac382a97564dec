r"""What each dimension's sums feed, summed over the dimensions inside the C walks.

A walk over dimension :math:`d` yields, for every target :math:`i`, the sums
:math:`a_{d,i} = \sum_j k_d(x_{id} - z_{jd})\, v_j` and, where asked, the derivative sums
:math:`b_{d,i} = \sum_j k'_d(x_{id} - z_{jd})\, v_j` (rows of :math:`C` columns). Every product and
gradient of an additive kernel needs only three reductions of them over the dimensions:

.. math::

    \text{out}_i = \sum_d s_d\, a_{d,i}, \qquad
    \text{dots}_d = \sum_i \langle G_i, a_{d,i} \rangle, \qquad
    \text{point}_{d,i} = s_d\, \langle W_i, b_{d,i} \rangle

(the product, or :math:`\sum_d s_d K_d^\top G` for :math:`V`'s gradient; the scales' gradient; the
inputs' gradient, :math:`W` being the row weights of the chain rule). Reducing them row by row as
the walk produces them keeps :math:`O((N + M) C)` numbers per thread instead of the
:math:`(D, N, C)` sums, and reads each dimension's sums once, while they are in cache.

:data:`COMBINE_SOURCE` is the C that every family's walks include: the ``lk_uses`` record, the row
step ``lk_use_row`` and ``lk_each_dimension``, which runs a family's per-dimension function over the
dimensions in parallel with one accumulator of ``out`` per thread. :func:`reduce` is the Python
side: it allocates what is asked for and calls a family's compiled entry point, whose trailing
arguments are :data:`USES_ARGTYPES`.
"""

from __future__ import annotations

import ctypes
from typing import Callable, Sequence

import torch
from torch import Tensor

__all__ = ["COMBINE_SOURCE", "USES_ARGTYPES", "reduce"]

#: The C that every family's walks include (the ``lk_uses`` record, ``lk_use_row``, ``lk_each_dimension``).
COMBINE_SOURCE = r"""
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* What the dimensions' sums feed (NULL: not wanted). out (n, C) = sum_d s_d a_d; dots[d] = <G, a_d>;
   point[d * n + i] = s_d <W_i, b_d,i> (a row per dimension, so that threads never share a line). */
typedef struct {
    int64_t D, n, C;
    const double *scales, *G, *W;
    double *out, *dots, *point;
} lk_uses;

/* How many entries ahead the walks ask for the rows they will read or add to in random order. */
#define LK_AHEAD 16

/* Ask for target i's rows of out, G and W (whichever are in use) ahead of lk_use_row. */
static inline __attribute__((always_inline)) void lk_prefetch_row(const lk_uses *u, int64_t i, const double *out) {
    if (i < 0 || i >= u->n) return;  /* a source entry ahead of a target in a merged order */
    if (out) __builtin_prefetch(out + i * u->C, 1);
    if (u->G) __builtin_prefetch(u->G + i * u->C);
    if (u->W) __builtin_prefetch(u->W + i * u->C);
}

/* Row j of the sources' values, C numbers of float32 (single) or float64, into row as float64 (add:
   added to it). Float32 values are read as given, half the bytes of a float64 copy; each converts
   exactly. */
static inline __attribute__((always_inline)) void lk_value_row(
        const void *values, int single, int64_t j, int64_t C, int add, double *restrict row) {
    if (single) {
        const float *restrict from = (const float *)values + j * C;
        if (add) {
            #pragma omp simd
            for (int64_t c = 0; c < C; ++c) row[c] += from[c];
        } else {
            #pragma omp simd
            for (int64_t c = 0; c < C; ++c) row[c] = from[c];
        }
    } else {
        const double *restrict from = (const double *)values + j * C;
        if (add) {
            #pragma omp simd
            for (int64_t c = 0; c < C; ++c) row[c] += from[c];
        } else {
            #pragma omp simd
            for (int64_t c = 0; c < C; ++c) row[c] = from[c];
        }
    }
}

/* Ask for row j of the sources' values ahead of lk_value_row (an address past them never faults). */
static inline __attribute__((always_inline)) void lk_prefetch_value(const void *values, int single, int64_t j, int64_t C) {
    __builtin_prefetch((const char *)values + j * C * (single ? 4 : 8));
}

/* Target i's rows a, b of dimension d into the thread's accumulator out and its dot. */
static inline __attribute__((always_inline)) void lk_use_row(
        const lk_uses *u, int64_t d, int64_t i, const double *restrict a, const double *restrict b,
        double *restrict out, double *restrict dot) {
    const int64_t C = u->C;
    const double s = u->scales[d];
    if (out) {
        double *restrict o = out + i * C;
        #pragma omp simd
        for (int64_t c = 0; c < C; ++c) o[c] += s * a[c];
    }
    if (u->G) {
        const double *restrict g = u->G + i * C;
        double t = 0.0;
        #pragma omp simd reduction(+ : t)
        for (int64_t c = 0; c < C; ++c) t += g[c] * a[c];
        *dot += t;
    }
    if (u->W) {
        const double *restrict w = u->W + i * C;
        double t = 0.0;
        #pragma omp simd reduction(+ : t)
        for (int64_t c = 0; c < C; ++c) t += w[c] * b[c];
        u->point[d * u->n + i] = s * t;
    }
}

/* Each thread's scratch, kept from one call to the next and grown when a call needs more. Buffers of
   this size (tens to hundreds of MB at 10^6 points) come from mmap: allocated and freed on every
   call they cost page faults on first touch and, when freed, a TLB shootdown of every core; that
   was a third of a product's time at N = 10^6. Thread-local, so calls from several threads (each
   with its own OpenMP team) never share one. */
static __thread double *lk_kept = NULL;
static __thread int64_t lk_kept_doubles = 0;

static double *lk_scratch(int64_t doubles) {
    if (doubles > lk_kept_doubles) {
        free(lk_kept);
        lk_kept = malloc(sizeof(double) * (size_t)doubles);
        lk_kept_doubles = lk_kept ? doubles : 0;
    }
    return lk_kept;
}

/* fn(problem, d, uses, out, work) for every dimension d, in parallel, each thread with its own work
   buffer of work_doubles and its own accumulator of out (thread 0's is out itself). The dimensions
   go to the threads in a fixed round robin and the accumulators are added in thread order, so that
   the result does not depend on timing: autograd's checks (gradcheck) ask a backward pass to repeat
   to the last bit. */
typedef void (*lk_dimension_fn)(const void *, int64_t, const lk_uses *, double *, double *);

static void lk_each_dimension(lk_dimension_fn fn, const void *problem, const lk_uses *u, int64_t work_doubles) {
    const int64_t most = omp_get_max_threads();
    const int threads = u->D < most ? (int)u->D : (int)most;
    const int64_t size = u->out ? u->n * u->C : 0;
    double *accumulators[threads];
    int team = 1;  /* the team's actual size: smaller when nested in another parallel region */
    #pragma omp parallel num_threads(threads)
    {
        const int t = omp_get_thread_num();
        #pragma omp single
        team = omp_get_num_threads();
        const int64_t own = t > 0 ? size : 0;
        double *work = lk_scratch(own + (work_doubles > 0 ? work_doubles : 1));
        double *out = size ? (t > 0 ? work + work_doubles : u->out) : NULL;
        if (out) memset(out, 0, sizeof(double) * (size_t)size);
        accumulators[t] = out;
        #pragma omp barrier
        #pragma omp for schedule(static, 1)
        for (int64_t d = 0; d < u->D; ++d) fn(problem, d, u, out, work);
        /* the implicit barrier of the loop: every accumulator is complete */
        if (size) {
            #pragma omp for schedule(static)
            for (int64_t k = 0; k < size; ++k) {
                double total = u->out[k];
                for (int s = 1; s < team; ++s) total += accumulators[s][k];
                u->out[k] = total;
            }
        }
    }
}
"""

#: The ctypes of the trailing arguments of every family's entry point (D, n, m, order, key, values,
#: single (the values are float32), C, scales, out, G, dots, W, point).
USES_ARGTYPES = [ctypes.c_int64] * 3 + [ctypes.c_void_p] * 3 + [ctypes.c_int64] * 2 + [ctypes.c_void_p] * 6


def _pointer(t: Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def _rows(t: Tensor | None) -> Tensor | None:
    return None if t is None else t.detach().to(torch.float64).contiguous()


def reduce(fn: Callable, leading: Sequence, order: Tensor, key: Tensor, num_sources: int, values: Tensor,
           scales: Tensor, *, out: bool = False, grad: Tensor | None = None,
           weights: Tensor | None = None) -> tuple[Tensor | None, Tensor | None, Tensor | None]:
    r"""``(out, dots, point)`` of a family's walks (``None`` where not asked): :math:`\sum_d s_d K_d V`
    ``(N, C)`` with ``out``, :math:`\langle G, K_d V \rangle` ``(D,)`` with ``grad`` :math:`G`, and
    :math:`s_d \sum_c W_{ic} (K'_d V)_{ic}` ``(N, D)`` with ``weights`` :math:`W`, all float64.

    Args:
        fn: the family's compiled entry point, ``leading`` its first arguments.
        order, key: ``(D, M + N)`` merged order and sorted values (``(D, N)`` for one set).
        num_sources: ``M``, or ``-1`` for one set.
        values: ``(M, C)`` the sources' values (float32 read as they are, any other dtype as float64).
        scales: ``(D,)`` per-dimension scales.
        grad, weights: ``(N, C)`` each, or ``None``.
    """
    dims, total = order.shape
    n, cols = total - max(num_sources, 0), values.shape[-1]
    single = values.dtype == torch.float32  # read as they are: float32 rows convert exactly, in C
    v = values.detach().contiguous() if single else _rows(values)
    s, g, w = _rows(scales), _rows(grad), _rows(weights)
    order, key = order.contiguous(), key.detach().to(torch.float64).contiguous()
    result = torch.empty(n, cols, dtype=torch.float64) if out else None  # every entry is written
    dots = torch.zeros(dims, dtype=torch.float64) if g is not None else None
    point = torch.empty(dims, n, dtype=torch.float64) if w is not None else None  # every entry is written
    fn(*leading, dims, n, num_sources, order.data_ptr(), key.data_ptr(), v.data_ptr(), int(single), cols, s.data_ptr(),
       _pointer(result), _pointer(g), _pointer(dots), _pointer(w), _pointer(point))
    return result, dots, None if point is None else point.T
