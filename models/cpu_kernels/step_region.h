// A decode step's layers in one OpenMP region per layer (decoder.cpp's LlamaDecoder runs it for
// up to kRegionRows rows when every linear is a panels kind: Q8 panels or Q4_0 / Q4_1 / Q8_0
// blocks, no LoRA slot in use, no tensor parallel; a sparse MLP when its experts run through the
// panel kernels and it has no shared expert).
//
// Why: the op-by-op step opens a parallel region per linear, the attention and (batched) each
// element-wise loop, ~150 a step of the default model at batch 1, and allocates each output. A
// region's fork and join cost ~1.7 us on two Zen 3 threads against ~0.55 us for a barrier
// inside one (PERFORMANCE.md). Here a layer is one region from its out projection to the next
// layer's rotary (then the attention's own region): threads split each product's output panels
// statically (units of 2 panels: 32 outputs, one int8 quantisation block), and sync only where
// data flows (after o, gate_up, down and qkv). Each thread keeps its own copy of the residual
// rows and of the normed (and quantised) input, computed by the same code from the same values,
// so no barrier waits on a norm. gate_up's unit u is gate panels 2u, 2u + 1 and the same up
// panels: its thread applies SiLU x up (and quantises those 32 activations) at once. A sparse
// MLP: the router's output panels split over the threads (one panel a unit), then
// moe_experts.h's experts_team on the same team (routing, the chosen experts' gate-up and down,
// the weighted sum: three more barriers), where the op-by-op step opened a region for it.
//
// Bits: every output element is computed by the same function on the same inputs in the same
// order as in the op-by-op step (q8_linear_panels / block_linear_panels are q8_linear's /
// block_linear's per-group bodies; the router's panels are packed_linear's, whose lanes' order
// depends on K alone; the element-wise functions are vec_math.h's; experts_team is what
// moe_forward runs): the same logits either way (tests/models/test_cpp_step_region.py,
// tests/models/moe/test_moe_cpp_step.py).
#pragma once

#include <torch/extension.h>

#include <omp.h>

#include <algorithm>
#include <vector>

#include "decoder.h"
#include "kernels.h"
#include "kv_int8.h"
#include "moe_block.h"
#include "q8_linear.h"
#include "vec_math.h"

namespace tgserve {

constexpr int64_t kRegionRows = 8;  // the few-rows passes of the panels kernels
// A sparse MLP's experts then have at most kRegionRows rows each: experts_team runs them all.
static_assert(kRegionRows <= moe_experts::kMostRows);

// What a step reads of the model (LlamaDecoder's members).
struct StepModel {
  const std::vector<LayerWeights>& layers;
  const torch::Tensor& final_norm;
  const std::vector<torch::Tensor>& k_caches;
  const std::vector<torch::Tensor>& v_caches;
  int64_t H, KVH, D, C;
  float eps;
  int64_t window;
  bool kv_int8;
  bool kv_half;  // float16 rows of a float32 model (kv_half.h; --kv-cache-dtype float16)
  bool kv_int8v;  // a float32 model's float16 K rows, int8 V rows (--kv-cache-dtype int8v)
};

// Row `row` [q + 2 kv] of layer w's qkv: (q / k norms per head, Qwen3,) rotary on q and k in
// place, q to q_out [H * D], k and v to the cache at `slot` (int8 rows, float16 rows, float16 K
// with int8 V rows, or the model's dtype).
template <typename T>
void rope_and_append(const StepModel& m, const LayerWeights& w, T* row, const T* cos,
                     const T* sin, int64_t slot, void* kc, void* vc, T* q_out) {
  const int64_t q_size = m.H * m.D, kv_size = m.KVH * m.D;
  if (w.q_norm && w.k_norm) {  // in place, per head: as models/layers.py's RMSNorm over D
    const T* qn = static_cast<const T*>(w.q_norm->data_ptr());
    const T* kn = static_cast<const T*>(w.k_norm->data_ptr());
    for (int64_t h = 0; h < m.H; ++h) rms_norm_row(row + h * m.D, qn, row + h * m.D, m.D, m.eps);
    for (int64_t g = 0; g < m.KVH; ++g)
      rms_norm_row(row + q_size + g * m.D, kn, row + q_size + g * m.D, m.D, m.eps);
  }
  rope_heads(row, cos, sin, m.H + m.KVH, m.D);
  std::copy(row, row + q_size, q_out);
  if (m.kv_int8)
    append_kv(row + q_size, row + q_size + kv_size, slot, m.KVH, m.D, static_cast<int8_t*>(kc),
              static_cast<int8_t*>(vc));
  else if (m.kv_int8v)
    append_kv(row + q_size, row + q_size + kv_size, slot, m.KVH, m.D,
              static_cast<c10::Half*>(kc), static_cast<int8_t*>(vc));
  else if (m.kv_half)
    append_kv(row + q_size, row + q_size + kv_size, slot, m.KVH, m.D,
              static_cast<c10::Half*>(kc), static_cast<c10::Half*>(vc));
  else
    append_kv(row + q_size, row + q_size + kv_size, slot, m.KVH, m.D, static_cast<T*>(kc),
              static_cast<T*>(vc));
}

// Whether the one-region step runs these layers (the linears' kinds and shapes; a sparse
// MLP's router dense (float / bf16 packed, not int8) or a block panels kind, its experts the
// panel kernels', no shared expert).
inline bool region_linear(const LinearWeights& w) {
  const int kind = static_cast<int>(w.block_type);
  return (is_q8_kind(kind) || (kind && block_panels_type(kind))) && !w.lora;
}
inline bool region_router(const LinearWeights& w) {
  const int kind = static_cast<int>(w.block_type);
  const bool dense = !kind && w.packed.scalar_type() != at::kChar;
  return (dense || (kind && block_panels_type(kind))) && !w.lora;
}
inline bool region_mlp(const LayerWeights& w) {
  if (w.moe)
    return w.moe->panel_experts && region_router(w.moe->router) && !w.moe->shared_gate_up;
  return w.gate_up && region_linear(*w.gate_up) && region_linear(*w.down) &&
         w.gate_up->out_features % 64 == 0;
}
inline bool runs_in_one_region(const std::vector<LayerWeights>& layers) {
  return std::all_of(layers.begin(), layers.end(), [](const LayerWeights& w) {
    return region_linear(w.qkv) && region_linear(w.o_proj) && region_mlp(w);
  });
}
// Whether every sparse block takes its one team (MoeWeights.one_region: off, a bench's or a
// test's peer runs the op-by-op step with each expert's products in turn).
inline bool sparse_teams_on(const std::vector<LayerWeights>& layers) {
  return std::all_of(layers.begin(), layers.end(),
                     [](const LayerWeights& w) { return !w.moe || w.moe->one_region; });
}

namespace region {

// A product's input rows [M, K]: as T (block kernels) and, for Q8 panels, quantised: int8 in
// xq, or int16 in xq16 (kQ16Activations kinds: q8_linear.h's activation_bits).
template <typename T>
struct Rows {
  const T* x = nullptr;
  const int8_t* xq = nullptr;
  const float* dx = nullptr;
  const int32_t* sx = nullptr;
  const int16_t* xq16 = nullptr;
};

// This thread's slice of `panels` output panels, in units of two (q8_linear's panel pairs).
inline std::pair<int64_t, int64_t> slice(int64_t panels) {
  const int64_t units = (panels + 1) / 2, t = omp_get_thread_num(), n = omp_get_num_threads();
  return {std::min(panels, 2 * (units * t / n)), std::min(panels, 2 * (units * (t + 1) / n))};
}

// y's output panels [p0, p1) of w for the rows `in` (M rows of K).
template <typename T>
void product(const LinearWeights& w, const Rows<T>& in, int64_t M, int64_t K, T* y, int64_t p0,
             int64_t p1) {
  const int kind = static_cast<int>(w.block_type);
  const T* bias = w.bias ? static_cast<const T*>(w.bias->data_ptr()) : nullptr;
  const uint8_t* wp = w.packed.data_ptr<uint8_t>();
  if (activation_bits(kind) == 16)
    q8_linear_panels<T, T>(in.xq16, in.dx, in.sx, M, K, wp, kind, bias, y, w.out_features, p0,
                           p1);
  else if (is_q8_kind(kind))
    q8_linear_panels<T, T>(in.xq, in.dx, in.sx, M, K, wp, kind, bias, y, w.out_features, p0, p1);
  else
    block_linear_panels<T, T>(in.x, M, K, wp, kind, bias, y, w.out_features, p0, p1);
}

// A thread's own rows: the residual x [M, C], the normed h [M, C] and h quantised (q8 layers).
template <typename T>
struct Own {
  std::vector<T> x, h;
  std::vector<int8_t> xq;
  std::vector<int16_t> xq16;
  std::vector<float> dx;
  std::vector<int32_t> sx;
  // h = norm(x) (and its rows quantised to `bits`: 8, 16, or 0 for none), as a product's input.
  Rows<T> normed(const T* weight, int64_t M, int64_t C, float eps, int bits) {
    for (int64_t b = 0; b < M; ++b) rms_norm_row(x.data() + b * C, weight, h.data() + b * C, C, eps);
    return quantized(h.data(), M, C, bits);
  }
  Rows<T> quantized(const T* rows, int64_t M, int64_t K, int bits) {
    if (!bits) return {rows};
    dx.resize(M * K / 32), sx.resize(M * K / 32);
    if (bits == 16) {
      xq16.resize(M * K);
      q8_quantize_rows(rows, M, K, xq16.data(), dx.data(), sx.data());
      return {rows, nullptr, dx.data(), sx.data(), xq16.data()};
    }
    xq.resize(M * K);
    q8_quantize_rows(rows, M, K, xq.data(), dx.data(), sx.data());
    return {rows, xq.data(), dx.data(), sx.data()};
  }
};

}  // namespace region

// The paged decode attention of layer l (attention.cpp, its own region) for the queries q
// [B, H, D] into out [B, H, D]; kOk or the kernel's error code.
template <typename T>
int decode_attention(const StepModel& m, size_t l, const T* q, T* out, const int64_t* tables,
                     int64_t width, const int64_t* lens, int64_t B);

// The layers of a decode step of B <= kRegionRows rows (decoder.cpp's `run` for these layers):
// x [B, C] the embeddings (the residual stream, overwritten), h [B, C] the final-normed output;
// cos / sin [B, D]; slots [B]; tables [B, width]; lens [B]. Returns the attention's code.
template <typename T>
int one_region_step(const StepModel& m, T* x, T* h, const T* cos, const T* sin,
                    const int64_t* slots, const int64_t* tables, int64_t width,
                    const int64_t* lens, int64_t B);

}  // namespace tgserve
