// The many-rows path of kquant_linear.cpp for bfloat16 activations on AVX512-BF16 (prefill, big
// batches): a thread unpacks a group of panels once into bf16 words and float scales, then runs
// 6-row x 4-panel vdpbf16ps tiles over it. Included by kquant_linear.cpp alone (its helpers share
// that file's anonymous namespace).
#pragma once

#include "x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include "aligned_scratch.h"
#include "group_walk.h"
#include "kquant_bf16_few.h"

namespace tgserve {
namespace {

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)

// Large M (prefill, big batches): a thread unpacks a group of 4 panels once into bf16 words
// [4][K / 2 steps] (the vdpbf16ps operands) and float scales [4][K / sub] (unpack_group), then
// runs 6-row x 4-panel register tiles over it (wide_tile: 24 dot chains in registers, the
// running sums in L1), walked by group_walk::walk. A lane's operations are the register path's
// (simd_pass), in its order, so the bits do not depend on the path or on M.
template <int TYPE>
void unpack_group(const uint8_t* Wp, int64_t panel_bytes, int64_t K, int nr, __m512i* words,
                  __m512* s, __m512* mt) {
  constexpr KFormat f = kformat(TYPE);
  constexpr int64_t bb = f.file_block * kPanel;
  const int64_t nb = K / f.width, steps = K / 2, subs = K / f.sub;
  const __m512i t0 = value_table(f.offset, 0), t1 = value_table(f.offset, 1);
  const __m512i low = _mm512_set1_epi16(0xF);
  for (int n = 0; n < nr; ++n)
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = Wp + n * panel_bytes + b * bb;
      const uint8_t* nib = blk + f.scales;
      __m512i* w = words + n * steps + b * (f.width / 2);
      for (int t = 0; t < f.width / 4; ++t) {
        const uint8_t* hi = nib + 8 * f.width + 2 * t * f.hbits * 4;
        const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(nib + t * 32)));
        w[2 * t] = (__m512i)step_values<TYPE>(_mm512_and_si512(bytes, low), hi, t0, t1);
        w[2 * t + 1] = (__m512i)step_values<TYPE>(_mm512_srli_epi16(bytes, 4), hi + f.hbits * 4, t0, t1);
      }
      for (int j = 0; j < f.width / f.sub; ++j) {
        const int64_t at = n * subs + b * (f.width / f.sub) + j;
        simd_scales<TYPE>(blk, j, &s[at], &mt[at]);
      }
    }
}

// out [m][n] (16 lanes at out + (m * kMaxNR + n) * 16) = rows x[0 .. MR) over the group's NR
// unpacked panels; xsum [MR][ns] the rows' 32-wide sums (types with a min).
template <int MR, int NR, int TYPE>
void wide_tile(const c10::BFloat16* x, int64_t K, const __m512i* words, const __m512* s,
               const __m512* mt, const float* xsum, int64_t ns, float* out) {
  constexpr KFormat f = kformat(TYPE);
  const int64_t steps = K / 2, subs = K / f.sub;
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) _mm512_storeu_ps(out + (m * kMaxNR + n) * kPanel, _mm512_setzero_ps());
  for (int64_t j = 0; j < subs; ++j) {
    __m512 dot[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n) dot[m][n] = _mm512_setzero_ps();
    for (int64_t t = j * (f.sub / 2); t < (j + 1) * (f.sub / 2); ++t) {
      __m512bh w[NR];
      for (int n = 0; n < NR; ++n) w[n] = (__m512bh)_mm512_loadu_si512(words + n * steps + t);
      for (int m = 0; m < MR; ++m) {
        const __m512bh xv = x_pair(x + m * K + 2 * t);
        for (int n = 0; n < NR; ++n) dot[m][n] = _mm512_dpbf16_ps(dot[m][n], xv, w[n]);
      }
    }
    const int64_t sum_index = j * f.sub / kSum;
    for (int n = 0; n < NR; ++n)
      for (int m = 0; m < MR; ++m) {
        float* a = out + (m * kMaxNR + n) * kPanel;
        __m512 acc = _mm512_fmadd_ps(s[n * subs + j], dot[m][n], _mm512_loadu_ps(a));
        if constexpr (TYPE == kQ5_1)
          acc = _mm512_fmadd_ps(mt[n * subs + j], _mm512_set1_ps(xsum[m * ns + sum_index]), acc);
        else if constexpr (f.has_min)
          acc = _mm512_fnmadd_ps(mt[n * subs + j], _mm512_set1_ps(xsum[m * ns + sum_index]), acc);
        _mm512_storeu_ps(a, acc);
      }
  }
}

template <int MR, int TYPE>
void wide_tile_panels(int nr, const c10::BFloat16* x, int64_t K, const __m512i* words,
                      const __m512* s, const __m512* mt, const float* xsum, int64_t ns, float* out) {
  switch (nr) {
    case 1: return wide_tile<MR, 1, TYPE>(x, K, words, s, mt, xsum, ns, out);
    case 2: return wide_tile<MR, 2, TYPE>(x, K, words, s, mt, xsum, ns, out);
    case 3: return wide_tile<MR, 3, TYPE>(x, K, words, s, mt, xsum, ns, out);
    default: return wide_tile<MR, 4, TYPE>(x, K, words, s, mt, xsum, ns, out);
  }
}

template <typename OutT, int TYPE>
void wide_linear(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* Wp,
                 const c10::BFloat16* bias, OutT* y, int64_t N, int64_t ldy, const float* xsum) {
  constexpr KFormat f = kformat(TYPE);
  const int64_t ns = K / kSum, panel_bytes = K / f.width * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (panels + kMaxNR - 1) / kMaxNR;
  const int64_t steps = K / 2, subs = K / f.sub;
  thread_local std::vector<__m512i> words;  // [4][K / 2], then s and mt [4][K / sub]
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kMaxNR, panels - g * kMaxNR));
  };
  const auto fill = [&](int64_t g) {
    words.resize(kMaxNR * (steps + 2 * subs));
    __m512* scales = reinterpret_cast<__m512*>(words.data() + kMaxNR * steps);
    unpack_group<TYPE>(Wp + g * kMaxNR * panel_bytes, panel_bytes, K, group_panels(g),
                       words.data(), scales, scales + kMaxNR * subs);
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float out[group_walk::kPassRows * kMaxNR * kPanel];
    const int nr = group_panels(g);
    const __m512* sc = reinterpret_cast<const __m512*>(words.data() + kMaxNR * steps);
    const float* xs = xsum ? xsum + m0 * ns : nullptr;
    const c10::BFloat16* xm = x + m0 * K;
    group_walk::with_rows(mr, [&](auto rows) {
      wide_tile_panels<decltype(rows)::value, TYPE>(nr, xm, K, words.data(), sc,
                                                    sc + kMaxNR * subs, xs, ns, out);
    });
    const int64_t n0 = g * kMaxNR * kPanel;
    store_out(out, mr, std::min(N - n0, nr * kPanel), bias ? bias + n0 : nullptr, y + m0 * ldy + n0, ldy);
  };
  group_walk::walk(M, K * 2, kWideRowBlockBytes, groups, fill, pass);
}

template <typename T, typename OutT>
void wide_any(int type, const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y,
              int64_t N, int64_t ldy, const float* xsum) {
  if constexpr (kHasSimd<T>) {
    switch (type) {
      case kQ5_0: wide_linear<OutT, kQ5_0>(x, M, K, Wp, bias, y, N, ldy, xsum); break;
      case kQ5_1: wide_linear<OutT, kQ5_1>(x, M, K, Wp, bias, y, N, ldy, xsum); break;
      case kQ4_K: wide_linear<OutT, kQ4_K>(x, M, K, Wp, bias, y, N, ldy, xsum); break;
      case kQ5_K: wide_linear<OutT, kQ5_K>(x, M, K, Wp, bias, y, N, ldy, xsum); break;
      default: wide_linear<OutT, kQ6_K>(x, M, K, Wp, bias, y, N, ldy, xsum); break;
    }
  }
}

#else
template <typename T, typename OutT>
void wide_any(int, const T*, int64_t, int64_t, const uint8_t*, const T*, OutT*, int64_t, int64_t,
              const float*) {}
#endif

}  // namespace
}  // namespace tgserve
