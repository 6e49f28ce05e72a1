// Row layouts shared by the paged attention kernel (attention.cpp) and its inner loops
// (attention_simd.h): chunk size, how query rows are packed, how float32 accumulator rows are
// padded, and the lazy-softmax slack. AVX-512 builds pad bf16 rows to 32 for pair loads;
// AVX2 builds use the portable layouts (float32 query rows padded to 16, no deinterleave).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include <immintrin.h>
#define TGSERVE_ATTN_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#define TGSERVE_ATTN_AVX2 1  // attention_avx2.h
#endif

namespace tgserve::attn {

constexpr int kChunk = 16;  // keys per chunk: one online-softmax step, one vector of scores

// How score_chunk wants the query heads: element type and row padding (rows are zero-padded
// to a multiple of `pad` elements). bf16 pairs when the CPU has dot products on them.
template <typename T>
struct QPack {
  using type = float;
  static constexpr int pad = 16;
};
#if defined(TGSERVE_ATTN_AVX512) && defined(__AVX512BF16__)
template <>
struct QPack<c10::BFloat16> {
  using type = c10::BFloat16;
  static constexpr int pad = 32;
};
#endif

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows of the float32 accumulators are acc_stride(D) long. For bf16 (AVX-512) each group of
// 32 columns is kept deinterleaved, [even columns, odd columns]: a V row's 32 bf16 then turn
// into float32 with one shift (even) and one mask (odd); store_row restores the order.
template <typename T>
struct AccPad {
  static constexpr int value = 16;
};
#if defined(TGSERVE_ATTN_AVX512)
template <>
struct AccPad<c10::BFloat16> {
  static constexpr int value = 32;
};
#endif
template <typename T>
int64_t acc_stride(int64_t D) {
  return round_up(D, AccPad<T>::value);
}

// Lazy online softmax: the running max m only moves when a score exceeds it by more than
// kSlack, so most chunks need no rescale; weights exp(s - m) stay <= e^8, far from overflow.
constexpr float kSlack = 8.0f;

// dst [Dp] = src [D] (converted), zero-padded to Dp = round_up(D, QPack<T>::pad).
template <typename T>
void pack_query(const T* src, int64_t D, typename QPack<T>::type* dst) {
  const int64_t Dp = round_up(D, QPack<T>::pad);
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<typename QPack<T>::type>(src[d]);
  for (int64_t d = D; d < Dp; ++d) dst[d] = typename QPack<T>::type(0.0f);
}

}  // namespace tgserve::attn
