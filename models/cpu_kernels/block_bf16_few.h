// The few-rows passes of block_linear.cpp for bfloat16 activations on AVX512-BF16 (a decode
// step, a speculative verify: M <= 8): a packed block's quants dequantised in registers, a pair
// of steps at a time, as the vdpbf16ps operand (d * q (+ m) with gguf's roundings, then bf16
// to nearest even), once for all rows of the pass; and store_lanes, the rounding of 16 output
// lanes (AVX-512). block_bf16_many.h reuses the block dequantisation. Included by
// block_linear.cpp alone (its anonymous namespace).
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <type_traits>

#include "bf16_pairs.h"
#include "block_format.h"

namespace tgserve {
namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
// y[0 .. count) = round(v + bias) in OutT, as static_cast<OutT>(float) rounds (bf16: to nearest
// even, NaN -> 0x7FC0, as c10::BFloat16 does), 16 lanes at a time.
template <typename T, typename OutT>
inline void store_lanes(__m512 v, const T* bias, int count, OutT* y) {
  const __mmask16 k = count >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << count) - 1);
  __m512 b = _mm512_setzero_ps();
  if (bias) {
    if constexpr (std::is_same_v<T, float>)
      b = _mm512_maskz_loadu_ps(k, bias);
    else
      b = _mm512_castsi512_ps(_mm512_slli_epi32(
          _mm512_cvtepu16_epi32(_mm256_maskz_loadu_epi16(k, bias)), 16));
  }
  v = _mm512_add_ps(v, b);
  if constexpr (std::is_same_v<OutT, float>) {
    _mm512_mask_storeu_ps(y, k, v);
  } else {
    const __m512i u = _mm512_castps_si512(v), one = _mm512_set1_epi32(1);
    const __m512i bias_rne =
        _mm512_add_epi32(_mm512_and_si512(_mm512_srli_epi32(u, 16), one), _mm512_set1_epi32(0x7FFF));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias_rne), 16);
    r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), _mm512_set1_epi32(0x7FC0));
    _mm256_mask_storeu_epi16(static_cast<void*>(y), k, _mm512_cvtepi32_epi16(r));
  }
}

#endif

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)

template <typename T>
constexpr bool kHasSimd = std::is_same_v<T, c10::BFloat16>;

template <int TYPE>
constexpr Format kFormat = TYPE == kQ4_0   ? Format{18, 32, false}
                           : TYPE == kQ4_1 ? Format{20, 64, true}
                                           : Format{34, 32, false};

inline __m512bh x_pair(const c10::BFloat16* x) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// 16 lane values -> the two halves of a step's operand: element e = 2l + i of a step is lane
// e / 2, so the low 16 elements take lanes 0..7 twice each, the high ones lanes 8..15.
inline void spread(__m512 v, __m512& lo, __m512& hi) {
  const __m512i idx = _mm512_srli_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);
  lo = _mm512_permutexvar_ps(idx, v);
  hi = _mm512_permutexvar_ps(_mm512_add_epi32(idx, _mm512_set1_epi32(8)), v);
}

// 16 float32 q values -> d * q (+ m) with gguf's roundings: d * q is exact (an 11-bit d times
// a q of at most 8 bits), so fl(fl(d q) + m) is one fma's single rounding.
template <bool MIN>
inline __m512 scale(__m512 q, __m512 d, __m512 mn) {
  if constexpr (MIN) return _mm512_fmadd_ps(q, d, mn);
  return _mm512_mul_ps(q, d);
}

// A packed block's d (and m) spread over a step's two halves (see spread).
struct BlockScales {
  __m512 dlo, dhi, mlo, mhi;
};

template <int TYPE>
inline BlockScales load_scales(const uint8_t* blk) {
  BlockScales s{};
  spread(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)blk)), s.dlo, s.dhi);
  if constexpr (kFormat<TYPE>.has_min)
    spread(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32))), s.mlo, s.mhi);
  return s;
}

// Steps 2t and 2t + 1 of a packed block's quants `q` as bf16 operands: the float32 values
// d * q (+ m) rounded to bf16 to nearest even by vcvtne2ps2bf16.
template <int TYPE>
inline void dequant_steps(const uint8_t* q, int t, const BlockScales& s, __m512bh& w0,
                          __m512bh& w1) {
  constexpr bool kMin = kFormat<TYPE>.has_min;
  __m512 l0, h0, l1, h1;
  if constexpr (TYPE == kQ8_0) {
    const uint8_t* p = q + 64 * t;
    l0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)p)));
    h0 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 16))));
    l1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 32))));
    h1 = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(p + 48))));
  } else {
    // 32 bytes: step 2t in the low nibbles, 2t + 1 in the high ones. vpermps reads the low 4
    // bits of each index: the nibble's value as float32, looked up in a 16-entry table.
    const __m512 table = _mm512_sub_ps(
        _mm512_set_ps(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
        _mm512_set1_ps(TYPE == kQ4_0 ? 8.0f : 0.0f));
    const __m512i blo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + 32 * t)));
    const __m512i bhi = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(q + 32 * t + 16)));
    l0 = _mm512_permutexvar_ps(blo, table);
    h0 = _mm512_permutexvar_ps(bhi, table);
    l1 = _mm512_permutexvar_ps(_mm512_srli_epi32(blo, 4), table);
    h1 = _mm512_permutexvar_ps(_mm512_srli_epi32(bhi, 4), table);
  }
  w0 = _mm512_cvtne2ps_pbh(scale<kMin>(h0, s.dhi, s.mhi), scale<kMin>(l0, s.dlo, s.mlo));
  w1 = _mm512_cvtne2ps_pbh(scale<kMin>(h1, s.dhi, s.mhi), scale<kMin>(l1, s.dlo, s.mlo));
}

// One packed block of a panel -> its 16 steps as bf16 operands, step s at w[s * stride].
template <int TYPE>
inline void dequant_block(const uint8_t* blk, __m512i* w, int64_t stride) {
  const BlockScales s = load_scales<TYPE>(blk);
  for (int t = 0; t < 8; ++t) {
    __m512bh w0, w1;
    dequant_steps<TYPE>(blk + kFormat<TYPE>.scales, t, s, w0, w1);
    w[2 * t * stride] = (__m512i)w0;
    w[(2 * t + 1) * stride] = (__m512i)w1;
  }
}

// Few rows: rows x[0 .. MR) against panels [0 .. NR) from `Wp` (panel stride `panel_bytes`);
// each pair of steps of the NR panels is dequantised in registers once for all MR rows. XT =
// bf16: vdpbf16ps on x's pairs; XT = float (x rounded from bf16, exact): the same pairs as two
// fmas each, odd element first, under DAZ + FTZ (bf16_pairs.h: the same bits, used where this
// CPU's vdpbf16ps is checked to give them).
template <int MR, int NR, int TYPE, typename XT>
void simd_pass(const XT* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, float* out) {
  constexpr Format f = kFormat<TYPE>;
  constexpr int64_t bb = f.file_block * kPanel;
  constexpr bool kFmas = std::is_same_v<XT, float>;
  const int64_t nb = K / kBlock;
  std::optional<bf16_pairs::FlushDenormals> flush;
  if constexpr (kFmas) flush.emplace();
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    BlockScales sc[NR];
    for (int j = 0; j < NR; ++j) sc[j] = load_scales<TYPE>(Wp + j * panel_bytes + b * bb);
    const XT* xb = x + b * kBlock;
    for (int t = 0; t < 8; ++t) {
      __m512bh w0[NR], w1[NR];
      for (int j = 0; j < NR; ++j)
        dequant_steps<TYPE>(Wp + j * panel_bytes + b * bb + f.scales, t, sc[j], w0[j], w1[j]);
      if constexpr (kFmas) {
        for (int s = 0; s < 2; ++s) {  // step 2t + s: k = 4t + 2s (even), 4t + 2s + 1 (odd)
          __m512 we[NR], wo[NR];
          for (int j = 0; j < NR; ++j)
            bf16_pairs::split_pairs((__m512i)(s ? w1[j] : w0[j]), we[j], wo[j]);
          for (int m = 0; m < MR; ++m) {
            const float* xk = xb + m * K + 4 * t + 2 * s;
            const __m512 xe = _mm512_set1_ps(xk[0]), xo = _mm512_set1_ps(xk[1]);
            for (int j = 0; j < NR; ++j)
              acc[m][j] = bf16_pairs::pair_fmas(acc[m][j], xe, xo, we[j], wo[j]);
          }
        }
      } else {
        for (int m = 0; m < MR; ++m) {
          const __m512bh x0 = x_pair(xb + m * K + 4 * t), x1 = x_pair(xb + m * K + 4 * t + 2);
          for (int j = 0; j < NR; ++j) {
            acc[m][j] = _mm512_dpbf16_ps(acc[m][j], x0, w0[j]);
            acc[m][j] = _mm512_dpbf16_ps(acc[m][j], x1, w1[j]);
          }
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) _mm512_storeu_ps(out + (m * kMaxNR + j) * kPanel, acc[m][j]);
}

template <int MR, int NR, typename XT>
void simd_type(int type, const XT* x, int64_t K, const uint8_t* Wp, int64_t pb, float* out) {
  switch (type) {
    case kQ4_0: simd_pass<MR, NR, kQ4_0>(x, K, Wp, pb, out); break;
    case kQ4_1: simd_pass<MR, NR, kQ4_1>(x, K, Wp, pb, out); break;
    default: simd_pass<MR, NR, kQ8_0>(x, K, Wp, pb, out); break;
  }
}

// MR = mr (1 .. R) rows; NR = nr panels (1 .. 4 for up to 2 rows, else 1 .. 2).
template <int R, typename XT>
void simd_rows(int type, const XT* x, int64_t K, const uint8_t* Wp, int64_t pb, int mr, int nr,
               float* out) {
  if constexpr (R > 1)
    if (mr < R) return simd_rows<R - 1>(type, x, K, Wp, pb, mr, nr, out);
  if constexpr (R <= 2) {
    switch (nr) {
      case 1: return simd_type<R, 1>(type, x, K, Wp, pb, out);
      case 2: return simd_type<R, 2>(type, x, K, Wp, pb, out);
      case 3: return simd_type<R, 3>(type, x, K, Wp, pb, out);
      default: return simd_type<R, 4>(type, x, K, Wp, pb, out);
    }
  } else {
    if (nr == 1) return simd_type<R, 1>(type, x, K, Wp, pb, out);
    simd_type<R, 2>(type, x, K, Wp, pb, out);
  }
}

// The few-rows pass for bf16 x: the pair fmas over `x32` (x as float32) where this CPU's
// vdpbf16ps matches them, else vdpbf16ps over x.
template <typename T>
void simd_any(int type, const T* x, const float* x32, int64_t K, const uint8_t* Wp, int64_t pb,
              int mr, int nr, float* out) {
  if constexpr (kHasSimd<T>) {
    if (x32)
      simd_rows<kMaxMR>(type, x32, K, Wp, pb, mr, nr, out);
    else
      simd_rows<kMaxMR>(type, x, K, Wp, pb, mr, nr, out);
  }
}

#else
template <typename T>
constexpr bool kHasSimd = false;
template <typename T>
void simd_any(int, const T*, const float*, int64_t, const uint8_t*, int64_t, int, int, float*) {}
#endif

}  // namespace
}  // namespace tgserve
