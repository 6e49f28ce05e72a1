// The paged attention's inner loops for builds with neither AVX-512 nor AVX2 (aarch64, and
// x86 without AVX2): the contracts of attention_simd.h in plain loops, each with an order
// written in the source, never left to the compiler (an `omp simd` reduction let GCC for
// aarch64 vectorise the float16 / int8 rows' instances in another order than the float32
// one, so a prefill row, which reads rows widened to float32, and its decode, which reads
// them in place, differed in the last bits: models/cpu_kernels/checks/attention_check.cpp).
// Reduction order: a score is 16 lane sums over d (lane l: d = l, l + 16, ... ascending; each
// product formed from the value widened to float32) folded by fold_lanes' fixed tree, then
// times the key's multiplier; the V sum is one chain per column over the chunk's keys in
// order. GCC vectorises the lanes (NEON on aarch64) without reordering them: the loops carry
// no reduction it may reassociate. Whether a * b + c is fused is the build's (-ffp-contract),
// the same in every instance of a build.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "attention_layout.h"
#include "vec_math.h"  // fast_exp

#if !defined(TGSERVE_ATTN_AVX512) && !defined(TGSERVE_ATTN_AVX2)
namespace tgserve::attn {

constexpr int kLanes = 16;

// The 16 lane sums folded in a fixed tree: lane l + w into lane l for w = 8, 4, 2, 1.
inline float fold_lanes(float* lane) {
  for (int w = kLanes / 2; w >= 1; w /= 2)
    for (int l = 0; l < w; ++l) lane[l] += lane[l + w];
  return lane[0];
}

template <typename T, int DC>
void score_chunk(const float* q, int64_t qstride, const T* const* rows, int n, int64_t G,
                 int64_t Drt, const float* scale, float* s) {
  const int64_t D = DC > 0 ? DC : Drt;
  for (int64_t h = 0; h < G; ++h)
    for (int i = 0; i < kChunk; ++i) {
      const float* qh = q + h * qstride;
      const T* k = rows[i];
      // Lane l sums q[d] k[d] for d = l, l + 16, ... in ascending d; each product is formed
      // from the value widened to float32 first, so the order is the same whatever T is.
      float lane[kLanes] = {};
      int64_t d0 = 0;
      for (; d0 + kLanes <= D; d0 += kLanes)
        for (int l = 0; l < kLanes; ++l)
          lane[l] += qh[d0 + l] * static_cast<float>(k[d0 + l]);
      for (int l = 0; d0 + l < D; ++l) lane[l] += qh[d0 + l] * static_cast<float>(k[d0 + l]);
      const float dot = fold_lanes(lane);
      s[h * kChunk + i] = i < n ? dot * scale[i] : -std::numeric_limits<float>::infinity();
    }
}

inline void softmax_chunk(float* s, int n, int64_t G, float* m, float* lsum, float* acc,
                          int64_t astride) {
  for (int64_t h = 0; h < G; ++h) {
    float* sh = s + h * kChunk;
    float mx = m[h];
    for (int i = 0; i < n; ++i) mx = std::max(mx, sh[i]);
    if (mx > m[h] + kSlack) {
      const float alpha = fast_exp(m[h] - mx);
      lsum[h * kChunk] *= alpha;
      for (int64_t d = 0; d < astride; ++d) acc[h * astride + d] *= alpha;
      m[h] = mx;
    }
    for (int i = 0; i < kChunk; ++i) {
      sh[i] = i < n ? std::exp(sh[i] - m[h]) : 0.0f;
      lsum[h * kChunk] += sh[i];
    }
  }
}

template <typename T, int DC>
void accumulate_chunk(const float* p, const T* const* rows, int64_t G, int64_t Drt, float* acc,
                      int64_t astride, int n) {  // keys past n weigh 0: skipped
  const int64_t D = DC > 0 ? DC : Drt;
  for (int64_t h = 0; h < G; ++h)
    for (int i = 0; i < n; ++i) {
      const float w = p[h * kChunk + i];
#pragma omp simd
      for (int64_t d = 0; d < D; ++d) acc[h * astride + d] += w * static_cast<float>(rows[i][d]);
    }
}

template <typename KV, typename T>
void store_row(const float* acc, float inv, int64_t D, T* out) {
  for (int64_t d = 0; d < D; ++d) out[d] = static_cast<T>(acc[d] * inv);
}

}  // namespace tgserve::attn
#endif
