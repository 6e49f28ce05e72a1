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
// it in tests/models/test_block_linear.py) and batch invariance holds as before. The
// few-rows pass for float32 activations makes those weights with one integer op and one fma
// where a block's scales allow it: AVX-512 mantissa_weights.h, AVX2 mantissa_avx2.h (one or two
// rows); the same bits, other blocks as above.
//
// Packed block (see block_linear.cpp): [16 d fp16][16 m fp16, Q4_1 only] then the quants: step
// s (k-pair 2s, 2s + 1) of lane l, element i, is byte 2l + i of a 32-byte chunk; Q8_0: chunk s
// holds the int8 values; Q4: chunk s / 2, low nibbles for even s, high nibbles for odd s.
#pragma once

#include "dense_tile.h"
#include "mantissa_avx2.h"
#include "mantissa_weights.h"
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

// Whether finite float32 Q4 blocks fold the nibble's shift into d (see rows_block): AVX-512
// only; with two ymm per vector the 4 scaled d per panel spill (a -march=haswell build
// measured 2.57 ms against 2.42 without it).
template <int TYPE>
constexpr bool kFoldQ4 = TYPE != 2 && TGSERVE_SIMD16 == 512;

// Few rows (decode, a speculative verify): up to kFewRows rows over NR panels, dequantising in
// registers, each weight once for all the pass's rows: no w buffer, no accumulator traffic.
// Panels per pass for mr rows: mr x NR accumulators beside NR weights and the panels' scales
// (AVX-512: 32 zmm; AVX2: 16 ymm, two per vector, so rows go 4 at a time over one panel).
constexpr int kFewRows = 8;
constexpr int kFewRowsPerPass = TGSERVE_SIMD16 == 512 ? kFewRows : 4;
constexpr int few_rows_panels(int mr) {
  if constexpr (TGSERVE_SIMD16 != 512) return mr <= 1 ? 4 : mr <= 2 ? 2 : 1;
  return mr <= 2 ? 4 : mr <= 4 ? 3 : 2;
}

// acc[m][j] = fma(x[m][e], w[j], acc[m][j]) for every row m (element e of row m at
// xf[m * ldx + e]) and panel j.
template <int MR, int NR>
[[gnu::always_inline]] inline void row_fmas(const float* xf, int64_t ldx, int e, const VF* w,
                                            VF (&acc)[MR][NR]) {
  for (int m = 0; m < MR; ++m) {
    const VF xv = v::set1f(xf[m * ldx + e]);
    for (int j = 0; j < NR; ++j) acc[m][j] = v::fmadd(xv, w[j], acc[m][j]);
  }
}

// Rows x[0 .. MR) (element e of row m at xf[m * ldx + e]) over one block of NR panels:
// for each element e in order, each panel: w = the weight, then acc[m][j] = fma(x[m][e], w,
// acc[m][j]) for every row: each lane runs `pass`'s portable order.
template <int TYPE, bool kRoundBf16, bool kFinite, int MR, int NR>
[[gnu::always_inline]] inline void rows_block(const float* xf, int64_t ldx,
                                              const uint8_t* const* blk, int64_t scales_bytes,
                                              VF (&acc)[MR][NR]) {
  VF d[NR], mn[NR];
  for (int j = 0; j < NR; ++j) {
    d[j] = v::load_halves(blk[j]);
    mn[j] = TYPE == 1 ? v::load_halves(blk[j] + 32) : v::zerof();
  }
  const auto fmas = [&](int e, const VF* w) { row_fmas(xf, ldx, e, w, acc); };
  for (int c = 0; c < (TYPE == 2 ? 16 : 8); ++c) {  // 32-byte chunks of quants
    VI words[NR];
    VF w[NR];
    for (int j = 0; j < NR; ++j) words[j] = v::load_u16(blk[j] + scales_bytes + 32 * c);
    if constexpr (TYPE == 2) {
      for (int i = 0; i < 2; ++i) {
        for (int j = 0; j < NR; ++j)
          w[j] = weight<TYPE, kRoundBf16, kFinite>(q8_at(words[j], i), d[j], mn[j]);
        fmas(2 * c + i, w);
      }
    } else if constexpr (kFinite && !kRoundBf16 && kFoldQ4<TYPE>) {
      // Finite float32 Q4: w = fma(q * 2^s, d * 2^-s, m) with q * 2^s the nibble left in place
      // (v & 0xF << s) and m = 0 (Q4_0: -8d, so w = d (q - 8)). d * q is exact and the scaling
      // by powers of two too, so the fma's one rounding gives gguf's fl(fl(d q) + m) bit for
      // bit, one shift fewer per weight.
      for (int u = 0; u < 4; ++u) {
        const VI mask = v::set1i(0xF << kQ4Shift[u]);
        const VF scale = v::set1f(1.0f / static_cast<float>(1 << kQ4Shift[u]));
        for (int j = 0; j < NR; ++j) {
          const VF base = TYPE == 1 ? mn[j] : v::mul(d[j], v::set1f(-8.0f));
          w[j] = v::fmadd(v::to_float(v::and_(words[j], mask)), v::mul(d[j], scale), base);
        }
        fmas(4 * c + u, w);
      }
    } else {
      for (int u = 0; u < 4; ++u) {
        for (int j = 0; j < NR; ++j)
          w[j] = weight<TYPE, kRoundBf16, kFinite>(q4_at<TYPE>(words[j], u), d[j], mn[j]);
        fmas(4 * c + u, w);
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

// out [m][j] (16 lanes at out + (m * max_nr + j) * 16) = rows x[0 .. MR) (row stride K) over
// panels [0 .. NR) of Wp, block after block (bf16 x: each block's 32 k as float32, exact).
// kTrusted: a Q4_1 weight whose blocks' constant terms were checked when packed.
template <int TYPE, typename T, int MR, int NR, bool kTrusted>
void few_rows(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
              int64_t scales_bytes, int max_nr, float* out) {
  constexpr bool kBf16 = std::is_same_v<T, c10::BFloat16>;
#if defined(TGSERVE_MANTISSA_AVX2)
  // AVX2, float32 x, one or two rows: one-fma weights (mantissa_avx2.h, the same bits); with
  // more rows this pass's shared weights do better.
  if constexpr (!kBf16 && MR <= 2 && (TYPE != 1 || kTrusted))
    return mantissa_avx2::few_rows<TYPE, MR, NR>(x, K, Wp, panel_bytes, file_block, scales_bytes,
                                                 max_nr, out);
#endif
  const int64_t bb = file_block * kLanes, nb = K / kBlockK;
  alignas(64) float xb[kBf16 ? MR * kBlockK : 1];
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = v::zerof();
  for (int64_t b = 0; b < nb; ++b) {
    const float* xf;
    int64_t ldx;
    if constexpr (kBf16) {
      for (int m = 0; m < MR; ++m)
        for (int e = 0; e < kBlockK; ++e)
          xb[m * kBlockK + e] = static_cast<float>(x[m * K + b * kBlockK + e]);
      xf = xb;
      ldx = kBlockK;
    } else {
      xf = x + b * kBlockK;
      ldx = K;
    }
    const uint8_t* blk[NR];
    for (int j = 0; j < NR; ++j) blk[j] = Wp + j * panel_bytes + b * bb;
#if defined(TGSERVE_MANTISSA_WEIGHTS)
    if constexpr (!kBf16)
      if (mantissa_weights::rows_block<TYPE, NR, kTrusted>(blk, scales_bytes,
                                                           [&](int e, const VF* w) {
            row_fmas(xf, ldx, e, w, acc);
          }))
        continue;
#endif
    bool finite = true;
    for (int j = 0; j < NR; ++j) {
      if constexpr (kBf16 || kFoldQ4<TYPE>) finite = finite && finite_halves(blk[j]) &&
                                                  (TYPE != 1 || finite_halves(blk[j] + 32));
    }
    if (finite)
      rows_block<TYPE, kBf16, true, MR, NR>(xf, ldx, blk, scales_bytes, acc);
    else
      rows_block<TYPE, kBf16, false, MR, NR>(xf, ldx, blk, scales_bytes, acc);
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) v::storef(out + (m * max_nr + j) * kLanes, acc[m][j]);
}

// few_rows for mr (1 .. kFewRowsPerPass) rows and nr (1 .. few_rows_panels(mr)) panels.
template <int TYPE, typename T, bool kTrusted, int MR = kFewRowsPerPass>
void few_rows_any(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                  int64_t file_block, int64_t scales_bytes, int mr, int nr, int max_nr,
                  float* out) {
  if constexpr (MR > 1)
    if (mr < MR)
      return few_rows_any<TYPE, T, kTrusted, MR - 1>(x, K, Wp, panel_bytes, file_block,
                                                     scales_bytes, mr, nr, max_nr, out);
  const auto run = [&](auto panels) {
    constexpr int NR = decltype(panels)::value;
    if constexpr (NR <= few_rows_panels(MR))
      few_rows<TYPE, T, MR, NR, kTrusted>(x, K, Wp, panel_bytes, file_block, scales_bytes,
                                          max_nr, out);
  };
  switch (nr) {
    case 1: return run(std::integral_constant<int, 1>{});
    case 2: return run(std::integral_constant<int, 2>{});
    case 3: return run(std::integral_constant<int, 3>{});
    default: return run(std::integral_constant<int, 4>{});
  }
}

// Many rows (prefill, batched decode): a group of nr panels dequantised once into `w`
// [nr][K][16] float32, linear.cpp's packed float32 panel layout (`dequant_panels`), then the
// dense kernel's register tile over it (`dense_rows`): the same fmas in the same order as
// `pass` and as linear.cpp's float32 pass, at the dense kernel's rate plus the amortised
// dequantising (the tile: dense_tile.h).
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

// The portable pass's contract: out [max_mr][max_nr][16] float32 sums of rows x[0 .. mr)
// (row stride K, mr <= kFewRows) over panels [0 .. nr) of Wp (panel stride panel_bytes,
// nr <= few_rows_panels(min(mr, kFewRowsPerPass))).
template <int TYPE, typename T, bool kTrusted = false>
void pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
          int64_t scales_bytes, int mr, int nr, int max_nr, float* out) {
  for (int m0 = 0; m0 < mr; m0 += kFewRowsPerPass)
    few_rows_any<TYPE, T, kTrusted>(x + m0 * K, K, Wp, panel_bytes, file_block, scales_bytes,
                                    std::min(kFewRowsPerPass, mr - m0), nr, max_nr,
                                    out + m0 * max_nr * kLanes);
}

}  // namespace tgserve::block_fma

#endif
