// The row-wise pieces of the C++ mixture-of-experts block (moe_block.h: its contract and
// numerics) and the Python binding of its weights.
#include "moe_block.h"

#include <c10/util/BFloat16.h>

#include <cmath>

namespace tgserve {

template <typename T>
void route_row(const T* logits, int64_t E, int64_t k, bool renormalize, int64_t* experts,
               float* weights) {
  std::vector<float> p(E);
  float top = -INFINITY;
  for (int64_t e = 0; e < E; ++e) top = std::max(top, static_cast<float>(logits[e]));
  float sum = 0.0f;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = std::exp(static_cast<float>(logits[e]) - top);
    sum += p[e];
  }
  for (int64_t e = 0; e < E; ++e) p[e] /= sum;
  std::vector<bool> taken(E, false);
  float kept = 0.0f;
  for (int64_t r = 0; r < k; ++r) {  // the r-th largest: strictly greater wins, so ties go low
    int64_t best = -1;
    for (int64_t e = 0; e < E; ++e)
      if (!taken[e] && (best < 0 || p[e] > p[best])) best = e;
    taken[best] = true;
    experts[r] = best;
    weights[r] = p[best];
    kept += p[best];
  }
  if (renormalize)
    for (int64_t r = 0; r < k; ++r) weights[r] /= kept;
}

// Two roundings per rank (a product, then a sum), as torch's mul and add: no contraction.
template <typename T>
__attribute__((optimize("fp-contract=off"))) void weighted_sum_cols(const T* const* y,
                                                                    const float* w, int64_t k,
                                                                    int64_t n, T* out) {
  for (int64_t c = 0; c < n; ++c) {
    float acc = static_cast<float>(y[0][c]) * w[0];
    for (int64_t r = 1; r < k; ++r) {
      const float product = static_cast<float>(y[r][c]) * w[r];
      acc = acc + product;
    }
    out[c] = static_cast<T>(acc);
  }
}

template <typename T>
void weighted_sum_rows(const T* slots, const float* weights, int64_t B, int64_t k, int64_t C,
                       T* out) {
  std::vector<const T*> ranks(k);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t r = 0; r < k; ++r) ranks[r] = slots + (b * k + r) * C;
    weighted_sum_cols<T>(ranks.data(), weights + b * k, k, C, out + b * C);
  }
}

template <typename T>
void add_gated_rows(T* x, const T* gate, const T* shared, int64_t B, int64_t C) {
  for (int64_t b = 0; b < B; ++b) {
    const float g = static_cast<float>(gate[b]);
    const float s = static_cast<float>(static_cast<T>(1.0f / (1.0f + std::exp(-g))));
    for (int64_t c = 0; c < C; ++c) {
      const T scaled = static_cast<T>(s * static_cast<float>(shared[b * C + c]));
      x[b * C + c] = static_cast<T>(static_cast<float>(x[b * C + c]) + static_cast<float>(scaled));
    }
  }
}

#define TGSERVE_INSTANTIATE(T)                                                                \
  template void route_row<T>(const T*, int64_t, int64_t, bool, int64_t*, float*);            \
  template void weighted_sum_rows<T>(const T*, const float*, int64_t, int64_t, int64_t, T*); \
  template void weighted_sum_cols<T>(const T* const*, const float*, int64_t, int64_t, T*);   \
  template void add_gated_rows<T>(T*, const T*, const T*, int64_t, int64_t);
TGSERVE_INSTANTIATE(float)
TGSERVE_INSTANTIATE(c10::BFloat16)
#undef TGSERVE_INSTANTIATE

void bind_moe(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<MoeWeights, std::shared_ptr<MoeWeights>>(m, "MoeWeights", py::module_local())
      .def(py::init([](LinearWeights router, std::vector<LinearWeights> gate_up,
                       std::vector<LinearWeights> down, int64_t top_k, bool renormalize,
                       std::optional<LinearWeights> shared_gate_up,
                       std::optional<LinearWeights> shared_down,
                       std::optional<LinearWeights> shared_gate) {
             const int64_t E = static_cast<int64_t>(gate_up.size());
             TORCH_CHECK(E > 0 && down.size() == gate_up.size() && router.out_features == E,
                         "MoeWeights: one gate_up and one down per expert, a router row each");
             TORCH_CHECK(0 < top_k && top_k <= E, "MoeWeights: top_k must be in 1..", E);
             TORCH_CHECK(shared_gate_up.has_value() == shared_down.has_value() &&
                             shared_down.has_value() == shared_gate.has_value(),
                         "MoeWeights: the shared expert's three weights come together");
             for (int64_t e = 0; e < E; ++e)
               TORCH_CHECK(gate_up[e].out_features == gate_up[0].out_features &&
                               down[e].out_features == down[0].out_features,
                           "MoeWeights: every expert has the same shape");
             const bool panels = moe_experts::panel_weights(gate_up, down);
             return std::make_shared<MoeWeights>(MoeWeights{
                 std::move(router), std::move(gate_up), std::move(down), top_k, renormalize,
                 std::move(shared_gate_up), std::move(shared_down), std::move(shared_gate),
                 panels});
           }),
           py::kw_only(), py::arg("router"), py::arg("gate_up"), py::arg("down"),
           py::arg("top_k"), py::arg("renormalize"), py::arg("shared_gate_up") = py::none(),
           py::arg("shared_down") = py::none(), py::arg("shared_gate") = py::none())
      .def_readonly("panel_experts", &MoeWeights::panel_experts)
      .def_readwrite("one_region", &MoeWeights::one_region);
}

}  // namespace tgserve
