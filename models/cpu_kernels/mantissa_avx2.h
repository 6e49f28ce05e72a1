// The few-rows float32 pass of block_fma.h on AVX2 + FMA with weights made by one fma from the
// quants' bits (mantissa_weights.h's idea without AVX-512), for Q4_0, Q4_1 whose constant
// terms were checked when packed (kQ4_1Exact) and Q8_0. Included by block_fma.h only.
//
// Contract (block_fma.h's few_rows for float32 x, MR <= 2 rows): out [m][j] (16 lanes at
// out + (m * max_nr + j) * 16) = rows x[0 .. MR) (row stride K) over panels [0 .. NR) of the
// packed blocks, each lane's acc = fma(x[k], w[k], acc) for k in order from +0, with w gguf's
// weight: the bits of block_fma.h's few-rows pass and of linear.cpp's float32 pass over
// `--dequantize`'s weights (a zero w may differ in sign, which no output shows: see
// mantissa_weights.h). Batch invariance: a lane's sequence depends on K alone, never on MR,
// NR or the thread.
//
// How: R = 2^15 (exponent 142, ulp 2^-8) is merged once into each source (vpor; Q8_0 vpxor,
// which also flips the byte's sign bit: u = q + 128), then each element's vpand keeps R's
// exponent and its field, so f = R + u (a field at bit 8) or R + 16 u (at bit 12); w = fma(f,
// d', c) with d' = d (d / 16 at bit 12, exact) and c = -(2^15 d) + m or -(2^11 d) + m (Q4_0:
// m = -8 d; Q8_0: -128 d). c is exact (mantissa_weights.h: Q4_0 / Q8_0 for every finite d;
// Q4_1 as checked at packing), so f d' + c = d q (+ m) exactly and the fma's one rounding is
// gguf's fl(d q) or fl(fl(d q) + m). Per weight (8 lanes): one vpand and one fma beside the
// row's fma, against a shift, a vpand, a vcvtdq2ps and an fma (block_fma.h's path on AVX2);
// per source a vpor. Blocks with a non-finite d (Q4_0, Q8_0) run a scalar loop of the same
// per-lane order.
//
// Sources (see block_fma.h's packed block): a lane's 16-bit word of a 32-byte chunk, widened;
// A = word << 8 holds elements u = 0, 2 of the chunk at bits 8, 12 (Q8_0: element 0 at 8),
// B = word holds u = 1, 3 (Q8_0: element 1 at 8); bit 23 and the other fields are cleared by
// the vpand.
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && !defined(__AVX512F__)
#define TGSERVE_MANTISSA_AVX2 1

#include "x86_intrinsics.h"

#include <cmath>
#include <cstdint>
#include <cstring>

#include <c10/util/Half.h>

namespace tgserve::mantissa_avx2 {

constexpr int kLanes = 16, kBlockK = 32;

// TYPE: 0 = Q4_0, 1 = Q4_1 (constant terms exact), 2 = Q8_0 (as block_fma.h). One R = 2^15
// (exponent 142, ulp 2^-8) for every element: a field at bit p = 8 reads u, at p = 12 16 u,
// so the p = 12 elements take d / 16 (exact) as their scale.
template <int TYPE>
struct Fields {
  static constexpr int kPerChunk = TYPE == 2 ? 2 : 4;  // elements per 32-byte chunk
  static constexpr int kPositions = TYPE == 2 ? 1 : 2;  // p = 8 (, 12)
  static constexpr uint32_t kR = 0x47000000u;          // 2^15
  // Merged into each source once (or; Q8_0 xor, flipping the byte's sign bit: u = q + 128).
  static constexpr uint32_t kMerge = kR | (TYPE == 2 ? 0x8000u : 0u);
  // Element u's bits of a merged source: R's exponent and the field (bit 23 and the other
  // fields cleared).
  static constexpr uint32_t mask(int u) {
    return kR | (TYPE == 2 ? 0xFF00u : (u < 2 ? 0x0F00u : 0xF000u));
  }
};

inline __m256 halves(const uint8_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

inline bool finite_halves(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i e = _mm256_and_si256(h, _mm256_set1_epi16(0x7C00));
  return _mm256_movemask_epi8(_mm256_cmpeq_epi16(e, _mm256_set1_epi16(0x7C00))) == 0;
}

// A panel's block, [p index][half]: the scale (d, or d / 16 at p = 12) and the constant term
// c = -(2^15 d) + m at p = 8, -(2^11 d) + m at p = 12 (Q4_0: m = -8 d; Q8_0: -128 d).
struct Scales {
  __m256 d[2][2], c[2][2];
};

template <int TYPE>
[[gnu::always_inline]] inline void scales(const uint8_t* blk, Scales& s) {
  for (int h = 0; h < 2; ++h) {
    const __m256 d = halves(blk + 16 * h);
    for (int k = 0; k < Fields<TYPE>::kPositions; ++k) {
      const float r = k ? 2048.0f : 32768.0f;
      s.d[k][h] = k ? _mm256_mul_ps(d, _mm256_set1_ps(1.0f / 16)) : d;
      if constexpr (TYPE == 1)
        s.c[k][h] = _mm256_fnmadd_ps(_mm256_set1_ps(r), d, halves(blk + 32 + 16 * h));
      else
        s.c[k][h] = _mm256_mul_ps(d, _mm256_set1_ps(-(r + (TYPE == 2 ? 128 : 8))));
    }
  }
}

// Element u's weights from its merged source (A for even u, B for odd u).
template <int TYPE>
[[gnu::always_inline]] inline __m256 weight(__m256i merged, int u, const Scales& s, int h) {
  const int k = Fields<TYPE>::kPositions == 1 ? 0 : u / 2;
  const __m256i mask = _mm256_set1_epi32(static_cast<int>(Fields<TYPE>::mask(u)));
  const __m256i f = _mm256_and_si256(merged, mask);
  return _mm256_fmadd_ps(_mm256_castsi256_ps(f), s.d[k][h], s.c[k][h]);
}

// One block of NR panels whose d is not finite (Q4_0, Q8_0), lane by lane in scalar code:
// the same per-lane order (w = fl(d q), acc = fma(x, w, acc)) over accumulators in memory.
template <int TYPE, int MR, int NR>
void scalar_block(const float* xb, int64_t K, const uint8_t* const* blk, int64_t scales_bytes,
                  __m256 (&acc)[MR][NR][2]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) {
      alignas(32) float a[kLanes];
      _mm256_store_ps(a, acc[m][j][0]);
      _mm256_store_ps(a + 8, acc[m][j][1]);
      for (int l = 0; l < kLanes; ++l) {
        uint16_t dh;
        std::memcpy(&dh, blk[j] + 2 * l, 2);
        const float d = static_cast<float>(c10::Half(dh, c10::Half::from_bits()));
        const uint8_t* q = blk[j] + scales_bytes;
        for (int e = 0; e < kBlockK; ++e) {
          const int s = e / 2, i = e % 2;
          int qv;
          if constexpr (TYPE == 2)
            qv = static_cast<int8_t>(q[32 * s + 2 * l + i]);
          else
            qv = ((q[32 * (s / 2) + 2 * l + i] >> (4 * (s % 2))) & 0xF) - 8;
          float w = d * static_cast<float>(qv);
          asm volatile("" : "+x"(w));  // no contraction: gguf's fl(d * q)
          a[l] = std::fma(xb[m * K + e], w, a[l]);
        }
      }
      acc[m][j][0] = _mm256_load_ps(a);
      acc[m][j][1] = _mm256_load_ps(a + 8);
    }
}

template <int TYPE, int MR, int NR>
void few_rows(const float* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
              int64_t file_block, int64_t scales_bytes, int max_nr, float* out) {
  using F = Fields<TYPE>;
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  __m256 acc[MR][NR][2];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j][0] = acc[m][j][1] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xb = x + b * kBlockK;
    const uint8_t* blk[NR];
    for (int j = 0; j < NR; ++j) blk[j] = Wp + j * panel_bytes + b * bb;
    if constexpr (TYPE != 1) {
      bool finite = true;
      for (int j = 0; j < NR; ++j) finite = finite && finite_halves(blk[j]);
      if (!finite) {
        scalar_block<TYPE, MR, NR>(xb, K, blk, scales_bytes, acc);
        continue;
      }
    }
    Scales s[NR];
    for (int j = 0; j < NR; ++j) scales<TYPE>(blk[j], s[j]);
    // Chunk by chunk, each (panel, half) accumulator through the chunk's elements in order;
    // the accumulators are independent chains, interleaved by the out-of-order core.
    for (int ch = 0; ch < kBlockK / F::kPerChunk; ++ch) {
      __m256 xv[MR][F::kPerChunk];
      for (int m = 0; m < MR; ++m)
        for (int u = 0; u < F::kPerChunk; ++u)
          xv[m][u] = _mm256_broadcast_ss(xb + m * K + F::kPerChunk * ch + u);
      for (int j = 0; j < NR; ++j)
        for (int h = 0; h < 2; ++h) {
          const __m128i words = _mm_loadu_si128(
              reinterpret_cast<const __m128i*>(blk[j] + scales_bytes + 32 * ch + 16 * h));
          const __m256i merge = _mm256_set1_epi32(static_cast<int>(F::kMerge));
          const __m256i b_src = _mm256_cvtepu16_epi32(words);
          const __m256i a_src = _mm256_slli_epi32(b_src, 8);
          const auto merged = [&](__m256i v) {
            return TYPE == 2 ? _mm256_xor_si256(v, merge) : _mm256_or_si256(v, merge);
          };
          __m256i src[2] = {merged(a_src), merged(b_src)};
          // Merged once per source: without the barrier GCC moves the or past each element's and.
          asm("" : "+x"(src[0]), "+x"(src[1]));
          for (int u = 0; u < F::kPerChunk; ++u) {
            const __m256 w = weight<TYPE>(src[u % 2], u, s[j], h);
            for (int m = 0; m < MR; ++m) acc[m][j][h] = _mm256_fmadd_ps(xv[m][u], w, acc[m][j][h]);
          }
        }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j)
      for (int h = 0; h < 2; ++h)
        _mm256_storeu_ps(out + (m * max_nr + j) * kLanes + 8 * h, acc[m][j][h]);
}

}  // namespace tgserve::mantissa_avx2

#endif
