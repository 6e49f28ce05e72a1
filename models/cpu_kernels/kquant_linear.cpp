// Linear layers over GGUF Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights kept as stored: the blocks
// are unpacked in registers, activations stay in their dtype, sums are float32 (block_linear.cpp
// does Q4_0 / Q4_1 / Q8_0 and dispatches these types here).
//
// Formats (ggml; a row of K weights is K / W blocks of W weights; q unsigned):
//   Q5_0 (W 32): fp16 d, 32-bit qh, 16 bytes of nibbles; q = nibble | bit << 4; w = d (q - 16).
//   Q5_1 (W 32): fp16 d, fp16 m, qh, nibbles; w = d q + m.
//   Q4_K (W 256): fp16 d, fp16 dmin, 12 bytes of 6-bit (sc, m) for 8 sub-blocks of 32, 128
//     bytes of nibbles; w = (d sc) q - (dmin m).   Q5_K: the same plus a 5th bit (32 bytes qh).
//   Q6_K (W 256): 128 bytes of low nibbles, 64 bytes of 2 high bits, 16 int8 scales of 16-wide
//     sub-blocks, fp16 d; w = (d sc) (q - 32).
//
// Packed layout (kquant_pack): rows are cut into panels of 16 (the last padded with zero rows);
// a panel stores its blocks in K order, each as [scales][nibble plane][high-bit planes]:
//   scales, lane l = row l of the panel: Q5_0 [16 d fp16]; Q5_1 [16 d][16 m]; Q4_K / Q5_K
//     [16 d][16 dmin][8 x 16 bytes: sc & 15 | (m & 15) << 4][4 x 16 bytes: byte (j % 4, l)
//     holds sub-block j's sc >> 4 | (m >> 4) << 2 in its low (j < 4) or high nibble];
//     Q6_K [16 d][16 x 16 int8 sc].
//   nibble plane: the W k as W / 2 k-pair steps lane-major (the vdpbf16ps operand, as
//     linear.cpp), two steps sharing 32 bytes: step 2t in the low nibbles, 2t + 1 in the high.
//   high planes (Q5: 1, Q6_K: 2): per step, per plane, 32 bits, bit 2l + i = bit 4 + plane of
//     lane l's pair element i (a mask register: nibble | 16 where set).
// A panel's block is 16 x the file's block bytes: resident bytes == the file's tensor bytes.
//
// Accumulation order of y[m, n] (one float32 lane, fixed by K alone): acc = 0; for each
// sub-block j in K order (32 wide; Q6_K 16 wide): dot = 0; for each k-pair step of j: dot += x
// . q (one vdpbf16ps; the integers, offsets applied, are exact in bf16); acc = fma(s_j, dot,
// acc) with s_j = d (Q5_0, Q5_1) or fl(d sc_j) (K types); then Q5_1: acc = fma(m, xsum_j, acc);
// Q4_K / Q5_K: acc = fma(-fl(dmin m_j), xsum_j, acc); xsum_j = sub-block j's x summed left to
// right. y = round(acc + bias[n]). The register tile, M, the thread and the other rows change
// which lanes run together, never a lane's sequence: batch invariance (issue #14) holds.
// float32 activations and CPUs without AVX512-BF16 run the portable order: dot = fma(x, q, dot)
// per element in float32 (x not rounded to bf16), as SIMD code (kquant_fma.h: AVX-512 or
// AVX2 + FMA) or plain loops.
#include "x86_intrinsics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"
#include "aligned_scratch.h"
#include "group_walk.h"
#include "kquant_fma.h"

namespace tgserve {
namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kSum = 32;  // xsum granularity: every type with a min has 32-wide sub-blocks
constexpr int kMaxMR = 4;
constexpr int kMaxNR = 4;
// More rows than this: unpack a group once per call (wide_linear, wide_fma). One thread, 960 x
// 768 Q4_K / Q6_K: the register passes ran 45-57 GFLOP/s at 4-8 rows, the group pass 59-68 at 9.
constexpr int64_t kWideM = 4;
// The same for float32 activations (and bf16 without AVX512-BF16): their few-rows passes run a
// register tile of up to 8 rows over each unpacked sub-block (kquant_fma::few_rows).
constexpr int kWideFmaM = 8;
// Few rows: each panel stream prefetches (into L2) the block this many bytes ahead, rounded up
// to whole blocks. Measured with bench.decode_layers on the 1B Q4_K_M file (quiet machine): the
// matrices of a token 35 -> 24-28 ms, the Q6_K LM head 11 -> 5.5-7 ms.
constexpr int64_t kPrefetchBytes = 8192;

struct KFormat {
  int width;       // weights per block (W)
  int sub;         // weights per scale
  int file_block;  // bytes of one row's block in the file
  int scales;      // bytes of a packed block's scales (16 rows)
  int hbits;       // bits above the nibble
  int offset;      // subtracted from q
  bool has_min;
};

constexpr KFormat kformat(int type) {
  switch (type) {
    case kQ5_0: return {32, 32, 22, 32, 1, 16, false};
    case kQ5_1: return {32, 32, 24, 64, 1, 0, true};
    case kQ4_K: return {256, 32, 144, 256, 0, 0, true};
    case kQ5_K: return {256, 32, 176, 256, 1, 0, true};
    case kQ6_K: return {256, 16, 210, 288, 2, 32, false};
    default: return {0, 0, 0, 0, 0, 0, false};
  }
}

inline float half_to_float(uint16_t h) { return static_cast<float>(c10::Half(h, c10::Half::from_bits())); }

inline float load_half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

// ---- the file's blocks ----

// Unsigned q of element e of a row's block in the file.
int file_q(const uint8_t* blk, int type, int e) {
  switch (type) {
    case kQ5_0:
    case kQ5_1: {
      const uint8_t* qs = blk + (type == kQ5_1 ? 8 : 6);
      uint32_t qh;
      std::memcpy(&qh, qs - 4, 4);
      const int nib = e < 16 ? qs[e] & 0xF : qs[e - 16] >> 4;
      return nib | ((qh >> e) & 1) << 4;
    }
    case kQ4_K:
    case kQ5_K: {  // sub-block j = e / 32: low (j even) or high nibbles of 32 bytes
      const int j = e / 32, l = e % 32;
      const uint8_t* qs = blk + (type == kQ5_K ? 48 : 16);
      const int nib = (qs[(j / 2) * 32 + l] >> ((j % 2) * 4)) & 0xF;
      return type == kQ5_K ? nib | ((blk[16 + l] >> j) & 1) << 4 : nib;
    }
    default: {  // Q6_K: halves of 128; within one, 32-groups g: ql (g odd: +32), shift g / 2
      const int h = e / 128, g = (e % 128) / 32, l = e % 32;
      const int nib = (blk[h * 64 + (g % 2) * 32 + l] >> ((g / 2) * 4)) & 0xF;
      return nib | ((blk[128 + h * 32 + l] >> (2 * g)) & 3) << 4;
    }
  }
}

// Sub-block j's 6-bit (scale, min) of a Q4_K / Q5_K block (ggml's get_scale_min_k4).
void file_scale_min(const uint8_t* blk, int j, int* sc, int* m) {
  const uint8_t* q = blk + 4;
  if (j < 4) {
    *sc = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *sc = (q[j + 4] & 0xF) | (q[j - 4] >> 6) << 4;
    *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
  }
}

// ---- the packed blocks (blk: one block of a panel) ----

inline int64_t nib_pos(int l, int e, int* shift) {
  const int s = e / 2;
  *shift = (s % 2) * 4;
  return (s / 2) * 32 + 2 * l + e % 2;
}

int packed_q(const uint8_t* blk, const KFormat& f, int l, int e) {
  int shift;
  const uint8_t* nib = blk + f.scales;
  int q = (nib[nib_pos(l, e, &shift)] >> shift) & 0xF;
  const uint8_t* hi = nib + 8 * f.width + (e / 2) * f.hbits * 4;
  for (int h = 0; h < f.hbits; ++h) {
    uint32_t bitsw;
    std::memcpy(&bitsw, hi + 4 * h, 4);
    q |= ((bitsw >> (2 * l + e % 2)) & 1) << (4 + h);
  }
  return q;
}

// Lane l's integer (sc, m) of sub-block j (K types).
void packed_scale_min(const uint8_t* blk, int type, int l, int j, int* sc, int* m) {
  if (type == kQ6_K) {
    *sc = static_cast<int8_t>(blk[32 + 16 * j + l]);
    *m = 0;
    return;
  }
  const int lo = blk[64 + 16 * j + l], hi = (blk[192 + 16 * (j % 4) + l] >> (4 * (j / 4))) & 0xF;
  *sc = (lo & 0xF) | (hi & 3) << 4;
  *m = (lo >> 4) | (hi >> 2) << 4;
}

// Lane l's scale s_j and min term (added: Q5_1 m, K types -fl(dmin m)) of sub-block j.
void lane_scales(const uint8_t* blk, int type, int l, int j, float* s, float* mt) {
  const float d = load_half(blk + 2 * l);
  *mt = 0.0f;
  if (type == kQ5_0 || type == kQ5_1) {
    *s = d;
    if (type == kQ5_1) *mt = load_half(blk + 32 + 2 * l);
    return;
  }
  int sc, m;
  packed_scale_min(blk, type, l, j, &sc, &m);
  *s = d * static_cast<float>(sc);
  if (type != kQ6_K) *mt = -(load_half(blk + 32 + 2 * l) * static_cast<float>(m));
}

template <typename T>
void sub_sums(const T* x, int64_t M, int64_t K, float* xsum) {
  const int64_t ns = K / kSum;
  for (int64_t m = 0; m < M; ++m)
    for (int64_t b = 0; b < ns; ++b) {
      float s = 0.0f;
      for (int64_t e = 0; e < kSum; ++e) s += static_cast<float>(x[m * K + b * kSum + e]);
      xsum[m * ns + b] = s;
    }
}

// y rows [0 .. mr) (ldy apart), columns [0 .. nn) = OutT(out + bias) from a pass's out
// [rows][kMaxNR][16].
template <typename T, typename OutT>
void store_out(const float* out, int mr, int64_t nn, const T* bias, OutT* y, int64_t ldy) {
  for (int m = 0; m < mr; ++m)
    for (int64_t c = 0; c < nn; ++c) {
      const float bv = bias ? static_cast<float>(bias[c]) : 0.0f;
      y[m * ldy + c] = static_cast<OutT>(out[(m * kMaxNR + c / kPanel) * kPanel + c % kPanel] + bv);
    }
}

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
template <typename T>
constexpr bool kHasSimd = false;
template <typename T>
void simd_any(int, const T*, int64_t, const uint8_t*, int64_t, const float*, int, int, float*) {}
template <typename T, typename OutT>
void wide_any(int, const T*, int64_t, int64_t, const uint8_t*, const T*, OutT*, int64_t, int64_t,
              const float*) {}
#endif

// The same per-lane order in plain loops (float32 activations, CPUs without AVX512-BF16).
template <typename T>
void portable_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                   const float* xsum, int mr, int nr, float* out) {
  const KFormat f = kformat(type);
  const int64_t bb = f.file_block * kPanel, nb = K / f.width, ns = K / kSum;
  for (int m = 0; m < mr; ++m)
    for (int n = 0; n < nr; ++n) {
      float acc[kPanel] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        for (int j = 0; j < f.width / f.sub; ++j) {
          const int64_t e0 = b * f.width + j * f.sub;
          for (int l = 0; l < kPanel; ++l) {
            float dot = 0.0f, s, mt;
            for (int e = 0; e < f.sub; ++e)  // an explicit fma: kquant_fma.h runs the same
              dot = std::fma(static_cast<float>(x[m * K + e0 + e]),
                             static_cast<float>(packed_q(blk, f, l, j * f.sub + e) - f.offset), dot);
            lane_scales(blk, type, l, j, &s, &mt);
            acc[l] = std::fma(s, dot, acc[l]);
            if (f.has_min) acc[l] = std::fma(mt, xsum[m * ns + e0 / kSum], acc[l]);
          }
        }
      }
      std::copy(acc, acc + kPanel, out + (m * kMaxNR + n) * kPanel);
    }
}

#if defined(TGSERVE_KQUANT_FMA)
// kquant_fma's name for a type's scales.
constexpr int fma_kind(int type) {
  namespace kf = kquant_fma;
  return type == kQ5_0 ? kf::kD : type == kQ5_1 ? kf::kDMin : type == kQ6_K ? kf::kInt8Scale : kf::kSixBit;
}

// kquant_fma::pass for one type, its shape taken from kformat.
template <int TYPE, typename T>
void fma_pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, const float* xsum,
              int mr, int nr, float* out) {
  namespace kf = kquant_fma;
  constexpr KFormat f = kformat(TYPE);
  constexpr int kind = fma_kind(TYPE);
  kf::pass<kind, f.width, f.sub, f.scales, f.hbits, f.offset, T>(
      x, K, Wp, panel_bytes, f.file_block, xsum, mr, nr, kMaxNR, out);
}

// Many rows without the bf16 dot product (float32 activations; bf16 on CPUs without
// AVX512-BF16): each thread unpacks a group of 4 panels once (kquant_fma::unpack_panels) and
// runs 6-row tiles over it (kquant_fma::tile_rows), walked by group_walk::walk: the portable
// order's operations per lane, so the bits are those of the few-rows passes.
template <int TYPE, typename T, typename OutT>
void wide_fma(const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y,
              int64_t N, int64_t ldy, const float* xsum) {
  namespace kf = kquant_fma;
  constexpr KFormat f = kformat(TYPE);
  constexpr int kind = fma_kind(TYPE);
  const int64_t panel_bytes = K / f.width * f.file_block * kPanel, ns = K / kSum;
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (panels + kMaxNR - 1) / kMaxNR;
  std::vector<float> x32;  // bf16 x as float32 once (exact)
  const float* xf = group_walk::float_rows(x, M, K, x32);
  thread_local AlignedScratch<float> unpacked;  // q [4][K][16], then s and mt [4][K / sub][16]
  const int64_t q_floats = kMaxNR * K * kPanel, s_floats = kMaxNR * (K / f.sub) * kPanel;
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kMaxNR, panels - g * kMaxNR));
  };
  const auto fill = [&](int64_t g) {
    float* q = unpacked.resize(q_floats + 2 * s_floats);
    kf::unpack_panels<kind, f.width, f.sub, f.scales, f.hbits, f.offset>(
        Wp + g * kMaxNR * panel_bytes, K, panel_bytes, f.file_block, group_panels(g), q,
        q + q_floats, q + q_floats + s_floats);
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float out[group_walk::kPassRows * kMaxNR * kPanel];
    const int nr = group_panels(g);
    const float* q = unpacked.data();
    kf::tile_rows<kind, f.sub>(xf + m0 * K, K, K, q, q + q_floats, q + q_floats + s_floats,
                               xsum ? xsum + m0 * ns : nullptr, ns, mr, nr, out, kMaxNR);
    const int64_t n0 = g * kMaxNR * kPanel;
    store_out(out, mr, std::min(N - n0, nr * kPanel), bias ? bias + n0 : nullptr, y + m0 * ldy + n0, ldy);
  };
  group_walk::walk_float_rows(M, K, groups, fill, pass);
}

template <typename T, typename OutT>
void wide_fma_any(int type, const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias,
                  OutT* y, int64_t N, int64_t ldy, const float* xsum) {
  switch (type) {
    case kQ5_0: return wide_fma<kQ5_0, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ5_1: return wide_fma<kQ5_1, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ4_K: return wide_fma<kQ4_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ5_K: return wide_fma<kQ5_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    default: return wide_fma<kQ6_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
  }
}
#endif

// The portable pass's order: SIMD float32 code where the CPU has AVX-512 or AVX2 + FMA
// (kquant_fma.h, the same bits), else the scalar loops above.
template <typename T>
void order_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                const float* xsum, int mr, int nr, float* out) {
#if defined(TGSERVE_KQUANT_FMA)
  switch (type) {
    case kQ5_0: return fma_pass<kQ5_0, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ5_1: return fma_pass<kQ5_1, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ4_K: return fma_pass<kQ4_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ5_K: return fma_pass<kQ5_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    default: return fma_pass<kQ6_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
  }
#else
  portable_pass<T>(type, x, K, Wp, panel_bytes, xsum, mr, nr, out);
#endif
}

}  // namespace

bool is_kquant_type(int type) { return type == kMixedBlocks || kformat(type).width > 0; }

int64_t block_width(int type) {
  if (type == kMixedBlocks) return 256;  // the widest of its parts' (each part checks its own)
  if (is_kquant_type(type)) return kformat(type).width;
  return block_bytes(type) > 0 ? 32 : 0;
}

int64_t row_bytes(int type, int64_t K) {
  const int64_t w = block_width(type);
  if (w == 0 || type == kMixedBlocks || K <= 0 || K % w) return 0;
  return K / w * (is_kquant_type(type) ? kformat(type).file_block : block_bytes(type));
}

void kquant_pack(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp) {
  const KFormat f = kformat(type);
  const int64_t nb = K / f.width, bb = f.file_block * kPanel, panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = Wp + (p * nb + b) * bb;
      uint8_t* nib = dst + f.scales;
      uint8_t* hi = nib + 8 * f.width;
      std::memset(dst, 0, bb);
      for (int l = 0; l < kPanel; ++l) {
        const int64_t n = p * kPanel + l;
        if (n >= N) continue;  // zero rows: zero scales
        const uint8_t* blk = raw + (n * nb + b) * f.file_block;
        if (type == kQ6_K) {
          std::memcpy(dst + 2 * l, blk + 208, 2);
          for (int j = 0; j < 16; ++j) dst[32 + 16 * j + l] = blk[192 + j];
        } else {
          std::memcpy(dst + 2 * l, blk, 2);                                         // d
          if (f.has_min) std::memcpy(dst + 32 + 2 * l, blk + 2, 2);                // m / dmin
          for (int j = 0; f.width == 256 && j < 8; ++j) {
            int sc, m;
            file_scale_min(blk, j, &sc, &m);
            dst[64 + 16 * j + l] = static_cast<uint8_t>((sc & 0xF) | (m & 0xF) << 4);
            dst[192 + 16 * (j % 4) + l] |= static_cast<uint8_t>(((sc >> 4) | (m >> 4) << 2) << (4 * (j / 4)));
          }
        }
        for (int e = 0; e < f.width; ++e) {
          const int q = file_q(blk, type, e);
          int shift;
          nib[nib_pos(l, e, &shift)] |= static_cast<uint8_t>((q & 0xF) << shift);
          for (int h = 0; h < f.hbits; ++h) {
            const int bit = (e / 2) * f.hbits * 32 + h * 32 + 2 * l + e % 2;
            hi[bit / 8] |= static_cast<uint8_t>(((q >> (4 + h)) & 1) << (bit % 8));
          }
        }
      }
    }
}

// Unpacked rows, as gguf's dequantisation computes them: fl(fl(s q) + m) or fl(fl(s q) - fl(dmin
// m)), no fused multiply-add (the empty asm keeps the compiler from contracting the roundings).
void kquant_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T, float* out) {
  if (type == kMixedBlocks) return mixed_rows(Wp, K, ids, T, out);  // mixed_blocks.cpp
  const KFormat f = kformat(type);
  const int64_t nb = K / f.width, bb = f.file_block * kPanel;
#pragma omp parallel for schedule(static) if (T * K >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = ids[t] / kPanel;
    const int l = static_cast<int>(ids[t] % kPanel);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = Wp + (p * nb + b) * bb;
      for (int e = 0; e < f.width; ++e) {
        float s, mt;
        lane_scales(blk, type, l, e / f.sub, &s, &mt);
        float v = s * static_cast<float>(packed_q(blk, f, l, e) - f.offset);
        asm volatile("" : "+x"(v), "+x"(mt));
        out[t * K + b * f.width + e] = f.has_min ? v + mt : v;  // mt = -fl(dmin m): v - fl(dmin m)
      }
    }
  }
}

template <typename T, typename OutT>
void kquant_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                   OutT* y, int64_t N) {
  if (type == kMixedBlocks) return mixed_linear<T, OutT>(x, M, K, Wp, bias, y, N);
  kquant_linear_ld<T, OutT>(x, M, K, Wp, type, bias, y, N, N);
}

template <typename T, typename OutT>
void kquant_linear_ld(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                      OutT* y, int64_t N, int64_t ldy) {
  const KFormat f = kformat(type);
  const int64_t panel_bytes = K / f.width * f.file_block * kPanel, ns = K / kSum;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  std::vector<float> xsum(f.has_min ? M * ns : 0);
  if (f.has_min) sub_sums(x, M, K, xsum.data());
  if (kHasSimd<T> && M > kWideM)
    return wide_any<T, OutT>(type, x, M, K, Wp, bias, y, N, ldy, f.has_min ? xsum.data() : nullptr);
  // Tile: few rows -> more panels per pass (independent chains); many rows -> more rows.
  int rows_per_pass = kMaxMR, nr_max = M <= 2 ? kMaxNR : 2;
#if defined(TGSERVE_KQUANT_FMA)
  if (!kHasSimd<T>) {
    if (M > kWideFmaM)
      return wide_fma_any<T, OutT>(type, x, M, K, Wp, bias, y, N, ldy,
                                   f.has_min ? xsum.data() : nullptr);
    rows_per_pass = kWideFmaM;
    nr_max = kquant_fma::few_rows_panels(
        static_cast<int>(std::min<int64_t>(M, kquant_fma::kFewRowsPerPass)));
  }
#endif
  nr_max = group_walk::balanced_panels(panels, nr_max, omp_get_max_threads());
  const int64_t groups = (panels + nr_max - 1) / nr_max;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * nr_max;
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, panels - p0));
    const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
    alignas(64) float out[kWideFmaM * kMaxNR * kPanel];
    for (int64_t m0 = 0; m0 < M; m0 += rows_per_pass) {
      const int mr = static_cast<int>(std::min<int64_t>(rows_per_pass, M - m0));
      const float* xs = f.has_min ? xsum.data() + m0 * ns : nullptr;
      if constexpr (kHasSimd<T>)
        simd_any<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      else
        order_pass<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      store_out(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * ldy + n0, ldy);
    }
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                            \
  template void kquant_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*,  \
                                       OutT*, int64_t);                                            \
  template void kquant_linear_ld<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                          OutT*, int64_t, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
