// Linear layers over GGUF block-quantised weights kept as stored (Q4_0, Q4_1, Q8_0): the
// blocks are unpacked in registers, activations stay in their dtype, sums are float32.
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
// Accumulation order of y[m, n] (one float32 lane, fixed by K alone, as in linear.cpp): acc =
// 0; for each block b in order: dot = 0; for each step s = 0..15: dot += x[m, pair s] . q[n,
// pair s] (one vdpbf16ps; the integers are exact in bf16); acc = fma(d[n, b], dot, acc); Q4_1:
// acc = fma(m[n, b], xsum[m, b], acc), xsum = the block's 32 x summed left to right. y =
// round(acc + bias[n]). The register tile, M, the thread and the other rows change which lanes
// run together, never a lane's sequence: batch invariance (issue #14) holds as for linear.cpp.
// float32 activations and CPUs without AVX512-BF16 run the portable pass: the same order, per
// lane, in plain loops (x * q in float32, not rounded to bf16).
//
// Two SIMD paths, one order. Few rows (M <= 8, decode): each pass unpacks its blocks in
// registers (the weights are read once; unpacking is cheap next to streaming them). Many rows:
// unpacking per 4-row pass would repeat for every pass, so a thread unpacks a group of 3 panels
// once into a bf16 scratch (L2-sized) and runs all its rows over it. Per (row, panel, block) both
// cost 16 vdpbf16ps + 1 fma (Q4_1: 2), so at large M the kernel runs at ~16/17 (16/18) of the
// dense bf16 kernel's rate on the same FMA units, while streaming a third of its bytes.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include <omp.h>

#include "kernels.h"

namespace tgserve {
namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kBlock = 32;
constexpr int kMaxMR = 4;
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
    case kQ4_1: return {20, 64, true};
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

// xsum [M, K / 32]: each block's 32 activations summed left to right in float32 (Q4_1's min).
template <typename T>
void block_sums(const T* x, int64_t M, int64_t K, float* xsum) {
  const int64_t nb = K / kBlock;
#pragma omp parallel for schedule(static) if (M * K >= 65536)
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < nb; ++b) {
      float s = 0.0f;
      for (int64_t e = 0; e < kBlock; ++e) s += static_cast<float>(x[m * K + b * kBlock + e]);
      xsum[m * nb + b] = s;
    }
}

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)

template <typename T>
constexpr bool kHasSimd = std::is_same_v<T, c10::BFloat16>;

// bf16 bit patterns of the nibble values, indexed by nibble (vpermw's table, 32 words).
inline __m512i nibble_table(int type) {
  alignas(64) uint16_t t[32];
  for (int i = 0; i < 32; ++i) {
    const float v = static_cast<float>((i & 0xF) - (type == kQ4_0 ? 8 : 0));
    uint32_t bits;
    std::memcpy(&bits, &v, 4);
    t[i] = static_cast<uint16_t>(bits >> 16);  // exact: small integers
  }
  return _mm512_load_si512(t);
}

inline __m512bh widen_int8(const uint8_t* w) {  // 32 int8 -> 32 bf16, exact
  const __m512 lo = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)w)));
  const __m512 hi =
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + 16))));
  return _mm512_cvtne2ps_pbh(hi, lo);
}

inline __m512bh x_pair(const c10::BFloat16* x) {
  int32_t pair;
  std::memcpy(&pair, x, 4);
  return (__m512bh)_mm512_set1_epi32(pair);
}

// Rows x[0 .. MR) against panels [0 .. NR) from `Wp` (panel stride `panel_bytes`).
template <int MR, int NR, int TYPE>
void simd_pass(const c10::BFloat16* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
               const float* xsum, float* out) {
  constexpr Format f = TYPE == kQ4_0 ? Format{18, 32, false}
                       : TYPE == kQ4_1 ? Format{20, 64, true}
                                       : Format{34, 32, false};
  constexpr int64_t bb = f.file_block * kPanel;
  const int64_t nb = K / kBlock;
  const __m512i table = nibble_table(TYPE), low = _mm512_set1_epi16(0xF);
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m512 dot[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NR; ++j) dot[m][j] = _mm512_setzero_ps();
    const c10::BFloat16* xb = x + b * kBlock;
    if constexpr (TYPE == kQ8_0) {
      for (int s = 0; s < 16; ++s) {
        __m512bh w[NR];
        for (int j = 0; j < NR; ++j) w[j] = widen_int8(Wp + j * panel_bytes + b * bb + f.scales + s * 32);
        for (int m = 0; m < MR; ++m) {
          const __m512bh xv = x_pair(xb + m * K + 2 * s);
          for (int j = 0; j < NR; ++j) dot[m][j] = _mm512_dpbf16_ps(dot[m][j], xv, w[j]);
        }
      }
    } else {
      for (int t = 0; t < 8; ++t) {  // steps 2t (low nibbles) and 2t + 1 (high nibbles)
        __m512bh w0[NR], w1[NR];
        for (int j = 0; j < NR; ++j) {
          const __m512i bytes = _mm512_cvtepu8_epi16(
              _mm256_loadu_si256((const __m256i*)(Wp + j * panel_bytes + b * bb + f.scales + t * 32)));
          w0[j] = (__m512bh)_mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), table);
          w1[j] = (__m512bh)_mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
        }
        for (int m = 0; m < MR; ++m) {
          const __m512bh x0 = x_pair(xb + m * K + 4 * t), x1 = x_pair(xb + m * K + 4 * t + 2);
          for (int j = 0; j < NR; ++j) {
            dot[m][j] = _mm512_dpbf16_ps(dot[m][j], x0, w0[j]);
            dot[m][j] = _mm512_dpbf16_ps(dot[m][j], x1, w1[j]);
          }
        }
      }
    }
    for (int j = 0; j < NR; ++j) {
      const uint8_t* blk = Wp + j * panel_bytes + b * bb;
      const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)blk));
      for (int m = 0; m < MR; ++m) acc[m][j] = _mm512_fmadd_ps(d, dot[m][j], acc[m][j]);
      if constexpr (f.has_min) {
        const __m512 mn = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32)));
        for (int m = 0; m < MR; ++m)
          acc[m][j] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xsum[m * nb + b]), acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) _mm512_storeu_ps(out + (m * kMaxNR + j) * kPanel, acc[m][j]);
}

template <int MR, int NR>
void simd_type(int type, const c10::BFloat16* x, int64_t K, const uint8_t* Wp, int64_t pb,
               const float* xs, float* out) {
  switch (type) {
    case kQ4_0: simd_pass<MR, NR, kQ4_0>(x, K, Wp, pb, xs, out); break;
    case kQ4_1: simd_pass<MR, NR, kQ4_1>(x, K, Wp, pb, xs, out); break;
    default: simd_pass<MR, NR, kQ8_0>(x, K, Wp, pb, xs, out); break;
  }
}

template <int NR>
void simd_rows(int type, const c10::BFloat16* x, int64_t K, const uint8_t* Wp, int64_t pb,
               const float* xs, int mr, float* out) {
  switch (mr) {
    case 1: simd_type<1, NR>(type, x, K, Wp, pb, xs, out); break;
    case 2: simd_type<2, NR>(type, x, K, Wp, pb, xs, out); break;
    case 3: simd_type<3, NR>(type, x, K, Wp, pb, xs, out); break;
    default: simd_type<4, NR>(type, x, K, Wp, pb, xs, out); break;
  }
}

template <typename T>
void simd_any(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t pb, const float* xs,
              int mr, int nr, float* out) {
  if constexpr (kHasSimd<T>) {
    switch (nr) {
      case 1: simd_rows<1>(type, x, K, Wp, pb, xs, mr, out); break;
      case 2: simd_rows<2>(type, x, K, Wp, pb, xs, mr, out); break;
      case 3: simd_rows<3>(type, x, K, Wp, pb, xs, mr, out); break;
      default: simd_rows<4>(type, x, K, Wp, pb, xs, mr, out); break;
    }
  }
}


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

// Many rows (M > kFewRows): a thread unpacks a group of kGroupPanels panels once into a bf16
// scratch, w [nb][16 steps][nr panels] x 32 bf16 (the vdpbf16ps operand) and the scales as
// float32, d / mn [nb][nr][16], then runs every row over it with a 4-row x 3-panel register
// tile (12 accumulators + 12 block dots + 3 weights + 1 broadcast of 32 zmm). Each lane runs
// the same sequence as simd_pass: the bits equal the few-rows path's.
constexpr int64_t kFewRows = 8;
constexpr int kTileRows = 4;
constexpr int kGroupPanels = 3;

struct Scratch {
  std::vector<__m512i> w;
  std::vector<float> d, mn;
  const uint8_t* group = nullptr;  // the panels the scratch holds (a thread reuses it)
};

template <int TYPE>
void unpack_group(const uint8_t* Wp, int64_t panel_bytes, int nr, int64_t nb, Scratch& s) {
  constexpr Format f = TYPE == kQ4_0 ? Format{18, 32, false}
                       : TYPE == kQ4_1 ? Format{20, 64, true}
                                       : Format{34, 32, false};
  constexpr int64_t bb = f.file_block * kPanel;
  const __m512i table = nibble_table(TYPE), low = _mm512_set1_epi16(0xF);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j) {
      const uint8_t* blk = Wp + j * panel_bytes + b * bb;
      const int64_t at = (b * nr + j) * kPanel;
      _mm512_storeu_ps(s.d.data() + at, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)blk)));
      if constexpr (f.has_min)
        _mm512_storeu_ps(s.mn.data() + at,
                         _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i*)(blk + 32))));
      __m512i* w = s.w.data() + b * 16 * nr + j;  // step t at w[t * nr]
      const uint8_t* q = blk + f.scales;
      if constexpr (TYPE == kQ8_0) {
        for (int t = 0; t < 16; ++t) w[t * nr] = (__m512i)widen_int8(q + t * 32);
      } else {
        for (int t = 0; t < 8; ++t) {
          const __m512i bytes = _mm512_cvtepu8_epi16(_mm256_loadu_si256((const __m256i*)(q + t * 32)));
          w[2 * t * nr] = _mm512_permutexvar_epi16(_mm512_and_si512(bytes, low), table);
          w[(2 * t + 1) * nr] = _mm512_permutexvar_epi16(_mm512_srli_epi16(bytes, 4), table);
        }
      }
    }
}

// Rows x[0 .. MR) against the scratch's NR panels, stored to y (row stride N, nn columns).
template <int MR, int NR, bool MIN, typename OutT>
void scratch_tile(const c10::BFloat16* x, int64_t K, const Scratch& s, const float* xsum,
                  const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  const int64_t nb = K / kBlock;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const __m512i* wb = s.w.data();
  const float* d = s.d.data();
  const float* mn = s.mn.data();
  for (int64_t b = 0; b < nb; ++b, wb += 16 * NR, d += NR * kPanel, mn += NR * kPanel) {
    __m512 dot[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int j = 0; j < NR; ++j) dot[m][j] = _mm512_setzero_ps();
    const c10::BFloat16* xb = x + b * kBlock;
    for (int t = 0; t < 16; ++t) {
      __m512bh w[NR];
      for (int j = 0; j < NR; ++j) w[j] = (__m512bh)_mm512_load_si512(wb + t * NR + j);
      for (int m = 0; m < MR; ++m) {
        const __m512bh xv = x_pair(xb + m * K + 2 * t);
        for (int j = 0; j < NR; ++j) dot[m][j] = _mm512_dpbf16_ps(dot[m][j], xv, w[j]);
      }
    }
    for (int j = 0; j < NR; ++j) {
      const __m512 dv = _mm512_loadu_ps(d + j * kPanel);
      for (int m = 0; m < MR; ++m) acc[m][j] = _mm512_fmadd_ps(dv, dot[m][j], acc[m][j]);
      if constexpr (MIN) {
        const __m512 mv = _mm512_loadu_ps(mn + j * kPanel);
        for (int m = 0; m < MR; ++m)
          acc[m][j] = _mm512_fmadd_ps(mv, _mm512_set1_ps(xsum[m * nb + b]), acc[m][j]);
      }
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j)
      if (j * kPanel < nn)
        store_lanes(acc[m][j], bias ? bias + j * kPanel : nullptr,
                    static_cast<int>(std::min<int64_t>(kPanel, nn - j * kPanel)), y + m * N + j * kPanel);
}

// scratch_tile with MR = mr (1 .. R) rows.
template <int R, int NR, bool MIN, typename OutT>
void scratch_tile_rows(int mr, const c10::BFloat16* x, int64_t K, const Scratch& s,
                       const float* xsum, const c10::BFloat16* bias, int64_t nn, OutT* y,
                       int64_t N) {
  if constexpr (R > 1)
    if (mr < R) return scratch_tile_rows<R - 1, NR, MIN>(mr, x, K, s, xsum, bias, nn, y, N);
  scratch_tile<R, NR, MIN>(x, K, s, xsum, bias, nn, y, N);
}

template <int NR, bool MIN, typename OutT>
void scratch_rows(const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                  const float* xsum, const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  const int64_t nb = K / kBlock;
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, M - m0));
    scratch_tile_rows<kTileRows, NR, MIN>(mr, x + m0 * K, K, s, MIN ? xsum + m0 * nb : nullptr,
                                          bias, nn, y + m0 * N, N);
  }
}

template <bool MIN, typename OutT>
void scratch_any(int nr, const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                 const float* xsum, const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  switch (nr) {
    case 1: scratch_rows<1, MIN>(x, M, K, s, xsum, bias, nn, y, N); break;
    case 2: scratch_rows<2, MIN>(x, M, K, s, xsum, bias, nn, y, N); break;
    default: scratch_rows<kGroupPanels, MIN>(x, M, K, s, xsum, bias, nn, y, N); break;
  }
}

// The many-rows path: work items are (panel group, chunk of rows); a thread's items come in
// group order, so it unpacks each of its groups once.
template <typename OutT>
void many_rows(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
               const c10::BFloat16* bias, const float* xsum, OutT* y, int64_t N) {
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
    s.d.resize(nb * kGroupPanels * kPanel);
    s.mn.resize(f.has_min ? nb * kGroupPanels * kPanel : 0);
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
      const float* xs = f.has_min ? xsum + r0 * nb : nullptr;
      const c10::BFloat16* bn = bias ? bias + n0 : nullptr;
      if (f.has_min)
        scratch_any<true>(nr, x + r0 * K, mm, K, s, xs, bn, nn, y + r0 * N + n0, N);
      else
        scratch_any<false>(nr, x + r0 * K, mm, K, s, xs, bn, nn, y + r0 * N + n0, N);
    }
  }
}

#else
template <typename T>
constexpr bool kHasSimd = false;
template <typename T>
void simd_any(int, const T*, int64_t, const uint8_t*, int64_t, const float*, int, int, float*) {}
#endif

// The same per-lane order in plain loops (float32 activations, CPUs without AVX512-BF16).
template <typename T>
void portable_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                   const float* xsum, int mr, int nr, float* out) {
  const Format f = format_of(type);
  const int64_t bb = f.file_block * kPanel, nb = K / kBlock;
  for (int m = 0; m < mr; ++m)
    for (int j = 0; j < nr; ++j) {
      float acc[kPanel] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = Wp + j * panel_bytes + b * bb;
        const float* xb = nullptr;
        float xv[kBlock];
        for (int e = 0; e < kBlock; ++e) xv[e] = static_cast<float>(x[m * K + b * kBlock + e]);
        xb = xv;
        for (int l = 0; l < kPanel; ++l) {
          float dot = 0.0f;
          for (int e = 0; e < kBlock; ++e) dot += xb[e] * static_cast<float>(packed_q(blk + f.scales, type, l, e));
          uint16_t d, mn;
          std::memcpy(&d, blk + 2 * l, 2);
          acc[l] = std::fma(half_to_float(d), dot, acc[l]);
          if (f.has_min) {
            std::memcpy(&mn, blk + 32 + 2 * l, 2);
            acc[l] = std::fma(half_to_float(mn), xsum[m * nb + b], acc[l]);
          }
        }
      }
      std::copy(acc, acc + kPanel, out + (m * kMaxNR + j) * kPanel);
    }
}

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

// Unpacked rows, as gguf's dequantisation computes them: fl(fl(d * q) + m), no fused multiply-add
// (the empty asm keeps the compiler from contracting the two roundings into one).
void block_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T,
                float* out) {
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
      for (int e = 0; e < kBlock; ++e) {
        float v = d * static_cast<float>(packed_q(blk + f.scales, type, l, e));
        asm volatile("" : "+x"(v));
        out[t * K + b * kBlock + e] = f.has_min ? v + mn : v;
      }
    }
  }
}

template <typename T, typename OutT>
void block_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                  OutT* y, int64_t N) {
  if (is_kquant_type(type)) return kquant_linear<T, OutT>(x, M, K, Wp, type, bias, y, N);
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, panel_bytes = nb * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  std::vector<float> xsum(f.has_min ? M * nb : 0);
  if (f.has_min) block_sums(x, M, K, xsum.data());
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (kHasSimd<T>) {
    if (M > kFewRows) return many_rows<OutT>(x, M, K, Wp, type, bias, xsum.data(), y, N);
  }
#endif
  // Few rows (decode): blocks unpacked in registers. Tile: fewer rows -> more panels per pass.
  const int nr_max = M <= 2 ? kMaxNR : 2;
  const int64_t groups = (panels + nr_max - 1) / nr_max;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * nr_max;
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, panels - p0));
    const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
    alignas(64) float out[kMaxMR * kMaxNR * kPanel];
    for (int64_t m0 = 0; m0 < M; m0 += kMaxMR) {
      const int mr = static_cast<int>(std::min<int64_t>(kMaxMR, M - m0));
      const float* xs = f.has_min ? xsum.data() + m0 * nb : nullptr;
      if constexpr (kHasSimd<T>)
        simd_any<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      else
        portable_pass<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      for (int m = 0; m < mr; ++m)
        for (int64_t c = 0; c < nn; c += kPanel) {
          const float* v = out + (m * kMaxNR + c / kPanel) * kPanel;
          const T* b = bias ? bias + n0 + c : nullptr;
          OutT* dst = y + (m0 + m) * N + n0 + c;
          const int count = static_cast<int>(std::min<int64_t>(kPanel, nn - c));
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
          if constexpr (kHasSimd<T>) {
            store_lanes(_mm512_load_ps(v), b, count, dst);
            continue;
          }
#endif
          for (int l = 0; l < count; ++l)
            dst[l] = static_cast<OutT>(v[l] + (b ? static_cast<float>(b[l]) : 0.0f));
        }
    }
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                          \
  template void block_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                      OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
