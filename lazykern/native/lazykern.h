/* What every C program of lazykern includes: the CPU engine's generated reductions
   (lazykern.cpu.codegen) and the C files written by hand next to the modules that load them
   (lazykern.structured, lazykern.cpu.dense_matmul). lazykern.native compiles each program as one
   translation unit with -I of this folder, and a change of this file changes every program's
   cache key, so no library compiled against an older copy is ever loaded. */
#ifndef LAZYKERN_H
#define LAZYKERN_H

#include <math.h>
#include <stdint.h>

/* A helper the compiler always inlines: called with constant arguments inside a loop, its own
   loops unroll and vectorize as if they were written out there. */
#define LK_INLINE static inline __attribute__((always_inline))

/* Flush-to-zero (x86's FTZ and DAZ, AArch64's FZ) in the calling thread from LK_FTZ_ON to
   LK_FTZ_OFF, in one block, the thread's setting restored after: a loop whose exponentials and
   products pass through subnormal numbers leaves the CPU's slow path, and the caller's own
   arithmetic is never affected (unlike -ffast-math, whose crtfastmath.o flushes in the whole
   process). Subnormals contribute below the smallest normal number to sums of order one. */
#if defined(__x86_64__) || defined(__i386__)
#include <xmmintrin.h>
#define LK_FTZ_ON const unsigned int lk_csr = _mm_getcsr(); _mm_setcsr(lk_csr | 0x8040u);
#define LK_FTZ_OFF _mm_setcsr(lk_csr);
#elif defined(__aarch64__)
#define LK_FTZ_ON uint64_t lk_fpcr; __asm__ volatile("mrs %0, fpcr" : "=r"(lk_fpcr)); \
    __asm__ volatile("msr fpcr, %0" : : "r"(lk_fpcr | (1ull << 24)));
#define LK_FTZ_OFF __asm__ volatile("msr fpcr, %0" : : "r"(lk_fpcr));
#else
#define LK_FTZ_ON
#define LK_FTZ_OFF
#endif

/* exp of an argument below about log FLT_MIN (float) or log DBL_MIN (double) is below the normal
   range: 0, as flush-to-zero makes it, and the argument is clamped before the call as well:
   glibc's vector exp finishes a vector with any lane out of its range by scalar calls, and short
   lengthscales put many pairs there (docs/cpu_engine.rst). A program reads the bound once per
   call from these volatiles into a local, so that GCC cannot fold exp of the constant and move
   the clamp after the call (it does: cond ? exp(MIN) : exp(v)). */
static volatile float lk_exp_min_float __attribute__((unused)) = -87.0f;
static volatile double lk_exp_min_double __attribute__((unused)) = -708.0;

/* fn(x) (exp or expf) for x >= lo, else 0, of type T. A macro, so that the vector loops that use
   it compile as if the expression were written out there. */
#define LK_EXP_CLAMPED(fn, T, x, lo) (fn((x) < (lo) ? (lo) : (x)) * (T)((x) >= (lo)))

#endif
