// The int8 K/V cache row (--kv-cache-dtype int8): how the C++ step writes a (token, KV head)
// row of K or V once, at append, and how the paged attention reads it back in place.
//
// Layout: a cache of int8 [num_blocks, block_size, KVH, D + 4]; the row of one token and KV
// head is its D values q[d] then its float32 scale s (4 bytes, host order, unaligned). The
// values are those of y = W x, W the unnormalised Walsh-Hadamard matrix on each block of P
// elements (P = the largest power of two dividing D: 64 for head_dim 64; W W = P I), so the row
// stands for x = W (q * s) / P. The rotation spreads a few large channels (RoPE'd K has them)
// over the whole row before one scale covers it: 2x less rounding error for the same bytes.
// Attention needs no un-rotated copy: q . x = (W q / P) . (q * s) (the kernel rotates the
// query once), and a V sum sum_i w_i x_i = W (sum_i w_i q_i s_i) / P (it rotates the output
// once). The scale is the row's own: s = max|y| / 127, so a row's bits depend on that row
// alone, never on what is appended after it or beside it (a block's rows are each final once
// written; prefix sharing, copy-on-write and the K/V tiers move them as bytes).
// models/kv_quant.py is the PyTorch statement of the same layout, rotation and rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kv_half.h"

#if defined(__AVX2__)
#include "x86_intrinsics.h"
#endif

namespace tgserve {

// Bytes an element type adds past D to each (token, KV head) row of the cache: the int8
// rows' scale, none for rows of the model's dtype.
template <typename KV>
struct KVRowExtra {
  static constexpr int64_t value = 0;
};
template <>
struct KVRowExtra<int8_t> {
  static constexpr int64_t value = sizeof(float);
};

// The scale of an int8 row of D values (read from its unaligned 4 bytes).
inline float kv_row_scale(const int8_t* row, int64_t D) {
  float s;
  std::memcpy(&s, row + D, sizeof(float));
  return s;
}

// The rotation's block: the largest power of two dividing D (D itself for 64 and 128).
inline int64_t kv_rotation_block(int64_t D) { return D & -D; }

// x [D] <- W x, W the unnormalised Walsh-Hadamard matrix (entries +-1) on each block of
// kv_rotation_block(D) elements: butterflies (a, b) -> (a + b, a - b) on pairs h apart, for
// h = 1, 2, 4, ... in that order, in float32 (each result one rounding: the same bits however
// the pairs are vectorised; a + b == b + a exactly).
inline void walsh_hadamard_scalar(float* x, int64_t D) {
  const int64_t P = kv_rotation_block(D);
  for (int64_t h = 1; h < P; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)
      for (int64_t j = i; j < i + h; ++j) {
        const float a = x[j], b = x[j + h];
        x[j] = a + b;
        x[j + h] = a - b;
      }
}

#if defined(__AVX2__)
// The same butterflies, 8 floats a register: h = 1, 2, 4 inside each group of 8 (a group's
// values after a stage depend on that group alone, so its three stages run back to back), then
// h = 8, 16, ... between registers. A prefill row rotates each query head and output row once
// (kv_rotate_query, the V sum): the scalar pairs were 8% of an int8 prefill's attention.
inline void walsh_hadamard_avx2(float* x, int64_t D, int64_t P) {
  for (int64_t i = 0; i < D; i += 8) {
    __m256 v = _mm256_loadu_ps(x + i), t;
    t = _mm256_permute_ps(v, 0xB1);  // pairs 1 apart swapped: x1 x0 x3 x2 ...
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xAA);
    t = _mm256_permute_ps(v, 0x4E);  // pairs 2 apart: x2 x3 x0 x1 ...
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xCC);
    t = _mm256_permute2f128_ps(v, v, 0x01);  // pairs 4 apart: the two halves swapped
    v = _mm256_blend_ps(_mm256_add_ps(v, t), _mm256_sub_ps(t, v), 0xF0);
    _mm256_storeu_ps(x + i, v);
  }
  for (int64_t h = 8; h < P; h *= 2)
    for (int64_t i = 0; i < D; i += 2 * h)
      for (int64_t j = i; j < i + h; j += 8) {
        const __m256 a = _mm256_loadu_ps(x + j), b = _mm256_loadu_ps(x + j + h);
        _mm256_storeu_ps(x + j, _mm256_add_ps(a, b));
        _mm256_storeu_ps(x + j + h, _mm256_sub_ps(a, b));
      }
}
#endif

inline void walsh_hadamard(float* x, int64_t D) {
#if defined(__AVX2__)
  const int64_t P = kv_rotation_block(D);
  if (P >= 8) return walsh_hadamard_avx2(x, D, P);
#endif
  walsh_hadamard_scalar(x, D);
}

// A query row [D] as the kernel scores it against int8 rows: W q / P (P a power of two:
// exact), so that its dot product with a row's values q * s is q . x.
inline void kv_rotate_query(float* q, int64_t D) {
  walsh_hadamard(q, D);
  const float inv = 1.0f / static_cast<float>(kv_rotation_block(D));
  for (int64_t d = 0; d < D; ++d) q[d] *= inv;
}

// x [D] -> dst [D + 4]: y = W x (float32, walsh_hadamard), q[d] = round-half-even(y[d] * (127 /
// max|y|)) in [-127, 127], then s = max|y| / 127 (all-zero rows: q = 0, s = 0). float32
// arithmetic, no fused operations.
template <typename T>
void quantize_kv_row(const T* x, int64_t D, int8_t* dst) {
  constexpr int64_t kOnStack = 512;
  float stack[kOnStack];
  std::vector<float> heap(D > kOnStack ? D : 0);
  float* y = D > kOnStack ? heap.data() : stack;
  for (int64_t d = 0; d < D; ++d) y[d] = static_cast<float>(x[d]);
  walsh_hadamard(y, D);
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(y[d]));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float r = std::nearbyint(y[d] * inv);
    dst[d] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  const float s = amax / 127.0f;
  std::memcpy(dst + D, &s, sizeof(float));
}

// One token's KVH heads of K or of V (x [KVH, D] of T) into cache slot `slot` (a cache of KV
// rows [slots, KVH, D + KVRowExtra<KV>]): copied as they are into a cache of T, quantised row
// by row into an int8 one, rounded to float16 (saturated) into a float16 one (kv_half.h).
template <typename T, typename KV>
void append_rows(const T* x, int64_t slot, int64_t KVH, int64_t D, KV* cache) {
  const int64_t DS = D + KVRowExtra<KV>::value;
  if constexpr (std::is_same_v<KV, int8_t>) {
    for (int64_t g = 0; g < KVH; ++g) quantize_kv_row(x + g * D, D, cache + (slot * KVH + g) * DS);
  } else if constexpr (std::is_same_v<KV, c10::Half> && !std::is_same_v<T, c10::Half>) {
    narrow_kv_row(x, KVH * D, cache + slot * KVH * D);  // a float32 model's float16 rows: kv_half.h
  } else {
    static_assert(std::is_same_v<KV, T>, "a float cache holds the model's dtype");
    std::copy(x, x + KVH * D, cache + slot * KVH * D);
  }
}

// One token's K and V heads (k, v [KVH, D] of T) into cache slot `slot`: K rows of KV, V rows
// of VV (KV, or int8 under a float32 model's float16 K rows: --kv-cache-dtype int8v), each
// written alone as append_rows says.
template <typename T, typename KV, typename VV = KV>
void append_kv(const T* k, const T* v, int64_t slot, int64_t KVH, int64_t D, KV* kc, VV* vc) {
  append_rows(k, slot, KVH, D, kc);
  append_rows(v, slot, KVH, D, vc);
}

}  // namespace tgserve
