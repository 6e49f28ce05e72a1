// A whole forward step of a Llama-family model in C++ (see decoder.cpp), and the named
// weights of one decoder layer it is built from (bound to Python as keyword-only classes).
#pragma once

#include <torch/extension.h>

#include <memory>
#include <optional>

#include "lora.h"

namespace tgserve {

// A linear layer: its weight [N, K] as stored (int8 when quantized), its packed copy for
// packed_linear (kernels.h), its bias [N] (none when the layer has none) and, for int8
// weights only, the float32 scale of each output row [N]. GGUF blocks kept as stored:
// block_type is their GGML type (else 0), `packed` their pack_blocks copy (also `weight`: no
// other copy is kept) and out_features N.
struct LinearWeights {
  torch::Tensor weight, packed;
  std::optional<torch::Tensor> bias, scales;
  int64_t block_type = 0, out_features = 0;
  std::optional<LoraWeights> lora;  // adapter slots added after the product (lora.h), or none
};

struct MoeWeights;  // a sparse MLP's router and experts (moe_block.h)

// One pre-norm decoder layer of the Llama family, named as in models/llama.py.
struct LayerWeights {
  torch::Tensor input_norm;  // [hidden] RMSNorm before attention
  LinearWeights qkv;         // [q + 2 kv, hidden], with bias for Qwen2
  LinearWeights o_proj;      // [hidden, q]
  torch::Tensor post_norm;   // [hidden] RMSNorm before the MLP
  // The MLP: a dense SwiGLU (gate_up [2 * intermediate, hidden]: gate rows, then up rows;
  // down [hidden, intermediate]) or a mixture of experts (moe), never both.
  std::optional<LinearWeights> gate_up, down;
  std::shared_ptr<MoeWeights> moe;
  // [head_dim] RMSNorm weights over each q / k head before rotary (Qwen3), else none.
  std::optional<torch::Tensor> q_norm, k_norm;
};

void bind_decoder(pybind11::module& m);

}  // namespace tgserve
