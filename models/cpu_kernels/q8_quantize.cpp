// The activation quantisers of the Q8 panels' products (q8_linear.h: int8, d = amax / 127;
// q16_dot.h: int16, d = amax / 32767): rows [M, K] -> their values, a step and a sum per block
// of 32. One IEEE operation per step on every ISA (AVX-512, AVX2, the scalar loop), so every
// build gives the same bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "q16_dot.h"
#include "q8_linear.h"

namespace tgserve {
namespace {

constexpr int64_t kBlock = 32;

// block(i) for the M * K / 32 blocks of rows [M, K]: few rows (a decode's, or a thread's own in
// step_region.h) on the calling thread, with no team at all (an `if (false)` region still starts
// one of one thread); more over the threads.
template <typename Block>
void each_block(int64_t M, int64_t K, const Block& block) {
  const int64_t count = M * (K / kBlock);
  if (M * K < 65536) {
    for (int64_t i = 0; i < count; ++i) block(i);
    return;
  }
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < count; ++i) block(i);
}

}  // namespace

template <typename T>
void q8_quantize_rows(const T* x, int64_t M, int64_t K, int8_t* xq, float* dx, int32_t* sx) {
  const int64_t nb = K / kBlock;
  const auto block = [&](int64_t i) {
    const T* src = x + i * kBlock;  // row i / nb, block i % nb: rows are K = nb * 32 apart
#if defined(__AVX512F__) && defined(__AVX512BW__)
    // The loop below, 16 lanes at a time, one IEEE operation per step as there: max_ps(|v|,
    // amax) keeps amax where v is NaN (as std::max(amax, |v|) does), vcvtps2dq rounds to nearest
    // even (nearbyint in the default mode; NaN -> INT_MIN, clamped to -127 as the cast's value).
    __m512 v[2];
    for (int h = 0; h < 2; ++h) {
      if constexpr (std::is_same_v<T, float>) {
        v[h] = _mm512_loadu_ps(src + 16 * h);
      } else {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + 16 * h));
        v[h] = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(raw), 16));
      }
    }
    const __m512 top = _mm512_max_ps(_mm512_abs_ps(v[1]),
                                     _mm512_max_ps(_mm512_abs_ps(v[0]), _mm512_setzero_ps()));
    const float amax = _mm512_reduce_max_ps(top);
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    __m512i total = _mm512_setzero_si512();
    for (int h = 0; h < 2; ++h) {
      __m512i q = _mm512_cvtps_epi32(_mm512_mul_ps(v[h], _mm512_set1_ps(inv)));
      q = _mm512_min_epi32(_mm512_max_epi32(q, _mm512_set1_epi32(-127)), _mm512_set1_epi32(127));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(xq + i * kBlock + 16 * h), _mm512_cvtepi32_epi8(q));
      total = _mm512_add_epi32(total, q);
    }
    dx[i] = d;
    sx[i] = _mm512_reduce_add_epi32(total);
#elif defined(__AVX2__)
    // The same steps 8 lanes at a time (before: the loop below, whose std::nearbyint is a libm
    // call saving the FP environment per value: 4% of an AVX2 int8 decode step at one thread).
    // max_ps(|v|, amax) keeps amax where v is NaN; the lanes' maxima and the integer sum are
    // exact in any order; vcvtps2dq rounds to nearest even, NaN -> INT_MIN (clamped to -127).
    __m256 v[4];
    const float amax = q16_dot::load_block_avx2(src, v);
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    __m256i q[4];
    __m256i total = _mm256_setzero_si256();
    for (int h = 0; h < 4; ++h) {
      q[h] = _mm256_cvtps_epi32(_mm256_mul_ps(v[h], _mm256_set1_ps(inv)));
      q[h] = _mm256_min_epi32(_mm256_max_epi32(q[h], _mm256_set1_epi32(-127)),
                              _mm256_set1_epi32(127));
      total = _mm256_add_epi32(total, q[h]);
    }
    // packs work per 128-bit lane: [q0 lo, q1 lo, q2 lo, q3 lo | q0 hi, ...] in 4-byte groups
    const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                             _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq + i * kBlock),
                        _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    dx[i] = d;
    sx[i] = q16_dot::sum_epi32_avx2(total);
#else
    float v[kBlock], amax = 0.0f;
    for (int e = 0; e < kBlock; ++e) {
      v[e] = static_cast<float>(src[e]);
      amax = std::max(amax, std::fabs(v[e]));
    }
    const float d = amax / 127.0f;
    const float inv = d > 0.0f ? 1.0f / d : 0.0f;
    int32_t sum = 0;
    for (int e = 0; e < kBlock; ++e) {
      // nearbyint: to nearest even (the default rounding mode), as vcvtps2dq
      const int q = static_cast<int>(std::nearbyint(v[e] * inv));
      const int8_t c = static_cast<int8_t>(std::clamp(q, -127, 127));
      xq[i * kBlock + e] = c;
      sum += c;
    }
    dx[i] = d;
    sx[i] = sum;
#endif
  };
  (void)nb;
  each_block(M, K, block);
}

template <typename T>
void q8_quantize_rows(const T* x, int64_t M, int64_t K, int16_t* xq, float* dx, int32_t* sx) {
  each_block(M, K, [&](int64_t i) {  // row i / nb, block i % nb: rows are K apart
    q16_dot::quantize_block(x + i * kBlock, xq + i * kBlock, dx[i], sx[i]);
  });
}

#define TGSERVE_INSTANTIATE(T, A) \
  template void q8_quantize_rows<T>(const T*, int64_t, int64_t, A*, float*, int32_t*);
TGSERVE_INSTANTIATE(float, int8_t)
TGSERVE_INSTANTIATE(c10::BFloat16, int8_t)
TGSERVE_INSTANTIATE(float, int16_t)
TGSERVE_INSTANTIATE(c10::BFloat16, int16_t)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
