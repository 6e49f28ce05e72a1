// block_linear.cpp's portable order as AVX-512 float32 code, for CPUs without AVX512-BF16 (and
// for float32 activations on every AVX-512 CPU). Included by block_linear.cpp only.
//
// The portable pass (block_linear.cpp) dequantises each packed block of a panel element by
// element with scalar code and then runs acc = fma(x[k], w[k], acc) per k for each of the 16
// lanes. Here one block of a panel is dequantised 16 lanes at a time into w [32 k][16 lanes]
// float32 (the same two roundings: fl(d * q), Q4_1 fl(fl(d * q) + m); for bfloat16
// activations then rounded to bf16 to nearest even, NaN -> 0x7FC0, as c10 rounds), and every
// row runs the same fmas, k in order, one zmm of 16 lanes per panel. Each lane sees the same
// operations in the same order as the portable pass, so the bits are the same (tested against
// it in tests/models/test_block_linear.py) and batch invariance holds as before.
//
// Packed block (see block_linear.cpp): [16 d fp16][16 m fp16, Q4_1 only] then the quants: step
// s (k-pair 2s, 2s + 1) of lane l, element i, is byte 2l + i of a 32-byte chunk; Q8_0: chunk s
// holds the int8 values; Q4: chunk s / 2, low nibbles for even s, high nibbles for odd s.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TGSERVE_BLOCK_FMA 1

#include <immintrin.h>

#include <cstdint>
#include <algorithm>
#include <cstring>
#include <type_traits>

namespace tgserve::block_fma {

constexpr int kLanes = 16;
constexpr int kBlockK = 32;

// Rounds 16 float32 to bfloat16 and back (c10's nearest even; NaN -> 0x7FC0).
inline __m512 round_to_bf16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  r = _mm512_mask_mov_epi32(r, _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q),
                            _mm512_set1_epi32(0x7FC00000));
  return _mm512_castsi512_ps(r);
}

// A 32-byte chunk as 16 lanes: lane l = byte 2l | byte 2l + 1 << 8.
inline __m512i chunk_words(const uint8_t* p) {
  return _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
}

// One packed block (`blk`, quants at blk + scales_bytes) -> w [32][16] float32 (see above).
// TYPE: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0 (block_linear.cpp maps its type ids to these).
template <int TYPE, bool kRoundBf16>
inline void dequant_block(const uint8_t* blk, int64_t scales_bytes, float* w) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  const __m512 mn = TYPE == 1 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                                    reinterpret_cast<const __m256i*>(blk + 32)))
                              : _mm512_setzero_ps();
  const uint8_t* q = blk + scales_bytes;
  auto put = [&](int e, __m512i qi) {
    __m512 v = _mm512_mul_round_ps(_mm512_cvtepi32_ps(qi), d,
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (TYPE == 1)
      v = _mm512_add_round_ps(v, mn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    if constexpr (kRoundBf16) v = round_to_bf16(v);
    _mm512_storeu_ps(w + e * kLanes, v);
  };
  if constexpr (TYPE == 2) {  // Q8_0: element 2s + i = the signed byte i of lane l in chunk s
    for (int s = 0; s < 16; ++s) {
      const __m512i v = chunk_words(q + 32 * s);
      put(2 * s, _mm512_srai_epi32(_mm512_slli_epi32(v, 24), 24));
      put(2 * s + 1, _mm512_srai_epi32(_mm512_slli_epi32(v, 16), 24));
    }
  } else {  // Q4: chunk t holds elements 4t .. 4t + 3 (see the layout above)
    const __m512i nib = _mm512_set1_epi32(0xF);
    const __m512i centre = _mm512_set1_epi32(TYPE == 0 ? 8 : 0);
    for (int t = 0; t < 8; ++t) {
      const __m512i v = chunk_words(q + 32 * t);
      auto at = [&](int shift) {
        return _mm512_sub_epi32(_mm512_and_si512(_mm512_srli_epi32(v, shift), nib), centre);
      };
      put(4 * t, at(0));       // step 2t, element 0: byte 2l, low nibble
      put(4 * t + 1, at(8));   // step 2t, element 1: byte 2l + 1, low nibble
      put(4 * t + 2, at(4));   // step 2t + 1, element 0: byte 2l, high nibble
      put(4 * t + 3, at(12));  // step 2t + 1, element 1: byte 2l + 1, high nibble
    }
  }
}

// One element's 16 lanes (quants qi) -> fl(d * q) (+ m), rounded to bf16 if asked (finite
// inputs: the caller took the NaN-aware path for blocks whose d or m is not finite).
template <int TYPE, bool kRoundBf16, bool kFinite>
[[gnu::always_inline]] inline __m512 weight(__m512i qi, __m512 d, __m512 mn) {
  __m512 v = _mm512_mul_round_ps(_mm512_cvtepi32_ps(qi), d,
                                 _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if constexpr (TYPE == 1)
    v = _mm512_add_round_ps(v, mn, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  if constexpr (kRoundBf16) {
    if constexpr (kFinite) {  // round_to_bf16 without the NaN lanes
      const __m512i u = _mm512_castps_si512(v);
      const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
      const __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
      v = _mm512_castsi512_ps(
          _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u))));
    } else {
      v = round_to_bf16(v);
    }
  }
  return v;
}

// One row (decode) over NR panels, dequantising in registers: no w buffer. For each block,
// each element e in order, each panel: acc = fma(x[e], w, acc), as `pass` does.
template <int TYPE, bool kRoundBf16, bool kFinite, int NR>
[[gnu::always_inline]] inline void row_block(const float* xf, const uint8_t* const* blk,
                                             int64_t scales_bytes, __m512* acc) {
  __m512 d[NR], mn[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk[j])));
    mn[j] = TYPE == 1 ? _mm512_cvtph_ps(_mm256_loadu_si256(
                            reinterpret_cast<const __m256i*>(blk[j] + 32)))
                      : _mm512_setzero_ps();
  }
  auto fmas = [&](int e, const __m512i* qi) {
    const __m512 xv = _mm512_set1_ps(xf[e]);
    for (int j = 0; j < NR; ++j)
      acc[j] = _mm512_fmadd_ps(xv, weight<TYPE, kRoundBf16, kFinite>(qi[j], d[j], mn[j]), acc[j]);
  };
  if constexpr (TYPE == 2) {
    for (int s = 0; s < 16; ++s) {
      __m512i v[NR], q[NR];
      for (int j = 0; j < NR; ++j) v[j] = chunk_words(blk[j] + scales_bytes + 32 * s);
      for (int j = 0; j < NR; ++j) q[j] = _mm512_srai_epi32(_mm512_slli_epi32(v[j], 24), 24);
      fmas(2 * s, q);
      for (int j = 0; j < NR; ++j) q[j] = _mm512_srai_epi32(_mm512_slli_epi32(v[j], 16), 24);
      fmas(2 * s + 1, q);
    }
  } else {
    const __m512i nib = _mm512_set1_epi32(0xF);
    const __m512i centre = _mm512_set1_epi32(TYPE == 0 ? 8 : 0);
    for (int t = 0; t < 8; ++t) {
      __m512i v[NR], q[NR];
      for (int j = 0; j < NR; ++j) v[j] = chunk_words(blk[j] + scales_bytes + 32 * t);
      for (const int shift : {0, 8, 4, 12}) {  // elements 4t .. 4t + 3 (see dequant_block)
        for (int j = 0; j < NR; ++j) {
          q[j] = _mm512_and_si512(_mm512_srli_epi32(v[j], shift), nib);
          if constexpr (TYPE == 0) q[j] = _mm512_sub_epi32(q[j], centre);
        }
        fmas(4 * t + (shift == 0 ? 0 : shift == 8 ? 1 : shift == 4 ? 2 : 3), q);
      }
    }
  }
}

// Whether 16 fp16 values at p are all finite (exponent bits not all ones).
inline bool finite_halves(const uint8_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  const __m256i e = _mm256_and_si256(h, _mm256_set1_epi16(0x7C00));
  return _mm256_movemask_epi8(_mm256_cmpeq_epi16(e, _mm256_set1_epi16(0x7C00))) == 0;
}

template <int TYPE, typename T, int NR>
void one_row(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
             int64_t scales_bytes, int max_nr, float* out) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  alignas(64) float xf[kBlockK];
  __m512 acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    for (int e = 0; e < kBlockK; ++e) xf[e] = static_cast<float>(x[b * kBlockK + e]);
    const uint8_t* blk[NR];
    bool finite = true;
    for (int j = 0; j < NR; ++j) {
      blk[j] = Wp + j * panel_bytes + b * bb;
      if constexpr (kBf16) finite = finite && finite_halves(blk[j]) &&
                                    (TYPE != 1 || finite_halves(blk[j] + 32));
    }
    if (finite)
      row_block<TYPE, kBf16, true, NR>(xf, blk, scales_bytes, acc);
    else
      row_block<TYPE, kBf16, false, NR>(xf, blk, scales_bytes, acc);
  }
  for (int j = 0; j < NR; ++j) _mm512_store_ps(out + j * kLanes, acc[j]);
  (void)max_nr;
}

// For MR rows m (x at xf + 32 m) and NR panels j: acc[m][j] (16 lanes, stored at acc_mem +
// (m * row_stride + j) * 16) = fma(x[m][e], w[j][e], acc[m][j]) for e = 0 .. 31, in order.
template <int MR, int NR>
inline void block_fmas(const float* xf, const float* w, float* acc_mem, int row_stride) {
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_load_ps(acc_mem + (m * row_stride + j) * kLanes);
  for (int e = 0; e < kBlockK; ++e) {
    __m512 wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = _mm512_loadu_ps(w + (j * kBlockK + e) * kLanes);
    for (int m = 0; m < MR; ++m) {
      const __m512 xv = _mm512_set1_ps(xf[m * kBlockK + e]);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) _mm512_store_ps(acc_mem + (m * row_stride + j) * kLanes, acc[m][j]);
}

// block_fmas for mr (1 .. 2) rows and nr (1 .. 4) panels.
inline void block_fmas_any(int mr, int nr, const float* xf, const float* w, float* acc,
                           int row_stride) {
  const auto one = [&](auto rows) {
    constexpr int R = decltype(rows)::value;
    switch (nr) {
      case 1: return block_fmas<R, 1>(xf, w, acc, row_stride);
      case 2: return block_fmas<R, 2>(xf, w, acc, row_stride);
      case 3: return block_fmas<R, 3>(xf, w, acc, row_stride);
      default: return block_fmas<R, 4>(xf, w, acc, row_stride);
    }
  };
  if (mr == 1)
    one(std::integral_constant<int, 1>{});
  else
    one(std::integral_constant<int, 2>{});
}

// Rows x[0 .. mr) over block b's dequantised w [nr][32][16]: out's sums go on.
template <typename T>
inline void rows_over_block(const T* x, int64_t K, int64_t b, const float* w, int mr, int nr,
                            int max_nr, float* out) {
  alignas(64) float xf[2 * kBlockK];
  for (int m = 0; m < mr; m += 2) {  // two rows at a time: 2 x nr independent fma chains
    const int rows = std::min(2, mr - m);
    for (int r = 0; r < rows; ++r)
      for (int e = 0; e < kBlockK; ++e)
        xf[r * kBlockK + e] = static_cast<float>(x[(m + r) * K + b * kBlockK + e]);
    block_fmas_any(rows, nr, xf, w, out + m * max_nr * kLanes, max_nr);
  }
}

// Many rows (prefill): a group of nr panels dequantised once, every block's w [nr][32][16]
// one after the other (`scratch`, nb * nr * 512 floats), then `rows_over_scratch` runs any
// number of 8-row passes over it: the same fmas in the same order as `pass`.
template <int TYPE, typename T>
void dequant_group(const uint8_t* Wp, int64_t K, int64_t panel_bytes, int64_t file_block,
                   int64_t scales_bytes, int nr, float* scratch) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j)
      dequant_block<TYPE, kBf16>(Wp + j * panel_bytes + b * bb, scales_bytes,
                                 scratch + (b * nr + j) * kBlockK * kLanes);
}

// out [mr][max_nr][16] = rows x[0 .. mr) over the scratch's nr panels (see dequant_group).
template <typename T>
void rows_over_scratch(const T* x, int64_t K, const float* scratch, int mr, int nr, int max_nr,
                       float* out) {
  const int64_t nb = K / kBlockK;
  for (int m = 0; m < mr; ++m) std::memset(out + m * max_nr * kLanes, 0, nr * kLanes * 4);
  for (int64_t b = 0; b < nb; ++b) {
    const float* w = scratch + b * nr * kBlockK * kLanes;
    rows_over_block(x, K, b, w, mr, nr, max_nr, out);
  }
}

// The portable pass's contract: out [max_mr][max_nr][16] float32 sums of rows x[0 .. mr)
// (row stride K) over panels [0 .. nr) of Wp (panel stride panel_bytes).
template <int TYPE, typename T>
void pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
          int64_t scales_bytes, int mr, int nr, int max_nr, float* out) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  if (mr == 1) {  // decode: dequantise in registers
    switch (nr) {
      case 1: return one_row<TYPE, T, 1>(x, K, Wp, panel_bytes, file_block, scales_bytes, max_nr, out);
      case 2: return one_row<TYPE, T, 2>(x, K, Wp, panel_bytes, file_block, scales_bytes, max_nr, out);
      case 3: return one_row<TYPE, T, 3>(x, K, Wp, panel_bytes, file_block, scales_bytes, max_nr, out);
      default: return one_row<TYPE, T, 4>(x, K, Wp, panel_bytes, file_block, scales_bytes, max_nr, out);
    }
  }
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  alignas(64) float w[4 * kBlockK * kLanes];  // nr <= 4 panels of one block
  for (int m = 0; m < mr; ++m) std::memset(out + m * max_nr * kLanes, 0, nr * kLanes * 4);
  for (int64_t b = 0; b < nb; ++b) {
    for (int j = 0; j < nr; ++j)
      dequant_block<TYPE, kBf16>(Wp + j * panel_bytes + b * bb, scales_bytes,
                                 w + j * kBlockK * kLanes);
    rows_over_block(x, K, b, w, mr, nr, max_nr, out);
  }
}

}  // namespace tgserve::block_fma

#endif
