// GGUF Q5_0, Q5_1, Q4_K, Q5_K and Q6_K blocks as kquant_linear.cpp keeps them: the formats, the
// packed layout's constants, where an element, a scale and a min sit in a file block and in a
// packed one, and the helpers every pass shares (sub-block sums of x, the store of a pass's tile).
// Included by kquant_linear.cpp alone (its helpers share that file's anonymous namespace).
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
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

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

}  // namespace
}  // namespace tgserve
