// The few-rows passes of kquant_linear.cpp for bfloat16 activations on AVX512-BF16: a packed
// block's nibbles and high bits turned into bf16 words in registers (vpermw tables) and vdpbf16ps
// against x's pairs, a register tile of up to 4 rows x 4 panels, one pass a (rows, panels, type)
// chosen from a table. Included by kquant_linear.cpp alone (its helpers share that file's anonymous
// namespace).
#pragma once

#include "x86_intrinsics.h"

#include <array>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "kquant_format.h"

namespace tgserve {
namespace {

// The bf16 many-rows walk keeps this much of x's rows in L2 while the groups go over them.
constexpr int64_t kWideRowBlockBytes = 256 * 1024;

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)

template <typename T>
constexpr bool kHasSimd = std::is_same_v<T, c10::BFloat16>;

// bf16 bit patterns of q - offset for q = 32 * half + i (vpermw / vpermt2w tables).
inline __m512i value_table(int offset, int half) {
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float v = static_cast<float>(32 * half + i - offset);
    uint32_t bitsw;
    std::memcpy(&bitsw, &v, 4);
    t[i] = static_cast<uint16_t>(bitsw >> 16);  // exact: small integers
  }
  return _mm512_load_si512(t);
}

inline __m512bh x_pair(const c10::BFloat16* x) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return (__m512bh)_mm512_set1_epi32(pair);
}

inline __mmask32 load_mask(const uint8_t* p) {
  uint32_t m;
  std::memcpy(&m, p, 4);
  return m;
}

// Words of q (nibble + high bits) of step s of a packed block -> bf16 values.
template <int TYPE>
inline __m512bh step_values(__m512i nib, const uint8_t* hi, __m512i t0, __m512i t1) {
  constexpr KFormat f = kformat(TYPE);
  if constexpr (f.hbits >= 1) nib = _mm512_mask_add_epi16(nib, load_mask(hi), nib, _mm512_set1_epi16(16));
  if constexpr (f.hbits == 2) {
    nib = _mm512_mask_add_epi16(nib, load_mask(hi + 4), nib, _mm512_set1_epi16(32));
    return (__m512bh)_mm512_permutex2var_epi16(t0, nib, t1);
  } else {
    return (__m512bh)_mm512_permutexvar_epi16(nib, t0);
  }
}

// Sub-block j's scale (and min term) vectors of a packed block, as lane_scales computes them.
template <int TYPE>
inline void simd_scales(const uint8_t* blk, int j, __m512* s, __m512* mt) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)blk));
  if constexpr (TYPE == kQ5_0 || TYPE == kQ5_1) {
    *s = d;
    if constexpr (TYPE == kQ5_1) *mt = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32)));
  } else if constexpr (TYPE == kQ6_K) {
    *s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(blk + 32 + 16 * j)))));
  } else {
    const __m512i lo = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + 64 + 16 * j)));
    const __m512i hi = _mm512_srli_epi32(
        _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i*)(blk + 192 + 16 * (j % 4)))), 4 * (j / 4));
    const __m512i three = _mm512_set1_epi32(3), fifteen = _mm512_set1_epi32(15);
    const __m512i sc = _mm512_or_si512(_mm512_and_si512(lo, fifteen), _mm512_slli_epi32(_mm512_and_si512(hi, three), 4));
    const __m512i m = _mm512_or_si512(_mm512_srli_epi32(lo, 4),
                                      _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2), three), 4));
    *s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    const __m512 dmin = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32)));
    *mt = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m));  // subtracted: fnmadd
  }
}

// Rows x[0 .. MR) against panels [0 .. NR) from `Wp` (panel stride `panel_bytes`).
template <int MR, int NR, int TYPE>
void simd_pass(const c10::BFloat16* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
               const float* xsum, float* out) {
  constexpr KFormat f = kformat(TYPE);
  constexpr int64_t bb = f.file_block * kPanel;
  constexpr int pairs = f.sub / 4;  // 32-byte nibble rows (two k-pair steps) per sub-block
  const int64_t nb = K / f.width, ns = K / kSum;
  constexpr int64_t pf = (kPrefetchBytes + bb - 1) / bb;
  const __m512i t0 = value_table(f.offset, 0), t1 = value_table(f.offset, 1);
  const __m512i low = _mm512_set1_epi16(0xF);
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) acc[m][n] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    const c10::BFloat16* xb = x + b * f.width;
    // Each panel's block `pf` ahead (past its last: the next group's panel), a line per step
    // pair: the hardware prefetcher alone keeps too few lines in flight for 4 streams (the
    // read probe: 1 stream a thread 18 GB/s, 4 streams or prefetch 27-31). No arithmetic changes.
    const int64_t ahead = (b + pf < nb ? 0 : (NR - 1) * panel_bytes) + pf * bb;
    for (int j = 0; j < f.width / f.sub; ++j) {
      __m512 dot[MR][NR];
      for (int m = 0; m < MR; ++m)
        for (int n = 0; n < NR; ++n) dot[m][n] = _mm512_setzero_ps();
      for (int t = j * pairs; t < (j + 1) * pairs; ++t) {  // steps 2t and 2t + 1
        __m512bh w0[NR], w1[NR];
        for (int n = 0; n < NR; ++n) {
          if (t * 64 < bb)
            _mm_prefetch(reinterpret_cast<const char*>(Wp + n * panel_bytes + b * bb + ahead + t * 64), _MM_HINT_T1);
          const uint8_t* nib = Wp + n * panel_bytes + b * bb + f.scales;
          const uint8_t* hi = nib + 8 * f.width + 2 * t * f.hbits * 4;
          const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(nib + t * 32)));
          w0[n] = step_values<TYPE>(_mm512_and_si512(bytes, low), hi, t0, t1);
          w1[n] = step_values<TYPE>(_mm512_srli_epi16(bytes, 4), hi + f.hbits * 4, t0, t1);
        }
        for (int m = 0; m < MR; ++m) {
          const __m512bh x0 = x_pair(xb + m * K + 4 * t), x1 = x_pair(xb + m * K + 4 * t + 2);
          for (int n = 0; n < NR; ++n) {
            dot[m][n] = _mm512_dpbf16_ps(dot[m][n], x0, w0[n]);
            dot[m][n] = _mm512_dpbf16_ps(dot[m][n], x1, w1[n]);
          }
        }
      }
      const int64_t sum_index = (b * f.width + j * f.sub) / kSum;
      for (int n = 0; n < NR; ++n) {
        __m512 s, mt;
        simd_scales<TYPE>(Wp + n * panel_bytes + b * bb, j, &s, &mt);
        for (int m = 0; m < MR; ++m) {
          acc[m][n] = _mm512_fmadd_ps(s, dot[m][n], acc[m][n]);
          if constexpr (TYPE == kQ5_1)
            acc[m][n] = _mm512_fmadd_ps(mt, _mm512_set1_ps(xsum[m * ns + sum_index]), acc[m][n]);
          else if constexpr (f.has_min)
            acc[m][n] = _mm512_fnmadd_ps(mt, _mm512_set1_ps(xsum[m * ns + sum_index]), acc[m][n]);
        }
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) _mm512_storeu_ps(out + (m * kMaxNR + n) * kPanel, acc[m][n]);
}

using PassFn = void (*)(const c10::BFloat16*, int64_t, const uint8_t*, int64_t, const float*, float*);

// [type index][mr - 1][nr - 1] -> simd_pass<mr, nr, type>.
template <int TYPE, int... I>
constexpr std::array<PassFn, kMaxMR * kMaxNR> tile_passes(std::integer_sequence<int, I...>) {
  return {&simd_pass<I / kMaxNR + 1, I % kMaxNR + 1, TYPE>...};
}
constexpr std::array<std::array<PassFn, kMaxMR * kMaxNR>, 5> kPasses = [] {
  constexpr auto tiles = std::make_integer_sequence<int, kMaxMR * kMaxNR>{};
  return std::array{tile_passes<kQ5_0>(tiles), tile_passes<kQ5_1>(tiles), tile_passes<kQ4_K>(tiles),
                    tile_passes<kQ5_K>(tiles), tile_passes<kQ6_K>(tiles)};
}();

template <typename T>
void simd_any(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t pb, const float* xs,
              int mr, int nr, float* out) {
  if constexpr (kHasSimd<T>) {
    const int t = type == kQ5_0 ? 0 : type == kQ5_1 ? 1 : type == kQ4_K ? 2 : type == kQ5_K ? 3 : 4;
    kPasses[t][(mr - 1) * kMaxNR + nr - 1](x, K, Wp, pb, xs, out);
  }
}

#else
template <typename T>
constexpr bool kHasSimd = false;
template <typename T>
void simd_any(int, const T*, int64_t, const uint8_t*, int64_t, const float*, int, int, float*) {}
#endif

}  // namespace
}  // namespace tgserve
