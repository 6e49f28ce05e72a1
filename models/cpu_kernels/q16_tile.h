// The many-rows pass of q8_linear.cpp for int16 activations (kQ16Activations kinds, q16_dot.h)
// on AVX2: prefill chunks and batched decode steps. A thread widens a group of Q8 panels ONCE
// (group_walk.h's walk) into int16 weight pairs, and a tile of up to kTileRows rows x one panel
// runs one vpmaddwd and one vpaddd per (row, 2 k, 8 lanes) with the block's int32 sums in ymm
// registers.
//
// Why (one thread, the shared AVX2 Zen 3 host, SmolLM2-135M's Q4_1 shapes, 64-512 rows; the
// table: PERFORMANCE.md): q16_avx2.h's pass decodes a block's nibbles again for every pass of at
// most 4 rows, feeds vpmaddwd from per-128-bit-lane unpacks and pays a vphaddd per row and
// block: ~88 GFLOP/s against the float32 activations' tile's ~96. Here the weights arrive as
// pairs ready for vpmaddwd, each row's 2 activations of a pair are one broadcast 32-bit word,
// and a block's sums come out with the lanes in order: ~121 GFLOP/s. (vpmaddwd runs 2 a cycle
// on Zen 3: 16 multiply-adds per instruction against an FMA's 8. A float32 FMA tile over the
// integer values, the same exact sums, reached only ~81: its per-block epilogue is extra work
// the float tile does not have, on the FMA ports it saturates.)
//
// Layout of a widened panel (panel_words(K) 32-bit words): pairs [K / 2][16 lanes], word
// (p, l) = w[l][2p] | w[l][2p + 1] << 16 as int16 (Q4_1: the nibble; Q4_0: nibble - 8; Q8_0
// and int8 rows: the int8 value), then d [K / 32][16] and Q4_1's m [K / 32][16] as float32 (fp16
// scales widened exactly; int8 rows' float32 copied).
//
// Same bits as every other pass (q8_linear.h's order): a block's 16 pair products per lane add
// up in int32 exactly (|pair| <= 2 * 128 * 32767, the block's sum <= 32 * 128 * 32767 = 1.34e8
// < 2^31), so the sum is the integer path's isum, Q4_0's minus 8 * sx (the offset folded into
// the weights: sum(xq * (n - 8)) = isum - 8 sx); then q8_rows_avx2.h's block_terms, the same
// IEEE epilogue in block order: acc = fma(d * dx, float(sum), acc), Q4_1: acc = fma(m * dx,
// float(sx), acc).
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "q8_rows_avx2.h"
#include "simd16.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && defined(TGSERVE_SIMD16)
#define TGSERVE_Q16_TILE 1

namespace tgserve::q16_tile {

using simd16::VI;
namespace v = simd16;

constexpr int kLanes = 16;  // a panel's output rows
constexpr int kBlock = 32;
constexpr int kTileRows = 6;  // rows per tile: 12 sums + 2 weights + a broadcast of 16 ymm
constexpr int kPairs = kBlock / 2;

// 32-bit words of one widened panel (see the file's comment).
inline int64_t panel_words(int64_t K) { return (K / 2 + 2 * (K / kBlock)) * kLanes; }

// Lane values a, b (int32, in int16 range) -> the pair words a | b << 16.
inline VI pair(VI a, VI b) {
  return v::or_(v::and_(a, v::set1i(0xFFFF)), v::slli(b, 16));
}

// The Q8 panel at `panel` (q8_linear.h's layout, blocks of block_bytes, the quants at byte
// `quants`) -> w [panel_words(K)]. kKind: q8_linear.cpp's layout variant (1 Q4_1, 2 Q4_0,
// 0 Q8_0, 3 int8 rows).
template <int kKind>
void widen_panel(const uint8_t* panel, int64_t K, int64_t block_bytes, int64_t quants,
                 int32_t* w) {
  constexpr bool kQ4 = kKind == 1 || kKind == 2;
  const int64_t nb = K / kBlock;
  float* d = reinterpret_cast<float*>(w + K / 2 * kLanes);
  float* mn = d + nb * kLanes;
  const auto put = [](int32_t* at, VI words) {
    v::storef(reinterpret_cast<float*>(at), v::as_float(words));
  };
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = panel + b * block_bytes;
    v::storef(d + b * kLanes, kKind == 3 ? v::loadf(reinterpret_cast<const float*>(blk))
                                         : v::load_halves(blk));
    if constexpr (kKind == 1) v::storef(mn + b * kLanes, v::load_halves(blk + 32));
    int32_t* wb = w + b * kPairs * kLanes;
    for (int g = 0; g < (kQ4 ? 4 : 8); ++g) {
      // lane l's 32-bit word: its 4 bytes of group g (k = 4 g + j; Q4's high nibbles 16 + 4 g + j)
      const VI words = v::as_int(v::loadf(reinterpret_cast<const float*>(blk + quants + 64 * g)));
      VI lo[4], hi[4];
      for (int j = 0; j < 4; ++j) {
        if constexpr (kQ4) {
          lo[j] = v::and_(v::srli(words, 8 * j), v::set1i(0xF));
          hi[j] = v::and_(v::srli(words, 8 * j + 4), v::set1i(0xF));
          if constexpr (kKind == 2) lo[j] = v::subi(lo[j], v::set1i(8)), hi[j] = v::subi(hi[j], v::set1i(8));
        } else {
          lo[j] = v::srai(v::slli(words, 24 - 8 * j), 24);  // the signed byte j
        }
      }
      for (int i = 0; i < 2; ++i) {  // pairs (4 g + 2 i, 4 g + 2 i + 1), Q4 also + 16
        put(wb + (2 * g + i) * kLanes, pair(lo[2 * i], lo[2 * i + 1]));
        if constexpr (kQ4) put(wb + (8 + 2 * g + i) * kLanes, pair(hi[2 * i], hi[2 * i + 1]));
      }
    }
  }
}

// out [m] (16 lanes at out + m * row_stride) = rows xq[0 .. MR) (K apart; their blocks' dx, sx
// K / 32 apart) over the widened panel w: the float32 sums before the bias.
template <bool kMin, int MR>
void tile(const int16_t* xq, const float* dx, const int32_t* sx, int64_t K, const int32_t* w,
          float* out, int64_t row_stride) {
  const int64_t nb = K / kBlock;
  const float* d = reinterpret_cast<const float*>(w + K / 2 * kLanes);
  alignas(32) float acc[MR][2][8];  // the float32 sums, in L1 (a load and a store a block)
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < 2; ++h) _mm256_store_ps(acc[m][h], _mm256_setzero_ps());
  for (int64_t b = 0; b < nb; ++b) {
    __m256i s[MR][2];  // the block's int32 sums, lanes 0-7 and 8-15
    const int32_t* wb = w + b * kPairs * kLanes;
    const int16_t* xb = xq + b * kBlock;
#pragma GCC unroll 16
    for (int p = 0; p < kPairs; ++p) {
      const __m256i w0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + p * kLanes));
      const __m256i w1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(wb + p * kLanes + 8));
      for (int m = 0; m < MR; ++m) {
        int32_t x2;  // row m's activations 2p, 2p + 1 of the block
        std::memcpy(&x2, xb + m * K + 2 * p, 4);
        const __m256i xv = _mm256_set1_epi32(x2);
        const __m256i p0 = _mm256_madd_epi16(w0, xv), p1 = _mm256_madd_epi16(w1, xv);
        s[m][0] = p == 0 ? p0 : _mm256_add_epi32(s[m][0], p0);
        s[m][1] = p == 0 ? p1 : _mm256_add_epi32(s[m][1], p1);
        q8_rows_avx2::pin(s[m][0]);  // the sums stay in registers, added pair by pair
        q8_rows_avx2::pin(s[m][1]);
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int h = 0; h < 2; ++h) {
        const float* dh = d + b * kLanes + 8 * h;
        const __m256 d_w = _mm256_load_ps(dh);
        const __m256 m_w = kMin ? _mm256_load_ps(dh + nb * kLanes) : d_w;
        // kOffset8 false: Q4_0's offset is in the weights
        const __m256 a = q8_rows_avx2::block_terms<kMin, false>(
            s[m][h], d_w, m_w, dx[m * nb + b], sx[m * nb + b], _mm256_load_ps(acc[m][h]));
        _mm256_store_ps(acc[m][h], a);
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < 2; ++h) _mm256_storeu_ps(out + m * row_stride + 8 * h, _mm256_load_ps(acc[m][h]));
}

}  // namespace tgserve::q16_tile

#endif
