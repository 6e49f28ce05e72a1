// linear.cpp's passes on AVX-512: MR rows x NR panels of accumulators in registers, one vdpbf16ps a
// k-pair (or its two fmas without AVX512-BF16; float32: one fma a k), int8 panels widened to bf16
// in registers, the tile stored from the registers with c10's rounding. Included by linear.cpp
// alone (its helpers share that file's anonymous namespace).
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <type_traits>

#include "linear_tile.h"

namespace tgserve {
namespace {

#if defined(__AVX512F__) && defined(__AVX512BW__)

// One k-step of a panel: 16 columns x a pair of k, as vdpbf16ps's operand.
inline __m512bh load_pairs(const c10::BFloat16* w) { return (__m512bh)_mm512_loadu_si512(w); }
// 32 int8, widened exactly to bf16: |q| <= 128 has at most 8 significant bits, so its float32
// has 16 zero low bits and its high half is its bf16; one vpermt2w gathers the 32 high halves
// (the same bits as vcvtne2ps2bf16, which costs more on the vector pipes here).
inline __m512bh load_pairs(const int8_t* w) {
  const __m512i lo = _mm512_castps_si512(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)w))));
  const __m512i hi = _mm512_castps_si512(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + 16)))));
  // word i of the result = word 2i + 1 of (lo, hi) (indices 32.. pick from hi)
  const __m512i high_halves = _mm512_set_epi16(
      63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
      17, 15, 13, 11, 9, 7, 5, 3, 1);
  return (__m512bh)_mm512_permutex2var_epi16(lo, high_halves, hi);
}

// One k-step of MR rows against NR panels: acc[m][j] += x pair (m) . W pairs (panel j).
// Without AVX512-BF16 the step is the portable pass's order in float32 code: two fmas, the
// pair's first k then its second (a bf16 is the high half of its float32).
template <int MR, int NR>
[[gnu::always_inline]] inline void step_bf16(const int32_t* pairs, const __m512bh* w,
                                             __m512 acc[kMaxMR][kMaxNR]) {
#if defined(__AVX512BF16__)
  for (int m = 0; m < MR; ++m) {
    const __m512bh xb = (__m512bh)_mm512_set1_epi32(pairs[m]);
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, w[j]);
  }
#else
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 w0[NR], w1[NR];
  for (int j = 0; j < NR; ++j) {
    w0[j] = _mm512_castsi512_ps(_mm512_slli_epi32((__m512i)w[j], 16));
    w1[j] = _mm512_castsi512_ps(_mm512_and_si512((__m512i)w[j], high));
  }
  for (int m = 0; m < MR; ++m) {
    const __m512 x0 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(pairs[m]) << 16)));
    const __m512 x1 = _mm512_castsi512_ps(
        _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(pairs[m]) & 0xFFFF0000u)));
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(x0, w0[j], acc[m][j]);
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(x1, w1[j], acc[m][j]);
  }
#endif
}

// One pass: rows x[0 .. MR) against panels Wp[0 .. NR) (each `steps` * 16 * step_k long).
// The steps whose pair lies inside x's rows run branch-free; an odd K's last k pairs with a
// zero in a last step of its own (the same vdpbf16ps on the same accumulators, in order).
template <int MR, int NR, typename WT>
[[gnu::always_inline]] inline void pass_bf16(const c10::BFloat16* x, int64_t K, const WT* Wp,
                                             int64_t steps, __m512 acc[kMaxMR][kMaxNR]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t full = K / 2;
  const int64_t stride = steps * 32;
  for (int64_t s = 0; s < full; ++s) {
    if constexpr (std::is_same_v<WT, int8_t>) {
      // int8 panels: a line (two steps) of each panel kPrefetchBytes ahead. The widening
      // leaves fewer misses in flight than the bf16 pass; without this the pass streams
      // below memory speed at M = 1.
      if ((s & 1) == 0)
        for (int j = 0; j < NR; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(Wp + j * stride + s * 32) + kPrefetchBytes,
                       _MM_HINT_T0);
    }
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = load_pairs(Wp + j * stride + s * 32);
    int32_t pairs[MR];
    for (int m = 0; m < MR; ++m) std::memcpy(&pairs[m], x + m * K + 2 * s, 4);
    step_bf16<MR, NR>(pairs, w, acc);
  }
  if (full < steps) {  // odd K
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = load_pairs(Wp + j * stride + full * 32);
    int32_t pairs[MR];
    for (int m = 0; m < MR; ++m) {
      uint16_t lo;
      std::memcpy(&lo, x + m * K + 2 * full, 2);
      pairs[m] = lo;
    }
    step_bf16<MR, NR>(pairs, w, acc);
  }
}

template <int MR, int NR>
[[gnu::always_inline]] inline void pass_f32(const float* x, int64_t K, const float* Wp,
                                            int64_t steps, __m512 acc[kMaxMR][kMaxNR]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t stride = steps * 16;
  for (int64_t s = 0; s < steps; ++s) {
    __m512 w[NR];
    for (int j = 0; j < NR; ++j) w[j] = _mm512_loadu_ps(Wp + j * stride + s * 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + s]);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(xb, w[j], acc[m][j]);
    }
  }
}

// y [16 lanes, the first cn stored] = round(v * scale + bias) from a register (scale: int8
// weights only, else null). Rounding to bfloat16 is c10's (nearest even, NaN -> 0x7FC0) in
// integer lanes, so the bits equal the scalar epilogue's.
template <typename OutT>
inline void store_lanes(__m512 v, const float* scale, const float* bias, int64_t cn, OutT* y) {
  const __mmask16 k = cn >= kPanel ? __mmask16(0xFFFF) : __mmask16((1u << cn) - 1);
  const __m512 b = _mm512_maskz_loadu_ps(k, bias);
  v = scale ? _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(k, scale), b) : _mm512_add_ps(v, b);
  if constexpr (std::is_same_v<OutT, float>) {
    _mm512_mask_storeu_ps(y, k, v);
  } else {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias_ne = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias_ne), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    _mm512_mask_cvtepi32_storeu_epi16(y, k, r);
  }
}

template <typename T, int MR, int NR, typename WT, typename OutT>
inline void pass(const T* x, int64_t K, const WT* Wp, int64_t steps, const Tile<OutT>& t) {
  __m512 acc[kMaxMR][kMaxNR];
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    pass_bf16<MR, NR, WT>(x, K, Wp, steps, acc);
  else
    pass_f32<MR, NR>(x, K, Wp, steps, acc);
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) {
      const int64_t c = j * kPanel;
      if (c < t.nn)
        store_lanes(acc[m][j], t.scale ? t.scale + c : nullptr, t.bias_f + c, t.nn - c,
                    t.y + m * t.N + c);
    }
}

template <typename T, int NR, typename WT, typename OutT>
inline void pass_rows(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr,
                      const Tile<OutT>& t) {
  switch (mr) {
    case 1: pass<T, 1, NR>(x, K, Wp, steps, t); break;
    case 2: pass<T, 2, NR>(x, K, Wp, steps, t); break;
    case 3: pass<T, 3, NR>(x, K, Wp, steps, t); break;
    case 4: pass<T, 4, NR>(x, K, Wp, steps, t); break;
    case 5: pass<T, 5, NR>(x, K, Wp, steps, t); break;
    default: pass<T, 6, NR>(x, K, Wp, steps, t); break;
  }
}

template <typename T, typename WT, typename OutT>
inline void any_pass(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr, int nr,
                     const Tile<OutT>& t) {
  switch (nr) {
    case 1: pass_rows<T, 1>(x, K, Wp, steps, mr, t); break;
    case 2: pass_rows<T, 2>(x, K, Wp, steps, mr, t); break;
    case 3: pass_rows<T, 3>(x, K, Wp, steps, mr, t); break;
    case 4: pass_rows<T, 4>(x, K, Wp, steps, mr, t); break;
    // more than 4 panels: one row only (M = 1 over int8 panels, see packed_linear)
    case 5: pass<T, 1, 5>(x, K, Wp, steps, t); break;
    case 6: pass<T, 1, 6>(x, K, Wp, steps, t); break;
    case 7: pass<T, 1, 7>(x, K, Wp, steps, t); break;
    default: pass<T, 1, 8>(x, K, Wp, steps, t); break;
  }
}

// Which (activation, weight) pairs have the SIMD pass: float/float and bf16 with bf16 or int8.
template <typename T, typename WT>
constexpr bool kHasSimdPass =
    (std::is_same_v<T, float> && std::is_same_v<WT, float>) ||
    (std::is_same_v<T, c10::BFloat16> &&
     (std::is_same_v<WT, c10::BFloat16> || std::is_same_v<WT, int8_t>));

#else
template <typename T, typename WT>
constexpr bool kHasSimdPass = false;
template <typename T, typename WT, typename OutT>
inline void any_pass(const T*, int64_t, const WT*, int64_t, int, int, const Tile<OutT>&) {}
#endif

}  // namespace
}  // namespace tgserve
