// Q4_0 / Q4_1 / Q8_0 weights made with one integer op and one fma (AVX-512, float32 activations),
// for block_fma.h's few-rows pass (its many-rows scratch fill measured no faster with them: the
// dense tiles over it dominate). Included by block_fma.h only.
//
// Contract: the same w bits as block_fma.h's `weight` (gguf's fl(d * q), Q4_1 fl(fl(d * q) + m))
// except possibly the sign of a zero w, which no output can show: every accumulator starts at
// +0 and x * w + acc is -0 only when both terms are -0, so an accumulator is never -0, and
// x * (+0) and x * (-0) differ only in sign (inf * 0 gives the same default NaN either way).
//
// How: vpternlogd puts the quant's u (Q4: the nibble; Q8_0: q + 128, the byte's sign bit
// flipped) into the mantissa of R = 2^(23 - p) at bit p, so the float f is R + u exactly. Then
// w = fma(f, d, c) with c the constant term:
//   Q8_0: u = q + 128, c = -(R + 128) * d;   Q4_0: u = nibble, c = -(R + 8) * d;
//   Q4_1: u = nibble,  c = m - R * d.
// When c is exactly that real number, f * d + c = q * d (+ m) exactly and the fma's one
// rounding gives fl(q * d) (= q * d: 11 bits times at most 8) or fl(q * d + m) = fl(fl(d q) + m)
// (d * q exact): gguf's w. Exactness of c:
// - Q8_0 (p = 8: R + 128 = 2^15 + 2^7) and Q4_0 (p = 8, 12: 2^15 + 2^3, 2^11 + 2^3): an fp16
//   d's 11-bit significand times R + bias spans at most 23 bits (no overflow: |d| R < 2^31;
//   fp16 subnormals are float32 normals), so c is exact for every finite d
//   (tests/models/test_mantissa_weights.py runs every fp16 d). d = inf / NaN would give
//   inf - inf: such blocks (rare) take block_fma.h's path.
// - Q4_1 (p = 8, 12): m - R * d is exact only when the two significands fit in 24 bits
//   together (real blocks: |m| ~ 8 d, 2^11 d and 2^15 d sit 8-13 binades above m, and every
//   block of the default model passes; not so for m << d, huge m over tiny d). Checked per
//   block: m - R * d rounded down and rounded up (one fma each, embedded rounding) are equal
//   iff it is exact, and the one rounded down is c. inf / NaN d or m give an inf or NaN c,
//   refused by vfpclassps. Those blocks take block_fma.h's path. A weight whose every block
//   passed that test when packed (kernels.h's kQ4_1Exact, models/block_linear.py) skips it.
//
// Quant positions: a lane's 16-bit word holds 4 nibbles at bits {0, 8, 4, 12} (elements u = 0..3
// of the chunk, block_fma.h's kQ4Shift) or 2 bytes (Q8_0 elements 0, 1). Two sources per chunk,
// A = word << 8 for even u, B = word for odd u, the field at p = kP[u / 2]:
//   Q8_0: A holds the low byte at 8, B the high byte at 8, p = 8 for both;
//   Q4: A holds u 0 at 8 and u 2 at 12, B u 1 at 8 and u 3 at 12, p = 8, 12.
// Q8_0 where the CPU has VBMI: vpermb, merged into R's bits, puts byte 2l + u of the chunk
// (sign bits flipped by one vpxor per chunk) at bit 8 of lane l: no widening, no vpternlogd.
// Per weight: one vpternlogd (VBMI Q8_0: one vpermb) and one fma (+ the row fmas), against
// vpand + vcvtdq2ps + an fma (Q4) or two shifts + vcvtdq2ps + vmulps (Q8_0) before; a chunk
// adds one shift beside its vpmovzxwd. Per block and panel: one multiply per p (Q4_1: two
// fmas and a compare per p).
#pragma once

#include "simd16.h"

#if defined(TGSERVE_SIMD16) && TGSERVE_SIMD16 == 512 && defined(__AVX512DQ__)
#define TGSERVE_MANTISSA_WEIGHTS 1

#include <cstdint>

namespace tgserve::mantissa_weights {

using simd16::VF;
using simd16::VI;
namespace v = simd16;

// TYPE: 0 = Q4_0, 1 = Q4_1, 2 = Q8_0 (as block_fma.h).
template <int TYPE>
struct Fields {
  static constexpr int kShiftA = 8;  // source A = word << 8, B = word
  static constexpr int kP[2] = {8, TYPE == 2 ? 8 : 12};
  static constexpr int kPositions = TYPE == 2 ? 1 : 2;  // distinct p
  static constexpr uint32_t kWidthMask = TYPE == 2 ? 0xFF : 0xF;
  static constexpr uint32_t kFlip = TYPE == 2 ? 0x80 : 0;  // Q8_0: u = q + 128
  static constexpr float kBias = TYPE == 2 ? 128.0f : 8.0f;  // Q8_0, Q4_0: c = -(R + bias) d
  static constexpr float r(int k) { return static_cast<float>(1 << (23 - kP[k])); }
  // R's float32 bits (exponent 127 + 23 - p, mantissa 0), Q8_0's flip at the field's top bit.
  static constexpr uint32_t r_bits(int k) {
    return static_cast<uint32_t>(127 + 23 - kP[k]) << 23 | kFlip << kP[k];
  }
};

// A panel's block: d, and c[k] the constant term for position k (see above).
struct Scales {
  VF d, c[2];
};

// The block's scales from its fp16 d (and m at blk + 32); false when this block cannot take
// the one-fma weights (non-finite d or m, Q4_1's inexact c): the caller runs block_fma.h's path.
// kTrusted (a kQ4_1Exact weight: every block's c was found exact and finite when packed,
// models/block_linear.py): c is one fma, any rounding giving the exact value, and no check.
template <int TYPE, bool kTrusted = false>
[[gnu::always_inline]] inline bool scales(const uint8_t* blk, Scales& s) {
  using F = Fields<TYPE>;
  constexpr int kNotFinite = 0x99;  // vfpclassps: QNaN 0x01, +inf 0x08, -inf 0x10, SNaN 0x80
  s.d = v::load_halves(blk);
  if constexpr (TYPE == 1 && kTrusted) {
    const __m512 m = v::load_halves(blk + 32).v;
    for (int k = 0; k < F::kPositions; ++k)
      s.c[k].v = _mm512_fnmadd_ps(_mm512_set1_ps(F::r(k)), s.d.v, m);
    return true;
  } else if constexpr (TYPE == 1) {
    const __m512 m = v::load_halves(blk + 32).v;
    constexpr int kDown = _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC;
    constexpr int kUp = _MM_FROUND_TO_POS_INF | _MM_FROUND_NO_EXC;
    __mmask16 exact = 0xFFFF;
    for (int k = 0; k < F::kPositions; ++k) {
      const __m512 r = _mm512_set1_ps(F::r(k));
      s.c[k].v = _mm512_fnmadd_round_ps(r, s.d.v, m, kDown);
      const __m512 up = _mm512_fnmadd_round_ps(r, s.d.v, m, kUp);
      exact = _mm512_mask_cmp_ps_mask(exact, s.c[k].v, up, _CMP_EQ_OQ);
    }
    return exact == 0xFFFF && _mm512_fpclass_ps_mask(s.c[0].v, kNotFinite) == 0;
  } else {
    if (_mm512_fpclass_ps_mask(s.d.v, kNotFinite) != 0) return false;
    for (int k = 0; k < F::kPositions; ++k)
      s.c[k] = v::mul(s.d, v::set1f(-(F::r(k) + F::kBias)));
    return true;
  }
}

// f = R + u: R's bits with the field at p from src (Q8_0: its top bit flipped), one
// vpternlogd: bits = mask ? src ^ r : r (0x6A: C ^ (A & B) with A = src, B = mask, C = r).
template <int TYPE>
[[gnu::always_inline]] inline VF r_plus_u(VI src, int k) {
  using F = Fields<TYPE>;
  const __m512i mask = _mm512_set1_epi32(static_cast<int32_t>(F::kWidthMask << F::kP[k]));
  const __m512i r = _mm512_set1_epi32(static_cast<int32_t>(F::r_bits(k)));
  return v::as_float(VI{_mm512_ternarylogic_epi32(src.v, mask, r, 0x6A)});
}

// A 32-byte chunk of a panel's quants as the sources of its weights: Q4 (and Q8_0 without
// VBMI) A = word << 8 for the even elements u, B = word for the odd ones (word: each lane's
// 16-bit word, widened); Q8_0 with VBMI the chunk's bytes, sign bits flipped once for both.
#if defined(__AVX512VBMI__)
constexpr bool kBytePermute = true;
#else
constexpr bool kBytePermute = false;
#endif

template <int TYPE>
struct Chunk {
  static constexpr bool kBytes = TYPE == 2 && kBytePermute;
  __m512i a, b;
  [[gnu::always_inline]] void load(const uint8_t* q) {
    if constexpr (kBytes) {
      const __m256i bytes = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
      a = _mm512_castsi256_si512(_mm256_xor_si256(bytes, _mm256_set1_epi8(-128)));
    } else {
      b = v::load_u16(q).v;
      a = _mm512_slli_epi32(b, Fields<TYPE>::kShiftA);
    }
  }
  // R + u of element u (Q8_0 with VBMI: vpermb puts byte 2l + u into byte 1 of lane l over
  // R's bits, no vpternlogd).
  [[gnu::always_inline]] VF r_plus_u(int u) const {
    if constexpr (kBytes) {
      const __m512i lane = v::lane_index().v;
      const __m512i index = _mm512_slli_epi32(
          _mm512_add_epi32(_mm512_add_epi32(lane, lane), _mm512_set1_epi32(u)), 8);
      const __m512i r = _mm512_set1_epi32(static_cast<int32_t>(Fields<TYPE>::r_bits(0)));
      return {_mm512_castsi512_ps(
          _mm512_mask_permutexvar_epi8(r, 0x2222222222222222ull, index, a))};
    } else {
      return mantissa_weights::r_plus_u<TYPE>(VI{u % 2 ? b : a}, TYPE == 2 ? 0 : u / 2);
    }
  }
  // Element u's weight: w = fma(R + u, d, c).
  [[gnu::always_inline]] VF weight(int u, const Scales& s) const {
    return v::fmadd(r_plus_u(u), s.d, s.c[TYPE == 2 ? 0 : u / 2]);
  }
};

// One block of NR panels (`blk`, quants at blk[j] + scales_bytes) for the few-rows pass: for
// each element e in order, w[j] its weights, then fmas(e, w) (the rows' fmas). false, nothing
// run, when a panel's block cannot take the one-fma weights.
template <int TYPE, int NR, bool kTrusted, typename Fmas>
[[gnu::always_inline]] inline bool rows_block(const uint8_t* const* blk, int64_t scales_bytes,
                                              Fmas&& fmas) {
  Scales s[NR];
  bool ok = true;
  for (int j = 0; j < NR; ++j) ok &= scales<TYPE, kTrusted>(blk[j], s[j]);
  if (!ok) return false;
  constexpr int kPerChunk = TYPE == 2 ? 2 : 4;
  for (int c = 0; c < 32 / kPerChunk; ++c) {  // 32-byte chunks of quants
    Chunk<TYPE> chunks[NR];
    for (int j = 0; j < NR; ++j) chunks[j].load(blk[j] + scales_bytes + 32 * c);
    for (int u = 0; u < kPerChunk; ++u) {
      VF w[NR];
      for (int j = 0; j < NR; ++j) w[j] = chunks[j].weight(u, s[j]);
      fmas(kPerChunk * c + u, w);
    }
  }
  return true;
}

}  // namespace tgserve::mantissa_weights

#endif
