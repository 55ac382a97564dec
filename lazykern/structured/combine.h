/* What every family's walks (gauss.c, recurrences.c) share: the reductions of each dimension's sums
   over the dimensions, done row by row inside the walks (see lazykern.structured.combine). The
   lk_uses record, the row step lk_use_row and lk_each_dimension, which runs a family's
   per-dimension function over the dimensions in parallel with one accumulator of out per thread. */
#ifndef LK_COMBINE_H
#define LK_COMBINE_H

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "lazykern.h"

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
LK_INLINE void lk_prefetch_row(const lk_uses *u, int64_t i, const double *out) {
    if (i < 0 || i >= u->n) return;  /* a source entry ahead of a target in a merged order */
    if (out) __builtin_prefetch(out + i * u->C, 1);
    if (u->G) __builtin_prefetch(u->G + i * u->C);
    if (u->W) __builtin_prefetch(u->W + i * u->C);
}

/* Row j of the sources' values, C numbers of float32 (single) or float64, into row as float64 (add:
   added to it). Float32 values are read as given, half the bytes of a float64 copy; each converts
   exactly. */
LK_INLINE void lk_value_row(
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
LK_INLINE void lk_prefetch_value(const void *values, int single, int64_t j, int64_t C) {
    __builtin_prefetch((const char *)values + j * C * (single ? 4 : 8));
}

/* Target i's rows a, b of dimension d into the thread's accumulator out and its dot. */
LK_INLINE void lk_use_row(
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

#endif
