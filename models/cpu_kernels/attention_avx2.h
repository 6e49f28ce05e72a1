// The paged attention's inner loops (attention.cpp) for AVX2 + FMA + F16C builds without
// AVX-512 (-march=haswell and later: Zen 1-3, Intel client CPUs): the contracts of
// attention_simd.h's AVX-512 and portable versions, in 8-lane vectors.
//
// Reduction order (fixed per build; a row's bits never depend on the other rows):
// - a score q . k: 8 lane sums over d = lane, lane + 8, ... in order (one FMA chain per key),
//   then the 8 lanes added as a fixed tree (hsum8: pairs, then pairs of pairs, then halves);
// - the softmax weights of a chunk: exp of (s - m) by exp8 (fast_exp's polynomial in FMAs);
//   per-lane running sums over the chunks in key order, added up by the caller;
// - the V sum: for each output column, one FMA per key, keys in order (0 .. n-1 of a chunk,
//   chunks in order); keys past n carry weight 0 and are skipped, which changes no bit.
// Math is float32 throughout; bf16 / half / int8 rows are widened exactly (int8 rows' scales
// are applied by the caller, once per key: kv_int8.h). int8 rows run the same chains with the
// query heads innermost, each 8 values widened once for up to 4 heads (int8_dot_chains,
// int8_weighted_sum): the bits of the float loops over the widened rows.
#pragma once

#include <immintrin.h>

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

// Lane i = the sum of the 8 lanes of a[i], as a fixed tree.
inline __m256 hsum8(const __m256* a) {
  const __m256 t0 = _mm256_hadd_ps(a[0], a[1]), t1 = _mm256_hadd_ps(a[2], a[3]);
  const __m256 t2 = _mm256_hadd_ps(a[4], a[5]), t3 = _mm256_hadd_ps(a[6], a[7]);
  const __m256 u0 = _mm256_hadd_ps(t0, t1), u1 = _mm256_hadd_ps(t2, t3);
  return _mm256_add_ps(_mm256_permute2f128_ps(u0, u1, 0x20), _mm256_permute2f128_ps(u0, u1, 0x31));
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

// int8 rows (kv_int8.h) with the query heads innermost: each 8 values of a K or V row are
// widened once for the NH (<= 4) heads sharing it instead of once per head, and the FMA chains
// are those of score_chunk / accumulate_chunk below, in the same order (the same bits).
//
// acc[h][i] (h < NH, i < 8): the 8 lane sums of q[h] . rows[i] over d in order (one chain per
// head and key); two keys at a time, so 2 NH chains are in flight.
template <int NH, int DC>
void int8_dot_chains(const float* q, int64_t qstride, const int8_t* const* rows, int64_t Drt,
                     __m256 (*acc)[8]) {
  const int64_t D = DC > 0 ? DC : Drt;
  for (int i = 0; i < 8; i += 2) {
    __m256 a[NH], b[NH];
    for (int h = 0; h < NH; ++h) a[h] = b[h] = _mm256_setzero_ps();
    for (int64_t d = 0; d < D; d += 8) {
      const __m256 k0 = load8(rows[i] + d, D - d), k1 = load8(rows[i + 1] + d, D - d);
      for (int h = 0; h < NH; ++h) {
        const __m256 qv = _mm256_loadu_ps(q + h * qstride + d);
        a[h] = _mm256_fmadd_ps(qv, k0, a[h]);
        b[h] = _mm256_fmadd_ps(qv, k1, b[h]);
      }
    }
    for (int h = 0; h < NH; ++h) acc[h][i] = a[h], acc[h][i + 1] = b[h];
  }
}

// acc [NH, astride] += p [NH, 16] @ rows [n, D]: per column one FMA chain through the keys in
// order (accumulate_chunk's), 16 columns at a time (2 NH chains in flight). Columns up to
// round_up(D, 16) are written (astride covers them; past D the rows read as 0).
template <int NH, int DC>
void int8_weighted_sum(const float* p, const int8_t* const* rows, int64_t Drt, float* acc,
                       int64_t astride, int n) {
  const int64_t D = DC > 0 ? DC : Drt;
  for (int64_t d = 0; d < D; d += 16) {
    __m256 a[NH], b[NH];
    for (int h = 0; h < NH; ++h) {
      a[h] = _mm256_loadu_ps(acc + h * astride + d);
      b[h] = _mm256_loadu_ps(acc + h * astride + d + 8);
    }
    for (int i = 0; i < n; ++i) {
      const __m256 v0 = load8(rows[i] + d, D - d), v1 = load8(rows[i] + d + 8, D - d - 8);
      for (int h = 0; h < NH; ++h) {
        const __m256 w = _mm256_set1_ps(p[h * kChunk + i]);
        a[h] = _mm256_fmadd_ps(w, v0, a[h]);
        b[h] = _mm256_fmadd_ps(w, v1, b[h]);
      }
    }
    for (int h = 0; h < NH; ++h) {
      _mm256_storeu_ps(acc + h * astride + d, a[h]);
      _mm256_storeu_ps(acc + h * astride + d + 8, b[h]);
    }
  }
}

// Calls f(std::integral_constant<int, NH>, h0) for the heads h0 .. h0 + NH - 1 of G, 4 at a time.
template <typename F>
void by_four_heads(int64_t G, F&& f) {
  for (int64_t h0 = 0; h0 < G; h0 += 4) {
    switch (std::min<int64_t>(4, G - h0)) {
      case 1: f(std::integral_constant<int, 1>{}, h0); break;
      case 2: f(std::integral_constant<int, 2>{}, h0); break;
      case 3: f(std::integral_constant<int, 3>{}, h0); break;
      default: f(std::integral_constant<int, 4>{}, h0); break;
    }
  }
}

// s [G, 16]: s[h, i] = scale[i] * q[h] . rows[i] (q rows `qstride` apart, zero-padded to 16;
// scale [16] each key's multiplier); lanes i >= n get -inf. Keys go 8 at a time: 8 FMA chains,
// one per key, over d.
template <typename T, int DC>
void score_chunk(const float* q, int64_t qstride, const T* const* rows, int n, int64_t G,
                 int64_t Drt, const float* scale, float* s) {
  const int64_t D = DC > 0 ? DC : Drt;
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  if constexpr (std::is_same_v<T, int8_t>) {  // heads innermost, the same chains
    for (int half = 0; half < kChunk / 8; ++half) {
      const __m256 sc = _mm256_loadu_ps(scale + half * 8), keep = first_lanes(n - half * 8);
      by_four_heads(G, [&](auto nh, int64_t h0) {
        __m256 acc[4][8];
        if (half * 8 < n) int8_dot_chains<decltype(nh)::value, DC>(q + h0 * qstride, qstride, rows + half * 8, D, acc);
        for (int h = 0; h < nh; ++h)
          _mm256_storeu_ps(s + (h0 + h) * kChunk + half * 8,
                           half * 8 < n ? _mm256_blendv_ps(neg_inf, _mm256_mul_ps(hsum8(acc[h]), sc), keep)
                                        : neg_inf);
      });
    }
    return;
  }
  for (int64_t h = 0; h < G; ++h) {
    const float* qh = q + h * qstride;
    for (int half = 0; half < kChunk / 8; ++half) {
      float* out = s + h * kChunk + half * 8;
      if (half * 8 >= n) {
        _mm256_storeu_ps(out, neg_inf);
        continue;
      }
      const T* const* r = rows + half * 8;
      __m256 acc[8];
      for (int i = 0; i < 8; ++i) acc[i] = _mm256_setzero_ps();
      for (int64_t d = 0; d < D; d += 8) {
        const __m256 qv = _mm256_loadu_ps(qh + d);
        for (int i = 0; i < 8; ++i) acc[i] = _mm256_fmadd_ps(qv, load8(r[i] + d, D - d), acc[i]);
      }
      const __m256 sv = _mm256_mul_ps(hsum8(acc), _mm256_loadu_ps(scale + half * 8));
      _mm256_storeu_ps(out, _mm256_blendv_ps(neg_inf, sv, first_lanes(n - half * 8)));
    }
  }
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

// acc [G, astride] += p [G, 16] @ rows [16, D] over the chunk's n keys (n is the count of
// nonzero weights: the caller's p has 0 past it). Columns go 64 at a time: 8 independent
// FMA chains (one per 8 columns) through the keys in order.
template <typename T, int DC>
void accumulate_chunk(const float* p, const T* const* rows, int64_t G, int64_t Drt, float* acc,
                      int64_t astride, int n) {
  const int64_t D = DC > 0 ? DC : Drt;
  if constexpr (std::is_same_v<T, int8_t>) {  // heads innermost, the same chains
    by_four_heads(G, [&](auto nh, int64_t h0) {
      int8_weighted_sum<decltype(nh)::value, DC>(p + h0 * kChunk, rows, D, acc + h0 * astride, astride, n);
    });
    return;
  }
  for (int64_t h = 0; h < G; ++h) {
    const float* ph = p + h * kChunk;
    float* ah = acc + h * astride;
    for (int64_t d0 = 0; d0 < D; d0 += 64) {
      const int nv = static_cast<int>(std::min<int64_t>(8, (D - d0 + 7) / 8));
      __m256 a[8];
      for (int j = 0; j < 8; ++j)
        if (j < nv) a[j] = _mm256_loadu_ps(ah + d0 + 8 * j);
      for (int i = 0; i < n; ++i) {
        const __m256 w = _mm256_set1_ps(ph[i]);
        for (int j = 0; j < 8; ++j)
          if (j < nv) a[j] = _mm256_fmadd_ps(w, load8(rows[i] + d0 + 8 * j, D - d0 - 8 * j), a[j]);
      }
      for (int j = 0; j < 8; ++j)
        if (j < nv) _mm256_storeu_ps(ah + d0 + 8 * j, a[j]);
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
