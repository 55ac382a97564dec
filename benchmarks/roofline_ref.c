/* Hand-written reference for benchmarks/roofline.py: the additive RBF product
 *
 *     out[i][c] = sum_j sum_e s[e] exp(-(x1[i][e] - x2[j][e])^2 / 2) v[j][c]
 *
 * written the way a person tunes it for a CPU: OpenMP over rows i, the points j in blocks of B
 * stored dimension-major (x2t[e][j], vt[c][j]) so that every operation, exp included, is a SIMD
 * loop over a block of j; per-lane accumulators; -O3 -march=native -ffast-math (the benchmark
 * compiles it, and links without -ffast-math so that crtfastmath.o, which turns on flush-to-zero
 * process-wide, is not linked in). m_padded is a multiple of B; padded columns of vt are zero.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#define B 64

#define DEFINE_REFERENCE(T, EXP, NAME)                                                            \
  void NAME(int64_t n, int64_t m_padded, int64_t d, int64_t c, const T* x1, const T* x2t,         \
            const T* s, const T* vt, T* out) {                                                    \
    _Pragma("omp parallel") {                                                                     \
      T* acc = (T*)aligned_alloc(64, sizeof(T) * (size_t)(c * B + B));                            \
      _Pragma("omp for schedule(dynamic, 4)") for (int64_t i = 0; i < n; ++i) {                   \
        for (int64_t q = 0; q < c * B; ++q) acc[q] = 0;                                           \
        for (int64_t j0 = 0; j0 < m_padded; j0 += B) {                                            \
          T k[B] __attribute__((aligned(64)));                                                    \
          for (int t = 0; t < B; ++t) k[t] = 0;                                                   \
          for (int64_t e = 0; e < d; ++e) {                                                       \
            const T xi = x1[i * d + e], se = s[e];                                                \
            const T* xj = x2t + e * m_padded + j0;                                                \
            for (int t = 0; t < B; ++t) {                                                         \
              const T z = xi - xj[t];                                                             \
              k[t] += se * EXP((T)-0.5 * z * z);                                                  \
            }                                                                                     \
          }                                                                                       \
          for (int64_t q = 0; q < c; ++q) {                                                       \
            const T* v = vt + q * m_padded + j0;                                                  \
            T* a = acc + q * B;                                                                   \
            for (int t = 0; t < B; ++t) a[t] += k[t] * v[t];                                      \
          }                                                                                       \
        }                                                                                         \
        for (int64_t q = 0; q < c; ++q) {                                                         \
          T r = 0;                                                                                \
          for (int t = 0; t < B; ++t) r += acc[q * B + t];                                        \
          out[i * c + q] = r;                                                                     \
        }                                                                                         \
      }                                                                                           \
      free(acc);                                                                                  \
    }                                                                                             \
  }

DEFINE_REFERENCE(float, expf, reference_float32)
DEFINE_REFERENCE(double, exp, reference_float64)
