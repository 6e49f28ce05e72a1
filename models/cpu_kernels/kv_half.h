// The float16 K/V cache of a float32 model (--kv-cache-dtype float16): how the C++ step writes a
// (token, KV head) row once, at append. The paged attention reads the rows in place with float32
// queries and outputs (attention.cpp's (float, c10::Half) instance), widening each value
// exactly, so its result is the float32 attention over the rounded rows, bit for bit.
//
// Rounding: each float32 value goes to the nearest float16, ties to even (torch's
// `.to(torch.float16)`, F16C's vcvtps2ph and c10::Half agree), after saturating at +-65504,
// float16's largest finite value: a value past it is stored as +-65504 where torch would store
// +-inf (an inf key makes every score of its row inf or NaN); NaN stays NaN. Below 2^-14 values
// are subnormal (absolute step 2^-24). models/kv_half.py is the PyTorch statement of the same
// rounding (the PyTorch paths' writer). A row's bits depend on that row alone.
#pragma once

#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

namespace tgserve {

constexpr float kHalfMax = 65504.0f;  // float16's largest finite value

// The cache element of one value: x saturated at +-kHalfMax (NaN passes: std::clamp returns it),
// rounded to nearest even.
inline c10::Half to_kv_half(float x) { return c10::Half(std::clamp(x, -kHalfMax, kHalfMax)); }

// n values of a float32 (or any float) row into float16 cache elements.
template <typename T>
void narrow_kv_row(const T* x, int64_t n, c10::Half* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = to_kv_half(static_cast<float>(x[i]));
}

}  // namespace tgserve
