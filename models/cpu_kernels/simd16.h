// Sixteen float32 / int32 lanes as one type over AVX-512 (one zmm) or AVX2 + FMA + F16C (two
// ymm), for the kernels that run the portable passes' per-lane order as SIMD code (block_fma.h,
// kquant_fma.h). Every operation is lane-wise and IEEE (fmadd / fnmadd fused, mul and add
// rounded to nearest even), so both builds give a lane the same bits as the scalar loops.
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define TGSERVE_SIMD16 512
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TGSERVE_SIMD16 256
#endif

#if defined(TGSERVE_SIMD16)
namespace tgserve::simd16 {

constexpr int kLanes = 16;  // the lanes of VF / VI: a panel's 16 output columns

#if TGSERVE_SIMD16 == 512
struct VF {
  __m512 v;
};
struct VI {
  __m512i v;
};
#define TGSERVE_F2(op) VF{op(a.v, b.v)}
#define TGSERVE_I2(op) VI{op(a.v, b.v)}
inline VF loadf(const float* p) { return {_mm512_loadu_ps(p)}; }
inline void storef(float* p, VF a) { _mm512_storeu_ps(p, a.v); }
inline VF set1f(float x) { return {_mm512_set1_ps(x)}; }
inline VI set1i(int32_t x) { return {_mm512_set1_epi32(x)}; }
inline VF fmadd(VF a, VF b, VF c) { return {_mm512_fmadd_ps(a.v, b.v, c.v)}; }
inline VF fnmadd(VF a, VF b, VF c) { return {_mm512_fnmadd_ps(a.v, b.v, c.v)}; }
inline VF mul(VF a, VF b) { return TGSERVE_F2(_mm512_mul_ps); }
inline VF add(VF a, VF b) { return TGSERVE_F2(_mm512_add_ps); }
inline VI and_(VI a, VI b) { return TGSERVE_I2(_mm512_and_si512); }
inline VI or_(VI a, VI b) { return TGSERVE_I2(_mm512_or_si512); }
inline VI addi(VI a, VI b) { return TGSERVE_I2(_mm512_add_epi32); }
inline VI subi(VI a, VI b) { return TGSERVE_I2(_mm512_sub_epi32); }
inline VI srlv(VI a, VI b) { return TGSERVE_I2(_mm512_srlv_epi32); }
inline VI srli(VI a, int n) { return {_mm512_srli_epi32(a.v, n)}; }
inline VI slli(VI a, int n) { return {_mm512_slli_epi32(a.v, n)}; }
inline VI srai(VI a, int n) { return {_mm512_srai_epi32(a.v, n)}; }
inline VF to_float(VI a) { return {_mm512_cvtepi32_ps(a.v)}; }
inline VF as_float(VI a) { return {_mm512_castsi512_ps(a.v)}; }
inline VI as_int(VF a) { return {_mm512_castps_si512(a.v)}; }
// 16 uint16 / uint8 / int8 / fp16 at p, widened to the 16 lanes.
inline VI load_u16(const uint8_t* p) {
  return {_mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
inline VI load_u8(const uint8_t* p) {
  return {_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline VI load_i8(const uint8_t* p) {
  return {_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))};
}
inline VF load_halves(const uint8_t* p) {
  return {_mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)))};
}
// Lanes where v is NaN take `nan_bits` (as int), the others keep bits.
inline VI where_nan(VF v, VI bits, int32_t nan_bits) {
  return {_mm512_mask_mov_epi32(bits.v, _mm512_cmp_ps_mask(v.v, v.v, _CMP_UNORD_Q),
                                _mm512_set1_epi32(nan_bits))};
}
inline VI lane_index() {
  return {_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0)};
}
#else
struct VF {
  __m256 lo, hi;
};
struct VI {
  __m256i lo, hi;
};
#define TGSERVE_F2(op) VF{op(a.lo, b.lo), op(a.hi, b.hi)}
#define TGSERVE_I2(op) VI{op(a.lo, b.lo), op(a.hi, b.hi)}
inline VF loadf(const float* p) { return {_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)}; }
inline void storef(float* p, VF a) {
  _mm256_storeu_ps(p, a.lo);
  _mm256_storeu_ps(p + 8, a.hi);
}
inline VF set1f(float x) { return {_mm256_set1_ps(x), _mm256_set1_ps(x)}; }
inline VI set1i(int32_t x) { return {_mm256_set1_epi32(x), _mm256_set1_epi32(x)}; }
inline VF fmadd(VF a, VF b, VF c) {
  return {_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi)};
}
inline VF fnmadd(VF a, VF b, VF c) {
  return {_mm256_fnmadd_ps(a.lo, b.lo, c.lo), _mm256_fnmadd_ps(a.hi, b.hi, c.hi)};
}
inline VF mul(VF a, VF b) { return TGSERVE_F2(_mm256_mul_ps); }
inline VF add(VF a, VF b) { return TGSERVE_F2(_mm256_add_ps); }
inline VI and_(VI a, VI b) { return TGSERVE_I2(_mm256_and_si256); }
inline VI or_(VI a, VI b) { return TGSERVE_I2(_mm256_or_si256); }
inline VI addi(VI a, VI b) { return TGSERVE_I2(_mm256_add_epi32); }
inline VI subi(VI a, VI b) { return TGSERVE_I2(_mm256_sub_epi32); }
inline VI srlv(VI a, VI b) { return TGSERVE_I2(_mm256_srlv_epi32); }
inline VI srli(VI a, int n) { return {_mm256_srli_epi32(a.lo, n), _mm256_srli_epi32(a.hi, n)}; }
inline VI slli(VI a, int n) { return {_mm256_slli_epi32(a.lo, n), _mm256_slli_epi32(a.hi, n)}; }
inline VI srai(VI a, int n) { return {_mm256_srai_epi32(a.lo, n), _mm256_srai_epi32(a.hi, n)}; }
inline VF to_float(VI a) { return {_mm256_cvtepi32_ps(a.lo), _mm256_cvtepi32_ps(a.hi)}; }
inline VF as_float(VI a) { return {_mm256_castsi256_ps(a.lo), _mm256_castsi256_ps(a.hi)}; }
inline VI as_int(VF a) { return {_mm256_castps_si256(a.lo), _mm256_castps_si256(a.hi)}; }
inline __m128i load128(const uint8_t* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}
inline __m128i load64(const uint8_t* p) {
  return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
}
inline VI load_u16(const uint8_t* p) {
  return {_mm256_cvtepu16_epi32(load128(p)), _mm256_cvtepu16_epi32(load128(p + 16))};
}
inline VI load_u8(const uint8_t* p) {
  return {_mm256_cvtepu8_epi32(load64(p)), _mm256_cvtepu8_epi32(load64(p + 8))};
}
inline VI load_i8(const uint8_t* p) {
  return {_mm256_cvtepi8_epi32(load64(p)), _mm256_cvtepi8_epi32(load64(p + 8))};
}
inline VF load_halves(const uint8_t* p) {
  return {_mm256_cvtph_ps(load128(p)), _mm256_cvtph_ps(load128(p + 16))};
}
inline VI where_nan(VF v, VI bits, int32_t nan_bits) {
  const __m256i n = _mm256_set1_epi32(nan_bits);
  const auto pick = [&](__m256 x, __m256i b) {
    const __m256i unord = _mm256_castps_si256(_mm256_cmp_ps(x, x, _CMP_UNORD_Q));
    return _mm256_blendv_epi8(b, n, unord);
  };
  return {pick(v.lo, bits.lo), pick(v.hi, bits.hi)};
}
inline VI lane_index() {
  return {_mm256_set_epi32(7, 6, 5, 4, 3, 2, 1, 0), _mm256_set_epi32(15, 14, 13, 12, 11, 10, 9, 8)};
}
#endif
#undef TGSERVE_F2
#undef TGSERVE_I2

inline VF zerof() { return set1f(0.0f); }

}  // namespace tgserve::simd16
#endif
