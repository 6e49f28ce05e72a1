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

#include "group_walk.h"
#include "simd16.h"

#if defined(TGSERVE_SIMD16)
#define TGSERVE_KQUANT_FMA 1

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Few rows (decode, a speculative verify): rows x[0 .. MR) over NR panels, each sub-block of
// the panels unpacked once (into q, L1) for all the rows: for each element e, the NR q vectors
// are loaded once and every row's dot chains take them (MR x NR chains in registers); the
// running sums stay in `out` (one load, fma, store per sub-block). AVX2: rows 4 at a time.
constexpr int kFewRowsPerPass = TGSERVE_SIMD16 == 512 ? 8 : 4;
constexpr int few_rows_panels(int mr) {
  if constexpr (TGSERVE_SIMD16 != 512) return mr <= 1 ? 4 : mr <= 2 ? 2 : 1;
  return mr <= 2 ? 4 : 2;
}

// out [m][n] (16 lanes at out + (m * max_nr + n) * 16) = rows x[0 .. MR) (row stride K) over
// panels [0 .. NR) of Wp; xsum [MR][K / 32] the rows' 32-wide sums (types with a min).
template <int KIND, int W, int SUB, int SCALES, int HBITS, int OFFSET, typename T, int MR, int NR>
void few_rows(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
              const float* xsum, int max_nr, float* out) {
  constexpr int kSubs = W / SUB;
  const int64_t bb = file_block * kLanes, nb = K / W, ns = K / 32;
  alignas(64) float q[NR][SUB * kLanes];
  alignas(64) float xf[MR][SUB];
  for (int m = 0; m < MR; ++m) std::memset(out + m * max_nr * kLanes, 0, NR * kLanes * 4);
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < kSubs; ++j) {
      VF s[NR], mt[NR];
      for (int n = 0; n < NR; ++n) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        unpack_sub<W, SUB, SCALES, HBITS, OFFSET>(blk, j, q[n]);
        scales<KIND>(blk, j, &s[n], &mt[n]);
      }
      const int64_t e0 = b * W + j * SUB;
      for (int m = 0; m < MR; ++m)
        for (int e = 0; e < SUB; ++e) xf[m][e] = static_cast<float>(x[m * K + e0 + e]);
      VF dot[MR][NR];
      for (int m = 0; m < MR; ++m)
        for (int n = 0; n < NR; ++n) dot[m][n] = v::zerof();
      for (int e = 0; e < SUB; ++e) {
        VF qv[NR];
        for (int n = 0; n < NR; ++n) qv[n] = v::loadf(q[n] + e * kLanes);
        for (int m = 0; m < MR; ++m) {
          const VF xv = v::set1f(xf[m][e]);
          for (int n = 0; n < NR; ++n) dot[m][n] = v::fmadd(xv, qv[n], dot[m][n]);
        }
      }
      for (int m = 0; m < MR; ++m)
        for (int n = 0; n < NR; ++n) {
          float* a = out + (m * max_nr + n) * kLanes;
          VF acc = v::fmadd(s[n], dot[m][n], v::loadf(a));
          if constexpr (KIND == kDMin)
            acc = v::fmadd(mt[n], v::set1f(xsum[m * ns + e0 / 32]), acc);
          else if constexpr (KIND == kSixBit)
            acc = v::fnmadd(mt[n], v::set1f(xsum[m * ns + e0 / 32]), acc);
          v::storef(a, acc);
        }
    }
}

// The portable pass's contract: out [mr][max_nr][16] = rows x[0 .. mr) (row stride K, mr <=
// 8) over panels [0 .. nr) of Wp (nr <= few_rows_panels(min(mr, kFewRowsPerPass))); xsum
// [mr][K / 32] the rows' 32-wide sums (types with a min). A lane's operations: dot = 0, dot =
// fma(x[e], q[e], dot) over a sub-block's elements in order, then the scale and min terms.
template <int KIND, int W, int SUB, int SCALES, int HBITS, int OFFSET, typename T, int MR = 1>
void pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, int64_t file_block,
          const float* xsum, int mr, int nr, int max_nr, float* out) {
  if constexpr (MR < kFewRowsPerPass) {
    if (mr > MR)
      return pass<KIND, W, SUB, SCALES, HBITS, OFFSET, T, MR + 1>(
          x, K, Wp, panel_bytes, file_block, xsum, mr, nr, max_nr, out);
  } else if (mr > MR) {  // AVX2: more rows than a pass holds
    pass<KIND, W, SUB, SCALES, HBITS, OFFSET, T, MR>(x, K, Wp, panel_bytes, file_block, xsum, MR,
                                                     nr, max_nr, out);
    const int64_t ns = K / 32;
    return pass<KIND, W, SUB, SCALES, HBITS, OFFSET, T, 1>(
        x + MR * K, K, Wp, panel_bytes, file_block, xsum ? xsum + MR * ns : nullptr, mr - MR, nr,
        max_nr, out + MR * max_nr * kLanes);
  }
  const auto run = [&](auto panels) {
    constexpr int NR = decltype(panels)::value;
    if constexpr (NR <= few_rows_panels(MR))
      few_rows<KIND, W, SUB, SCALES, HBITS, OFFSET, T, MR, NR>(x, K, Wp, panel_bytes, file_block,
                                                               xsum, max_nr, out);
  };
  switch (nr) {
    case 1: return run(std::integral_constant<int, 1>{});
    case 2: return run(std::integral_constant<int, 2>{});
    case 3: return run(std::integral_constant<int, 3>{});
    default: return run(std::integral_constant<int, 4>{});
  }
}

// Many rows (prefill, batched decode): a group of nr panels unpacked once (`unpack_panels`)
// into q [nr][K][16] float32 (q - offset, exact) and the sub-blocks' scales s, mt
// [nr][K / SUB][16], then 6-row register tiles over it (`tile_rows`): for each sub-block, dot
// [MR][NR] in registers from 0, dot = fma(x[e], q[e], dot) over its elements in order, then acc
// (kept in `out`, L1) = fma(s, dot, acc) and the min term: `pass`'s operations in its order,
// each q unpacked once per call instead of once per pass. Tile: AVX-512 6 rows x 4 panels (24
// dot chains, 4 q, a broadcast), AVX2 6 rows x 1 panel.
constexpr int kTilePanels = TGSERVE_SIMD16 == 512 ? 4 : 1;

template <int KIND, int W, int SUB, int SCALES, int HBITS, int OFFSET>
void unpack_panels(const uint8_t* Wp, int64_t K, int64_t panel_bytes, int64_t file_block, int nr,
                   float* q, float* s, float* mt) {
  const int64_t bb = file_block * kLanes, nb = K / W, subs = K / SUB;
  for (int n = 0; n < nr; ++n)
    for (int64_t b = 0; b < nb; ++b)
      for (int j = 0; j < W / SUB; ++j) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        unpack_sub<W, SUB, SCALES, HBITS, OFFSET>(blk, j, q + (n * K + b * W + j * SUB) * kLanes);
        VF sv, mv;
        scales<KIND>(blk, j, &sv, &mv);
        const int64_t at = (n * subs + b * (W / SUB) + j) * kLanes;
        v::storef(s + at, sv);
        v::storef(mt + at, mv);
      }
}

// out [m][n] (16 lanes at out + (m * row_stride + n) * 16) = rows x[0 .. MR) (row stride ldx,
// xsum rows ns apart) over the unpacked panels [0 .. NR) (see unpack_panels).
template <int KIND, int SUB, int MR, int NR>
inline void tile(const float* x, int64_t ldx, int64_t K, const float* q, const float* s,
                 const float* mt, const float* xsum, int64_t ns, float* out, int row_stride) {
  const int64_t subs = K / SUB;
  for (int m = 0; m < MR; ++m)
    for (int n = 0; n < NR; ++n) v::storef(out + (m * row_stride + n) * kLanes, v::zerof());
  for (int64_t j = 0; j < subs; ++j) {
    VF dot[MR][NR];
    for (int m = 0; m < MR; ++m)
      for (int n = 0; n < NR; ++n) dot[m][n] = v::zerof();
    for (int64_t e = j * SUB; e < (j + 1) * SUB; ++e) {
      VF qv[NR];
      for (int n = 0; n < NR; ++n) qv[n] = v::loadf(q + (n * K + e) * kLanes);
      for (int m = 0; m < MR; ++m) {
        const VF xv = v::set1f(x[m * ldx + e]);
        for (int n = 0; n < NR; ++n) dot[m][n] = v::fmadd(xv, qv[n], dot[m][n]);
      }
    }
    for (int n = 0; n < NR; ++n) {
      const VF sv = v::loadf(s + (n * subs + j) * kLanes);
      const VF mv = v::loadf(mt + (n * subs + j) * kLanes);
      for (int m = 0; m < MR; ++m) {
        float* a = out + (m * row_stride + n) * kLanes;
        VF acc = v::fmadd(sv, dot[m][n], v::loadf(a));
        if constexpr (KIND == kDMin)
          acc = v::fmadd(mv, v::set1f(xsum[m * ns + j * SUB / 32]), acc);
        else if constexpr (KIND == kSixBit)
          acc = v::fnmadd(mv, v::set1f(xsum[m * ns + j * SUB / 32]), acc);
        v::storef(a, acc);
      }
    }
  }
}

template <int KIND, int SUB, int MR>
inline void tile_panels(const float* x, int64_t ldx, int64_t K, const float* q, const float* s,
                        const float* mt, const float* xsum, int64_t ns, int nr, float* out,
                        int row_stride) {
  if constexpr (kTilePanels == 1) {
    const int64_t subs = K / SUB;
    for (int n = 0; n < nr; ++n)
      tile<KIND, SUB, MR, 1>(x, ldx, K, q + n * K * kLanes, s + n * subs * kLanes,
                             mt + n * subs * kLanes, xsum, ns, out + n * kLanes, row_stride);
  } else {
    const auto run = [&](auto panels) {
      constexpr int NR = decltype(panels)::value;
      tile<KIND, SUB, MR, NR>(x, ldx, K, q, s, mt, xsum, ns, out, row_stride);
    };
    switch (nr) {
      case 1: return run(std::integral_constant<int, 1>{});
      case 2: return run(std::integral_constant<int, 2>{});
      case 3: return run(std::integral_constant<int, 3>{});
      default: return run(std::integral_constant<int, 4>{});
    }
  }
}

// tile for mr (1 .. 6) rows and nr (1 .. 4) panels.
template <int KIND, int SUB>
void tile_rows(const float* x, int64_t ldx, int64_t K, const float* q, const float* s,
               const float* mt, const float* xsum, int64_t ns, int mr, int nr, float* out,
               int row_stride) {
  group_walk::with_rows(mr, [&](auto rows) {
    tile_panels<KIND, SUB, decltype(rows)::value>(x, ldx, K, q, s, mt, xsum, ns, nr, out,
                                                  row_stride);
  });
}

}  // namespace tgserve::kquant_fma

#endif
