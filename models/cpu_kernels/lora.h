// LoRA adapters' batched shrink / expand on the CPU (lora.cpp): each row of a step adds its own
// adapter's low-rank product to a projection's output. Layout: models/lora/stack.py.
#pragma once

#include <torch/extension.h>

#include <cstdint>

namespace tgserve {

// One fused projection's adapter slots (shared with Python's LoraStack, updated in place when
// an adapter is loaded into a slot):
// a [slots, S * R, K] (model dtype), b [slots, R, N] (model dtype: lora_B transposed),
// scales [slots, N] float32,
// offsets [S + 1] int64 (where each slice's outputs start).
struct LoraWeights {
  torch::Tensor a, b, scales, offsets;
};

// y [B, N] += for each row with rows[row] = s >= 0, slice by slice:
// T(scale[s, n] * T(b[s, :, n] . T(a[s, slice rows, :] . x[row]))), added in float and rounded
// once to T (the PyTorch reference's rounding points). Rows of -1 are left as they are.
template <typename T>
void lora_add(const LoraWeights& w, const T* x, T* y, int64_t B, const int64_t* rows);

void bind_lora(pybind11::module& m);

}  // namespace tgserve
