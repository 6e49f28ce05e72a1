// The AVX-512 build's vector helpers for the paged attention's inner loops
// (attention_simd.h): a row's 16 elements of any cache type as float32 lanes and back, the
// tail mask, bf16 / half pair loads, and reduce16, the fixed tree that turns 16 lane-sum
// vectors into 16 scores (its order is part of every AVX-512 score's bits).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#include "attention_layout.h"  // TGSERVE_ATTN_AVX512 (and immintrin.h with it)

#if defined(TGSERVE_ATTN_AVX512)
namespace tgserve::attn {

// 16 elements of a row as float32; lanes outside `m` read nothing and are 0.
inline __m512 load16(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load16(const c10::Half* p, __mmask16 m) {
  return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
}
inline __m512 load16(const c10::BFloat16* p, __mmask16 m) {  // bf16 = top half of a float32
  const __m512i w = _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(m, p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
}
inline __m512 load16(const int8_t* p, __mmask16 m) {  // int8 cache rows, widened exactly
  return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, p)));
}

// 16 float32 lanes to a row of T, rounding to nearest even.
inline void store16(float* p, __m512 x, __mmask16 m) { _mm512_mask_storeu_ps(p, m, x); }
inline void store16(c10::Half* p, __m512 x, __mmask16 m) {
  _mm256_mask_storeu_epi16(p, m, _mm512_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
}
inline void store16(c10::BFloat16* p, __m512 x, __mmask16 m) {
#if defined(__AVX512BF16__)
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(x));
#else
  alignas(64) float f[16];
  _mm512_storeu_ps(f, x);
  for (int i = 0; i < 16; ++i)
    if (m >> i & 1) p[i] = static_cast<c10::BFloat16>(f[i]);
#endif
}

inline __mmask16 tail_mask16(int64_t n) {  // the first min(n, 16) lanes
  return n >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << n) - 1);
}

// 32 bf16 / half elements from p; only the first `left` (< 32: a row's tail) are read. A plain
// load for whole vectors lets the compiler fold it into the instruction using it.
inline __m512i load32x16(const void* p, int64_t left) {
  if (left >= 32) return _mm512_loadu_si512(p);
  return _mm512_maskz_loadu_epi16((__mmask32(1) << left) - 1, p);
}

// Lane i of the result = horizontal sum of a[i] (a 16x16 transpose folded into the adds:
// 45 shuffles/adds instead of 16 separate reductions).
inline __m512 reduce16(const __m512* a) {
  __m512 b[8], c[4], d[2];
  for (int i = 0; i < 8; ++i)  // per 128-bit lane: [a0+a2, a'0+a'2, a1+a3, a'1+a'3]
    b[i] = _mm512_add_ps(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]),
                         _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per 128-bit lane: the four vectors' partial sums
    const __m512d x = _mm512_castps_pd(b[2 * i]), y = _mm512_castps_pd(b[2 * i + 1]);
    c[i] = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)),
                         _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  for (int i = 0; i < 2; ++i)  // fold 128-bit lanes pairwise
    d[i] = _mm512_add_ps(_mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0x88),
                         _mm512_shuffle_f32x4(c[2 * i], c[2 * i + 1], 0xDD));
  return _mm512_add_ps(_mm512_shuffle_f32x4(d[0], d[1], 0x88),
                       _mm512_shuffle_f32x4(d[0], d[1], 0xDD));
}

}  // namespace tgserve::attn
#endif
