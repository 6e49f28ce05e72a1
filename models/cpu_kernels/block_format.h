// GGUF block formats (Q4_0, Q4_1, Q8_0) as block_linear.cpp keeps them: the constants of the
// packed layout, where an element sits in a file block and in a packed one, and the reference
// dequantisation of one weight (gguf's two float32 roundings). Included by block_linear.cpp
// alone (its helpers share that file's anonymous namespace).
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
#pragma once

#include <c10/util/Half.h>

#include <cstdint>
#include <cstring>

#include "kernels.h"

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

}  // namespace
}  // namespace tgserve
