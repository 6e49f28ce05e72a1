// kquant_linear.cpp's portable order as AVX-512 float32 code: float32 activations on every
// AVX-512 CPU, and bfloat16 on CPUs without AVX512-BF16. Included by kquant_linear.cpp only.
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

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TGSERVE_KQUANT_FMA 1

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

namespace tgserve::kquant_fma {

constexpr int kLanes = 16;

// Which scales a type has: Q5_0 (s = d), Q5_1 (s = d, + m), Q4_K / Q5_K (6-bit sc and m of
// 32-wide sub-blocks), Q6_K (int8 sc of 16-wide sub-blocks).
enum Kind { kD = 0, kDMin = 1, kSixBit = 2, kInt8Scale = 3 };

// Sub-block j's scale s and min term mt (subtracted for kSixBit, added for kDMin).
template <int KIND>
inline void scales(const uint8_t* blk, int j, __m512* s, __m512* mt) {
  const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk)));
  *mt = _mm512_setzero_ps();
  if constexpr (KIND == kD || KIND == kDMin) {
    *s = d;
    if constexpr (KIND == kDMin)
      *mt = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
  } else if constexpr (KIND == kInt8Scale) {
    const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 32 + 16 * j));
    *s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(sc)));
  } else {
    const __m512i lo = _mm512_cvtepu8_epi32(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 64 + 16 * j)));
    const __m512i hi = _mm512_srli_epi32(
        _mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk + 192 + 16 * (j % 4)))),
        4 * (j / 4));
    const __m512i three = _mm512_set1_epi32(3), fifteen = _mm512_set1_epi32(15);
    const __m512i sc = _mm512_or_si512(_mm512_and_si512(lo, fifteen),
                                       _mm512_slli_epi32(_mm512_and_si512(hi, three), 4));
    const __m512i m = _mm512_or_si512(
        _mm512_srli_epi32(lo, 4),
        _mm512_slli_epi32(_mm512_and_si512(_mm512_srli_epi32(hi, 2), three), 4));
    *s = _mm512_mul_ps(d, _mm512_cvtepi32_ps(sc));
    const __m512 dmin =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk + 32)));
    *mt = _mm512_mul_ps(dmin, _mm512_cvtepi32_ps(m));
  }
}

// q[e] - offset for the SUB elements of sub-block j of a packed block, 16 lanes each.
template <int W, int SUB, int SCALES, int HBITS, int OFFSET>
inline void unpack_sub(const uint8_t* blk, int j, float* q) {
  const uint8_t* nib = blk + SCALES;
  const uint8_t* hi = nib + 8 * W;
  const __m512i lane2 = _mm512_slli_epi32(
      _mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);  // 2l
  const __m512i low = _mm512_set1_epi32(0xF), one = _mm512_set1_epi32(1);
  const __m512i offset = _mm512_set1_epi32(OFFSET);
  for (int e = 0; e < SUB; e += 4) {  // elements e .. e + 3 = steps s, s + 1 = one byte row
    const int el = j * SUB + e, s = el / 2;
    const __m512i v = _mm512_cvtepu16_epi32(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(nib + (s / 2) * 32)));
    for (int u = 0; u < 4; ++u) {  // element el + u: step s + u / 2, pair element u % 2
      const int step = s + u / 2, i = u % 2;
      __m512i qv = _mm512_and_si512(_mm512_srli_epi32(v, 8 * i + 4 * (step % 2)), low);
      for (int h = 0; h < HBITS; ++h) {
        uint32_t bits;
        std::memcpy(&bits, hi + (step * HBITS + h) * 4, 4);
        const __m512i idx = _mm512_add_epi32(lane2, _mm512_set1_epi32(i));
        const __m512i bit = _mm512_and_si512(
            _mm512_srlv_epi32(_mm512_set1_epi32(static_cast<int>(bits)), idx), one);
        qv = _mm512_or_si512(qv, _mm512_slli_epi32(bit, 4 + h));
      }
      _mm512_storeu_ps(q + (e + u) * kLanes, _mm512_cvtepi32_ps(_mm512_sub_epi32(qv, offset)));
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
      __m512 s[4], mt[4];
      for (int n = 0; n < nr; ++n) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        unpack_sub<W, SUB, SCALES, HBITS, OFFSET>(blk, j, q[n]);
        scales<KIND>(blk, j, &s[n], &mt[n]);
      }
      const int64_t e0 = b * W + j * SUB;
      for (int m = 0; m < mr; ++m) {
        for (int e = 0; e < SUB; ++e) xf[e] = static_cast<float>(x[m * K + e0 + e]);
        __m512 dot[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(),
                         _mm512_setzero_ps()};
        for (int e = 0; e < SUB; ++e) {
          const __m512 xv = _mm512_set1_ps(xf[e]);
          for (int n = 0; n < 4; ++n)
            if (n < nr) dot[n] = _mm512_fmadd_ps(xv, _mm512_load_ps(q[n] + e * kLanes), dot[n]);
        }
        for (int n = 0; n < nr; ++n) {
          float* a = out + (m * max_nr + n) * kLanes;
          __m512 acc = _mm512_fmadd_ps(s[n], dot[n], _mm512_load_ps(a));
          if constexpr (KIND == kDMin)
            acc = _mm512_fmadd_ps(mt[n], _mm512_set1_ps(xsum[m * ns + e0 / 32]), acc);
          else if constexpr (KIND == kSixBit)
            acc = _mm512_fnmadd_ps(mt[n], _mm512_set1_ps(xsum[m * ns + e0 / 32]), acc);
          _mm512_store_ps(a, acc);
        }
      }
    }
}

}  // namespace tgserve::kquant_fma

#endif
