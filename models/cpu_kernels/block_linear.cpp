// Linear layers over GGUF block-quantised weights kept as stored (Q4_0, Q4_1, Q8_0): the
// blocks stay in memory as the file's bytes; the kernel dequantises them on the fly and runs
// the dense kernel's order, so the outputs are bitwise those of `--dequantize` + linear.cpp.
//
// Formats (ggml): a row of K weights is K / 32 blocks; block b holds an fp16 scale d (Q4_1:
// and an fp16 min m) and 32 small integers q. Weight = d * q (Q8_0: q int8; Q4_0: q = nibble
// - 8) or d * q + m (Q4_1: q = nibble).
//
// Packed layout (pack_blocks): rows are cut into panels of 16 (the last one padded with zero
// rows); a panel stores its blocks in K order, each block as [16 d fp16][16 m fp16, Q4_1 only]
// then the 32 k of the 16 rows as 16 k-pair steps, lane-major inside a step (the vdpbf16ps
// operand, as linear.cpp): Q8_0: a step is 32 int8 (lane l, pair i at byte 2l + i); Q4: two
// steps share 32 bytes, step 2t in the low nibbles, step 2t + 1 in the high ones. A panel's
// block is 16 x the file's block bytes: resident bytes == the file's tensor bytes.
//
// Accumulation order of y[m, n] (one float32 lane, fixed by K alone): each weight is first
// dequantised as gguf does it in float32, w = d * q, Q4_1: w = (d * q) + m (d * q is exact:
// an 11-bit d times a q of at most 8 bits, so only the add rounds), then, for bfloat16
// activations, rounded to bf16 (nearest even, as torch's .to(torch.bfloat16)); then acc = 0;
// for every k-pair step in order: acc = vdpbf16ps(acc, x pair, w pair); y = round(acc +
// bias[n]). That is linear.cpp's order over the weights `--dequantize` holds, so the two paths
// agree bit for bit. float32 activations keep the float32 weights and run acc = fma(x[k], w[k],
// acc) for every k (linear.cpp's AVX-512 float32 pass, i.e. `--dequantize --dtype float32`);
// bf16 without AVX512-BF16 runs linear.cpp's portable order (acc = fma(x, w, acc) per k). The tile, M,
// the thread and the other rows change which lanes run together, never a lane's sequence:
// batch invariance (issue #14) holds as for linear.cpp.
//
// Two SIMD paths, one order. Few rows (M <= 8: decode, a speculative verify): a pass
// dequantises each pair of steps of its panels in registers and runs all its rows (up to 8)
// over them (the weights are read once; dequantising costs ALU work next to streaming a third
// of the dense bytes); from 2 rows, bf16 activations run each vdpbf16ps as its two fmas where
// this CPU's instruction gives their bits (bf16_pairs.h: half the cost per row), float32 ones
// a register tile of rows x panels per block (block_fma.h). Many rows:
// a thread dequantises a group of 4 panels once into a scratch (L2-sized) and runs the dense
// kernel's 6-row register tiles over it: the dense kernel's work plus the amortised
// dequantising. bf16 with AVX512-BF16: a bf16 scratch, 6 x 4 vdpbf16ps tiles (many_rows);
// float32 (and bf16 without AVX512-BF16, AVX-512 or AVX2): a float32 scratch in linear.cpp's
// layout, 6-row fma tiles (many_rows_fma, block_fma.h, group_walk.h).
#include "x86_intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include <omp.h>

#include "kernels.h"
#include "bf16_pairs.h"
#include "block_fma.h"
#include "group_walk.h"
#include "aligned_scratch.h"

namespace tgserve {
namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kBlock = 32;
constexpr int kMaxMR = 8;  // few-rows pass: every row of a decode step in one pass
constexpr int kMaxNR = 4;

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

// Bytes of one block of 16 rows in the packed layout, and where its quants start.
struct Format {
  int64_t file_block;  // bytes of one row's block in the file
  int64_t scales;      // bytes of d (and m) for 16 rows
  bool has_min;
};

Format format_of(int type) {
  switch (type) {
    case kQ4_0: return {18, 32, false};
    case kQ4_1:
    case kQ4_1Exact: return {20, 64, true};
    case kQ8_0: return {34, 32, false};
    default: return {0, 0, false};
  }
}

// q of element e (0..31) of a row's block in the file (signed: Q4_0 and Q8_0 centred).
inline int file_q(const uint8_t* blk, int type, int e) {
  if (type == kQ8_0) return static_cast<int8_t>(blk[2 + e]);
  const uint8_t* qs = blk + (type == kQ4_1 ? 4 : 2);
  const int nib = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
  return type == kQ4_0 ? nib - 8 : nib;
}

// Byte and shift of element e of lane l inside a packed block's quants.
inline int64_t packed_pos(int type, int l, int e, int* shift) {
  const int s = e / 2, i = e % 2;
  if (type == kQ8_0) {
    *shift = 0;
    return s * 32 + 2 * l + i;
  }
  *shift = (s % 2) * 4;
  return (s / 2) * 32 + 2 * l + i;
}

// q of element e of lane l from a packed block (quants part).
inline int packed_q(const uint8_t* q, int type, int l, int e) {
  int shift;
  const uint8_t byte = q[packed_pos(type, l, e, &shift)];
  if (type == kQ8_0) return static_cast<int8_t>(byte);
  const int nib = (byte >> shift) & 0xF;
  return type == kQ4_0 ? nib - 8 : nib;
}

// One weight as gguf dequantises it: d * q, Q4_1 (d * q) + m, two float32 roundings, no fused
// multiply-add (the empty asm keeps the compiler from contracting them).
inline float dequant(float d, float mn, int q, bool has_min) {
  float v = d * static_cast<float>(q);
  asm volatile("" : "+x"(v));
  return has_min ? v + mn : v;
}

// w [16 lanes][32]: one packed block of a panel, dequantised (rounded to WT).
template <typename WT>
void dequant_block_portable(const uint8_t* blk, const Format& f, int type, WT w[kPanel][kBlock]) {
  for (int l = 0; l < kPanel; ++l) {
    uint16_t dh, mh = 0;
    std::memcpy(&dh, blk + 2 * l, 2);
    if (f.has_min) std::memcpy(&mh, blk + 32 + 2 * l, 2);
    const float d = half_to_float(dh), mn = half_to_float(mh);
    for (int e = 0; e < kBlock; ++e)
      w[l][e] = static_cast<WT>(dequant(d, mn, packed_q(blk + f.scales, type, l, e), f.has_min));
  }
}

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

// Many rows (M > kFewRows): a thread dequantises a group of kGroupPanels panels once into a
// bf16 scratch, w [K / 2 steps][nr panels] x 32 bf16 (the vdpbf16ps operand), then runs every
// row over it with a 6-row x 4-panel register tile (24 accumulators + 4 weights + 1 broadcast
// of 32 zmm), linear.cpp's pass over a scratch instead of a packed bf16 matrix.
constexpr int64_t kFewRows = 8;
constexpr int kTileRows = 6;
constexpr int kGroupPanels = 4;

struct Scratch {
  std::vector<__m512i> w;
  const uint8_t* group = nullptr;  // the panels the scratch holds (a thread reuses it)
};

template <int TYPE>
void unpack_group(const uint8_t* Wp, int64_t panel_bytes, int nr, int64_t nb, Scratch& s) {
  constexpr int64_t bb = kFormat<TYPE>.file_block * kPanel;
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j)
      dequant_block<TYPE>(Wp + j * panel_bytes + b * bb, s.w.data() + b * 16 * nr + j, nr);
}

// Rows x[0 .. MR) against the scratch's NR panels, stored to y (row stride N, nn columns).
template <int MR, int NR, typename OutT>
void scratch_tile(const c10::BFloat16* x, int64_t K, const Scratch& s,
                  const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  const int64_t steps = K / 2;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const __m512i* ws = s.w.data();
  for (int64_t t = 0; t < steps; ++t, ws += NR) {
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = (__m512bh)_mm512_load_si512(ws + j);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = x_pair(x + m * K + 2 * t);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, w[j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j)
      if (j * kPanel < nn)
        store_lanes(acc[m][j], bias ? bias + j * kPanel : nullptr,
                    static_cast<int>(std::min<int64_t>(kPanel, nn - j * kPanel)), y + m * N + j * kPanel);
}

// scratch_tile with MR = mr (1 .. R) rows.
template <int R, int NR, typename OutT>
void scratch_tile_rows(int mr, const c10::BFloat16* x, int64_t K, const Scratch& s,
                       const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  if constexpr (R > 1)
    if (mr < R) return scratch_tile_rows<R - 1, NR>(mr, x, K, s, bias, nn, y, N);
  scratch_tile<R, NR>(x, K, s, bias, nn, y, N);
}

template <int NR, typename OutT>
void scratch_rows(const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                  const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, M - m0));
    scratch_tile_rows<kTileRows, NR>(mr, x + m0 * K, K, s, bias, nn, y + m0 * N, N);
  }
}

template <typename OutT>
void scratch_any(int nr, const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                 const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  switch (nr) {
    case 1: scratch_rows<1>(x, M, K, s, bias, nn, y, N); break;
    case 2: scratch_rows<2>(x, M, K, s, bias, nn, y, N); break;
    case 3: scratch_rows<3>(x, M, K, s, bias, nn, y, N); break;
    default: scratch_rows<kGroupPanels>(x, M, K, s, bias, nn, y, N); break;
  }
}

// The many-rows path: work items are (panel group, chunk of rows); a thread's items come in
// group order, so it dequantises each of its groups once.
template <typename OutT>
void many_rows(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
               const c10::BFloat16* bias, OutT* y, int64_t N) {
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, panel_bytes = nb * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kGroupPanels - 1) / kGroupPanels;
  // Enough items to keep every thread busy, row chunks of at least 64 rows.
  const int64_t threads = omp_get_max_threads();
  const int64_t chunks =
      std::clamp<int64_t>((2 * threads + groups - 1) / groups, 1, (M + 63) / 64);
  const int64_t rows = (M + chunks - 1) / chunks;
#pragma omp parallel
  {
    thread_local Scratch s;
    s.w.resize(nb * 16 * kGroupPanels);
    s.group = nullptr;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < groups * chunks; ++item) {
      const int64_t g = item / chunks, r0 = (item % chunks) * rows;
      const int64_t p0 = g * kGroupPanels;
      const int nr = static_cast<int>(std::min<int64_t>(kGroupPanels, panels - p0));
      const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
      const uint8_t* group = Wp + p0 * panel_bytes;
      if (s.group != group) {
        switch (type) {
          case kQ4_0: unpack_group<kQ4_0>(group, panel_bytes, nr, nb, s); break;
          case kQ4_1: unpack_group<kQ4_1>(group, panel_bytes, nr, nb, s); break;
          default: unpack_group<kQ8_0>(group, panel_bytes, nr, nb, s); break;
        }
        s.group = group;
      }
      const int64_t mm = std::min(rows, M - r0);
      if (mm <= 0) continue;
      scratch_any(nr, x + r0 * K, mm, K, s, bias ? bias + n0 : nullptr, nn, y + r0 * N + n0, N);
    }
  }
}

#else
template <typename T>
constexpr bool kHasSimd = false;
template <typename T>
void simd_any(int, const T*, const float*, int64_t, const uint8_t*, int64_t, int, int, float*) {}
#endif

// float32 activations (and bf16 on CPUs without AVX512-BF16): each block of the nr panels is
// dequantised once (float32 weights for float32 x, bf16 for bf16 x), then every row runs
// linear.cpp's order over it: acc = fma(x, w, acc) per k (its AVX-512 float32 pass and its
// portable pass, both explicit fmas).
template <typename T>
void portable_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                   int mr, int nr, float* out) {
  using WT = std::conditional_t<std::is_same_v<T, float>, float, c10::BFloat16>;
  const Format f = format_of(type);
  const int64_t bb = f.file_block * kPanel, nb = K / kBlock;
  std::fill(out, out + kMaxMR * kMaxNR * kPanel, 0.0f);
  WT w[kPanel][kBlock];
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j) {
      dequant_block_portable<WT>(Wp + j * panel_bytes + b * bb, f, type, w);
      for (int m = 0; m < mr; ++m) {
        float* acc = out + (m * kMaxNR + j) * kPanel;
        for (int e = 0; e < kBlock; ++e) {
          const float xv = static_cast<float>(x[m * K + b * kBlock + e]);
          for (int l = 0; l < kPanel; ++l) {
            acc[l] = std::fma(xv, static_cast<float>(w[l][e]), acc[l]);
          }
        }
      }
    }
}

// The portable pass's order: SIMD float32 code where the CPU has AVX-512 or AVX2 + FMA
// (block_fma.h, the same bits), else the scalar loops above.
// `trusted`: a kQ4_1Exact weight (its blocks' constant terms checked when packed).
template <typename T>
void order_pass(int type, bool trusted, const T* x, int64_t K, const uint8_t* Wp,
                int64_t panel_bytes, int mr, int nr, float* out) {
#if defined(TGSERVE_BLOCK_FMA)
  const Format f = format_of(type);
  const auto run = [&](auto pass) {
    pass(x, K, Wp, panel_bytes, f.file_block, f.scales, mr, nr, kMaxNR, out);
  };
  switch (type) {
    case kQ4_0: return run(block_fma::pass<0, T>);
    case kQ4_1:
      return trusted ? run(block_fma::pass<1, T, true>) : run(block_fma::pass<1, T>);
    default: return run(block_fma::pass<2, T>);
  }
#else
  (void)trusted;
  portable_pass<T>(type, x, K, Wp, panel_bytes, mr, nr, out);
#endif
}

// y rows [0 .. mr) (N apart), columns [0 .. nn) = round(out + bias) in OutT, from a pass's
// out [kMaxMR][kMaxNR][16] (bf16: c10's nearest even, NaN -> 0x7FC0).
template <typename T, typename OutT>
void store_tile(const float* out, int mr, int64_t nn, const T* bias, OutT* y, int64_t N) {
  for (int m = 0; m < mr; ++m)
    for (int64_t c = 0; c < nn; c += kPanel) {
      const float* v = out + (m * kMaxNR + c / kPanel) * kPanel;
      const T* b = bias ? bias + c : nullptr;
      OutT* dst = y + m * N + c;
      const int count = static_cast<int>(std::min<int64_t>(kPanel, nn - c));
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
      store_lanes(_mm512_loadu_ps(v), b, count, dst);
#else
      for (int l = 0; l < count; ++l)
        dst[l] = static_cast<OutT>(v[l] + (b ? static_cast<float>(b[l]) : 0.0f));
#endif
    }
}

#if defined(TGSERVE_BLOCK_FMA)
static_assert(kMaxMR == block_fma::kFewRows);

// Many rows without the bf16 dot product (float32 activations; bf16 on CPUs without
// AVX512-BF16): each thread dequantises a group of 4 panels into float32 in linear.cpp's
// layout (block_fma::dequant_panels; bf16 activations: the weights rounded to bf16 first) and
// runs the dense kernel's 6-row tile over it (block_fma::dense_rows), walked by
// group_walk::walk. A lane's operations are the portable order's: batch invariance holds, and
// the bits are linear.cpp's over the `--dequantize` weights.
template <typename T, typename OutT>
void many_rows_fma(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                   OutT* y, int64_t N) {
  const Format f = format_of(type);
  const int64_t panel_bytes = K / kBlock * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kMaxNR - 1) / kMaxNR;
  // bf16 x as float32 once (exact), so the tile broadcasts float32 as the dense pass does.
  std::vector<float> x32;
  const float* xf = group_walk::float_rows(x, M, K, x32);
  thread_local AlignedScratch<float> w;  // the group's panels, [4][K][16]
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kMaxNR, panels - g * kMaxNR));
  };
  const auto fill = [&](int64_t g) {
    float* dst = w.resize(kMaxNR * K * kPanel);
    const uint8_t* group = Wp + g * kMaxNR * panel_bytes;
    const auto run = [&](auto dequant) {
      dequant(group, K, panel_bytes, f.file_block, f.scales, group_panels(g), dst);
    };
    switch (type) {
      case kQ4_0: return run(block_fma::dequant_panels<0, T>);
      case kQ4_1: return run(block_fma::dequant_panels<1, T>);
      default: return run(block_fma::dequant_panels<2, T>);
    }
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float out[kMaxMR * kMaxNR * kPanel];
    const int nr = group_panels(g);
    const int64_t n0 = g * kMaxNR * kPanel, nn = std::min(N - n0, nr * kPanel);
    block_fma::dense_rows(xf + m0 * K, K, K, w.data(), mr, nr, out, kMaxNR);
    store_tile<T, OutT>(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * N + n0, N);
  };
  group_walk::walk_float_rows(M, K, groups, fill, pass);
}
#endif

}  // namespace

int64_t block_bytes(int type) { return format_of(type).file_block; }

void pack_blocks(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp) {
  if (is_kquant_type(type)) return kquant_pack(raw, N, K, type, Wp);  // kquant_linear.cpp
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, bb = f.file_block * kPanel, panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = Wp + (p * nb + b) * bb;
      std::memset(dst, 0, bb);
      for (int l = 0; l < kPanel; ++l) {
        const int64_t n = p * kPanel + l;
        if (n >= N) continue;  // zero rows: d = m = 0
        const uint8_t* blk = raw + (n * nb + b) * f.file_block;
        std::memcpy(dst + 2 * l, blk, 2);                            // d
        if (f.has_min) std::memcpy(dst + 32 + 2 * l, blk + 2, 2);  // m
        for (int e = 0; e < kBlock; ++e) {
          int shift;
          const int64_t pos = packed_pos(type, l, e, &shift);
          const int q = file_q(blk, type, e);
          const int stored = type == kQ4_0 ? q + 8 : q;  // the nibble (or the int8 byte)
          dst[f.scales + pos] |= static_cast<uint8_t>((stored & (type == kQ8_0 ? 0xFF : 0xF)) << shift);
        }
      }
    }
}

// Unpacked rows, as gguf's dequantisation computes them (dequant: fl(fl(d * q) + m)).
void block_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T,
                float* out) {
  if (type == kQ4_1Exact) type = kQ4_1;
  if (is_kquant_type(type)) return kquant_rows(Wp, K, type, ids, T, out);
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, bb = f.file_block * kPanel;
#pragma omp parallel for schedule(static) if (T * K >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = ids[t] / kPanel;
    const int l = static_cast<int>(ids[t] % kPanel);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = Wp + (p * nb + b) * bb;
      uint16_t dh, mh = 0;
      std::memcpy(&dh, blk + 2 * l, 2);
      if (f.has_min) std::memcpy(&mh, blk + 32 + 2 * l, 2);
      const float d = half_to_float(dh), mn = half_to_float(mh);
      for (int e = 0; e < kBlock; ++e)
        out[t * K + b * kBlock + e] = dequant(d, mn, packed_q(blk + f.scales, type, l, e), f.has_min);
    }
  }
}

namespace {

// Panels [p0, p0 + nr) of the few-rows product for every row of x, in passes of kMaxMR rows
// (x32: x as float32 for the bf16 pair fmas, or null).
template <typename T, typename OutT>
void few_rows_group(int type, bool trusted, const T* x, const float* x32, int64_t M, int64_t K,
                    const uint8_t* Wp, int64_t panel_bytes, const T* bias, OutT* y, int64_t N,
                    int64_t p0, int nr) {
  const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
  alignas(64) float out[kMaxMR * kMaxNR * kPanel];
  for (int64_t m0 = 0; m0 < M; m0 += kMaxMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMaxMR, M - m0));
    if constexpr (kHasSimd<T>)
      simd_any<T>(type, x + m0 * K, x32 ? x32 + m0 * K : nullptr, K, Wp + p0 * panel_bytes,
                  panel_bytes, mr, nr, out);
    else
      order_pass<T>(type, trusted, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, mr, nr,
                    out);
    store_tile<T, OutT>(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * N + n0, N);
  }
}

// Panels per few-rows pass for M rows (fewer rows -> more panels per pass).
template <typename T>
int few_rows_nr(int64_t M) {
  int nr_max = M <= 2 ? kMaxNR : 2;
#if defined(TGSERVE_BLOCK_FMA)
  if constexpr (!kHasSimd<T>)
    nr_max = block_fma::few_rows_panels(
        static_cast<int>(std::min<int64_t>(M, block_fma::kFewRowsPerPass)));
#endif
  return nr_max;
}

// bf16 x as float32 (exact) for the pair fmas, where this CPU's vdpbf16ps is two fmas and
// rows share the dequantising (one row: vdpbf16ps, 5-10% faster there, one thread); else empty.
template <typename T>
std::vector<float> pair_rows(const T* x, int64_t M, int64_t K) {
  std::vector<float> x32;
#if defined(TGSERVE_BF16_PAIRS)
  if (kHasSimd<T> && M >= 2 && bf16_pairs::fmas_match_dpbf16()) {
    x32.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) x32[i] = static_cast<float>(x[i]);
  }
#else
  (void)x, (void)M, (void)K;
#endif
  return x32;
}

}  // namespace

template <typename T, typename OutT>
void block_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                  OutT* y, int64_t N) {
  const bool trusted = type == kQ4_1Exact;  // Q4_1's constant terms were checked when packed
  if (trusted) type = kQ4_1;
  if (is_kquant_type(type)) return kquant_linear<T, OutT>(x, M, K, Wp, type, bias, y, N);
  const Format f = format_of(type);
  const int64_t panel_bytes = K / kBlock * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (kHasSimd<T>) {
    if (M > kFewRows) return many_rows<OutT>(x, M, K, Wp, type, bias, y, N);
  }
#endif
#if defined(TGSERVE_BLOCK_FMA)
  if constexpr (!kHasSimd<T>) {
    if (M > kMaxMR) return many_rows_fma<T, OutT>(x, M, K, Wp, type, bias, y, N);
  }
#endif
  // Few rows (decode, a speculative verify), or no SIMD.
  const int nr_max = group_walk::balanced_panels(panels, few_rows_nr<T>(M), omp_get_max_threads());
  const int64_t groups = (panels + nr_max - 1) / nr_max;
  const std::vector<float> x32 = pair_rows(x, M, K);
  const float* x32p = x32.empty() ? nullptr : x32.data();
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * nr_max;
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, panels - p0));
    few_rows_group<T, OutT>(type, trusted, x, x32p, M, K, Wp, panel_bytes, bias, y, N, p0, nr);
  }
}

bool block_panels_type(int type) {
  return type == kQ4_0 || type == kQ4_1 || type == kQ8_0 || type == kQ4_1Exact;
}

template <typename T, typename OutT>
void block_linear_panels(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
                         const T* bias, OutT* y, int64_t N, int64_t p_begin, int64_t p_end) {
  const bool trusted = type == kQ4_1Exact;
  if (trusted) type = kQ4_1;
  const int64_t panel_bytes = K / kBlock * format_of(type).file_block * kPanel;
  const int nr_max = few_rows_nr<T>(M);
  const std::vector<float> x32 = pair_rows(x, M, K);
  const float* x32p = x32.empty() ? nullptr : x32.data();
  for (int64_t p0 = p_begin; p0 < p_end; p0 += nr_max) {
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, p_end - p0));
    few_rows_group<T, OutT>(type, trusted, x, x32p, M, K, Wp, panel_bytes, bias, y, N, p0, nr);
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                          \
  template void block_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                      OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE
template void block_linear_panels<float, float>(const float*, int64_t, int64_t, const uint8_t*,
                                                int, const float*, float*, int64_t, int64_t,
                                                int64_t);
template void block_linear_panels<c10::BFloat16, c10::BFloat16>(
    const c10::BFloat16*, int64_t, int64_t, const uint8_t*, int, const c10::BFloat16*,
    c10::BFloat16*, int64_t, int64_t, int64_t);

}  // namespace tgserve
