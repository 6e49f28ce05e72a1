// int16 activations (`--activation-quantization int16`, q8_linear.h's kQ16Activations kinds):
// the quantiser of a block of 32 activations and the portable block sums. The weights are the
// Q8 panels of the int8 path (q8_linear.h), unchanged; only the activations carry 16 bits.
//
// Quantiser, per row and block of 32 k (q8_linear.h's int8 recipe with 32767 for 127):
// d = amax / 32767, q = round-to-nearest-even(x * (1 / d)) clamped to [-32767, 32767] (0 where
// d = 0), s = sum of q. The step d is amax / 32767: each value is off by at most d / 2, about
// 1.5e-5 of the block's largest (bf16 keeps 8 bits: 3.9e-3 of the value), so the products are
// float-like where int8's steps (amax / 127) change the default model's greedy answers.
//
// Integer sums, exact in int32 on every path (so any order of the adds gives the same bits):
// Q4 kinds |nibble * q| <= 15 * 32767, 32 of them <= 15.7e6; Q8 |q_w * q| <= 128 * 32767, 32 of
// them <= 1.35e8 < 2^31. AVX2 builds (AVX-512 ones too) run q16_avx2.h's vpmaddwd pass; the
// others q8_dot.h's scalar_sums (the int8 path's loops on int16 values): the same integers.
#pragma once

#include "x86_intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include <c10/util/BFloat16.h>

#include "q8_dot.h"

namespace tgserve::q16_dot {

constexpr int kLanes = 16;  // a panel's rows
constexpr int kQMax = 32767;

#if defined(__AVX2__)
// The AVX2 steps both block quantisers share (this one and q8_linear.cpp's int8 one): a block's
// 32 values as 4 x 8 float32 (bfloat16 widened exactly: the top half of a float32) and their
// largest |v|. max_ps(|v|, amax) keeps amax where v is NaN (as std::max does); maxima are exact
// in any order.
template <typename T>
inline float load_block_avx2(const T* src, __m256 v[4]) {
  __m256 top = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int h = 0; h < 4; ++h) {
    if constexpr (std::is_same_v<T, float>) {
      v[h] = _mm256_loadu_ps(src + 8 * h);
    } else {
      const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + 8 * h));
      v[h] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(raw), 16));
    }
    top = _mm256_max_ps(_mm256_andnot_ps(sign, v[h]), top);
  }
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(top), _mm256_extractf128_ps(top, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  return _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
}

// The 8 int32 lanes' sum (exact in any order).
inline int32_t sum_epi32_avx2(__m256i total) {
  __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4e));
  s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xb1));
  return _mm_cvtsi128_si32(s4);
}
#endif

// One block: src[0 .. 32) -> q[0 .. 32), its step d and the sum of q.
template <typename T>
inline void quantize_block(const T* src, int16_t* q, float& d, int32_t& s) {
#if defined(__AVX2__)
  // The scalar loop's steps 8 lanes at a time, one IEEE operation each: max_ps(|v|, amax) keeps
  // amax where v is NaN (as std::max does), vcvtps2dq rounds to nearest even (NaN -> INT_MIN,
  // clamped to -32767 as the scalar cast's value); maxima and integer sums are exact in any order.
  __m256 v[4];
  const float amax = load_block_avx2(src, v);
  d = amax / static_cast<float>(kQMax);
  const __m256 inv = _mm256_set1_ps(d > 0.0f ? 1.0f / d : 0.0f);
  const __m256i hi = _mm256_set1_epi32(kQMax), lo = _mm256_set1_epi32(-kQMax);
  __m256i total = _mm256_setzero_si256();
  for (int h = 0; h < 4; h += 2) {
    __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(v[h], inv));
    __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(v[h + 1], inv));
    a = _mm256_min_epi32(_mm256_max_epi32(a, lo), hi);
    b = _mm256_min_epi32(_mm256_max_epi32(b, lo), hi);
    total = _mm256_add_epi32(total, _mm256_add_epi32(a, b));
    // packs works per 128-bit lane: [a lo, b lo | a hi, b hi] -> [a lo, a hi | b lo, b hi]
    const __m256i words = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 8 * h), words);
  }
  s = sum_epi32_avx2(total);
#else
  float v[32], amax = 0.0f;
  for (int e = 0; e < 32; ++e) {
    v[e] = static_cast<float>(src[e]);
    amax = std::max(amax, std::fabs(v[e]));
  }
  d = amax / static_cast<float>(kQMax);
  const float inv = d > 0.0f ? 1.0f / d : 0.0f;
  int32_t sum = 0;
  for (int e = 0; e < 32; ++e) {
    // nearbyint: to nearest even (the default rounding mode), as vcvtps2dq
    const int r = static_cast<int>(std::nearbyint(v[e] * inv));
    q[e] = static_cast<int16_t>(std::clamp(r, -kQMax, kQMax));
    sum += q[e];
  }
  s = sum;
#endif
}

}  // namespace tgserve::q16_dot
