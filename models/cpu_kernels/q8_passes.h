// The passes of q8_linear.cpp (the contract and the layout: q8_linear.h): a Q8 panel kind's
// layout, the float32 epilogue, the portable pass (q8_dot.h's integer sums of a block, then the
// epilogue: simd16.h's lanes or the scalar loop, the same bits) and the dispatch of a pass of up
// to kRows rows x kPanels panels to this build's fastest one: AVX512-VNNI's pass_vnni (int8),
// q8_avx2.h (one or two int8 rows), q8_rows_avx2.h (three or four), q16_avx2.h (int16 rows on
// every AVX2 build). Each runs q8_linear.h's order, so a row gets the same bits from any of them.
// Included by q8_linear.cpp only.
#pragma once

#include <algorithm>
#include <cmath>
#include <type_traits>

#include "kernels.h"
#include "q16_avx2.h"
#include "q8_avx2.h"
#include "q8_dot.h"
#include "q8_linear.h"
#include "q8_rows_avx2.h"
#include "simd16.h"

namespace tgserve::q8_pass {

constexpr int64_t kPanel = 16;
constexpr int64_t kBlock = 32;
constexpr int kRows = 4;    // rows per pass
constexpr int kPanels = 2;  // panels per pass (a thread's unit of work)

// Where d, m and the quants of a panel's block start, by kind (q8_linear.h: a file's scales
// are fp16, 2 bytes a lane; int8 rows' float32). Q4_1's 16 fp16 mins follow its scales.
struct Layout {
  int64_t bytes;  // one panel's block
  int64_t quants;  // offset of the quants
  bool q4, has_min, offset8, half;  // nibbles; Q4_1's min; Q4_0's nibble - 8; fp16 scales
  bool act16 = false;  // int16 activations (kQ16Activations kinds: q16_dot.h)
};

inline Layout layout_of(int kind) {
  if (kind >= kQ16Activations) {  // the same panels, int16 activations
    Layout f = layout_of(kind - kQ16Activations + kQ8Activations);
    f.act16 = f.bytes > 0;
    return f;
  }
  switch (kind - kQ8Activations) {
    case kQ4_0: return {32 + 256, 32, true, false, true, true};
    case kQ4_1: return {32 + 32 + 256, 64, true, true, false, true};
    case kQ8_0: return {32 + 512, 32, false, false, false, true};
    case kInt8Rows: return {64 + 512, 64, false, false, false, false};
    default: return {0, 0, false, false, false, false};
  }
}

// Lane l's weight scale (d) and Q4_1 min (m) of a panel's block `blk` as float32 (fp16 -> float32
// is exact).
inline float scale_of(const Layout& f, const uint8_t* blk, int l) {
  if (f.half) return static_cast<float>(reinterpret_cast<const c10::Half*>(blk)[l]);
  return reinterpret_cast<const float*>(blk)[l];
}
inline float min_of(const uint8_t* blk, int l) {
  return static_cast<float>(reinterpret_cast<const c10::Half*>(blk + 32)[l]);
}

// acc [MR][NR][16] += the block's terms (q8_linear.h's order), from isum [MR][NR][16].
template <int MR, int NR>
inline void epilogue(const Layout& f, const uint8_t* const* blk, const float* dx,
                     const int32_t* sx, int64_t nb, const int32_t* isum, float* acc) {
  for (int m = 0; m < MR; ++m) {
    const float d_x = dx[m * nb];
    const int32_t s_x = sx[m * nb];
    const int32_t off = f.offset8 ? 8 * s_x : 0;
    for (int j = 0; j < NR; ++j) {
      const int32_t* is = isum + (m * NR + j) * kPanel;
      float* a = acc + (m * NR + j) * kPanel;
#if defined(TGSERVE_SIMD16)
      using namespace simd16;
      const VF dxv = set1f(d_x);
      const VI sums = subi(as_int(loadf(reinterpret_cast<const float*>(is))), set1i(off));
      const VF d_w = f.half ? load_halves(blk[j]) : loadf(reinterpret_cast<const float*>(blk[j]));
      VF v = fmadd(mul(d_w, dxv), to_float(sums), loadf(a));
      if (f.has_min)
        v = fmadd(mul(load_halves(blk[j] + 32), dxv), set1f(static_cast<float>(s_x)), v);
      storef(a, v);
#else
      for (int l = 0; l < kPanel; ++l) {
        const float scale = scale_of(f, blk[j], l) * d_x;  // rounded: an fma operand, not fused
        float v = std::fma(scale, static_cast<float>(is[l] - off), a[l]);
        if (f.has_min) v = std::fma(min_of(blk[j], l) * d_x, static_cast<float>(s_x), v);
        a[l] = v;
      }
#endif
    }
  }
}

// Block b's operands: each row's 32 int8 activations (rows K apart), each panel's block (panels
// panel_bytes apart: its scales) and that block's quants.
template <int MR, int NR, typename A = int8_t>
struct BlockOperands {
  const A* x[MR];
  const uint8_t* blk[NR];
  const uint8_t* w[NR];
  BlockOperands(const Layout& f, const A* xq, int64_t K, const uint8_t* Wp,
                int64_t panel_bytes, int64_t b) {
    for (int m = 0; m < MR; ++m) x[m] = xq + m * K + b * kBlock;
    for (int j = 0; j < NR; ++j) {
      blk[j] = Wp + j * panel_bytes + b * f.bytes;
      w[j] = blk[j] + f.quants;
    }
  }
};

// Rows xq[0 .. MR) (K apart; int8, or int16: q16_dot.h) against panels Wp[0 .. NR)
// (panel_bytes apart) -> acc [MR][NR][16], the float32 sums before the bias.
template <bool Q4, int MR, int NR, typename A>
void pass(const Layout& f, const A* xq, const float* dx, const int32_t* sx, int64_t K,
          const uint8_t* Wp, int64_t panel_bytes, float* acc) {
  const int64_t nb = K / kBlock;
  std::fill(acc, acc + MR * NR * kPanel, 0.0f);
  alignas(64) int32_t isum[MR * NR * kPanel];
  for (int64_t b = 0; b < nb; ++b) {
    const BlockOperands<MR, NR, A> at(f, xq, K, Wp, panel_bytes, b);
    if constexpr (std::is_same_v<A, int16_t>)
      q8_dot::scalar_sums<Q4, MR, NR>(at.x, at.w, isum);
    else
      q8_dot::block_sums<Q4, MR, NR>(at.x, at.w, isum);
    epilogue<MR, NR>(f, at.blk, dx + b, sx + b, nb, isum, acc);
  }
}

#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
// `pass` with the block's integer sums and the float32 sums kept in registers (no isum / acc
// round trip through memory per block): the same integers (q8_dot::vnni_sums) and the same
// epilogue operations in the same order as `epilogue`, so the same bits. kMin / kOffset8 /
// kHalf: the layout's has_min / offset8 / half as constants (no zero offset subtracted, no
// untaken branch).
template <bool Q4, bool kMin, bool kOffset8, bool kHalf, int MR, int NR>
void pass_vnni(const Layout& f, const int8_t* xq, const float* dx, const int32_t* sx, int64_t K,
               const uint8_t* Wp, int64_t panel_bytes, float* out) {
  const int64_t nb = K / kBlock;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const BlockOperands<MR, NR> at(f, xq, K, Wp, panel_bytes, b);
    const uint8_t* const* blk = at.blk;
    __m512i isum[MR][NR];
    q8_dot::vnni_sums<Q4, MR, NR>(at.x, at.w, isum);
    for (int m = 0; m < MR; ++m) {
      const __m512 dxv = _mm512_set1_ps(dx[m * nb + b]);
      const int32_t s_x = sx[m * nb + b];
      for (int j = 0; j < NR; ++j) {
        const __m512 d_w =
            kHalf ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j])))
                  : _mm512_loadu_ps(reinterpret_cast<const float*>(blk[j]));
        __m512i terms = isum[m][j];
        if constexpr (kOffset8) terms = _mm512_sub_epi32(terms, _mm512_set1_epi32(8 * s_x));
        const __m512 sums = _mm512_cvtepi32_ps(terms);
        __m512 v = _mm512_fmadd_ps(_mm512_mul_ps(d_w, dxv), sums, acc[m][j]);
        if constexpr (kMin) {
          const __m512 m_w =  // Q4_1's fp16 mins, after its 16 fp16 scales
              _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j] + 32)));
          v = _mm512_fmadd_ps(_mm512_mul_ps(m_w, dxv), _mm512_set1_ps(static_cast<float>(s_x)), v);
        }
        acc[m][j] = v;
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) _mm512_storeu_ps(out + (m * NR + j) * kPanel, acc[m][j]);
}
#endif

// rows(std::integral_constant<int, v>) for the layout's variant v: 1 Q4_1, 2 Q4_0, 0 Q8_0 (fp16
// scales), 3 int8 rows (float32 scales).
template <typename Rows>
[[gnu::always_inline]] inline void dispatch_layout(const Layout& f, const Rows& rows) {
  if (f.has_min) return rows(std::integral_constant<int, 1>{});
  if (f.offset8) return rows(std::integral_constant<int, 2>{});
  if (!f.half) return rows(std::integral_constant<int, 3>{});
  return rows(std::integral_constant<int, 0>{});
}

// mr rows (1 .. kRows) through the generic pass (q8_dot.h's sums, then the simd16 epilogue):
// where no ISA-specific pass exists for the activations' width.
template <bool Q4, int NR, typename A>
void generic_rows(int mr, const Layout& f, const A* xq, const float* dx, const int32_t* sx,
                  int64_t K, const uint8_t* Wp, int64_t pb, float* acc) {
  switch (mr) {
    case 1: return pass<Q4, 1, NR>(f, xq, dx, sx, K, Wp, pb, acc);
    case 2: return pass<Q4, 2, NR>(f, xq, dx, sx, K, Wp, pb, acc);
    case 3: return pass<Q4, 3, NR>(f, xq, dx, sx, K, Wp, pb, acc);
    default: return pass<Q4, kRows, NR>(f, xq, dx, sx, K, Wp, pb, acc);
  }
}

// The int16 rows' pass: q16_avx2.h's (every AVX2 build), else the portable one.
template <bool Q4, int NR>
void pass_rows(int mr, const Layout& f, const int16_t* xq, const float* dx, const int32_t* sx,
               int64_t K, const uint8_t* Wp, int64_t pb, float* acc) {
#if defined(TGSERVE_Q16_AVX2)
  const auto rows = [&](auto kind) {
    constexpr int v = decltype(kind)::value;  // the layout: 1 Q4_1, 2 Q4_0, 0 Q8_0, 3 int8 rows
    constexpr bool kMin = v == 1, kOffset8 = v == 2, kHalf = v != 3;
    const auto run = [&](auto rows_c) {
      constexpr int MR = decltype(rows_c)::value;
      q16_avx2::pass<Q4, kMin, kOffset8, kHalf, MR, NR>(xq, dx, sx, K, Wp, pb, f.bytes, f.quants,
                                                        acc);
    };
    switch (mr) {
      case 1: return run(std::integral_constant<int, 1>{});
      case 2: return run(std::integral_constant<int, 2>{});
      case 3: return run(std::integral_constant<int, 3>{});
      default: return run(std::integral_constant<int, kRows>{});
    }
  };
  return dispatch_layout(f, rows);
#else
  return generic_rows<Q4, NR>(mr, f, xq, dx, sx, K, Wp, pb, acc);
#endif
}

template <bool Q4, int NR>
void pass_rows(int mr, const Layout& f, const int8_t* xq, const float* dx, const int32_t* sx,
               int64_t K, const uint8_t* Wp, int64_t pb, float* acc) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  const auto rows = [&](auto kind) {
    constexpr int v = decltype(kind)::value;  // the layout: 1 Q4_1, 2 Q4_0, 0 Q8_0, 3 int8 rows
    constexpr bool kMin = v == 1, kOffset8 = v == 2, kHalf = v != 3;
    switch (mr) {
      case 1: return pass_vnni<Q4, kMin, kOffset8, kHalf, 1, NR>(f, xq, dx, sx, K, Wp, pb, acc);
      case 2: return pass_vnni<Q4, kMin, kOffset8, kHalf, 2, NR>(f, xq, dx, sx, K, Wp, pb, acc);
      case 3: return pass_vnni<Q4, kMin, kOffset8, kHalf, 3, NR>(f, xq, dx, sx, K, Wp, pb, acc);
      default:
        return pass_vnni<Q4, kMin, kOffset8, kHalf, kRows, NR>(f, xq, dx, sx, K, Wp, pb, acc);
    }
  };
  return dispatch_layout(f, rows);
#else
#if defined(TGSERVE_Q8_AVX2) && defined(TGSERVE_Q8_ROWS_AVX2)
  // One or two rows: both panels' sums in registers, at the read bound (q8_avx2.h); three or
  // four: tiles of the rows x one panel (q8_rows_avx2.h).
  const auto rows = [&](auto kind) {
    constexpr int v = decltype(kind)::value;  // as in the VNNI build's dispatch above
    constexpr bool kMin = v == 1, kOffset8 = v == 2, kHalf = v != 3;
    switch (mr) {
      case 1:
        return q8_avx2::pass<Q4, kMin, kOffset8, kHalf, 1, NR>(xq, dx, sx, K, Wp, pb, f.bytes,
                                                               f.quants, acc);
      case 2:
        return q8_avx2::pass<Q4, kMin, kOffset8, kHalf, 2, NR>(xq, dx, sx, K, Wp, pb, f.bytes,
                                                               f.quants, acc);
      case 3:
        return q8_rows_avx2::pass<Q4, kMin, kOffset8, kHalf, 3>(xq, dx, sx, K, Wp, pb, f.bytes,
                                                                f.quants, NR, acc);
      default:
        return q8_rows_avx2::pass<Q4, kMin, kOffset8, kHalf, kRows>(
            xq, dx, sx, K, Wp, pb, f.bytes, f.quants, NR, acc);
    }
  };
  return dispatch_layout(f, rows);
#else
  return generic_rows<Q4, NR>(mr, f, xq, dx, sx, K, Wp, pb, acc);
#endif
#endif
}


}  // namespace tgserve::q8_pass
