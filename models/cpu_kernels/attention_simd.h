// Inner loops of the paged decode attention (attention.cpp). Each works on one chunk of
// kChunk = 16 keys of one KV head against the G query heads sharing it, so a K/V row is
// loaded once for all G heads and the 16 scores of a head fill exactly one AVX-512 vector.
// AVX-512 versions (bf16 dot products on _mm512_dpbf16_ps where the CPU has it), AVX2 versions
// (attention_avx2.h; its scores take a whole group's rows at once, keys in lanes:
// attention_avx2_scores.h) and portable scalar fallbacks share the same contracts; all math is
// float32 except that bf16 q and K are multiplied as bf16 pairs on AVX512-BF16 (exact
// products, float32 sums). Cache rows are float32 / bf16 / half, or int8 (kv_int8.h): int8
// values are widened exactly to float32 in the same loops (or, for a group of rows, by the
// caller into float32 rows first: the same bits), and each row's scale is applied once per
// key by the caller (folded into the score's multiplier, and into the V weight).
// Reduction order of the AVX-512 build: a score is 16 lane sums over d (lane, lane + 16, ...)
// added by reduce16's fixed tree; the V sum is two FMA chains per column (even and odd keys
// of a chunk) added at the chunk's end. The portable build (attention_portable.h): 16 lane
// sums over d and a fixed tree, the V sum one chain per column in key order. The softmax and
// the merge of key ranges (attention.cpp) are shared.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include "vec_math.h"  // fast_exp, and simd::exp on AVX-512

#include "attention_layout.h"  // TGSERVE_ATTN_AVX512, chunk size, row layouts
#include "attention_vec512.h"  // AVX-512: load16, store16, tail_mask16, load32x16, reduce16

namespace tgserve::attn {

#if defined(TGSERVE_ATTN_AVX512)

// acc[h][i] = the 16 lane sums of q[h] . rows[i] (d ascending, one FMA chain a key) for HN
// query heads of one KV head, each row converted to float32 once for all HN heads instead of
// once per head: 8 keys at a time, so HN x 8 accumulators, HN query vectors and the converted
// row stay in the 32 registers. The chains are score_chunk's, so are the bits.
template <typename T, int DC, int HN>
inline void lane_sums_by_heads(const float* q, int64_t qstride, const T* const* rows,
                               int64_t Drt, __m512 (*acc)[kChunk]) {
  const int64_t D = DC > 0 ? DC : Drt;
  for (int i0 = 0; i0 < kChunk; i0 += 8) {
    __m512 a[HN][8];
    for (int h = 0; h < HN; ++h)
      for (int i = 0; i < 8; ++i) a[h][i] = _mm512_setzero_ps();
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = tail_mask16(D - d);
      __m512 qv[HN];
      for (int h = 0; h < HN; ++h) qv[h] = _mm512_loadu_ps(q + h * qstride + d);
      for (int i = 0; i < 8; ++i) {
        const __m512 k = load16(rows[i0 + i] + d, m);
        for (int h = 0; h < HN; ++h) a[h][i] = _mm512_fmadd_ps(qv[h], k, a[h][i]);
      }
    }
    for (int h = 0; h < HN; ++h)
      for (int i = 0; i < 8; ++i) acc[h][i0 + i] = a[h][i];
  }
}

// s [G, 16]: s[h, i] = scale[i] * q[h] . rows[i] over D elements (q rows `qstride` apart,
// packed by pack_query; scale [16] each key's multiplier); lanes i >= n get -inf. DC > 0
// fixes D at compile time.
template <typename T, int DC>
void score_chunk(const typename QPack<T>::type* q, int64_t qstride, const T* const* rows, int n,
                 int64_t G, int64_t Drt, const float* scale, float* s) {
  const int64_t D = DC > 0 ? DC : Drt;
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // Rows read in place as another type (float16, int8, bf16 without bf16 pairs: a decode
  // row's K rows) are converted once per 3 heads (lane_sums_by_heads), not once per head.
  if constexpr (!std::is_same_v<T, float> && QPack<T>::pad == 16) {
    for (int64_t h0 = 0; h0 < G; h0 += 3) {
      __m512 acc[3][kChunk];
      const float* qh = reinterpret_cast<const float*>(q + h0 * qstride);
      const int64_t hn = std::min<int64_t>(3, G - h0);
      if (hn == 3) lane_sums_by_heads<T, DC, 3>(qh, qstride, rows, D, acc);
      else if (hn == 2) lane_sums_by_heads<T, DC, 2>(qh, qstride, rows, D, acc);
      else lane_sums_by_heads<T, DC, 1>(qh, qstride, rows, D, acc);
      for (int64_t h = 0; h < hn; ++h) {
        const __m512 sv = _mm512_mul_ps(reduce16(acc[h]), _mm512_loadu_ps(scale));
        _mm512_storeu_ps(s + (h0 + h) * kChunk, _mm512_mask_blend_ps(tail_mask16(n), neg_inf, sv));
      }
    }
    return;
  }
  for (int64_t h = 0; h < G; ++h) {
    __m512 acc[kChunk];
    for (int i = 0; i < kChunk; ++i) acc[i] = _mm512_setzero_ps();
    if constexpr (QPack<T>::pad == 32) {  // bf16 pairs: 32 elements per dot-product step
#if defined(__AVX512BF16__)
      const uint16_t* qh = reinterpret_cast<const uint16_t*>(q + h * qstride);
      for (int64_t d = 0; d < D; d += 32) {
        const __m512bh qv = (__m512bh)_mm512_loadu_si512(qh + d);
        for (int i = 0; i < kChunk; ++i)
          acc[i] = _mm512_dpbf16_ps(acc[i], qv, (__m512bh)load32x16(rows[i] + d, D - d));
      }
#endif
    } else {
      const float* qh = reinterpret_cast<const float*>(q + h * qstride);
      for (int64_t d = 0; d < D; d += 16) {
        const __mmask16 m = tail_mask16(D - d);
        const __m512 qv = _mm512_loadu_ps(qh + d);
        for (int i = 0; i < kChunk; ++i)
          acc[i] = _mm512_fmadd_ps(qv, load16(rows[i] + d, m), acc[i]);
      }
    }
    const __m512 sv = _mm512_mul_ps(reduce16(acc), _mm512_loadu_ps(scale));
    _mm512_storeu_ps(s + h * kChunk, _mm512_mask_blend_ps(tail_mask16(n), neg_inf, sv));
  }
}

// Online softmax step for G heads: s [G, 16] scores -> p [G, 16] weights exp(s - m) in
// place (lanes >= n: 0). m [G] is the running reference max, lsum [G, 16] the running sums
// (per lane; added up by the caller) and acc [G, astride] the weighted V sums, both
// rescaled when m moves.
inline void softmax_chunk(float* s, int n, int64_t G, float* m, float* lsum, float* acc,
                          int64_t astride) {
  for (int64_t h = 0; h < G; ++h) {
    const __m512 sv = _mm512_loadu_ps(s + h * kChunk);
    // m = -inf (first chunk) makes any finite score move it.
    if (_mm512_cmp_ps_mask(sv, _mm512_set1_ps(m[h] + kSlack), _CMP_GT_OQ)) {
      const float mx = _mm512_reduce_max_ps(sv);
      const __m512 alpha = _mm512_set1_ps(fast_exp(m[h] - mx));  // ~0 when m was -inf
      _mm512_storeu_ps(lsum + h * kChunk, _mm512_mul_ps(alpha, _mm512_loadu_ps(lsum + h * kChunk)));
      float* a = acc + h * astride;
      for (int64_t d = 0; d < astride; d += 16)
        _mm512_storeu_ps(a + d, _mm512_mul_ps(alpha, _mm512_loadu_ps(a + d)));
      m[h] = mx;
    }
    // Lanes past the range (score -inf) must weigh exactly 0, not exp(-87).
    const __m512 e = simd::exp(_mm512_sub_ps(sv, _mm512_set1_ps(m[h])));
    const __m512 pv = _mm512_maskz_mov_ps(tail_mask16(n), e);
    _mm512_storeu_ps(s + h * kChunk, pv);
    _mm512_storeu_ps(lsum + h * kChunk, _mm512_add_ps(pv, _mm512_loadu_ps(lsum + h * kChunk)));
  }
}

// acc [G, astride] += p [G, 16] @ rows [16, D]: each 16-column tile of the 16 V rows is
// converted once and kept in registers for all G heads. Rows i >= n must be readable (their
// weights are 0).
inline void weighted_tile(const float* p, const __m512* v, int64_t G, float* acc,
                          int64_t astride) {
  for (int64_t h = 0; h < G; ++h) {
    const float* ph = p + h * kChunk;
    __m512 a0 = _mm512_loadu_ps(acc + h * astride), a1 = _mm512_setzero_ps();
    for (int i = 0; i < kChunk; i += 2) {  // two chains: halves the fma latency chain
      a0 = _mm512_fmadd_ps(_mm512_set1_ps(ph[i]), v[i], a0);
      a1 = _mm512_fmadd_ps(_mm512_set1_ps(ph[i + 1]), v[i + 1], a1);
    }
    _mm512_storeu_ps(acc + h * astride, _mm512_add_ps(a0, a1));
  }
}

template <typename T, int DC>
void accumulate_chunk(const float* p, const T* const* rows, int64_t G, int64_t Drt, float* acc,
                      int64_t astride, int n) {  // rows past n (weight 0) read as 0
  const int64_t D = DC > 0 ? DC : Drt;
  __m512 v[kChunk];
  if constexpr (std::is_same_v<T, c10::BFloat16>) {  // 32 columns: even, then odd (AccPad)
    for (int64_t d = 0; d < D; d += 32) {
      for (int i = 0; i < kChunk; ++i)
        v[i] = _mm512_castsi512_ps(_mm512_slli_epi32(load32x16(rows[i] + d, i < n ? D - d : 0), 16));
      weighted_tile(p, v, G, acc + d, astride);
      const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
      for (int i = 0; i < kChunk; ++i)
        v[i] = _mm512_castsi512_ps(_mm512_and_si512(load32x16(rows[i] + d, i < n ? D - d : 0), hi));
      weighted_tile(p, v, G, acc + d + 16, astride);
    }
  } else {
    for (int64_t d = 0; d < D; d += 16) {
      const __mmask16 m = tail_mask16(D - d);
      for (int i = 0; i < kChunk; ++i) v[i] = load16(rows[i] + d, i < n ? m : __mmask16(0));
      weighted_tile(p, v, G, acc + d, astride);
    }
  }
}

// out [D] = acc [D] * inv (acc in the AccPad<KV> layout of a cache of KV rows), rounded to T.
template <typename KV, typename T>
void store_row(const float* acc, float inv, int64_t D, T* out) {
  const __m512 s = _mm512_set1_ps(inv);
  if constexpr (std::is_same_v<KV, c10::BFloat16>) {
    const __m512i lo = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    const __m512i hi = _mm512_add_epi32(lo, _mm512_set1_epi32(8));
    for (int64_t d = 0; d < D; d += 32) {
      const __m512 e = _mm512_mul_ps(_mm512_loadu_ps(acc + d), s);
      const __m512 o = _mm512_mul_ps(_mm512_loadu_ps(acc + d + 16), s);
      store16(out + d, _mm512_permutex2var_ps(e, lo, o), tail_mask16(D - d));
      if (D - d > 16)
        store16(out + d + 16, _mm512_permutex2var_ps(e, hi, o), tail_mask16(D - d - 16));
    }
  } else {
    for (int64_t d = 0; d < D; d += 16)
      store16(out + d, _mm512_mul_ps(_mm512_loadu_ps(acc + d), s), tail_mask16(D - d));
  }
}

#endif

}  // namespace tgserve::attn

#include "attention_portable.h"  // neither AVX-512 nor AVX2 (aarch64 and others): plain loops

namespace tgserve::attn {

#if !defined(TGSERVE_ATTN_AVX2)
// The scores of a group's R rows for one chunk and KV head, row by row: p [R, G, 16], row i's
// G query heads at q[i] (qstride apart), its keys in this chunk n[i] (0: skipped). (The AVX2
// build scores all the rows' heads at once with the keys in lanes: attention_avx2_scores.h.)
template <typename T, int DC, typename Q>
void score_rows(const Q* const* q, int64_t qstride, const T* const* rows, const int* n, int R,
                int64_t G, int64_t D, const float* kmul, float* p, float* /*kt*/) {
  for (int i = 0; i < R; ++i)
    if (n[i] > 0) score_chunk<T, DC>(q[i], qstride, rows, n[i], G, D, kmul, p + i * G * kChunk);
}
#endif

}  // namespace tgserve::attn

#if defined(TGSERVE_ATTN_AVX2)
#include "attention_avx2.h"         // the same contracts in 8-lane AVX2 vectors
#include "attention_avx2_scores.h"  // its scores, keys in lanes
#endif
