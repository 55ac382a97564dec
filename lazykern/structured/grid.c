/* The off-diagonal blocks of H = W^T D^{-1} W for the grid preconditioner (grid.py).

   W is the (N x M) interpolation matrix of a sum of one-dimensional terms: point i has four weights
   on the grid of each term e, at local grid points below[i, e] - 1 .. below[i, e] + 2, and term e's
   grid starts at column offsets[e] of W. For the terms j0 <= j < j1, block_j = out + out_start[j - j0]
   is term j's block row of H, (size_j x width), of which the columns of terms e >= j are summed:

       H[a, b] = sum_i W[i, a] W[i, b] / D_i.

   Inputs are point-major (below[i * terms + e], weight[(i * terms + e) * 4 + k]) so that one point's
   terms lie together. Each term j is summed by one thread into its own block, the blocks being
   disjoint; the caller zeroes them. */

#include <stdint.h>

#include "lazykern.h"

void lk_grid_rows(int64_t n, int64_t terms, int64_t j0, int64_t j1, int64_t width, const int64_t *offsets,
                  const int64_t *below, const double *weight, const double *inv_noise, const int64_t *out_start,
                  double *out) {
    #pragma omp parallel for schedule(dynamic, 1)
    for (int64_t j = j0; j < j1; ++j) {
        double *block = out + out_start[j - j0];
        for (int64_t i = 0; i < n; ++i) {
            const int64_t *b = below + i * terms;
            const double *w = weight + i * terms * 4;
            double left[4];
            for (int p = 0; p < 4; ++p) left[p] = w[j * 4 + p] * inv_noise[i];
            double *rows = block + (b[j] - 1) * width;
            for (int64_t e = j; e < terms; ++e) {
                const double *right = w + e * 4;
                double *cell = rows + offsets[e] + b[e] - 1;
                for (int p = 0; p < 4; ++p)
                    for (int q = 0; q < 4; ++q) cell[p * width + q] += left[p] * right[q];
            }
        }
    }
}

/* The transpose of W as CSR (grid points by rows), by counting: crow (width + 1) holds each grid
   point's first entry, rows[k] the point and values[k] the weight of entry k, points ascending within
   a grid point. Entries of point i on term e: columns offsets[e] + below[i, e] - 1 + q, q = 0..3. */
void lk_grid_transpose(int64_t n, int64_t terms, int64_t width, const int64_t *offsets, const int64_t *below,
                       const double *weight, int64_t *crow, int32_t *rows, double *values) {
    for (int64_t c = 0; c <= width; ++c) crow[c] = 0;
    for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < terms; ++e)
            for (int q = 0; q < 4; ++q) crow[offsets[e] + below[i * terms + e] - 1 + q + 1] += 1;
    for (int64_t c = 0; c < width; ++c) crow[c + 1] += crow[c];
    int64_t *next = crow; /* crow[c] advances past each entry placed, then is restored below */
    for (int64_t i = 0; i < n; ++i)
        for (int64_t e = 0; e < terms; ++e)
            for (int q = 0; q < 4; ++q) {
                int64_t c = offsets[e] + below[i * terms + e] - 1 + q, k = next[c]++;
                rows[k] = (int32_t)i;
                values[k] = weight[(i * terms + e) * 4 + q];
            }
    for (int64_t c = width; c > 0; --c) crow[c] = crow[c - 1];
    crow[0] = 0;
}
