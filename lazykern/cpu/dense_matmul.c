/* Products of a stored dense kernel matrix with a few right-hand sides (why this loop nest and not
   BLAS: lazykern.cpu.dense_matmul, which loads this file once per element type). */
#include "lazykern.h"

/* LK_REAL: the element type, float or double, defined before this file by its loader. */
typedef LK_REAL T;

/* out[b, i, q] = sum_j K[b, i, j] * vt[b, q, j]: 4 rows of K against 4 columns of V per sweep. */
void lk_dense_matmul(const T* restrict K, const T* restrict vt, T* restrict out,
                     int64_t batch, int64_t n, int64_t m, int64_t c, int64_t threads) {
  const int64_t blocks = (n + 3) / 4;
  #pragma omp parallel for num_threads(threads) schedule(dynamic, 8)
  for (int64_t rb = 0; rb < batch * blocks; ++rb) {
    const int64_t b = rb / blocks, i0 = (rb - b * blocks) * 4;
    const int64_t nr = n - i0 < 4 ? n - i0 : 4;
    const T* const v = vt + b * c * m;
    /* Rows past the end repeat row 0 of the block; their sums are never written. */
    const T* const k0 = K + (b * n + i0) * m;
    const T* const k1 = k0 + (nr > 1 ? m : 0);
    const T* const k2 = k0 + (nr > 2 ? 2 * m : 0);
    const T* const k3 = k0 + (nr > 3 ? 3 * m : 0);
    T* const o = out + (b * n + i0) * c;
    for (int64_t q = 0; q < c; q += 4) {
      const int64_t nq = c - q < 4 ? c - q : 4;
      const T* const v0 = v + q * m;
      const T* const v1 = v0 + (nq > 1 ? m : 0);
      const T* const v2 = v0 + (nq > 2 ? 2 * m : 0);
      const T* const v3 = v0 + (nq > 3 ? 3 * m : 0);
      T s00 = 0, s01 = 0, s02 = 0, s03 = 0, s10 = 0, s11 = 0, s12 = 0, s13 = 0;
      T s20 = 0, s21 = 0, s22 = 0, s23 = 0, s30 = 0, s31 = 0, s32 = 0, s33 = 0;
      #pragma omp simd reduction(+:s00,s01,s02,s03,s10,s11,s12,s13,s20,s21,s22,s23,s30,s31,s32,s33)
      for (int64_t j = 0; j < m; ++j) {
        const T a0 = k0[j], a1 = k1[j], a2 = k2[j], a3 = k3[j];
        const T b0 = v0[j], b1 = v1[j], b2 = v2[j], b3 = v3[j];
        s00 += a0 * b0; s01 += a0 * b1; s02 += a0 * b2; s03 += a0 * b3;
        s10 += a1 * b0; s11 += a1 * b1; s12 += a1 * b2; s13 += a1 * b3;
        s20 += a2 * b0; s21 += a2 * b1; s22 += a2 * b2; s23 += a2 * b3;
        s30 += a3 * b0; s31 += a3 * b1; s32 += a3 * b2; s33 += a3 * b3;
      }
      const T s[4][4] = {{s00, s01, s02, s03}, {s10, s11, s12, s13}, {s20, s21, s22, s23}, {s30, s31, s32, s33}};
      for (int64_t r = 0; r < nr; ++r)
        for (int64_t t = 0; t < nq; ++t) o[r * c + q + t] = s[r][t];
    }
  }
}
