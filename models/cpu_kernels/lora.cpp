// Batched LoRA for mixed steps (the Punica / S-LoRA shape): rows of different adapters and of the
// base model in one call, each row reading its own slot's A and B. Two passes, each a parallel
// loop over (row, output) pairs: the shrink u[row] = a[slot] . x[row] (S * R dots of length K),
// then the expand y[row, n] += scale * b[slot, n] . u[row, slice of n] (N dots of length R).
// Batch invariance: every value is one dot product computed by one thread in a fixed order
// (8 float lanes over the length, then the lanes summed in a fixed tree), so a row's bits do
// not depend on the other rows of the step, their adapters, or the thread count. A slice whose
// scale is 0 in a slot (a module the adapter leaves out) is skipped: its delta would be +0.
#include "lora.h"

#include <ATen/ATen.h>

#include <vector>

namespace tgserve {
namespace {

// sum_i a[i] * b[i] in float: 8 independent lanes (vectorised without reassociation), then a
// fixed pairwise sum of the lanes and the tail in order.
template <typename TA, typename TB>
inline float ordered_dot(const TA* a, const TB* b, int64_t n) {
  float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l)
      lanes[l] += static_cast<float>(a[i + l]) * static_cast<float>(b[i + l]);
  float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
              ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  for (; i < n; ++i) sum += static_cast<float>(a[i]) * static_cast<float>(b[i]);
  return sum;
}

constexpr int64_t kParallelWork = 1 << 16;  // multiply-adds below which one thread runs a pass

}  // namespace

template <typename T>
void lora_add(const LoraWeights& w, const T* x, T* y, int64_t B, const int64_t* rows) {
  const int64_t slots = w.a.size(0), SR = w.a.size(1), K = w.a.size(2);
  const int64_t N = w.b.size(1), R = w.b.size(2), S = w.offsets.numel() - 1;
  const T* a = static_cast<const T*>(w.a.data_ptr());
  const T* b = static_cast<const T*>(w.b.data_ptr());
  const float* scales = w.scales.data_ptr<float>();
  const int64_t* off = w.offsets.data_ptr<int64_t>();
  for (int64_t r = 0; r < B; ++r)
    TORCH_CHECK(rows[r] >= -1 && rows[r] < slots, "lora_add: row slot ", rows[r], " outside ",
                slots, " slots");
  // Which (slot, slice) pairs hold an adapter's module: a slice's scale is set for all its rows.
  auto active = [&](int64_t slot, int64_t s) { return scales[slot * N + off[s]] != 0.0f; };
  std::vector<T> u(static_cast<size_t>(B * SR));
  const bool wide_shrink = B * SR * K >= kParallelWork;
#pragma omp parallel for if (wide_shrink)
  for (int64_t i = 0; i < B * SR; ++i) {
    const int64_t row = i / SR, j = i % SR, slot = rows[row];
    if (slot < 0 || !active(slot, j / R)) continue;
    u[i] = T(ordered_dot(a + (slot * SR + j) * K, x + row * K, K));
  }
  const bool wide_expand = B * N * R >= kParallelWork;
#pragma omp parallel for if (wide_expand)
  for (int64_t i = 0; i < B * S; ++i) {
    const int64_t row = i / S, s = i % S, slot = rows[row];
    if (slot < 0 || !active(slot, s)) continue;
    const T* us = u.data() + row * SR + s * R;
    for (int64_t n = off[s]; n < off[s + 1]; ++n) {
      const T t = T(ordered_dot(b + (slot * N + n) * R, us, R));
      const T delta = T(static_cast<float>(t) * scales[slot * N + n]);
      y[row * N + n] = T(static_cast<float>(y[row * N + n]) + static_cast<float>(delta));
    }
  }
}

template void lora_add<float>(const LoraWeights&, const float*, float*, int64_t,
                              const int64_t*);
template void lora_add<c10::BFloat16>(const LoraWeights&, const c10::BFloat16*, c10::BFloat16*,
                                      int64_t, const int64_t*);

namespace {

// The PyTorch layers' entry (models/lora/stack.py): y [B, N] updated in place.
void lora_add_py(torch::Tensor x, torch::Tensor y, torch::Tensor rows, torch::Tensor a,
                 torch::Tensor b, torch::Tensor scales, torch::Tensor offsets) {
  TORCH_CHECK(x.is_contiguous() && y.is_contiguous() && a.is_contiguous() && b.is_contiguous(),
              "lora_add: contiguous tensors only");
  TORCH_CHECK(x.scalar_type() == a.scalar_type() && y.scalar_type() == a.scalar_type() &&
                  b.scalar_type() == a.scalar_type() && scales.scalar_type() == at::kFloat &&
                  rows.scalar_type() == at::kLong && offsets.scalar_type() == at::kLong,
              "lora_add: x, y, a, b in one dtype; float32 scales; int64 rows and offsets");
  TORCH_CHECK(x.size(0) == rows.numel() && y.size(0) == rows.numel() && x.size(1) == a.size(2) &&
                  y.size(1) == b.size(1),
              "lora_add: shapes do not match the stack");
  const LoraWeights w{a, b, scales, offsets};
  const auto rows_c = rows.contiguous();
  const int64_t* r = rows_c.data_ptr<int64_t>();
  switch (x.scalar_type()) {
    case at::kFloat:
      lora_add<float>(w, x.data_ptr<float>(), y.data_ptr<float>(), x.size(0), r);
      break;
    case at::kBFloat16:
      lora_add<c10::BFloat16>(w, static_cast<const c10::BFloat16*>(x.data_ptr()),
                              static_cast<c10::BFloat16*>(y.data_ptr()), x.size(0), r);
      break;
    default: TORCH_CHECK(false, "lora_add: unsupported dtype ", x.scalar_type());
  }
}

}  // namespace

void bind_lora(pybind11::module& m) {
  namespace py = pybind11;
  py::class_<LoraWeights>(m, "LoraWeights", py::module_local())
      .def(py::init([](torch::Tensor a, torch::Tensor b, torch::Tensor scales,
                       torch::Tensor offsets) {
             TORCH_CHECK(a.dim() == 3 && b.dim() == 3 && a.size(0) == b.size(0) &&
                             scales.scalar_type() == at::kFloat &&
                             offsets.scalar_type() == at::kLong &&
                             a.size(1) == (offsets.numel() - 1) * b.size(2),
                         "LoraWeights: a [slots, S*R, K], b [slots, N, R], float32 scales, "
                         "int64 offsets [S + 1]");
             return LoraWeights{std::move(a), std::move(b), std::move(scales),
                                std::move(offsets)};
           }),
           py::kw_only(), py::arg("a"), py::arg("b"), py::arg("scales"), py::arg("offsets"));
  m.def("lora_add", &lora_add_py, "LoRA adapters added to a projection's rows (see lora.h)",
        py::arg("x"), py::arg("y"), py::arg("rows"), py::arg("a"), py::arg("b"),
        py::arg("scales"), py::arg("offsets"), py::call_guard<py::gil_scoped_release>());
}

}  // namespace tgserve
