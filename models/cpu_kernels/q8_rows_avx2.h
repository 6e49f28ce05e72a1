// The AVX2 pass of q8_linear.cpp for many activation rows (prefill chunks, batched decode
// steps, an expert's rows): a tile of MR rows x H ymm halves of 8 output lanes (q8_linear.cpp
// runs 3 or 4 rows x one panel, H = 2) whose block integer sums stay in ymm registers and whose
// float32 sums are written back once per block, where the generic pass (q8_dot.h's block_sums,
// then the simd16 epilogue) stores and reloads every block's integer sums and widens every
// group's pairs. q8_avx2.h keeps one or two rows (a decode row reads the weights once: the
// read bound, with both panels' sums in registers).
//
// Registers (16 ymm): a block's int16 pair sums MR x H, the decoded weights of a group (Q4: low
// and high nibbles, 2 H; Q8: the group's weights and their magnitudes, 2 H), the broadcast
// activation words and the nibble mask; the float32 sums MR x H live in an L1 tile (one load
// folded into the fma and one store per block: the integer part is ~20 vector ops per half,
// the round trip costs the memory ports only). One thread, 64 rows x SmolLM2-135M's gate_up
// (3072 x 576), thread CPU time on the shared AVX2 Zen 3 host: Q4_1 126 GFLOP/s (q8_avx2.h's
// two-row pass run twice: 113), Q4_0 152 (107), Q8_0 106 (77); tiles of 4 rows x 2 panels
// (sums spilled), 8 rows x half a panel and 2 rows x 2 panels were no faster.
//
// The same integers and the same IEEE epilogue as the generic pass, so the same bits for every
// row whatever M is and whichever pass runs it (q8_linear.h's order):
// - Q4 kinds: vpmaddubsw(nibbles, xq) gives 16-bit pairs n1 * x1 + n2 * x2 with 0 <= n <= 15
//   and |x| <= 127, so |pair| <= 2 * 15 * 127 = 3810 (never saturated); a block is 4 groups x
//   (low, high) = 8 such pairs per 16-bit lane, |sum| <= 8 * 3810 = 30480 < 32767, so the
//   int16 adds are exact, and one vpmaddwd by ones per block widens the pair sums to the
//   block's exact int32 sums;
// - Q8 kinds: vpmaddubsw(|wq|, xq with wq's sign) (|pair| <= 2 * 128 * 127 = 32512: exact),
//   widened by vpmaddwd every group (two pairs could reach 65024: no int16 sum);
// - then per lane, in block order (block_terms): acc = fma(d * dx, float(isum - offset), acc)
//   (Q4_0: offset 8 * sx), Q4_1: acc = fma(m * dx, float(sx), acc); d * dx and m * dx rounded
//   products, fp16 scales widened by vcvtph2ps (exact).
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>

#include "q8_avx2.h"
#include "q8_dot.h"

// block_terms compiles in every AVX2 build (q16_avx2.h's int16 pass shares it, AVX-512 builds
// included); the int8 tile only where AVX512-VNNI's pass_vnni does not take over.
#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
namespace tgserve::q8_rows_avx2 {

// acc + one block's terms for 8 lanes, q8_linear.h's order: fma(d * dx, float(isum - offset),
// acc) (Q4_0: offset 8 * sx), then Q4_1: fma(m * dx, float(sx), .); d * dx, m * dx rounded.
template <bool kMin, bool kOffset8>
[[gnu::always_inline]] inline __m256 block_terms(__m256i isum, __m256 d_w, __m256 m_w, float d_x,
                                                 int32_t s_x, __m256 acc) {
  const __m256 dxv = _mm256_set1_ps(d_x);
  if constexpr (kOffset8) isum = _mm256_sub_epi32(isum, _mm256_set1_epi32(8 * s_x));
  acc = _mm256_fmadd_ps(_mm256_mul_ps(d_w, dxv), _mm256_cvtepi32_ps(isum), acc);
  if constexpr (kMin)
    acc = _mm256_fmadd_ps(_mm256_mul_ps(m_w, dxv), _mm256_set1_ps(static_cast<float>(s_x)), acc);
  return acc;
}

// An empty asm that takes and gives v in a ymm register: after each group's add it keeps the
// block's sums in registers, added group by group. Without it GCC (12, -O3) reassociated the
// unrolled integer sums, computing every group's products first and spilling them to the stack.
// With the one-panel tile below: one thread, 64 rows, out of line as q8_linear.cpp calls it, on
// the shared AVX2 Zen 3 host, Q4_1 3072 x 576 ~80 -> ~115 GFLOP/s, 576 x 1536 ~88 -> ~125, Q8_0
// 3072 x 576 ~66 -> ~84 (the same bits).
[[gnu::always_inline]] inline void pin(__m256i& v) { asm("" : "+x"(v)); }

}  // namespace tgserve::q8_rows_avx2
#endif

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__) && \
    !(defined(__AVX512VNNI__) && defined(__AVX512BW__))
#define TGSERVE_Q8_ROWS_AVX2 1

namespace tgserve::q8_rows_avx2 {

// A group's 32 bytes of nibbles -> the low and the high nibbles as bytes 0..15.
[[gnu::always_inline]] inline void split_nibbles(__m256i raw, __m256i low, __m256i& lo,
                                                 __m256i& hi) {
  lo = _mm256_and_si256(raw, low);
  hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low);
}

// Rows xq[0 .. MR) (K apart; dx, sx K / 32 apart) against the panel at `panel` (its two ymm
// halves of 8 lanes), blocks of block_bytes with the quants at byte `quants` (Q4_1's fp16 mins
// at byte 32) -> out [MR] rows of 16 lanes `stride` floats apart (the float32 sums before the
// bias). kMin: Q4_1; kOffset8: Q4_0's nibble - 8; kHalf: fp16 scales. One panel a call, so
// every offset inside a block is a constant (before: a runtime range of halves, h0 .. h0 + H).
template <bool Q4, bool kMin, bool kOffset8, bool kHalf, int MR>
void tile(const int8_t* xq, const float* dx, const int32_t* sx, int64_t K, const uint8_t* panel,
          int64_t block_bytes, int64_t quants, float* out, int64_t stride) {
  constexpr int H = 2;
  const int64_t nb = K / 32;
  const __m256i ones16 = _mm256_set1_epi16(1);
  alignas(32) float acc[MR][H][8];  // the float32 sums, in L1 (see the file's comment)
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h) _mm256_store_ps(acc[m][h], _mm256_setzero_ps());
  const int64_t ahead = q8_avx2::prefetch_ahead();
  for (int64_t b = 0; b < nb; ++b) {
    const uint8_t* blk = panel + b * block_bytes;
    // the panel's bytes `ahead` of this block (past its end: the next panel's) into L1, as
    // q8_avx2.h does (its distance, TGSERVE_Q8_PREFETCH): the first pass over a panel reads
    // it from memory; a few rows are near the read bound (one thread, 4 rows x 49152 x 1536
    // Q4_1 weights on the shared AVX2 Zen 3 host: 123-125 -> 124-133 GFLOP/s)
    for (int64_t at = ahead; ahead > 0 && at < ahead + block_bytes; at += 64)
      _mm_prefetch(reinterpret_cast<const char*>(blk + at), _MM_HINT_T0);
    const auto load = [&](int h, int g) {  // half h's 32 bytes of group g (64 bytes a group)
      return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + quants + 64 * g + 32 * h));
    };
    const auto word = [&](int m, int at) {  // row m's 4 activations at k = 32 b + at
      return _mm256_set1_epi32(q8_dot::word(xq + m * K + 32 * b + at));
    };
    __m256i isum[MR][H];
    if constexpr (Q4) {
      const __m256i low = _mm256_set1_epi8(0x0F);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        __m256i lo[H], hi[H];  // k = 4 g + j and 16 + 4 g + j of each lane
        for (int h = 0; h < H; ++h) split_nibbles(load(h, g), low, lo[h], hi[h]);
        for (int m = 0; m < MR; ++m) {
          const __m256i xl = word(m, 4 * g), xh = word(m, 16 + 4 * g);
          for (int h = 0; h < H; ++h) {
            const __m256i p =
                _mm256_add_epi16(_mm256_maddubs_epi16(lo[h], xl), _mm256_maddubs_epi16(hi[h], xh));
            isum[m][h] = g == 0 ? p : _mm256_add_epi16(isum[m][h], p);  // exact: see above
            pin(isum[m][h]);
          }
        }
      }
      for (int m = 0; m < MR; ++m)
        for (int h = 0; h < H; ++h) isum[m][h] = _mm256_madd_epi16(isum[m][h], ones16);
    } else {
#pragma GCC unroll 8
      for (int g = 0; g < 8; ++g) {
        __m256i wv[H], wabs[H];  // the weights, and |wq| (-128 -> 128 as unsigned)
        for (int h = 0; h < H; ++h) wabs[h] = _mm256_abs_epi8(wv[h] = load(h, g));
        for (int m = 0; m < MR; ++m) {
          const __m256i xb = word(m, 4 * g);
          for (int h = 0; h < H; ++h) {
            const __m256i p = _mm256_madd_epi16(
                _mm256_maddubs_epi16(wabs[h], _mm256_sign_epi8(xb, wv[h])), ones16);
            isum[m][h] = g == 0 ? p : _mm256_add_epi32(isum[m][h], p);
            pin(isum[m][h]);
          }
        }
      }
    }
    for (int m = 0; m < MR; ++m)
      for (int h = 0; h < H; ++h) {
        const __m256 d_w = q8_avx2::scales<kHalf>(blk, h);
        const __m256 m_w = kMin ? q8_avx2::scales<true>(blk + 32, h) : d_w;  // mins
        const __m256 v = block_terms<kMin, kOffset8>(isum[m][h], d_w, m_w, dx[m * nb + b],
                                                     sx[m * nb + b], _mm256_load_ps(acc[m][h]));
        _mm256_store_ps(acc[m][h], v);
      }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h)
      _mm256_storeu_ps(out + m * stride + 8 * h, _mm256_load_ps(acc[m][h]));
}

// The pass for MR rows against NR panels (panel_bytes apart) -> out [MR][NR][16]: a tile a panel.
template <bool Q4, bool kMin, bool kOffset8, bool kHalf, int MR>
void pass(const int8_t* xq, const float* dx, const int32_t* sx, int64_t K, const uint8_t* Wp,
          int64_t panel_bytes, int64_t block_bytes, int64_t quants, int NR, float* out) {
  for (int p = 0; p < NR; ++p)
    tile<Q4, kMin, kOffset8, kHalf, MR>(xq, dx, sx, K, Wp + p * panel_bytes, block_bytes, quants,
                                        out + 16 * p, 16 * NR);
}

}  // namespace tgserve::q8_rows_avx2
#endif
