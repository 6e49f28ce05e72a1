// Python bindings of the CPU kernels: tensor checks stay in the Python wrappers
// (models/cpu_kernels/paged_attention.py, fused_decoder.py); these only dispatch on dtype.
#include <torch/extension.h>

#include "decoder.h"
#include "kernels.h"

namespace {

template <typename F>
void dispatch(at::ScalarType dtype, const char* what, F&& f) {
  switch (dtype) {
    case at::kFloat: f(float{}); break;
    case at::kBFloat16: f(c10::BFloat16{}); break;
    case at::kHalf: f(c10::Half{}); break;
    default: TORCH_CHECK(false, what, ": unsupported dtype ", dtype);
  }
}

void check_error(int code, const char* what) {
  TORCH_CHECK(code != tgserve::kBadSeqLen, what, ": a seq_len is negative or exceeds its block table");
  TORCH_CHECK(code != tgserve::kBadBlock, what, ": a block table entry is outside the cache");
}

// q [B, H, D]; caches [num_blocks, bs, KVH, D]; tables [B, nb] int64; lens [B] int64.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor tables, torch::Tensor lens, double scale, int64_t window) {
  auto out = torch::empty_like(q);
  int code = tgserve::kOk;
  dispatch(q.scalar_type(), "paged_decode", [&](auto tag) {
    using T = decltype(tag);
    code = tgserve::paged_decode_attention<T>(
        static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k_cache.data_ptr()),
        static_cast<const T*>(v_cache.data_ptr()), tables.data_ptr<int64_t>(), tables.size(1),
        lens.data_ptr<int64_t>(), static_cast<T*>(out.data_ptr()), q.size(0), q.size(1),
        k_cache.size(2), q.size(2), k_cache.size(1), k_cache.size(0), static_cast<float>(scale),
        window);
  });
  check_error(code, "paged_decode");
  return out;
}

// x [M, K] @ w [N, K]^T (+ bias) -> [M, N] float32 (the LM head) or in x's dtype.
torch::Tensor linear(torch::Tensor x, torch::Tensor w, c10::optional<torch::Tensor> bias,
                     bool float_out) {
  const int64_t M = x.size(0), K = x.size(1), N = w.size(0);
  auto y = torch::empty({M, N}, x.options().dtype(float_out ? at::kFloat : x.scalar_type()));
  dispatch(x.scalar_type(), "linear", [&](auto tag) {
    using T = decltype(tag);
    const T* b = bias ? static_cast<const T*>(bias->data_ptr()) : nullptr;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* wp = static_cast<const T*>(w.data_ptr());
    if (float_out)
      tgserve::small_m_linear<T, float>(xp, M, K, wp, b, y.data_ptr<float>(), N);
    else
      tgserve::small_m_linear<T, T>(xp, M, K, wp, b, static_cast<T*>(y.data_ptr()), N);
  });
  return y;
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("paged_decode", &paged_decode, "paged decode attention (see kernels.h)");
  m.def("linear", &linear, "small-M linear layer (see kernels.h)");
  tgserve::bind_decoder(m);
}
