// The Python bindings of the Q8 panels' products (q8_linear.h; models/activation_quant.py wraps
// them with the shape checks): q8_quantize / q16_quantize, q8_linear, and which integer path this
// build compiled (q8_isa, q16_isa).
#include <torch/extension.h>

#include <string>
#include <tuple>

#include "q16_avx2.h"
#include "q8_linear.h"
#include "q8_bindings.h"

namespace tgserve {
namespace {

constexpr int64_t kPanel = 16;
constexpr int64_t kBlock = 32;

torch::Tensor checked_rows(const torch::Tensor& x, const char* what) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), what, ": x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, what,
              ": x must be float32 or bfloat16");
  TORCH_CHECK(x.size(1) % kBlock == 0, what, ": K must be a multiple of 32, got ", x.size(1));
  return x;
}

// x [M, K] -> (xq [M, K] int8 (A = int8_t) or int16, dx [M, K / 32] float32, sx [M, K / 32]
// int32).
template <typename A>
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> quantize(torch::Tensor x) {
  checked_rows(x, "q8_quantize");
  const int64_t M = x.size(0), K = x.size(1);
  torch::Tensor xq = torch::empty({M, K}, x.options().dtype(c10::CppTypeToScalarType<A>::value));
  auto dx = torch::empty({M, K / kBlock}, x.options().dtype(at::kFloat));
  auto sx = torch::empty({M, K / kBlock}, x.options().dtype(at::kInt));
  A* q = xq.data_ptr<A>();
  if (x.scalar_type() == at::kFloat)
    q8_quantize_rows(x.data_ptr<float>(), M, K, q, dx.data_ptr<float>(), sx.data_ptr<int32_t>());
  else
    q8_quantize_rows(static_cast<const c10::BFloat16*>(x.data_ptr()), M, K, q,
                     dx.data_ptr<float>(), sx.data_ptr<int32_t>());
  return {xq, dx, sx};
}

// x [M, K] @ W^T (+ bias) from Q8 panels -> [M, N] float32 (float_out) or in x's dtype.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, int64_t kind, int64_t N,
                     c10::optional<torch::Tensor> bias, bool float_out) {
  checked_rows(x, "q8_linear");
  const int64_t M = x.size(0), K = x.size(1);
  TORCH_CHECK(is_q8_kind(static_cast<int>(kind)), "q8_linear: unknown kind ", kind);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.is_contiguous() && packed.dim() == 2 &&
                  packed.size(0) == (N + kPanel - 1) / kPanel &&
                  packed.size(1) == K / kBlock * q8_block_bytes(static_cast<int>(kind)),
              "q8_linear: the packed weight does not match N = ", N, " and K = ", K);
  TORCH_CHECK(!bias || (bias->scalar_type() == x.scalar_type() && bias->numel() == N &&
                        bias->is_contiguous()),
              "q8_linear: bias must be [N] in x's dtype");
  auto y = torch::empty({M, N}, x.options().dtype(float_out ? at::kFloat : x.scalar_type()));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const int t = static_cast<int>(kind);
  if (x.scalar_type() == at::kFloat) {
    const float* b = bias ? bias->data_ptr<float>() : nullptr;
    q8_linear<float, float>(x.data_ptr<float>(), M, K, wp, t, b, y.data_ptr<float>(), N);
    return y;
  }
  using BF = c10::BFloat16;
  const BF* xp = static_cast<const BF*>(x.data_ptr());
  const BF* b = bias ? static_cast<const BF*>(bias->data_ptr()) : nullptr;
  if (float_out)
    q8_linear<BF, float>(xp, M, K, wp, t, b, y.data_ptr<float>(), N);
  else
    q8_linear<BF, BF>(xp, M, K, wp, t, b, static_cast<BF*>(y.data_ptr()), N);
  return y;
}

// The integer path this build runs (for the tests and the startup log).
std::string isa() {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
  return "avx512_vnni";
#elif defined(__AVX2__)
  return "avx2";
#else
  return "scalar";
#endif
}
std::string q16_isa() {
#if defined(TGSERVE_Q16_AVX2)
  return "avx2";
#else
  return "scalar";
#endif
}

}  // namespace

void bind_q8_linear(pybind11::module& m) {
  namespace py = pybind11;
  m.def("q8_quantize", &quantize<int8_t>, "int8 activations per block of 32 (see q8_linear.h)",
        py::arg("x"));
  m.def("q16_quantize", &quantize<int16_t>,
        "int16 activations per block of 32 (see q16_dot.h)", py::arg("x"));
  m.def("q8_linear", &linear, "linear layer with int8 activations (see q8_linear.h)",
        py::arg("x"), py::arg("packed"), py::arg("kind"), py::arg("n"), py::arg("bias"),
        py::arg("float_out"));
  m.def("q8_isa", &isa, "the integer dot product this build runs: avx512_vnni, avx2, scalar");
  m.def("q16_isa", &q16_isa, "the int16 activations' integer path of this build: avx2, scalar");
}


}  // namespace tgserve
