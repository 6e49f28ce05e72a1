// kquant_linear.cpp's portable order as SIMD float32 code (simd16.h: AVX-512, or AVX2 + FMA):
// float32 activations everywhere, bfloat16 on CPUs without AVX512-BF16. Included by
// kquant_linear.cpp only.
//
// The portable pass unpacks every q with scalar code, one lane and one element at a time. Here
// a sub-block of a panel is unpacked 16 lanes at a time into float32 q - offset values (exact:
// small integers), and each lane runs the portable pass's operations in its order: dot = 0;
// for each element e of the sub-block: dot = fma(x[e], q[e], dot); acc = fma(s_j, dot, acc);
// then the min term (Q5_1: acc = fma(m, xsum_j, acc); Q4_K / Q5_K: acc = fma(-fl(dmin m_j),
// xsum_j, acc), written as fnmadd of fl(dmin m_j)). Scales as lane_scales computes them.
//
// Packed block (see kquant_linear.cpp): [scales][nibble plane][high-bit planes]; element e of
// lane l is step s = e / 2, pair element i = e % 2: its nibble is byte 2l + i of the 32-byte row
// s / 2 (low nibble for even s), its high bit h is bit 2l + i of the 32-bit word h of step s.
#pragma once

#include "simd16.h"

#if defined(TGSERVE_SIMD16)
#define TGSERVE_KQUANT_FMA 1

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tgserve::kquant_fma {

using simd16::VF;
using simd16::VI;
namespace v = simd16;

using simd16::kLanes;

// Which scales a type has: Q5_0 (s = d), Q5_1 (s = d, + m), Q4_K / Q5_K (6-bit sc and m of
// 32-wide sub-blocks), Q6_K (int8 sc of 16-wide sub-blocks).
enum Kind { kD = 0, kDMin = 1, kSixBit = 2, kInt8Scale = 3 };

// Sub-block j's scale s and min term mt (subtracted for kSixBit, added for kDMin).
template <int KIND>
inline void scales(const uint8_t* blk, int j, VF* s, VF* mt) {
  const VF d = v::load_halves(blk);
  *mt = v::zerof();
  if constexpr (KIND == kD || KIND == kDMin) {
    *s = d;
    if constexpr (KIND == kDMin) *mt = v::load_halves(blk + 32);
  } else if constexpr (KIND == kInt8Scale) {
    *s = v::mul(d, v::to_float(v::load_i8(blk + 32 + 16 * j)));
  } else {
    const VI lo = v::load_u8(blk + 64 + 16 * j);
    const VI hi = v::srli(v::load_u8(blk + 192 + 16 * (j % 4)), 4 * (j / 4));
    const VI three = v::set1i(3), fifteen = v::set1i(15);
    const VI sc = v::or_(v::and_(lo, fifteen), v::slli(v::and_(hi, three), 4));
    const VI m = v::or_(v::srli(lo, 4), v::slli(v::and_(v::srli(hi, 2), three), 4));
    *s = v::mul(d, v::to_float(sc));
    *mt = v::mul(v::load_halves(blk + 32), v::to_float(m));
  }
}

// q[e] - offset for the SUB elements of sub-block j of a packed block, 16 lanes each.
template <int W, int SUB, int SCALES, int HBITS, int OFFSET>
inline void unpack_sub(const uint8_t* blk, int j, float* q) {
  const uint8_t* nib = blk + SCALES;
  const uint8_t* hi = nib + 8 * W;
  const VI lane2 = v::slli(v::lane_index(), 1);  // 2l
  const VI low = v::set1i(0xF), one = v::set1i(1), offset = v::set1i(OFFSET);
  for (int e = 0; e < SUB; e += 4) {  // elements e .. e + 3 = steps s, s + 1 = one byte row
    const int el = j * SUB + e, s = el / 2;
    const VI words = v::load_u16(nib + (s / 2) * 32);
    for (int u = 0; u < 4; ++u) {  // element el + u: step s + u / 2, pair element u % 2
      const int step = s + u / 2, i = u % 2;
      VI qv = v::and_(v::srli(words, 8 * i + 4 * (step % 2)), low);
      for (int h = 0; h < HBITS; ++h) {
        uint32_t bits;
        std::memcpy(&bits, hi + (step * HBITS + h) * 4, 4);
        const VI idx = v::addi(lane2, v::set1i(i));
        const VI bit = v::and_(v::srlv(v::set1i(static_cast<int32_t>(bits)), idx), one);
        qv = v::or_(qv, v::slli(bit, 4 + h));
      }
      v::storef(q + (e + u) * kLanes, v::to_float(v::subi(qv, offset)));
    }
  }
}

// The portable pass's contract: out [mr][max_nr][16] = rows x[0 .. mr) (row stride K) over
// panels [0 .. nr) of Wp; xsum [mr][K / 32] the rows' 32-wide sums (types with a min).
template <int KIND, int W, int SUB, int SCALES, int HBITS, int OFFSET, typename T>
void pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
          const float* xsum, int mr, int nr, int max_nr, float* out) {
  constexpr int kSubs = W / SUB;
  const int64_t bb = file_block * kLanes, nb = K / W, ns = K / 32;
  alignas(64) float q[4][SUB * kLanes];  // nr <= 4 panels of one sub-block
  alignas(64) float xf[SUB];
  for (int m = 0; m < mr; ++m) std::memset(out + m * max_nr * kLanes, 0, nr * kLanes * 4);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kSubs; ++j) {
      VF s[4], mt[4];
      for (int n = 0; n < nr; ++n) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        unpack_sub<W, SUB, SCALES, HBITS, OFFSET>(blk, j, q[n]);
        scales<KIND>(blk, j, &s[n], &mt[n]);
      }
      const int64_t e0 = b * W + j * SUB;
      for (int m = 0; m < mr; ++m) {
        for (int e = 0; e < SUB; ++e) xf[e] = static_cast<float>(x[m * K + e0 + e]);
        VF dot[4] = {v::zerof(), v::zerof(), v::zerof(), v::zerof()};
        for (int e = 0; e < SUB; ++e) {
          const VF xv = v::set1f(xf[e]);
          for (int n = 0; n < 4; ++n)
            if (n < nr) dot[n] = v::fmadd(xv, v::loadf(q[n] + e * kLanes), dot[n]);
        }
        for (int n = 0; n < nr; ++n) {
          float* a = out + (m * max_nr + n) * kLanes;
          VF acc = v::fmadd(s[n], dot[n], v::loadf(a));
          if constexpr (KIND == kDMin)
            acc = v::fmadd(mt[n], v::set1f(xsum[m * ns + e0 / 32]), acc);
          else if constexpr (KIND == kSixBit)
            acc = v::fnmadd(mt[n], v::set1f(xsum[m * ns + e0 / 32]), acc);
          v::storef(a, acc);
        }
      }
    }
}

}  // namespace tgserve::kquant_fma

#endif
