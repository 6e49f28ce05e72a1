// The AVX2 pass of q8_linear.cpp for int16 activations (q16_dot.h; kQ16Activations kinds): MR
// rows (K apart) against NR panels of the int8 path's Q8 panels (q8_linear.h), vpmaddwd on the
// weights widened to int16. Compiled in every AVX2 build, AVX-512 ones included (there it is
// correct and gives the same bits; not tuned).
//
// A panel half's 32 bytes of a group (8 lanes x 4 k, lane-major) widen with vpunpck{l,h}bw,
// which works per 128-bit lane: the low unpack holds lanes {0, 1 | 4, 5}, the high one lanes
// {2, 3 | 6, 7}, 4 k each as int16 (Q4: the byte; its low nibble by `and 15`, its high one by a
// 16-bit shift right by 4, the upper byte being 0; Q8: unpacked with its sign bytes). vpmaddwd
// against the row's 4 activations of those k, broadcast as one 64-bit word, gives 2 partial sums
// per lane; the block's partials add up exactly in int32 (bounds: q16_dot.h), and one vphaddd of
// the two unpacks' sums per block gives [l0 l1 l2 l3 | l4 l5 l6 l7]: the lanes in order.
//
// Then the int8 path's epilogue per lane, in block order (q8_rows_avx2.h's block_terms):
// acc = fma(d * dx, float(isum - offset), acc) (Q4_0: offset 8 * sx), Q4_1: acc = fma(m * dx,
// float(sx), acc); so the scalar pass (q8_dot.h's scalar_sums + q8_linear.cpp's epilogue) gives
// the same bits. The float32 sums live in an L1 tile (a load and a store per block), the block's
// integer sums in registers (2 MR a panel half).
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "q8_avx2.h"
#include "q8_rows_avx2.h"

#if defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TGSERVE_Q16_AVX2 1

namespace tgserve::q16_avx2 {

// Row x's 4 int16 activations at x[0 .. 4) in each 64-bit quarter.
[[gnu::always_inline]] inline __m256i four(const int16_t* x) {
  int64_t w;
  std::memcpy(&w, x, 8);
  return _mm256_set1_epi64x(w);
}

// Rows xq[0 .. MR) (K apart; dx, sx K / 32 apart) against panels Wp[0 .. NR) (panel_bytes
// apart), blocks of block_bytes with the quants at byte `quants` (Q4_1's fp16 mins at byte 32)
// -> out [MR][NR][16], the float32 sums before the bias. kMin: Q4_1; kOffset8: Q4_0's nibble - 8;
// kHalf: fp16 scales (a file's), else float32 (int8 rows).
template <bool Q4, bool kMin, bool kOffset8, bool kHalf, int MR, int NR>
void pass(const int16_t* xq, const float* dx, const int32_t* sx, int64_t K, const uint8_t* Wp,
          int64_t panel_bytes, int64_t block_bytes, int64_t quants, float* out) {
  constexpr int H = 2 * NR;  // panel halves of 8 lanes: half h = panel h / 2, lanes 8 (h % 2)
  const int64_t nb = K / 32;
  alignas(32) float acc[MR][H][8];
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h) _mm256_store_ps(acc[m][h], _mm256_setzero_ps());
  const int64_t ahead = q8_avx2::prefetch_ahead();
  const __m256i zero = _mm256_setzero_si256();
  for (int64_t b = 0; b < nb; ++b) {
    // each panel's bytes `ahead` of this block into L1 (q8_avx2.h's distance and reason)
    for (int j = 0; ahead > 0 && j < NR; ++j)
      for (int64_t at = ahead; at < ahead + block_bytes; at += 64)
        _mm_prefetch(reinterpret_cast<const char*>(Wp + j * panel_bytes + b * block_bytes + at),
                     _MM_HINT_T0);
    for (int h = 0; h < H; ++h) {
      const uint8_t* blk = Wp + (h / 2) * panel_bytes + b * block_bytes;
      const uint8_t* wq = blk + quants + 32 * (h % 2);
      __m256i sa[MR], sb[MR];  // the unpacks' partial sums: lanes {0,1|4,5} and {2,3|6,7}
      if constexpr (Q4) {
        const __m256i low = _mm256_set1_epi16(0x0F);
#pragma GCC unroll 4
        for (int g = 0; g < 4; ++g) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 64 * g));
          const __m256i ua = _mm256_unpacklo_epi8(raw, zero), ub = _mm256_unpackhi_epi8(raw, zero);
          // k = 4 g + j (low nibbles) and 16 + 4 g + j (high ones)
          const __m256i la = _mm256_and_si256(ua, low), ha = _mm256_srli_epi16(ua, 4);
          const __m256i lb = _mm256_and_si256(ub, low), hb = _mm256_srli_epi16(ub, 4);
          for (int m = 0; m < MR; ++m) {
            const int16_t* x = xq + m * K + 32 * b;
            const __m256i xl = four(x + 4 * g), xh = four(x + 16 + 4 * g);
            const __m256i pa = _mm256_add_epi32(_mm256_madd_epi16(la, xl), _mm256_madd_epi16(ha, xh));
            const __m256i pb = _mm256_add_epi32(_mm256_madd_epi16(lb, xl), _mm256_madd_epi16(hb, xh));
            sa[m] = g == 0 ? pa : _mm256_add_epi32(sa[m], pa);
            sb[m] = g == 0 ? pb : _mm256_add_epi32(sb[m], pb);
            q8_rows_avx2::pin(sa[m]);
            q8_rows_avx2::pin(sb[m]);
          }
        }
      } else {
#pragma GCC unroll 8
        for (int g = 0; g < 8; ++g) {
          const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wq + 64 * g));
          const __m256i sign = _mm256_cmpgt_epi8(zero, raw);
          const __m256i ua = _mm256_unpacklo_epi8(raw, sign), ub = _mm256_unpackhi_epi8(raw, sign);
          for (int m = 0; m < MR; ++m) {
            const __m256i xw = four(xq + m * K + 32 * b + 4 * g);
            const __m256i pa = _mm256_madd_epi16(ua, xw), pb = _mm256_madd_epi16(ub, xw);
            sa[m] = g == 0 ? pa : _mm256_add_epi32(sa[m], pa);
            sb[m] = g == 0 ? pb : _mm256_add_epi32(sb[m], pb);
            q8_rows_avx2::pin(sa[m]);
            q8_rows_avx2::pin(sb[m]);
          }
        }
      }
      const __m256 d_w = q8_avx2::scales<kHalf>(blk, h % 2);
      const __m256 m_w = kMin ? q8_avx2::scales<true>(blk + 32, h % 2) : d_w;
      for (int m = 0; m < MR; ++m) {
        const __m256i isum = _mm256_hadd_epi32(sa[m], sb[m]);  // lanes in order (see above)
        const __m256 v = q8_rows_avx2::block_terms<kMin, kOffset8>(
            isum, d_w, m_w, dx[m * nb + b], sx[m * nb + b], _mm256_load_ps(acc[m][h]));
        _mm256_store_ps(acc[m][h], v);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int h = 0; h < H; ++h)
      _mm256_storeu_ps(out + (m * NR + h / 2) * 16 + 8 * (h % 2), _mm256_load_ps(acc[m][h]));
}

}  // namespace tgserve::q16_avx2
#endif
