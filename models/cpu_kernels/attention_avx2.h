// The paged attention's inner loops (attention.cpp) for AVX2 + FMA + F16C builds without
// AVX-512 (-march=haswell and later: Zen 1-3, Intel client CPUs): the contracts of
// attention_simd.h's AVX-512 and portable versions, in 8-lane vectors.
//
// Reduction order (fixed per build; a row's bits never depend on the other rows):
// - a score q . k: one FMA chain over d = 0, 1, ..., D-1 in order per (row, head, key), the
//   keys in lanes (attention_avx2_scores.h: K^T tiles), times the key's multiplier;
// - the softmax weights of a chunk: exp of (s - m) by exp8 (fast_exp's polynomial in FMAs);
//   per-lane running sums over the chunks in key order, added up by the caller;
// - the V sum: for each output column, one FMA per key, keys in order (0 .. n-1 of a chunk,
//   chunks in order); keys past n carry weight 0 and are skipped, which changes no bit. The
//   heads sharing a V row share its loads (weighted_rows), never a chain.
// Math is float32 throughout; bf16 / half / int8 rows are widened exactly (int8 rows' scales
// are applied by the caller, once per key: kv_int8.h), in the loads or into L1 copies first
// (the same bits).
#pragma once

#include "x86_intrinsics.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <utility>

#include "attention_layout.h"
#include "vec_math.h"

namespace tgserve::attn {

// 8 elements of a row as float32, reading only the first min(left, 8).
inline __m256 load8(const float* p, int64_t left) {
  if (left >= 8) return _mm256_loadu_ps(p);
  alignas(32) float t[8] = {};
  std::memcpy(t, p, left * sizeof(float));
  return _mm256_load_ps(t);
}
inline __m128i load8x16(const void* p, int64_t left) {  // 8 uint16, zero past `left`
  if (left >= 8) return _mm_loadu_si128(static_cast<const __m128i*>(p));
  alignas(16) uint16_t t[8] = {};
  std::memcpy(t, p, left * sizeof(uint16_t));
  return _mm_load_si128(reinterpret_cast<const __m128i*>(t));
}
inline __m256 load8(const c10::Half* p, int64_t left) { return _mm256_cvtph_ps(load8x16(p, left)); }
inline __m256 load8(const c10::BFloat16* p, int64_t left) {  // bf16 = top half of a float32
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(load8x16(p, left)), 16));
}
inline __m256 load8(const int8_t* p, int64_t left) {  // int8 cache rows, widened exactly
  __m128i v;
  if (left >= 8) {
    v = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
  } else {
    int64_t bytes = 0;
    std::memcpy(&bytes, p, std::max<int64_t>(left, 0));
    v = _mm_cvtsi64_si128(bytes);
  }
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v));
}

inline __m256 first_lanes(int64_t n) {  // all-ones in lanes < n (n may be <= 0 or > 8)
  const __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  const int k = static_cast<int>(std::clamp<int64_t>(n, 0, 8));
  return _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(k), idx));
}

// exp as vec_math.h's fast_exp (its constants), 8 lanes: 2^n built in the exponent bits.
inline __m256 exp8(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.0f)), _mm256_set1_ps(88.0f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x));
  __m256 p = _mm256_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 7; ++i) p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpPoly[i]));
  const __m256i bias = _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127));
  return _mm256_mul_ps(p, _mm256_castsi256_ps(_mm256_slli_epi32(bias, 23)));
}

// Online softmax step for G heads, as the AVX-512 version: s [G, 16] -> p [G, 16] in place
// (lanes >= n: 0), m [G] the running reference max (moves by more than kSlack only), lsum
// [G, 16] the per-lane running sums, acc [G, astride] rescaled when m moves.
inline void softmax_chunk(float* s, int n, int64_t G, float* m, float* lsum, float* acc,
                          int64_t astride) {
  for (int64_t h = 0; h < G; ++h) {
    float* sh = s + h * kChunk;
    float* lh = lsum + h * kChunk;
    const __m256 s0 = _mm256_loadu_ps(sh), s1 = _mm256_loadu_ps(sh + 8);
    const __m256 bar = _mm256_set1_ps(m[h] + kSlack);  // m = -inf: any finite score moves it
    const __m256 above = _mm256_or_ps(_mm256_cmp_ps(s0, bar, _CMP_GT_OQ), _mm256_cmp_ps(s1, bar, _CMP_GT_OQ));
    if (_mm256_movemask_ps(above)) {
      alignas(32) float t[8];
      _mm256_store_ps(t, _mm256_max_ps(s0, s1));
      const float mx = *std::max_element(t, t + 8);
      const __m256 alpha = _mm256_set1_ps(fast_exp(m[h] - mx));  // ~0 when m was -inf
      _mm256_storeu_ps(lh, _mm256_mul_ps(alpha, _mm256_loadu_ps(lh)));
      _mm256_storeu_ps(lh + 8, _mm256_mul_ps(alpha, _mm256_loadu_ps(lh + 8)));
      float* a = acc + h * astride;
      for (int64_t d = 0; d < astride; d += 8)
        _mm256_storeu_ps(a + d, _mm256_mul_ps(alpha, _mm256_loadu_ps(a + d)));
      m[h] = mx;
    }
    const __m256 mv = _mm256_set1_ps(m[h]);
    // Lanes past the range (score -inf) must weigh exactly 0, not exp(-87).
    const __m256 p0 = _mm256_and_ps(exp8(_mm256_sub_ps(s0, mv)), first_lanes(n));
    const __m256 p1 = _mm256_and_ps(exp8(_mm256_sub_ps(s1, mv)), first_lanes(n - 8));
    _mm256_storeu_ps(sh, p0);
    _mm256_storeu_ps(sh + 8, p1);
    _mm256_storeu_ps(lh, _mm256_add_ps(p0, _mm256_loadu_ps(lh)));
    _mm256_storeu_ps(lh + 8, _mm256_add_ps(p1, _mm256_loadu_ps(lh + 8)));
  }
}

// acc [NH, astride] += p [NH, 16] @ rows [n, D] for NH <= 4 heads: each V row's 8 * CW
// columns are loaded once for the NH heads (p broadcast), NH * CW accumulators + NH weights +
// one row vector <= 16 ymm. Per column one FMA chain through the keys in order. Columns up
// to round_up(D, 8) are written.
template <int NH, typename T, int DC>
void weighted_rows(const float* p, const T* const* rows, int64_t Drt, float* acc,
                   int64_t astride, int n) {
  const int64_t D = DC > 0 ? DC : Drt;
  constexpr int CW = NH == 1 ? 8 : NH == 2 ? 4 : NH == 3 ? 4 : 2;
  constexpr bool kWhole = DC > 0 && DC % (8 * CW) == 0;  // every pass CW full vectors
  for (int64_t d0 = 0; d0 < D; d0 += 8 * CW) {
    const int nv = kWhole ? CW : static_cast<int>(std::min<int64_t>(CW, (D - d0 + 7) / 8));
    __m256 a[NH][CW];
    for (int h = 0; h < NH; ++h)
      for (int c = 0; c < CW; ++c)
        if (c < nv) a[h][c] = _mm256_loadu_ps(acc + h * astride + d0 + 8 * c);
    for (int i = 0; i < n; ++i) {
      __m256 w[NH];
      for (int h = 0; h < NH; ++h) w[h] = _mm256_broadcast_ss(p + h * kChunk + i);
      for (int c = 0; c < CW; ++c) {
        if (c >= nv) continue;
        __m256 v = load8(rows[i] + d0 + 8 * c, kWhole ? 8 : D - d0 - 8 * c);
        __asm__("" : "+x"(v));  // one load for the NH FMAs: GCC would fold it into each
        for (int h = 0; h < NH; ++h) a[h][c] = _mm256_fmadd_ps(w[h], v, a[h][c]);
      }
    }
    for (int h = 0; h < NH; ++h)
      for (int c = 0; c < CW; ++c)
        if (c < nv) _mm256_storeu_ps(acc + h * astride + d0 + 8 * c, a[h][c]);
  }
}

// acc [G, astride] += p [G, 16] @ rows [16, D] over the chunk's n keys (n is the count of
// nonzero weights: the caller's p has 0 past it), the heads 4 at a most a tile.
template <typename T, int DC>
void accumulate_chunk(const float* p, const T* const* rows, int64_t G, int64_t D, float* acc,
                      int64_t astride, int n) {
  for (int64_t h0 = 0; h0 < G; h0 += 4) {
    const float* ph = p + h0 * kChunk;
    float* ah = acc + h0 * astride;
    switch (std::min<int64_t>(4, G - h0)) {
      case 1: weighted_rows<1, T, DC>(ph, rows, D, ah, astride, n); break;
      case 2: weighted_rows<2, T, DC>(ph, rows, D, ah, astride, n); break;
      case 3: weighted_rows<3, T, DC>(ph, rows, D, ah, astride, n); break;
      default: weighted_rows<4, T, DC>(ph, rows, D, ah, astride, n); break;
    }
  }
}

// out [D] = acc [D] * inv, rounded to T (nearest even).
template <typename KV, typename T>
void store_row(const float* acc, float inv, int64_t D, T* out) {
  const __m256 s = _mm256_set1_ps(inv);
  for (int64_t d = 0; d < D; d += 8) {
    alignas(32) float t[8];
    _mm256_store_ps(t, _mm256_mul_ps(_mm256_loadu_ps(acc + d), s));
    const int64_t k = std::min<int64_t>(8, D - d);
    if constexpr (std::is_same_v<T, float>) {
      std::memcpy(out + d, t, k * sizeof(float));
    } else {
      for (int64_t i = 0; i < k; ++i) out[d + i] = static_cast<T>(t[i]);
    }
  }
}

}  // namespace tgserve::attn
