// 16-wide AVX-512 helpers: exp (any AVX512F target; the attention kernel uses it too), and
// loads/stores of float and bf16 rows as float32 vectors with rounding to the row type, the
// vector forms of vec_math.h's element-wise helpers (AVX512F + AVX512-BF16 targets only:
// TGSERVE_VEC_SIMD is then defined).
#pragma once

namespace tgserve {
// vec_math.h's fast_exp constants, shared with its vector forms (here, attention_avx2.h): x = n ln2
// + r with ln2 in two parts (Cody-Waite), e^r by Horner's rule over kExpPoly (degree 6).
constexpr float kLog2e = 1.44269504088896341f;
constexpr float kLn2Hi = 0.693145751953125f, kLn2Lo = 1.428606765330187e-06f;
constexpr float kExpPoly[7] = {1.0f / 720.0f, 1.0f / 120.0f, 1.0f / 24.0f, 1.0f / 6.0f,
                               0.5f, 1.0f, 1.0f};
}  // namespace tgserve

#if defined(__AVX512F__)
#include "x86_intrinsics.h"

namespace tgserve::simd {

// exp as vec_math.h's fast_exp: Cody-Waite reduction, degree-6 polynomial, scale by 2^n.
inline __m512 exp(__m512 x) {
  x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)), _mm512_set1_ps(88.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo),
                                    _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x));
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  return _mm512_scalef_ps(p, n);
}

}  // namespace tgserve::simd

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__)
#define TGSERVE_VEC_SIMD 1

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

namespace tgserve::simd {

template <typename T>
constexpr bool kVectorized = std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;

inline __mmask16 tail_mask(int64_t remaining) {
  return remaining >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << remaining) - 1);
}

inline __m512 load(const float* p, __mmask16 m) { return _mm512_maskz_loadu_ps(m, p); }
inline __m512 load(const c10::BFloat16* p, __mmask16 m) {  // bf16 = top half of a float32
  const __m256i half = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
}

inline void store(float* p, __m512 v, __mmask16 m) { _mm512_mask_storeu_ps(p, m, v); }
inline void store(c10::BFloat16* p, __m512 v, __mmask16 m) {  // round to nearest even
  _mm256_mask_storeu_epi16(p, m, (__m256i)_mm512_cvtneps_pbh(v));
}

// v rounded to T and widened back: where eager PyTorch materialises an intermediate in T.
template <typename T>
inline __m512 round_to(__m512 v) {
  if constexpr (std::is_same_v<T, float>) {
    return v;
  } else {
    const __m256i half = (__m256i)_mm512_cvtneps_pbh(v);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(half), 16));
  }
}

}  // namespace tgserve::simd

#endif
