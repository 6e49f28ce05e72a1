// The AVX2 build's scores (attention_avx2.h) with the keys in lanes: for one chunk of 16 keys
// and one KV head, the chunk's K rows are transposed once into kt [D, 16] (float32; bf16 /
// half / int8 rows widened exactly on the way), then every (row, query head) of the group
// scores the 16 keys at once: s[0 .. 15] = sum over d of q[d] * kt[d][0 .. 15], a GEMM tile of
// broadcast query values against 2 ymm of keys. No horizontal sums, and the q values are
// broadcast from L1 instead of holding 8 ymm per head: a tile of 6 (row, head) pairs keeps 12
// accumulators and issues 2 key loads + 6 broadcasts per 12 FMAs (the row-dot form loaded
// one K vector per FMA and was load-bound).
//
// Reduction order (fixed; a row's bits never depend on the other rows): score i of a (row,
// head) is one FMA chain over d = 0, 1, ..., D-1 in order, starting from 0, then multiplied
// by the key's multiplier (the softmax scale, times an int8 row's scale: kv_int8.h), lane-wise
// for the 16 keys. A pair's chain is its own whichever tile, group or chunk of work it falls
// in, so decode (a group of one row) and prefill give a row the same bits.
#pragma once

#include "x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "attention_avx2.h"  // load8, first_lanes
#include "attention_layout.h"

namespace tgserve::attn {

// r[j] <- lane j of r[0 .. 7] (an 8 x 8 transpose in registers).
inline void transpose8(__m256* r) {
  __m256 t[8], u[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    t[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    u[i] = _mm256_shuffle_ps(t[i], t[i + 2], 0x44);
    u[i + 1] = _mm256_shuffle_ps(t[i], t[i + 2], 0xEE);
    u[i + 2] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0x44);
    u[i + 3] = _mm256_shuffle_ps(t[i + 1], t[i + 3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    r[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
    r[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
  }
}

// kt[d][kb .. kb + 7] <- 8 int8 rows' values d .. d + 15, widened: the bytes transposed in
// 128-bit registers (3 rounds of unpacks) before the 8 values of a d are widened together.
inline void transpose_int8x16(const int8_t* const* r8, int64_t d, float* kt) {
  __m128i x[8], a[8];
  for (int i = 0; i < 8; ++i) x[i] = _mm_loadu_si128(reinterpret_cast<const __m128i*>(r8[i] + d));
  for (int i = 0; i < 8; i += 2) {  // bytes of rows i, i + 1 interleaved: d 0-7, then 8-15
    a[i] = _mm_unpacklo_epi8(x[i], x[i + 1]);
    a[i + 1] = _mm_unpackhi_epi8(x[i], x[i + 1]);
  }
  for (int i = 0; i < 8; i += 4)  // 4 rows' bytes per d: d 0-3, 4-7, 8-11, 12-15
    for (int j = 0; j < 2; ++j) {
      x[i + 2 * j] = _mm_unpacklo_epi16(a[i + j], a[i + j + 2]);
      x[i + 2 * j + 1] = _mm_unpackhi_epi16(a[i + j], a[i + j + 2]);
    }
  // x[0..3]: rows 0-3 at d 0-3, 4-7, 8-11, 12-15; x[4..7] the same for rows 4-7.
  for (int j = 0; j < 4; ++j) {
    const __m128i lo = _mm_unpacklo_epi32(x[j], x[j + 4]), hi = _mm_unpackhi_epi32(x[j], x[j + 4]);
    const __m128i v[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int k = 0; k < 4; ++k)  // d = 4 j + k: the 8 rows' bytes in v[k]'s low half
      _mm256_store_ps(kt + (d + 4 * j + k) * kChunk, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v[k])));
  }
}

// kt [D, 16] (row d 64-byte aligned): kt[d][i] = rows[i][d] as float32, for d < D. float32
// rows of whole 8s load as 128-bit halves, which does the transpose's lane-crossing step.
template <typename T, int DC>
void transpose_keys(const T* const* rows, int64_t Drt, float* kt) {
  const int64_t D = DC > 0 ? DC : Drt;
  if constexpr (std::is_same_v<T, int8_t> && DC > 0 && DC % 16 == 0) {
    for (int kb = 0; kb < kChunk; kb += 8)
      for (int64_t d = 0; d < D; d += 16) transpose_int8x16(rows + kb, d, kt + kb);
    return;
  }
  for (int kb = 0; kb < kChunk; kb += 8) {
    const T* const* r8 = rows + kb;
    for (int64_t d = 0; d < D; d += 8) {
      __m256 r[8];
      if constexpr (std::is_same_v<T, float> && DC % 8 == 0 && DC > 0) {
        for (int i = 0; i < 4; ++i) {  // lanes: row i, row i + 4 (d .. d + 3, then d + 4 ..)
          r[i] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r8[i] + d)),
                                      _mm_loadu_ps(r8[i + 4] + d), 1);
          r[i + 4] = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(r8[i] + d + 4)),
                                          _mm_loadu_ps(r8[i + 4] + d + 4), 1);
        }
        for (int h = 0; h < 8; h += 4) {  // 4 x 4 transposes within each 128-bit half
          const __m256 t0 = _mm256_unpacklo_ps(r[h], r[h + 1]), t1 = _mm256_unpackhi_ps(r[h], r[h + 1]);
          const __m256 t2 = _mm256_unpacklo_ps(r[h + 2], r[h + 3]), t3 = _mm256_unpackhi_ps(r[h + 2], r[h + 3]);
          r[h] = _mm256_shuffle_ps(t0, t2, 0x44);
          r[h + 1] = _mm256_shuffle_ps(t0, t2, 0xEE);
          r[h + 2] = _mm256_shuffle_ps(t1, t3, 0x44);
          r[h + 3] = _mm256_shuffle_ps(t1, t3, 0xEE);
        }
      } else {
        for (int i = 0; i < 8; ++i) r[i] = load8(r8[i] + d, D - d);
        transpose8(r);
      }
      const int64_t nd = std::min<int64_t>(8, D - d);
      for (int j = 0; j < nd; ++j) _mm256_store_ps(kt + (d + j) * kChunk + kb, r[j]);
    }
  }
}

// NQ (row, head) pairs against the chunk: s[j] [16] = kmul * (q[j] . kt), lanes >= n[j] -inf.
template <int NQ, int DC>
void score_tile(const float* const* q, const float* kt, int64_t Drt, const float* kmul,
                const int* n, float* const* s) {
  const int64_t D = DC > 0 ? DC : Drt;
  __m256 a[NQ], b[NQ];
  for (int j = 0; j < NQ; ++j) a[j] = b[j] = _mm256_setzero_ps();
#pragma GCC unroll 4
  for (int64_t d = 0; d < D; ++d) {
    const __m256 k0 = _mm256_load_ps(kt + d * kChunk), k1 = _mm256_load_ps(kt + d * kChunk + 8);
    for (int j = 0; j < NQ; ++j) {
      const __m256 qv = _mm256_broadcast_ss(q[j] + d);
      a[j] = _mm256_fmadd_ps(qv, k0, a[j]);
      b[j] = _mm256_fmadd_ps(qv, k1, b[j]);
    }
  }
  const __m256 m0 = _mm256_loadu_ps(kmul), m1 = _mm256_loadu_ps(kmul + 8);
  const __m256 neg_inf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  for (int j = 0; j < NQ; ++j) {
    _mm256_storeu_ps(s[j], _mm256_blendv_ps(neg_inf, _mm256_mul_ps(a[j], m0), first_lanes(n[j])));
    _mm256_storeu_ps(s[j] + 8, _mm256_blendv_ps(neg_inf, _mm256_mul_ps(b[j], m1), first_lanes(n[j] - 8)));
  }
}

// The scores of a group's R rows for one chunk and KV head: p [R, G, 16], row i's G query
// heads at q[i] (qstride apart), its keys in this chunk n[i] (rows with n[i] = 0 are skipped).
// kt: scratch [D, 16], 64-byte aligned. Pairs go 6 to a tile, the last tile 1-5.
template <typename T, int DC>
void score_rows(const float* const* q, int64_t qstride, const T* const* rows, const int* n,
                int R, int64_t G, int64_t D, const float* kmul, float* p, float* kt) {
  transpose_keys<T, DC>(rows, D, kt);
  constexpr int kTile = 6;
  const float* tq[kTile];
  float* ts[kTile];
  int tn[kTile];
  int k = 0;
  auto flush = [&] {
    switch (k) {
      case 1: score_tile<1, DC>(tq, kt, D, kmul, tn, ts); break;
      case 2: score_tile<2, DC>(tq, kt, D, kmul, tn, ts); break;
      case 3: score_tile<3, DC>(tq, kt, D, kmul, tn, ts); break;
      case 4: score_tile<4, DC>(tq, kt, D, kmul, tn, ts); break;
      case 5: score_tile<5, DC>(tq, kt, D, kmul, tn, ts); break;
      case 6: score_tile<6, DC>(tq, kt, D, kmul, tn, ts); break;
      default: break;
    }
    k = 0;
  };
  for (int i = 0; i < R; ++i) {
    if (n[i] == 0) continue;
    for (int64_t h = 0; h < G; ++h) {
      tq[k] = q[i] + h * qstride;
      ts[k] = p + (i * G + h) * kChunk;
      tn[k] = n[i];
      if (++k == kTile) flush();
    }
  }
  flush();
}

}  // namespace tgserve::attn
