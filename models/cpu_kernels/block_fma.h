// block_linear.cpp's portable order as SIMD float32 code (simd16.h: AVX-512, or AVX2 + FMA), for
// CPUs without AVX512-BF16 and for float32 activations. Included by block_linear.cpp only.
//
// The portable pass (block_linear.cpp) dequantises each packed block of a panel element by
// element with scalar code and then runs acc = fma(x[k], w[k], acc) per k for each of the 16
// lanes. Here one block of a panel is dequantised 16 lanes at a time into w [32 k][16 lanes]
// float32 (the same two roundings: fl(d * q), Q4_1 fl(fl(d * q) + m); for bfloat16
// activations then rounded to bf16 to nearest even, NaN -> 0x7FC0, as c10 rounds), and every
// row runs the same fmas, k in order, 16 lanes per panel. Each lane sees the same
// operations in the same order as the portable pass, so the bits are the same (tested against
// it in tests/models/test_block_linear.py) and batch invariance holds as before.
//
// Packed block (see block_linear.cpp): [16 d fp16][16 m fp16, Q4_1 only] then the quants: step
// s (k-pair 2s, 2s + 1) of lane l, element i, is byte 2l + i of a 32-byte chunk; Q8_0: chunk s
// holds the int8 values; Q4: chunk s / 2, low nibbles for even s, high nibbles for odd s.
#pragma once

#include "group_walk.h"
#include "simd16.h"

#if defined(TGSERVE_SIMD16)
#define TGSERVE_BLOCK_FMA 1

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace tgserve::block_fma {

using simd16::VF;
using simd16::VI;
namespace v = simd16;

using simd16::kLanes;
constexpr int kBlockK = 32;

// 16 float32 rounded to bfloat16 and back (c10's nearest even); kFinite: no NaN lanes (the
// caller checked the block's scales), else NaN -> 0x7FC0 as c10 does.
template <bool kFinite>
inline VF round_to_bf16(VF x) {
  const VI u = v::as_int(x);
  const VI lsb = v::and_(v::srli(u, 16), v::set1i(1));
  VI r = v::addi(u, v::addi(lsb, v::set1i(0x7FFF)));
  r = v::and_(r, v::set1i(static_cast<int32_t>(0xFFFF0000u)));
  if constexpr (!kFinite) r = v::where_nan(x, r, 0x7FC00000);
  return v::as_float(r);
}

// One element's 16 lanes (quants qi) -> fl(d * q) (+ m), rounded to bf16 if asked.
// Q4_1's fl(fl(d * q) + m) is one fma: d (fp16, 11 bits) times q (4 bits) is exact in float32,
// so only the add rounds, as the fma's single rounding does (NaN and inf alike).
template <int TYPE, bool kRoundBf16, bool kFinite>
[[gnu::always_inline]] inline VF weight(VI qi, VF d, VF mn) {
  VF w = TYPE == 1 ? v::fmadd(v::to_float(qi), d, mn) : v::mul(v::to_float(qi), d);
  if constexpr (kRoundBf16) w = round_to_bf16<kFinite>(w);
  return w;
}

// The quants of element e of a Q4 chunk's lanes (v: lane l = byte 2l | byte 2l + 1 << 8):
// element 4t + u sits at bit shift {0, 8, 4, 12}[u] (step 2t / 2t + 1, pair element 0 / 1).
constexpr int kQ4Shift[4] = {0, 8, 4, 12};

template <int TYPE>
[[gnu::always_inline]] inline VI q4_at(VI words, int u) {
  VI q = v::and_(v::srli(words, kQ4Shift[u]), v::set1i(0xF));
  if constexpr (TYPE == 0) q = v::subi(q, v::set1i(8));
  return q;
}

// Q8_0 chunk s: element 2s + i = the signed byte i of each lane's word.
inline VI q8_at(VI words, int i) { return v::srai(v::slli(words, i == 0 ? 24 : 16), 24); }

// One packed block (`blk`, quants at blk + scales_bytes) -> w [32][16] float32 (see above).
// TYPE: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0 (block_linear.cpp maps its type ids to these).
template <int TYPE, bool kRoundBf16>
inline void dequant_block(const uint8_t* blk, int64_t scales_bytes, float* w) {
  const VF d = v::load_halves(blk);
  const VF mn = TYPE == 1 ? v::load_halves(blk + 32) : v::zerof();
  const uint8_t* q = blk + scales_bytes;
  const auto put = [&](int e, VI qi) {
    v::storef(w + e * kLanes, weight<TYPE, kRoundBf16, false>(qi, d, mn));
  };
  if constexpr (TYPE == 2) {
    for (int s = 0; s < 16; ++s) {
      const VI words = v::load_u16(q + 32 * s);
      put(2 * s, q8_at(words, 0));
      put(2 * s + 1, q8_at(words, 1));
    }
  } else {
    for (int t = 0; t < 8; ++t) {
      const VI words = v::load_u16(q + 32 * t);
      for (int u = 0; u < 4; ++u) put(4 * t + u, q4_at<TYPE>(words, u));
    }
  }
}

// Whether finite float32 Q4 blocks fold the nibble's shift into d (see row_block): AVX-512
// only; with two ymm per vector the 4 scaled d per panel spill (a -march=haswell build
// measured 2.57 ms against 2.42 without it).
template <int TYPE>
constexpr bool kFoldQ4 = TYPE != 2 && TGSERVE_SIMD16 == 512;

// One row (decode) over NR panels, dequantising in registers: no w buffer. For each block,
// each element e in order, each panel: acc = fma(x[e], w, acc), as `pass` does.
template <int TYPE, bool kRoundBf16, bool kFinite, int NR>
[[gnu::always_inline]] inline void row_block(const float* xf, const uint8_t* const* blk,
                                             int64_t scales_bytes, VF* acc) {
  VF d[NR], mn[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = v::load_halves(blk[j]);
    mn[j] = TYPE == 1 ? v::load_halves(blk[j] + 32) : v::zerof();
  }
  const auto fmas = [&](int e, const VI* qi) {
    const VF xv = v::set1f(xf[e]);
    for (int j = 0; j < NR; ++j)
      acc[j] = v::fmadd(xv, weight<TYPE, kRoundBf16, kFinite>(qi[j], d[j], mn[j]), acc[j]);
  };
  for (int c = 0; c < (TYPE == 2 ? 16 : 8); ++c) {  // 32-byte chunks of quants
    VI words[NR], q[NR];
    for (int j = 0; j < NR; ++j) words[j] = v::load_u16(blk[j] + scales_bytes + 32 * c);
    if constexpr (TYPE == 2) {
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < NR; ++j) q[j] = q8_at(words[j], i);
        fmas(2 * c + i, q);
      }
    } else if constexpr (kFinite && !kRoundBf16 && kFoldQ4<TYPE>) {
      // Finite float32 Q4: w = fma(q * 2^s, d * 2^-s, m) with q * 2^s the nibble left in place
      // (v & 0xF << s) and m = 0 (Q4_0: -8d, so w = d (q - 8)). d * q is exact and the scaling
      // by powers of two too, so the fma's one rounding gives gguf's fl(fl(d q) + m) bit for
      // bit, one shift fewer per weight.
      for (int u = 0; u < 4; ++u) {
        const VI mask = v::set1i(0xF << kQ4Shift[u]);
        const VF scale = v::set1f(1.0f / static_cast<float>(1 << kQ4Shift[u]));
        const VF xv = v::set1f(xf[4 * c + u]);
        for (int j = 0; j < NR; ++j) {
          const VF base = TYPE == 1 ? mn[j] : v::mul(d[j], v::set1f(-8.0f));
          const VF w = v::fmadd(v::to_float(v::and_(words[j], mask)), v::mul(d[j], scale), base);
          acc[j] = v::fmadd(xv, w, acc[j]);
        }
      }
    } else {
      for (int u = 0; u < 4; ++u) {
        for (int j = 0; j < NR; ++j) q[j] = q4_at<TYPE>(words[j], u);
        fmas(4 * c + u, q);
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
             int64_t scales_bytes, float* out) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  alignas(64) float xf[kBlockK];
  VF acc[NR];
  for (int j = 0; j < NR; ++j) acc[j] = v::zerof();
  for (int64_t b = 0; b < nb; ++b) {
    for (int e = 0; e < kBlockK; ++e) xf[e] = static_cast<float>(x[b * kBlockK + e]);
    const uint8_t* blk[NR];
    bool finite = true;
    for (int j = 0; j < NR; ++j) {
      blk[j] = Wp + j * panel_bytes + b * bb;
      if constexpr (kBf16 || kFoldQ4<TYPE>) finite = finite && finite_halves(blk[j]) &&
                                                  (TYPE != 1 || finite_halves(blk[j] + 32));
    }
    if (finite)
      row_block<TYPE, kBf16, true, NR>(xf, blk, scales_bytes, acc);
    else
      row_block<TYPE, kBf16, false, NR>(xf, blk, scales_bytes, acc);
  }
  for (int j = 0; j < NR; ++j) v::storef(out + j * kLanes, acc[j]);
}

// For MR rows m (x at xf + 32 m) and NR panels j: acc[m][j] (16 lanes, stored at acc_mem +
// (m * row_stride + j) * 16) = fma(x[m][e], w[j][e], acc[m][j]) for e = 0 .. 31, in order.
template <int MR, int NR>
inline void block_fmas(const float* xf, const float* w, float* acc_mem, int row_stride) {
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = v::loadf(acc_mem + (m * row_stride + j) * kLanes);
  for (int e = 0; e < kBlockK; ++e) {
    VF wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = v::loadf(w + (j * kBlockK + e) * kLanes);
    for (int m = 0; m < MR; ++m) {
      const VF xv = v::set1f(xf[m * kBlockK + e]);
      for (int j = 0; j < NR; ++j) acc[m][j] = v::fmadd(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) v::storef(acc_mem + (m * row_stride + j) * kLanes, acc[m][j]);
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

// Many rows (prefill, batched decode): a group of nr panels dequantised once into `w`
// [nr][K][16] float32, linear.cpp's packed float32 panel layout (`dequant_panels`), then the
// dense kernel's register tile over it (`dense_rows`): the same fmas in the same order as
// `pass` and as linear.cpp's float32 pass, at the dense kernel's rate plus the amortised
// dequantising. Tile: AVX-512 6 rows x 4 panels (24 accumulators, 4 weights, a broadcast: 29
// of 32 zmm), AVX2 6 rows x 1 panel (12 + 2 + 1 of 16 ymm).
constexpr int kTilePanels = TGSERVE_SIMD16 == 512 ? 4 : 1;

template <int TYPE, typename T>
void dequant_panels(const uint8_t* Wp, int64_t K, int64_t panel_bytes, int64_t file_block,
                    int64_t scales_bytes, int nr, float* w) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  for (int j = 0; j < nr; ++j)
    for (int64_t b = 0; b < nb; ++b)
      dequant_block<TYPE, kBf16>(Wp + j * panel_bytes + b * bb, scales_bytes,
                                 w + (j * K + b * kBlockK) * kLanes);
}

// out [m][j] (16 lanes at out + (m * row_stride + j) * 16) = rows x[0 .. MR) (row stride ldx)
// over panels w[0 .. NR) (panel stride K * 16): acc = 0; acc = fma(x[k], w[k], acc), k in order.
template <int MR, int NR>
inline void dense_tile(const float* x, int64_t ldx, int64_t K, const float* w, float* out,
                       int row_stride) {
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = v::zerof();
  const int64_t stride = K * kLanes;
  for (int64_t k = 0; k < K; ++k) {
    VF wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = v::loadf(w + j * stride + k * kLanes);
    for (int m = 0; m < MR; ++m) {
      const VF xv = v::set1f(x[m * ldx + k]);
      for (int j = 0; j < NR; ++j) acc[m][j] = v::fmadd(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) v::storef(out + (m * row_stride + j) * kLanes, acc[m][j]);
}

template <int MR>
inline void dense_tile_panels(const float* x, int64_t ldx, int64_t K, const float* w, int nr,
                              float* out, int row_stride) {
  if constexpr (kTilePanels == 1) {
    for (int j = 0; j < nr; ++j)
      dense_tile<MR, 1>(x, ldx, K, w + j * K * kLanes, out + j * kLanes, row_stride);
  } else {
    switch (nr) {
      case 1: return dense_tile<MR, 1>(x, ldx, K, w, out, row_stride);
      case 2: return dense_tile<MR, 2>(x, ldx, K, w, out, row_stride);
      case 3: return dense_tile<MR, 3>(x, ldx, K, w, out, row_stride);
      default: return dense_tile<MR, 4>(x, ldx, K, w, out, row_stride);
    }
  }
}

// dense_tile for mr (1 .. 6) rows and nr (1 .. 4) panels.
inline void dense_rows(const float* x, int64_t ldx, int64_t K, const float* w, int mr, int nr,
                       float* out, int row_stride) {
  group_walk::with_rows(mr, [&](auto rows) {
    dense_tile_panels<decltype(rows)::value>(x, ldx, K, w, nr, out, row_stride);
  });
}

// The portable pass's contract: out [max_mr][max_nr][16] float32 sums of rows x[0 .. mr)
// (row stride K) over panels [0 .. nr) of Wp (panel stride panel_bytes).
template <int TYPE, typename T>
void pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
          int64_t scales_bytes, int mr, int nr, int max_nr, float* out) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
  if (mr == 1) {  // decode: dequantise in registers
    switch (nr) {
      case 1: return one_row<TYPE, T, 1>(x, K, Wp, panel_bytes, file_block, scales_bytes, out);
      case 2: return one_row<TYPE, T, 2>(x, K, Wp, panel_bytes, file_block, scales_bytes, out);
      case 3: return one_row<TYPE, T, 3>(x, K, Wp, panel_bytes, file_block, scales_bytes, out);
      default: return one_row<TYPE, T, 4>(x, K, Wp, panel_bytes, file_block, scales_bytes, out);
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
