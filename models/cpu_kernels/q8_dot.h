// The integer part of q8_linear.cpp: one block of 32 k, MR activation rows against NR panels of
// 16 weight rows, as exact int32 sums. Three builds, the same integers (no sum can overflow or
// saturate: |xq| <= 127, |wq| <= 128, 32 terms):
// - AVX512-VNNI: vpdpbusd multiplies unsigned by signed bytes. Q4 kinds: the nibbles (0..15)
//   are the unsigned operand as they are. Q8: the activations become unsigned as xq + 128 (xor
//   0x80) and the sum is corrected by 128 * sum(wq), itself a vpdpbusd of ones against wq.
// - AVX2: vpmaddubsw (unsigned x signed bytes -> saturating int16 pairs) then vpmaddwd by ones.
//   Q4 kinds as above (pairs <= 2 * 15 * 127); Q8: |wq| against xq with wq's sign (vpsignb),
//   pairs <= 2 * 128 * 127 < 32767, so nothing saturates.
// - scalar loops.
// Q4 kinds yield sum(xq * nibble); q8_linear's epilogue takes Q4_0's 8 * sum(xq) off.
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <cstring>

namespace tgserve::q8_dot {

constexpr int kLanes = 16;  // a panel's rows

inline int32_t word(const int8_t* p) {
  int32_t w;
  std::memcpy(&w, p, 4);
  return w;
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// acc [MR][NR] = the block's exact int32 sums (lane l of acc[m][j]: row m against panel j's
// lane l), left in registers for the caller's epilogue. x[m] the block's 32 int8 activations
// of row m, w[j] panel j's quants.
template <bool Q4, int MR, int NR>
[[gnu::always_inline]] inline void vnni_sums(const int8_t* const* x, const uint8_t* const* w,
                                             __m512i (&acc)[MR][NR]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_si512();
  if constexpr (Q4) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
      __m512i lo[NR], hi[NR];
      for (int j = 0; j < NR; ++j) {
        const __m512i raw = _mm512_loadu_si512(w[j] + 64 * g);
        lo[j] = _mm512_and_si512(raw, low);
        hi[j] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low);
      }
      for (int m = 0; m < MR; ++m) {
        const __m512i xl = _mm512_set1_epi32(word(x[m] + 4 * g));
        const __m512i xh = _mm512_set1_epi32(word(x[m] + 16 + 4 * g));
        for (int j = 0; j < NR; ++j) {
          acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], lo[j], xl);
          acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], hi[j], xh);
        }
      }
    }
  } else {
    const __m512i ones = _mm512_set1_epi8(1);
    __m512i wsum[NR];
    for (int j = 0; j < NR; ++j) wsum[j] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      __m512i wv[NR];
      for (int j = 0; j < NR; ++j) {
        wv[j] = _mm512_loadu_si512(w[j] + 64 * g);
        wsum[j] = _mm512_dpbusd_epi32(wsum[j], ones, wv[j]);
      }
      for (int m = 0; m < MR; ++m) {
        const __m512i xu = _mm512_set1_epi32(word(x[m] + 4 * g) ^ int32_t(0x80808080u));
        for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbusd_epi32(acc[m][j], xu, wv[j]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_sub_epi32(acc[m][j], _mm512_slli_epi32(wsum[j], 7));
  }
}
#endif

// isum [MR][NR][16] by scalar loops: x[m] the block's 32 activations of row m (int8, or int16:
// q16_dot.h), w[j] panel j's quants. Q4 kinds: sum(x * nibble).
template <bool Q4, int MR, int NR, typename A>
inline void scalar_sums(const A* const* x, const uint8_t* const* w, int32_t* isum) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j)
      for (int l = 0; l < kLanes; ++l) {
        int32_t s = 0;
        for (int g = 0; g < (Q4 ? 4 : 8); ++g)
          for (int e = 0; e < 4; ++e) {
            const uint8_t byte = w[j][64 * g + 4 * l + e];
            if constexpr (Q4) {
              s += x[m][4 * g + e] * (byte & 0xF) + x[m][16 + 4 * g + e] * (byte >> 4);
            } else {
              s += x[m][4 * g + e] * static_cast<int8_t>(byte);
            }
          }
        isum[(m * NR + j) * kLanes + l] = s;
      }
}

// isum [MR][NR][16]: x[m] the block's 32 int8 activations of row m, w[j] panel j's quants.
// Builds without AVX512-VNNI (those with it run vnni_sums inside q8_linear.cpp's pass_vnni).
template <bool Q4, int MR, int NR>
inline void block_sums(const int8_t* const* x, const uint8_t* const* w, int32_t* isum) {
#if defined(__AVX2__)
  // A panel is two halves of 8 lanes: bytes [0, 32) and [32, 64) of each group.
  constexpr int H = 2 * NR;
  const __m256i ones16 = _mm256_set1_epi16(1);
  __m256i acc[MR][H];
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h) acc[m][h] = _mm256_setzero_si256();
  const auto load = [&](int h, int g) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[h / 2] + 64 * g + 32 * (h % 2)));
  };
  if constexpr (Q4) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    for (int g = 0; g < 4; ++g) {
      __m256i lo[H], hi[H];
      for (int h = 0; h < H; ++h) {
        const __m256i raw = load(h, g);
        lo[h] = _mm256_and_si256(raw, low);
        hi[h] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
      }
      for (int m = 0; m < MR; ++m) {
        const __m256i xl = _mm256_set1_epi32(word(x[m] + 4 * g));
        const __m256i xh = _mm256_set1_epi32(word(x[m] + 16 + 4 * g));
        for (int h = 0; h < H; ++h) {
          const __m256i pairs =
              _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xl), _mm256_maddubs_epi16(hi[h], xh));
          acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(pairs, ones16));
        }
      }
    }
  } else {
    for (int g = 0; g < 8; ++g) {
      __m256i wv[H], wabs[H];
      for (int h = 0; h < H; ++h) {
        wv[h] = load(h, g);
        wabs[h] = _mm256_abs_epi8(wv[h]);  // -128 -> 128 as unsigned
      }
      for (int m = 0; m < MR; ++m) {
        const __m256i xb = _mm256_set1_epi32(word(x[m] + 4 * g));
        for (int h = 0; h < H; ++h) {
          const __m256i pairs = _mm256_maddubs_epi16(wabs[h], _mm256_sign_epi8(xb, wv[h]));
          acc[m][h] = _mm256_add_epi32(acc[m][h], _mm256_madd_epi16(pairs, ones16));
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(isum + (m * NR + h / 2) * kLanes + 8 * (h % 2)),
                          acc[m][h]);
#else
  scalar_sums<Q4, MR, NR>(x, w, isum);
#endif
}

}  // namespace tgserve::q8_dot
