// Batched LoRA for mixed steps (the Punica / S-LoRA shape): rows of different adapters and of the
// base model in one call, each row reading its own slot's A and B. Two passes, each a parallel
// loop: the shrink u[row] = a[slot] . x[row] (S * R dots of length K: 8 float lanes over K, then
// the lanes summed in a fixed tree), then the expand over chunks of outputs, acc[n] = sum over
// r in order of u[row, r] * bt[slot, r, n] (B stored transposed, so a chunk's outputs are one
// vector operation per r), y[row, n] += scale * acc[n].
// Batch invariance: every value is computed by one thread in an order fixed by the shapes
// (K, R, N and the chunking of N), never by the rows or adapters sharing the call or the thread
// count. A slice whose scale is 0 in a slot (a module the adapter leaves out) is skipped: its
// delta would be +0.
#include "lora.h"

#include <ATen/ATen.h>

#include <algorithm>
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

constexpr int64_t kParallelWork = 1 << 14;  // multiply-adds below which one thread runs a pass
constexpr int64_t kChunk = 128;              // outputs of one expand work item

}  // namespace

template <typename T>
void lora_add(const LoraWeights& w, const T* x, T* y, int64_t B, const int64_t* rows) {
  const int64_t slots = w.a.size(0), SR = w.a.size(1), K = w.a.size(2);
  const int64_t R = w.b.size(1), N = w.b.size(2), S = w.offsets.numel() - 1;
  const T* a = static_cast<const T*>(w.a.data_ptr());
  const T* bt = static_cast<const T*>(w.b.data_ptr());  // [slots, R, N]
  const float* scales = w.scales.data_ptr<float>();
  const int64_t* off = w.offsets.data_ptr<int64_t>();
  for (int64_t r = 0; r < B; ++r)
    TORCH_CHECK(rows[r] >= -1 && rows[r] < slots, "lora_add: row slot ", rows[r], " outside ",
                slots, " slots");
  // Which (slot, slice) pairs hold an adapter's module: a slice's scale is set for all its rows.
  auto active = [&](int64_t slot, int64_t s) { return scales[slot * N + off[s]] != 0.0f; };
  std::vector<T> u(static_cast<size_t>(B * SR));
#pragma omp parallel for if (B * SR * K >= kParallelWork)
  for (int64_t i = 0; i < B * SR; ++i) {
    const int64_t row = i / SR, j = i % SR, slot = rows[row];
    if (slot < 0 || !active(slot, j / R)) continue;
    u[i] = T(ordered_dot(a + (slot * SR + j) * K, x + row * K, K));
  }
  // The expand's work items: (row, slice, first output of a chunk of kChunk).
  std::vector<int64_t> items;
  for (int64_t row = 0; row < B; ++row)
    for (int64_t s = 0; s < S; ++s)
      if (rows[row] >= 0 && active(rows[row], s))
        for (int64_t n0 = off[s]; n0 < off[s + 1]; n0 += kChunk) items.insert(items.end(), {row, s, n0});
  const int64_t num_items = static_cast<int64_t>(items.size() / 3);
#pragma omp parallel for if (num_items * kChunk * R >= kParallelWork)
  for (int64_t i = 0; i < num_items; ++i) {
    const int64_t row = items[3 * i], s = items[3 * i + 1], n0 = items[3 * i + 2];
    const int64_t slot = rows[row], width = std::min(kChunk, off[s + 1] - n0);
    const T* us = u.data() + row * SR + s * R;
    float acc[kChunk] = {};
    for (int64_t r = 0; r < R; ++r) {
      const float ur = static_cast<float>(us[r]);
      const T* brow = bt + (slot * R + r) * N + n0;
      for (int64_t j = 0; j < width; ++j) acc[j] += ur * static_cast<float>(brow[j]);
    }
    T* yr = y + row * N + n0;
    const float* sc = scales + slot * N + n0;
    for (int64_t j = 0; j < width; ++j) {
      const T delta = T(static_cast<float>(T(acc[j])) * sc[j]);
      yr[j] = T(static_cast<float>(yr[j]) + static_cast<float>(delta));
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
                  y.size(1) == b.size(2),
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
                             a.size(1) == (offsets.numel() - 1) * b.size(1),
                         "LoraWeights: a [slots, S*R, K], b [slots, R, N], float32 scales, "
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
