// The AVX2 pass of q8_linear.cpp for one or two activation rows (a batch-1 decode's linears and
// LM head, a 2-token verify): q8_linear.h's order with the block's integer sums and the float32
// sums kept in ymm registers, where the generic pass (q8_dot.h's block_sums, then the simd16
// epilogue) stores both to memory and reloads them every block of 32 k.
//
// The same integers and the same IEEE epilogue as the generic pass, so the same bits:
// - Q4 kinds: each 16-bit pair vpmaddubsw makes is nibble * xq + nibble * xq, at most
//   2 * 15 * 127 = 3810 in magnitude; the block's 8 such pairs (4 groups, low and high nibbles)
//   sum to at most 30480 < 32767, so they add up exactly in int16 and one vpmaddwd by ones per
//   block widens them (the generic pass widens each group's);
// - Q8: |wq| against xq with wq's sign (q8_dot.h), widened per group (a pair reaches 32512);
// - then per lane: acc = fma(d * dx, float(isum - offset), acc) (+ fma(m * dx, float(sx), acc)
//   for Q4_1), fp16 scales (a file's) widened by vcvtph2ps (exact).
#pragma once

#include "x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <cstdlib>

#include "q8_dot.h"

// prefetch_ahead and scales compile in every AVX2 build (AVX-512 ones too: q16_avx2.h's int16
// pass runs there); the int8 pass only where AVX512-VNNI's pass_vnni does not take over.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
namespace tgserve::q8_avx2 {

// Each panel stream prefetches (into L1) the bytes this far ahead of the block it reads,
// a line at a time as it goes (past a panel's end: the next group's panel, the same thread's
// next stream under q8_linear's static split): the hardware prefetcher alone keeps too few
// lines in flight for a thread's two panel streams (the bench's read probe on the shared
// AVX2 Zen 3 host: one stream a thread 7.3 GB/s, with a 1 KiB prefetch 13.2). Arithmetic
// untouched: the same bits. TGSERVE_Q8_PREFETCH=<bytes> sets the distance (0: off), read once.
inline int64_t prefetch_ahead() {
  static const int64_t bytes = [] {
    const char* v = std::getenv("TGSERVE_Q8_PREFETCH");
    return v ? std::max<int64_t>(0, std::atoll(v)) : int64_t{1024};
  }();
  return bytes;
}

// The 8 lanes [8 * half, 8 * half + 8) of a panel block's 16 scales: fp16 or float32.
template <bool kHalf>
inline __m256 scales(const uint8_t* p, int half) {
  if constexpr (kHalf)
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half)));
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * half);
}

}  // namespace tgserve::q8_avx2
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define TGSERVE_Q8_AVX2 1

namespace tgserve::q8_avx2 {

// Rows xq[0 .. MR) (K apart) against panels Wp[0 .. NR) (panel_bytes apart), `nb` blocks of
// `block_bytes` (the quants at `quants`; Q4_1's fp16 mins at byte 32) -> out [MR][NR][16].
// kMin: Q4_1; kOffset8: Q4_0 (nibble - 8); kHalf: fp16 scales (a file's), else float32.
template <bool Q4, bool kMin, bool kOffset8, bool kHalf, int MR, int NR>
void pass(const int8_t* xq, const float* dx, const int32_t* sx, int64_t K, const uint8_t* Wp,
          int64_t panel_bytes, int64_t block_bytes, int64_t quants, float* out) {
  constexpr int H = 2 * NR;  // ymm halves of the panels: half h = panel h / 2, lanes 8 * (h % 2)
  const int64_t nb = K / 32;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256 acc[MR][H];
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h) acc[m][h] = _mm256_setzero_ps();
  const int64_t ahead = prefetch_ahead(), stream_bytes = nb * block_bytes;
  int64_t next[NR];  // each stream's next line to prefetch, bytes from its panel's start
  for (int j = 0; j < NR; ++j) next[j] = ahead;
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; ahead > 0 && j < NR; ++j)
      for (; next[j] < (b + 1) * block_bytes + ahead; next[j] += 64) {
        const int64_t past = next[j] >= stream_bytes ? (NR - 1) * panel_bytes : 0;
        _mm_prefetch(reinterpret_cast<const char*>(Wp + j * panel_bytes + next[j] + past),
                     _MM_HINT_T0);
      }
    const uint8_t* blk[NR];
    for (int j = 0; j < NR; ++j) blk[j] = Wp + j * panel_bytes + b * block_bytes;
    const auto load = [&](int h, int g) {
      return _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(blk[h / 2] + quants + 64 * g + 32 * (h % 2)));
    };
    __m256i isum[MR][H];
    if constexpr (Q4) {
      const __m256i low = _mm256_set1_epi8(0x0F);
      __m256i pairs[MR][H];
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < H; ++h) pairs[m][h] = _mm256_setzero_si256();
      for (int g = 0; g < 4; ++g) {
        __m256i lo[H], hi[H];
        for (int h = 0; h < H; ++h) {
          const __m256i raw = load(h, g);
          lo[h] = _mm256_and_si256(raw, low);
          hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
        }
        for (int m = 0; m < MR; ++m) {
          const int8_t* x = xq + m * K + 32 * b;
          const __m256i xl = _mm256_set1_epi32(q8_dot::word(x + 4 * g));
          const __m256i xh = _mm256_set1_epi32(q8_dot::word(x + 16 + 4 * g));
          for (int h = 0; h < H; ++h)
            pairs[m][h] = _mm256_add_epi16(
                pairs[m][h],
                _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xl), _mm256_maddubs_epi16(hi[h], xh)));
        }
      }
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < H; ++h) isum[m][h] = _mm256_madd_epi16(pairs[m][h], ones16);
    } else {
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < H; ++h) isum[m][h] = _mm256_setzero_si256();
      for (int g = 0; g < 8; ++g) {
        __m256i wv[H], wabs[H];
        for (int h = 0; h < H; ++h) {
          wv[h] = load(h, g);
          wabs[h] = _mm256_abs_epi8(wv[h]);  // -128 -> 128 as unsigned
        }
        for (int m = 0; m < MR; ++m) {
          const __m256i xb = _mm256_set1_epi32(q8_dot::word(xq + m * K + 32 * b + 4 * g));
          for (int h = 0; h < H; ++h) {
            const __m256i p = _mm256_maddubs_epi16(wabs[h], _mm256_sign_epi8(xb, wv[h]));
            isum[m][h] = _mm256_add_epi32(isum[m][h], _mm256_madd_epi16(p, ones16));
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m) {
      const __m256 dxv = _mm256_set1_ps(dx[m * nb + b]);
      const int32_t s_x = sx[m * nb + b];
      for (int h = 0; h < H; ++h) {
        __m256i terms = isum[m][h];
        if constexpr (kOffset8) terms = _mm256_sub_epi32(terms, _mm256_set1_epi32(8 * s_x));
        const __m256 scale = _mm256_mul_ps(scales<kHalf>(blk[h / 2], h % 2), dxv);
        __m256 v = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(terms), acc[m][h]);
        if constexpr (kMin) {
          const __m256 m_w = scales<true>(blk[h / 2] + 32, h % 2);
          v = _mm256_fmadd_ps(_mm256_mul_ps(m_w, dxv), _mm256_set1_ps(static_cast<float>(s_x)), v);
        }
        acc[m][h] = v;
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h) _mm256_storeu_ps(out + (m * NR + h / 2) * 16 + 8 * (h % 2), acc[m][h]);
}

}  // namespace tgserve::q8_avx2
#endif
