// The sparse MLP of a mixture-of-experts layer inside the C++ step (decoder.cpp): router,
// softmax top-k, the chosen experts' SwiGLU over their rows, the rank-order weighted sum, and
// Qwen2-MoE's gated shared expert -- what models/moe/block.py computes, with no Python between.
//
// Numerics follow the eager block: router logits in T, softmax and top-k in float32 (ties to
// the lower expert id, as torch.topk on a CPU), weights renormalised by their float32 sum;
// each expert's rows through the step's linear kernels (gate_up, T(silu(gate)) * up rounded to
// T, down, outputs in T); out = T(((y0 w0) + y1 w1) + ...), a float32 multiply then add per
// rank in rank order (no fused multiply-add, as torch's two ops round).
//
// Batch invariance: a row's routing reads its own logits only; an expert's rows go through
// kernels whose per-row order is fixed by K alone (linear.cpp, block_linear.cpp), and each
// kernel splits its output columns over the threads by a fixed static schedule; the weighted
// sum runs over the row's own slots. A row's bits never depend on which other rows share its
// experts or on how many rows the step has. Steps of at most 64 rows whose busiest expert has
// at most 8 (a decode step's) run the whole block -- router, top-k, the experts through the
// same panel kernels and the weighted sum -- in one OpenMP team (moe_experts.h) instead of a
// region for the router and two per expert: the same bits.
#pragma once

#include <torch/extension.h>

#include <memory>
#include <optional>
#include <vector>

#include "decoder.h"
#include "moe_experts.h"
#include "vec_math.h"

namespace tgserve {

struct MoeWeights {
  LinearWeights router;                 // [E, hidden], no bias
  std::vector<LinearWeights> gate_up;   // E experts of [2 I, hidden]: gate rows, then up rows
  std::vector<LinearWeights> down;      // E experts of [hidden, I]
  int64_t top_k = 1;
  bool renormalize = false;
  // Qwen2-MoE: a dense SwiGLU expert every row runs, scaled by sigmoid(shared_gate(x)) [1].
  std::optional<LinearWeights> shared_gate_up, shared_down, shared_gate;
  // The experts run through the panel kernels (moe_experts.h: one team for a decode step).
  bool panel_experts = false;
  // Whether such blocks take the one team (Python: `one_region`, True; False runs the router
  // and each expert's products in turn, as the steps with more rows do: a bench's and a test's
  // peer).
  bool one_region = true;
};

// logits [E] of one row -> its top_k experts (descending probability, ties to the lower id)
// and their float32 weights (softmax over all E, renormalised over the k when asked).
template <typename T>
void route_row(const T* logits, int64_t E, int64_t k, bool renormalize, int64_t* experts,
               float* weights);

// out [B, C] = sum over ranks r of T(y_r) * w_r as models/moe/experts.weighted_sum, rounded
// to T; slots [B, k, C] the slot outputs, weights [B, k].
template <typename T>
void weighted_sum_rows(const T* slots, const float* weights, int64_t B, int64_t k, int64_t C,
                       T* out);

// x [B, C] += T(sigmoid(gate[b]) * shared[b]) per row, the gate rounded to T first.
template <typename T>
void add_gated_rows(T* x, const T* gate, const T* shared, int64_t B, int64_t C);

// The block's output [B, C] in h's dtype for the normed hidden h [B, C]; `linear(x, w)` is the
// step's product x [m, K] @ w^T -> [m, N] (decoder.cpp's), `reduce(t)` sums a tensor-parallel
// rank's partial [B, C] over the ranks in place (models/moe/parallel.py: the routed experts'
// weighted sum, then the shared expert's down projection, as the eager block reduces them).
template <typename T, typename Linear, typename Reduce>
torch::Tensor moe_forward(const torch::Tensor& h, const MoeWeights& w, const Linear& linear,
                          const Reduce& reduce) {
  const int64_t B = h.size(0), C = h.size(1), E = static_cast<int64_t>(w.gate_up.size());
  const int64_t k = w.top_k, I = w.gate_up.front().out_features / 2;
  const T* hp = static_cast<const T*>(h.data_ptr());
  auto out = torch::empty({B, C}, h.options());
  T* op = static_cast<T*>(out.data_ptr());
  const auto route = [&](const T* logits, int64_t* experts, float* weights) {
    route_row<T>(logits, E, k, w.renormalize, experts, weights);
  };
  std::vector<int64_t> chosen;
  std::vector<float> weights;
  bool done = false;
  if (w.one_region && w.panel_experts && B <= moe_experts::kTeamRows) {
    // A decode step's block in one team (moe_experts.h); more rows: the router's product
    // shares its rows between the threads first (the team runs it on one).
    torch::Tensor logits = B > moe_experts::kMostRows ? linear(h, w.router) : torch::Tensor();
    const auto router_logits = [&]() {
      if (!logits.defined()) logits = linear(h, w.router);
      return static_cast<const T*>(logits.data_ptr());
    };
    // The calling thread's plan; the team reaches it through this pointer (inside the region
    // the thread_local's name would mean each thread's own).
    thread_local moe_experts::Plan<T> own;
    moe_experts::Plan<T>* const plan = &own;
#pragma omp parallel
    experts_team<T>(hp, B, C, w.gate_up, w.down, k, router_logits, route, *plan, op);
    done = plan->team;
    chosen = plan->chosen;
    weights = plan->weights;
  }
  if (!done && chosen.empty()) {
    const torch::Tensor logits = linear(h, w.router);  // [B, E] in T
    const T* lp = static_cast<const T*>(logits.data_ptr());
    chosen.resize(B * k);
    weights.resize(B * k);
    for (int64_t b = 0; b < B; ++b) route(lp + b * E, chosen.data() + b * k, weights.data() + b * k);
  }
  // Else each expert's products in turn. Slots (row b, rank r) = b * k + r, grouped by expert.
  std::vector<std::vector<int64_t>> by_expert(done ? 0 : E);
  for (int64_t s = 0; s < B * k && !done; ++s) by_expert[chosen[s]].push_back(s);
  auto slots = torch::empty({done ? 0 : B * k, C}, h.options());  // each slot's expert output
  T* sp = static_cast<T*>(slots.data_ptr());
  for (int64_t e = 0; e < E && !done; ++e) {
    const std::vector<int64_t>& mine = by_expert[e];
    const int64_t m = static_cast<int64_t>(mine.size());
    if (m == 0) continue;
    torch::Tensor xe = h;  // [m, C]: the expert's rows (h itself for a lone row)
    if (B > 1) {
      xe = torch::empty({m, C}, h.options());
      T* xp = static_cast<T*>(xe.data_ptr());
      for (int64_t i = 0; i < m; ++i) {
        const T* row = hp + mine[i] / k * C;
        std::copy(row, row + C, xp + i * C);
      }
    }
    const torch::Tensor gate_up = linear(xe, w.gate_up[e]);  // [m, 2 I]
    auto act = torch::empty({m, I}, h.options());
    const T* gp = static_cast<const T*>(gate_up.data_ptr());
    T* ap = static_cast<T*>(act.data_ptr());
    for (int64_t i = 0; i < m; ++i) silu_mul_row(gp + i * 2 * I, ap + i * I, I);
    const torch::Tensor y = linear(act, w.down[e]);  // [m, C]
    const T* yp = static_cast<const T*>(y.data_ptr());
    for (int64_t i = 0; i < m; ++i) std::copy(yp + i * C, yp + (i + 1) * C, sp + mine[i] * C);
  }
  if (!done) weighted_sum_rows<T>(sp, weights.data(), B, k, C, op);
  reduce(out);
  if (w.shared_gate_up && w.shared_down && w.shared_gate) {
    const int64_t SI = w.shared_gate_up->out_features / 2;
    const torch::Tensor gate_up = linear(h, *w.shared_gate_up);  // [B, 2 SI]
    auto act = torch::empty({B, SI}, h.options());
    const T* gp = static_cast<const T*>(gate_up.data_ptr());
    T* ap = static_cast<T*>(act.data_ptr());
    for (int64_t b = 0; b < B; ++b) silu_mul_row(gp + b * 2 * SI, ap + b * SI, SI);
    torch::Tensor shared = linear(act, *w.shared_down);  // [B, C]
    reduce(shared);
    const torch::Tensor gate = linear(h, *w.shared_gate);      // [B, 1]
    add_gated_rows<T>(op, static_cast<const T*>(gate.data_ptr()),
                      static_cast<const T*>(shared.data_ptr()), B, C);
  }
  return out;
}

void bind_moe(pybind11::module& m);

}  // namespace tgserve
