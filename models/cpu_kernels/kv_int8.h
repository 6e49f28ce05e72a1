// The int8 K/V cache row (--kv-cache-dtype int8): how the C++ step writes a (token, KV head)
// row of K or V once, at append, and how the paged attention reads it back in place.
//
// Layout: a cache of int8 [num_blocks, block_size, KVH, D + 4]; the row of one token and KV
// head is its D values q[d] then its float32 scale s (4 bytes, host order, unaligned), and the
// value it stands for is q[d] * s. The scale is the row's own: s = max|x| / 127, so a row's
// bits depend on that row alone, never on what is appended after it or beside it (a block's
// rows are each final once written; prefix sharing, copy-on-write and the K/V tiers move them
// as bytes). models/kv_quant.py is the PyTorch statement of the same layout and rounding.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// x [D] -> dst [D + 4]: q[d] = round-half-even(x[d] * (127 / max|x|)) in [-127, 127], then
// s = max|x| / 127 (all-zero rows: q = 0, s = 0). float32 arithmetic, no fused operations.
template <typename T>
void quantize_kv_row(const T* x, int64_t D, int8_t* dst) {
  float amax = 0.0f;
  for (int64_t d = 0; d < D; ++d) amax = std::max(amax, std::fabs(static_cast<float>(x[d])));
  const float inv = amax > 0.0f ? 127.0f / amax : 0.0f;
  for (int64_t d = 0; d < D; ++d) {
    const float r = std::nearbyint(static_cast<float>(x[d]) * inv);
    dst[d] = static_cast<int8_t>(std::clamp(r, -127.0f, 127.0f));
  }
  const float s = amax / 127.0f;
  std::memcpy(dst + D, &s, sizeof(float));
}

// One token's K and V heads (k, v [KVH, D] of T) into cache slot `slot` (caches of KV rows
// [slots, KVH, D + KVRowExtra<KV>]): copied as they are into a cache of T, quantised row by
// row into an int8 one.
template <typename T, typename KV>
void append_kv(const T* k, const T* v, int64_t slot, int64_t KVH, int64_t D, KV* kc, KV* vc) {
  const int64_t DS = D + KVRowExtra<KV>::value;
  if constexpr (std::is_same_v<KV, int8_t>) {
    for (int64_t g = 0; g < KVH; ++g) {
      quantize_kv_row(k + g * D, D, kc + (slot * KVH + g) * DS);
      quantize_kv_row(v + g * D, D, vc + (slot * KVH + g) * DS);
    }
  } else {
    static_assert(std::is_same_v<KV, T>, "a float cache holds the model's dtype");
    std::copy(k, k + KVH * D, kc + slot * KVH * D);
    std::copy(v, v + KVH * D, vc + slot * KVH * D);
  }
}

}  // namespace tgserve
