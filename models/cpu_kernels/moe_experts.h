// A decode step's sparse block inside one OpenMP team (moe_block.h calls it for steps of at
// most kMostRows rows): router, top-k, every chosen expert's gate-up with its SiLU x up, and
// down with the rank-order weighted sum, the threads sharing units of work between three
// barriers. `experts_team` runs on every thread of an enclosing team (orphaned worksharing: a
// step that keeps one team for its whole layer loop calls it from inside; moe_forward opens a
// region around it); called outside any parallel region it runs on the caller's thread alone.
//
// Units, handed out dynamically (one at a time: a thread descheduled by another process on a
// shared host leaves the units it has not taken to the others, instead of half the product):
// - gate-up: (expert, kUnitPanels panels of gate rows and the matching panels of up rows),
//   then that slice's SiLU x up (and with int8 activations its quantisation, whole blocks of
//   32): no barrier between the product and the activation;
// - down: (kUnitPanels output panels): every active expert's rows for those columns, then the
//   rank-order weighted sum of each row's slots for them, straight into the output.
// Before (16ca175..dfafdac): the router's product its own region, quantise / copy / gate-up /
// SiLU / down split by four barriers, the weighted sum after the region on one thread.
//
// Weights: GGUF blocks as stored (block_linear_panels: Q4_0, Q4_1, Q8_0) or Q8 panels with
// int8 activations (q8_linear_panels; `--activation-quantization int8`), the intermediate a
// multiple of 32 (a gate panel never holds up rows). With int8 activations each input row is
// quantised once and its int8 values serve every expert that row chose (llama.cpp's way).
//
// Numerics: each product's output lane runs the panel kernel's own sequence, which depends on
// K alone (block_linear.cpp, q8_linear.h); SiLU x up and the Q8 quantisation work element- and
// block-wise (vec_math.h, q8_linear.h), so a slice gets the bits its row gets whole; the sum
// is weighted_sum_cols' per column (moe_block.cpp). A row's bits are those of the per-expert
// calls (moe_block.h) and never depend on the other rows, the unit order or the thread count.
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

// out[c] = T(((y[0][c] w[0]) + y[1][c] w[1]) + ...) for c < n, a float32 multiply then add
// per rank (no fused multiply-add, as torch's two ops round); y[r] the rank r output row.
template <typename T>
void weighted_sum_cols(const T* const* y, const float* w, int64_t k, int64_t n, T* out);

namespace moe_experts {

constexpr int64_t kUnitPanels = 4;  // output panels of 16 per unit of work
constexpr int64_t kMostRows = 8;    // rows per expert the team runs (a decode step's)
constexpr int64_t kTeamRows = 64;   // rows of a step that route in the team (a decode batch)

// The experts' weights run through the panel kernels, and no expert has LoRA slots.
inline bool panel_weights(const std::vector<LinearWeights>& gate_up,
                          const std::vector<LinearWeights>& down) {
  const int type = static_cast<int>(gate_up.front().block_type);
  if (!is_q8_kind(type) && !block_panels_type(type)) return false;
  // int16 activations (kQ16Activations): the team's buffers hold int8 rows; such experts run
  // each expert's products in turn (q8_linear, the same bits a row gets alone)
  if (activation_bits(type) == 16) return false;
  // I % 32: a gate panel holds no up rows, a slice of SiLU x up whole blocks of 32
  if (gate_up.front().out_features % 64 != 0) return false;
  for (const auto* ws : {&gate_up, &down})
    for (const LinearWeights& w : *ws)
      if (w.lora || static_cast<int>(w.block_type) != type) return false;
  return true;
}

// Rows x [m, K] (T, or int8 with a scale and a sum per block of 32) -> y [m, N] over output
// panels [p_begin, p_end) of w, on the calling thread.
template <typename T>
void product_unit(const LinearWeights& w, const void* x, const float* dx, const int32_t* sx,
                  int64_t m, int64_t K, T* y, int64_t p_begin, int64_t p_end) {
  const int type = static_cast<int>(w.block_type);
  const uint8_t* wp = w.packed.data_ptr<uint8_t>();
  const T* bias = w.bias ? static_cast<const T*>(w.bias->data_ptr()) : nullptr;
  if (is_q8_kind(type))
    q8_linear_panels<T, T>(static_cast<const int8_t*>(x), dx, sx, m, K, wp, type, bias, y,
                           w.out_features, p_begin, p_end);
  else
    block_linear_panels<T, T>(static_cast<const T*>(x), m, K, wp, type, bias, y,
                              w.out_features, p_begin, p_end);
}

// A step's routing and buffers: planned by one thread (under `omp single`), read by the team.
template <typename T>
struct Plan {
  std::vector<int64_t> chosen;   // [B, k] expert of each slot (row b, rank r) = b * k + r
  std::vector<float> weights;    // [B, k]
  bool team = false;             // every expert has at most kMostRows rows: the team runs them
  std::vector<int64_t> active;   // experts with rows, ascending
  std::vector<int64_t> row0;     // [A + 1] each active expert's first row in the buffers
  std::vector<int64_t> buf_row;  // [B * k] slot -> its row in the buffers
  AlignedScratch<uint8_t> xs, acts;  // [R, C] / [R, I]: T, or int8 with int8 activations
  std::vector<float> dx, da;         // int8: [R, C / 32] / [R, I / 32] block scales
  std::vector<int32_t> sx, sa;       // int8: their block sums
  std::vector<T> gu, ys;             // [R, 2 I] gate-up outputs, [R, C] down outputs
};

// The plan's buffers once chosen is filled (count[e]: slots that chose e): the active experts,
// each slot's buffer row (an expert's rows contiguous, in slot order) and each expert's input
// rows: h's rows, or their int8 values (each row quantised once, alone: the bits q8_linear
// gives it) with their scales and sums.
template <typename T>
void plan_buffers(Plan<T>& p, const T* h, int64_t B, int64_t C, int64_t I, int64_t k,
                  const std::vector<int64_t>& count, bool q8) {
  const int64_t E = static_cast<int64_t>(count.size()), nb = C / 32;
  const int64_t xw = q8 ? 1 : static_cast<int64_t>(sizeof(T));
  p.active.clear();
  p.row0.assign(1, 0);
  std::vector<int64_t> next(E, 0);
  for (int64_t e = 0; e < E; ++e)
    if (count[e] > 0) {
      p.active.push_back(e);
      next[e] = p.row0.back();
      p.row0.push_back(p.row0.back() + count[e]);
    }
  const int64_t R = p.row0.back();
  p.buf_row.resize(B * k);
  for (int64_t s = 0; s < B * k; ++s) p.buf_row[s] = next[p.chosen[s]]++;
  uint8_t* xs = p.xs.resize(R * C * xw);
  p.acts.resize(R * I * xw);
  p.dx.resize(q8 ? R * nb : 0);
  p.sx.resize(p.dx.size());
  p.da.resize(q8 ? R * I / 32 : 0);
  p.sa.resize(p.da.size());
  p.gu.resize(R * 2 * I);
  p.ys.resize(R * C);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t r = p.buf_row[b * k];  // the row's first slot; the others copy it
    if (q8)
      q8_quantize_rows(h + b * C, 1, C, reinterpret_cast<int8_t*>(xs) + r * C,
                       p.dx.data() + r * nb, p.sx.data() + r * nb);
    else
      std::copy(h + b * C, h + (b + 1) * C, reinterpret_cast<T*>(xs) + r * C);
    for (int64_t j = 1; j < k; ++j) {
      const int64_t o = p.buf_row[b * k + j];
      std::copy(xs + r * C * xw, xs + (r + 1) * C * xw, xs + o * C * xw);
      if (!q8) continue;
      std::copy(p.dx.begin() + r * nb, p.dx.begin() + (r + 1) * nb, p.dx.begin() + o * nb);
      std::copy(p.sx.begin() + r * nb, p.sx.begin() + (r + 1) * nb, p.sx.begin() + o * nb);
    }
  }
}

}  // namespace moe_experts

// out [B, C] (T) = the routed experts' weighted sum for the normed rows h [B, C]
// (panel_weights experts); `router_logits()` returns h's router logits [B, E] (the step's
// product), `route(logits_row, chosen, weights)` picks a row's top k. Call on every thread of
// a team (or outside one); `plan` is shared by the team. When an expert has more than
// kMostRows rows the team stops after routing (plan.team false, plan.chosen / weights
// filled) and the caller runs each expert's products in turn.
template <typename T, typename Router, typename Route>
void experts_team(const T* h, int64_t B, int64_t C, const std::vector<LinearWeights>& gate_up,
                  const std::vector<LinearWeights>& down, int64_t k, const Router& router_logits,
                  const Route& route, moe_experts::Plan<T>& p, T* out) {
  using moe_experts::kUnitPanels;
  const int64_t E = static_cast<int64_t>(gate_up.size()), I = gate_up.front().out_features / 2;
  const bool q8 = is_q8_kind(static_cast<int>(gate_up.front().block_type));
  const int64_t xw = q8 ? 1 : static_cast<int64_t>(sizeof(T));  // bytes per buffered value
#pragma omp single
  {
    const T* logits = router_logits();
    p.chosen.resize(B * k);
    p.weights.resize(B * k);
    for (int64_t b = 0; b < B; ++b)
      route(logits + b * E, p.chosen.data() + b * k, p.weights.data() + b * k);
    std::vector<int64_t> count(E, 0);
    for (int64_t s = 0; s < B * k; ++s) ++count[p.chosen[s]];
    p.team = *std::max_element(count.begin(), count.end()) <= moe_experts::kMostRows;
    if (p.team) moe_experts::plan_buffers(p, h, B, C, I, k, count, q8);
  }  // implicit barrier: the plan and the input rows are ready
  if (!p.team) return;
  const int64_t A = static_cast<int64_t>(p.active.size()), G = 2 * I;
  const int64_t slices = (I + 16 * kUnitPanels - 1) / (16 * kUnitPanels);  // per expert
  thread_local AlignedScratch<T> pair_buf, act_buf;  // a slice's [gate | up] rows, SiLU x up
#pragma omp for schedule(dynamic, 1)
  for (int64_t u = 0; u < A * slices; ++u) {
    const int64_t a = u / slices, r0 = p.row0[a], m = p.row0[a + 1] - r0, nb = C / 32;
    const int64_t c0 = u % slices * 16 * kUnitPanels, c1 = std::min(I, c0 + 16 * kUnitPanels);
    const int64_t w = c1 - c0;
    const LinearWeights& wt = gate_up[p.active[a]];
    const uint8_t* x = p.xs.data() + r0 * C * xw;
    const float* dx = q8 ? p.dx.data() + r0 * nb : nullptr;
    const int32_t* sx = q8 ? p.sx.data() + r0 * nb : nullptr;
    T* gu = p.gu.data() + r0 * G;
    moe_experts::product_unit<T>(wt, x, dx, sx, m, C, gu, c0 / 16, c1 / 16);            // gate
    moe_experts::product_unit<T>(wt, x, dx, sx, m, C, gu, (I + c0) / 16, (I + c1) / 16);  // up
    T* pair = pair_buf.resize(2 * w);
    T* act = act_buf.resize(w);
    for (int64_t i = 0; i < m; ++i) {
      const T* row = gu + i * G;
      std::copy(row + c0, row + c1, pair);
      std::copy(row + I + c0, row + I + c1, pair + w);
      const int64_t at = (r0 + i) * I + c0;  // the slice's first value in acts
      if (!q8) {
        silu_mul_row(pair, reinterpret_cast<T*>(p.acts.data()) + at, w);
        continue;
      }
      silu_mul_row(pair, act, w);
      q8_quantize_rows(act, 1, w, reinterpret_cast<int8_t*>(p.acts.data()) + at,
                       p.da.data() + at / 32, p.sa.data() + at / 32);
    }
  }  // implicit barrier: every expert's activations are ready
  const int64_t panels = (C + 15) / 16, units = (panels + kUnitPanels - 1) / kUnitPanels;
  thread_local std::vector<const T*> ranks;  // a row's slot outputs, rank order
#pragma omp for schedule(dynamic, 1)
  for (int64_t u = 0; u < units; ++u) {
    const int64_t p0 = u * kUnitPanels, p1 = std::min(panels, p0 + kUnitPanels), nb = I / 32;
    for (int64_t a = 0; a < A; ++a) {
      const int64_t r0 = p.row0[a];
      moe_experts::product_unit<T>(down[p.active[a]], p.acts.data() + r0 * I * xw,
                                   q8 ? p.da.data() + r0 * nb : nullptr,
                                   q8 ? p.sa.data() + r0 * nb : nullptr, p.row0[a + 1] - r0, I,
                                   p.ys.data() + r0 * C, p0, p1);
    }
    const int64_t c0 = 16 * p0, n = std::min(C, 16 * p1) - c0;
    ranks.resize(k);
    for (int64_t b = 0; b < B; ++b) {
      for (int64_t j = 0; j < k; ++j) ranks[j] = p.ys.data() + p.buf_row[b * k + j] * C + c0;
      weighted_sum_cols<T>(ranks.data(), p.weights.data() + b * k, k, n, out + b * C + c0);
    }
  }  // implicit barrier: out is complete
}

}  // namespace tgserve
