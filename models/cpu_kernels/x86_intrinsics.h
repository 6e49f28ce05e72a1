// <immintrin.h>, on x86 only: every kernel source includes the x86 intrinsics through this
// header. Their SIMD passes sit behind ISA macros (__AVX2__, __AVX512F__, ...), but the header
// itself exists on x86 alone, and an unguarded include stopped the whole library compiling for
// aarch64 (models/cpu_kernels/cross_check.py; tests/models/test_kernel_cross_build.py holds the
// rule).
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif
