// A sparse block's routed experts in ONE OpenMP region (moe_block.h calls it for decode-sized
// steps): every chosen expert's gate-up, SiLU x up and down, the threads splitting the units
// (expert, group of kUnitPanels output panels) of each product between them, three barriers
// and no fork / join per expert. Before, each expert's two products were a region each: at
// batch 1 on a top-4 layer, 8 forks and joins where this has one, and a thread's share of a
// small expert product was a few panels (the per-call start-up and the OpenMP wake-up around
// ~0.5-1 MB of weights).
//
// Weights: GGUF blocks as stored (block_linear_panels: Q4_0, Q4_1, Q8_0) or Q8 panels with
// int8 activations (q8_linear_panels; `--activation-quantization int8`). With int8
// activations each row of the block's input is quantised once and its int8 values serve every
// expert that row chose (llama.cpp's way); the SiLU x up rows are quantised once for down.
//
// Numerics: each product's output lane runs the panel kernel's own sequence, which depends on
// K alone (block_linear.cpp, q8_linear.h), and a row quantises the same way whichever rows
// share its experts, so a row's bits are those of the per-expert calls (moe_block.h) and never
// depend on the other rows, the unit split or the thread count.
#pragma once

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "aligned_scratch.h"
#include "decoder.h"
#include "kernels.h"
#include "q8_linear.h"
#include "vec_math.h"

namespace tgserve {

namespace moe_experts {

constexpr int64_t kUnitPanels = 4;  // output panels of 16 per unit of work
constexpr int64_t kMostRows = 8;    // rows per expert the region serves (a decode step's)

// The experts' weights run through the panel kernels, and no expert has LoRA slots.
inline bool panel_weights(const std::vector<LinearWeights>& gate_up,
                          const std::vector<LinearWeights>& down) {
  const int type = static_cast<int>(gate_up.front().block_type);
  const bool q8 = is_q8_kind(type);
  if (!q8 && !block_panels_type(type)) return false;
  for (const auto* ws : {&gate_up, &down})
    for (const LinearWeights& w : *ws)
      if (w.lora || static_cast<int>(w.block_type) != type) return false;
  return true;
}

// One product over units: rows x [m, K] of expert a (or their int8 values), output y [m, N].
struct Rows {
  const void* x;        // [m, K] in T (float path) or int8 (q8 path)
  const float* dx;      // q8: [m, K / 32] scales
  const int32_t* sx;    // q8: [m, K / 32] sums
  void* y;              // [m, N] in T
};

template <typename T>
void product_unit(const LinearWeights& w, const Rows& r, int64_t m, int64_t K, int64_t p_begin,
                  int64_t p_end) {
  const int type = static_cast<int>(w.block_type);
  const uint8_t* wp = w.packed.data_ptr<uint8_t>();
  const T* bias = w.bias ? static_cast<const T*>(w.bias->data_ptr()) : nullptr;
  T* y = static_cast<T*>(r.y);
  if (is_q8_kind(type))
    q8_linear_panels<T, T>(static_cast<const int8_t*>(r.x), r.dx, r.sx, m, K, wp, type, bias, y,
                           w.out_features, p_begin, p_end);
  else
    block_linear_panels<T, T>(static_cast<const T*>(r.x), m, K, wp, type, bias, y,
                              w.out_features, p_begin, p_end);
}

}  // namespace moe_experts

// slots [B * k, C]: slot s = (row s / k, rank s % k) gets its expert's output for h's row
// s / k; by_expert[e] the slots that chose e, in slot order (every slot in one list). h [B, C].
// Serves panel_weights experts with at most kMostRows slots each (the caller checks).
template <typename T>
void experts_region(const T* h, int64_t C, const std::vector<LinearWeights>& gate_up,
                    const std::vector<LinearWeights>& down,
                    const std::vector<std::vector<int64_t>>& by_expert, int64_t k, T* slots) {
  using moe_experts::kUnitPanels;
  std::vector<int64_t> active, row0{0};  // experts with rows; their first row in the buffers
  for (int64_t e = 0; e < static_cast<int64_t>(by_expert.size()); ++e)
    if (!by_expert[e].empty()) {
      active.push_back(e);
      row0.push_back(row0.back() + static_cast<int64_t>(by_expert[e].size()));
    }
  const int64_t A = static_cast<int64_t>(active.size()), R = row0.back();
  const int64_t I = gate_up.front().out_features / 2, G = 2 * I;
  const bool q8 = is_q8_kind(static_cast<int>(gate_up.front().block_type));
  const int64_t B = R / k;       // h's rows (every row has k slots)
  std::vector<int64_t> src(R);  // buffer row -> h's row
  for (int64_t a = 0; a < A; ++a)
    for (int64_t i = 0; i < row0[a + 1] - row0[a]; ++i) src[row0[a] + i] = by_expert[active[a]][i] / k;
  // Activations: q8 -> int8 rows with a scale and a sum per block of 32; float -> T rows.
  const int64_t xw = q8 ? 1 : static_cast<int64_t>(sizeof(T));
  thread_local AlignedScratch<uint8_t> h_buf, x_buf, act_buf;
  int8_t* hq = reinterpret_cast<int8_t*>(h_buf.resize(q8 ? B * C : 0));  // q8: h's rows
  uint8_t* xs = x_buf.resize(R * C * xw);
  uint8_t* acts = act_buf.resize(R * I * xw);
  std::vector<float> dh(q8 ? B * C / 32 : 0), dx(q8 ? R * C / 32 : 0), da(q8 ? R * I / 32 : 0);
  std::vector<int32_t> sh(dh.size()), sx(dx.size()), sa(da.size());
  std::vector<T> gu(R * G), ys(R * C);
  const auto rows = [&](int64_t a, bool first) {  // expert a's rows of a product
    const int64_t K = first ? C : I, r = row0[a];
    return moe_experts::Rows{(first ? xs : acts) + r * K * xw,
                             q8 ? (first ? dx : da).data() + r * K / 32 : nullptr,
                             q8 ? (first ? sx : sa).data() + r * K / 32 : nullptr,
                             first ? static_cast<void*>(gu.data() + r * G)
                                   : static_cast<void*>(ys.data() + r * C)};
  };
  // A product's units, (expert, kUnitPanels panels) in that order, split evenly and
  // statically: at batch 1 every expert has one row, so every unit is the same work.
  const auto run_units = [&](bool first) {
    const int64_t K = first ? C : I, panels = ((first ? G : C) + 15) / 16;
    const int64_t units = (panels + kUnitPanels - 1) / kUnitPanels;  // per expert
#pragma omp for schedule(static)
    for (int64_t u = 0; u < A * units; ++u) {
      const int64_t a = u / units, p0 = u % units * kUnitPanels;
      const LinearWeights& w = (first ? gate_up : down)[active[a]];
      moe_experts::product_unit<T>(w, rows(a, first), row0[a + 1] - row0[a], K, p0,
                                   std::min(panels, p0 + kUnitPanels));
    }
  };
#pragma omp parallel
  {
    // q8: each of h's rows quantised once (a row alone: the bits q8_linear gives it).
    if (q8) {
#pragma omp for schedule(static)
      for (int64_t b = 0; b < B; ++b)
        q8_quantize_rows(h + b * C, 1, C, hq + b * C, dh.data() + b * C / 32,
                         sh.data() + b * C / 32);
    }
    // Each expert's rows, contiguous: h's rows (float) or their int8 values, scales and sums.
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      if (q8) {
        const int64_t b = src[r], nb = C / 32;
        std::copy(hq + b * C, hq + (b + 1) * C, reinterpret_cast<int8_t*>(xs) + r * C);
        std::copy(dh.begin() + b * nb, dh.begin() + (b + 1) * nb, dx.begin() + r * nb);
        std::copy(sh.begin() + b * nb, sh.begin() + (b + 1) * nb, sx.begin() + r * nb);
      } else {
        const T* row = h + src[r] * C;
        std::copy(row, row + C, reinterpret_cast<T*>(xs) + r * C);
      }
    }
    run_units(true);
    std::vector<T> act(q8 ? I : 0);  // q8: a row's SiLU x up before it is quantised
#pragma omp for schedule(static)
    for (int64_t r = 0; r < R; ++r) {
      if (q8) {
        silu_mul_row(gu.data() + r * G, act.data(), I);
        q8_quantize_rows(act.data(), 1, I, reinterpret_cast<int8_t*>(acts) + r * I,
                         da.data() + r * I / 32, sa.data() + r * I / 32);
      } else {
        silu_mul_row(gu.data() + r * G, reinterpret_cast<T*>(acts) + r * I, I);
      }
    }
    run_units(false);
  }
  for (int64_t a = 0; a < A; ++a)
    for (int64_t i = 0; i < row0[a + 1] - row0[a]; ++i) {
      const T* y = ys.data() + (row0[a] + i) * C;
      std::copy(y, y + C, slots + by_expert[active[a]][i] * C);
    }
}

}  // namespace tgserve
