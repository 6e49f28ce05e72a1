// Python bindings of the CPU kernels: tensor checks stay in the Python wrappers
// (models/cpu_kernels/paged_attention.py, fused_decoder.py); these only dispatch on dtype.
#include <torch/extension.h>

#include "decoder.h"
#include "kernels.h"
#include "kv_int8.h"
#include "lora.h"
#include "moe_block.h"
#include "q8_bindings.h"
#include "q8_linear.h"

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

#ifndef TGSERVE_LINEAR_KERNELS_ONLY  // the linear kernels' test builds (cpu_kernels.KERNEL_SETS)
void check_error(int code, const char* what) {
  TORCH_CHECK(code != tgserve::kBadSeqLen, what, ": a seq_len is negative or exceeds its block table");
  TORCH_CHECK(code != tgserve::kBadBlock, what, ": a block table entry is outside the cache");
}

// q [B, H, D]; caches [num_blocks, bs, KVH, D] of q's dtype (or float16 for a float32 q:
// kv_half.h), or int8 [num_blocks, bs, KVH, D + 4] (kv_int8.h; q float32 or bf16), or for a
// float32 q float16 K with int8 V (--kv-cache-dtype int8v); tables [B, nb] int64; lens [B] int64.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor tables, torch::Tensor lens, double scale, int64_t window) {
  auto out = torch::empty_like(q);
  int code = tgserve::kOk;
  const bool int8 = k_cache.scalar_type() == at::kChar;
  const bool int8v = v_cache.scalar_type() == at::kChar && !int8;  // float16 K rows, int8 V rows
  TORCH_CHECK(!int8 || q.scalar_type() != at::kHalf, "paged_decode: int8 K/V with float16 q");
  TORCH_CHECK(!int8v || (q.scalar_type() == at::kFloat && k_cache.scalar_type() == at::kHalf),
              "paged_decode: int8 V rows take float16 K rows and a float32 q");
  dispatch(q.scalar_type(), "paged_decode", [&](auto tag) {
    using T = decltype(tag);
    auto run = [&](auto kv_tag, auto vv_tag) {
      using KV = decltype(kv_tag);
      using VV = decltype(vv_tag);
      code = tgserve::paged_decode_attention<T, KV, VV>(
          static_cast<const T*>(q.data_ptr()), static_cast<const KV*>(k_cache.data_ptr()),
          static_cast<const VV*>(v_cache.data_ptr()), tables.data_ptr<int64_t>(),
          tables.size(1), lens.data_ptr<int64_t>(), static_cast<T*>(out.data_ptr()), q.size(0),
          q.size(1), k_cache.size(2), q.size(2), k_cache.size(1), k_cache.size(0),
          static_cast<float>(scale), window);
    };
    if constexpr (std::is_same_v<T, c10::Half>) {
      run(T{}, T{});
    } else if (int8) {
      run(int8_t{}, int8_t{});
    } else if constexpr (std::is_same_v<T, float>) {
      if (int8v) {
        run(c10::Half{}, int8_t{});  // float16 K, int8 V rows (kv_int8.h)
      } else if (k_cache.scalar_type() == at::kHalf) {
        run(c10::Half{}, c10::Half{});  // a float32 model's float16 rows (kv_half.h)
      } else {
        run(T{}, T{});
      }
    } else {
      run(T{}, T{});
    }
  });
  check_error(code, "paged_decode");
  return out;
}

// k, v [N, KVH, D] -> their int8 rows (kv_int8.h) at slots [N] of caches [blocks, bs, KVH,
// D + 4]: the C++ step's own append, for the PyTorch layers' path. A float16 K cache [blocks,
// bs, KVH, D] (--kv-cache-dtype int8v) takes K's float16 rows (kv_half.h) instead.
void write_kv_int8(torch::Tensor k_cache, torch::Tensor v_cache, torch::Tensor k, torch::Tensor v,
                   torch::Tensor slots) {
  const int64_t N = k.size(0), KVH = k.size(1), D = k.size(2);
  const int64_t num_slots = k_cache.size(0) * k_cache.size(1);
  const int64_t* slot = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < N; ++i)
    TORCH_CHECK(slot[i] >= 0 && slot[i] < num_slots, "write_kv_int8: a slot outside the cache");
  const bool half_k = k_cache.scalar_type() == at::kHalf;
  TORCH_CHECK(half_k || k_cache.scalar_type() == at::kChar, "write_kv_int8: int8 or float16 K");
  int8_t* vc = v_cache.data_ptr<int8_t>();
  dispatch(k.scalar_type(), "write_kv_int8", [&](auto tag) {
    using T = decltype(tag);
    const T* kp = static_cast<const T*>(k.data_ptr());
    const T* vp = static_cast<const T*>(v.data_ptr());
    auto write = [&](auto* kc) {
#pragma omp parallel for if (N >= 64)
      for (int64_t i = 0; i < N; ++i)
        tgserve::append_kv(kp + i * KVH * D, vp + i * KVH * D, slot[i], KVH, D, kc, vc);
    };
    if (half_k) write(static_cast<c10::Half*>(k_cache.data_ptr()));
    else write(k_cache.data_ptr<int8_t>());
  });
}

#endif  // TGSERVE_LINEAR_KERNELS_ONLY

// w [N, K] -> its packed copy (see kernels.h), a [panels, elements per panel] tensor. int8
// weights are packed for bfloat16 activations (pairs of k).
torch::Tensor pack_linear(torch::Tensor w) {
  TORCH_CHECK(w.dim() == 2 && w.is_contiguous(), "pack_linear: a contiguous [N, K] weight");
  const int64_t N = w.size(0), K = w.size(1);
  const bool int8 = w.scalar_type() == at::kChar;
  const bool pairs = int8 || w.scalar_type() == at::kBFloat16;
  const int64_t steps = tgserve::packed_linear_steps(K, pairs);
  auto packed = torch::empty({(N + 15) / 16, steps * 16 * (pairs ? 2 : 1)}, w.options());
  if (int8) {
    tgserve::pack_linear_weight<c10::BFloat16, int8_t>(w.data_ptr<int8_t>(), N, K,
                                                       packed.data_ptr<int8_t>());
    return packed;
  }
  dispatch(w.scalar_type(), "pack_linear", [&](auto tag) {
    using T = decltype(tag);
    tgserve::pack_linear_weight<T, T>(static_cast<const T*>(w.data_ptr()), N, K,
                                      static_cast<T*>(packed.data_ptr()));
  });
  return packed;
}

// x [M, K] @ W [N, K]^T (* scales, int8 weights) (+ bias) from W's packed copy -> [M, N]
// float32 (the LM head) or in x's dtype.
torch::Tensor linear(torch::Tensor x, torch::Tensor packed, c10::optional<torch::Tensor> bias,
                     int64_t N, bool float_out, c10::optional<torch::Tensor> scales) {
  const bool int8 = packed.scalar_type() == at::kChar;
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "linear: x must be a contiguous [M, K] tensor");
  TORCH_CHECK(int8 ? x.scalar_type() == at::kBFloat16 : x.scalar_type() == packed.scalar_type(),
              "linear: x must be bfloat16 for int8 weights, else of the weight's dtype");
  TORCH_CHECK(int8 == scales.has_value(), "linear: scales come with int8 weights, only");
  TORCH_CHECK(!scales || (scales->scalar_type() == at::kFloat && scales->numel() == N),
              "linear: scales must be float32 [N]");
  const int64_t M = x.size(0), K = x.size(1);
  const bool pairs = x.scalar_type() == at::kBFloat16;
  TORCH_CHECK(packed.size(0) == (N + 15) / 16 &&
                  packed.size(1) == tgserve::packed_linear_steps(K, pairs) * 16 * (pairs ? 2 : 1),
              "linear: the packed weight does not match N and x's K");
  auto y = torch::empty({M, N}, x.options().dtype(float_out ? at::kFloat : x.scalar_type()));
  dispatch(x.scalar_type(), "linear", [&](auto tag) {
    using T = decltype(tag);
    const T* b = bias ? static_cast<const T*>(bias->data_ptr()) : nullptr;
    const T* xp = static_cast<const T*>(x.data_ptr());
    auto run = [&](auto wtag) {
      using WT = decltype(wtag);
      const WT* wp = static_cast<const WT*>(packed.data_ptr());
      const float* sp = scales ? scales->data_ptr<float>() : nullptr;
      if (float_out)
        tgserve::packed_linear<T, float, WT>(xp, M, K, wp, sp, b, y.data_ptr<float>(), N);
      else
        tgserve::packed_linear<T, T, WT>(xp, M, K, wp, sp, b, static_cast<T*>(y.data_ptr()), N);
    };
    if constexpr (std::is_same_v<T, c10::BFloat16>) {
      if (int8) return run(int8_t{});
    }
    run(T{});
  });
  return y;
}

// GGUF blocks kept as stored (block_linear.cpp, kquant_linear.cpp). raw [N, row bytes] uint8
// as in the file -> the packed copy, a [panels, 16 * row bytes] uint8 tensor.
torch::Tensor pack_blocks(torch::Tensor raw, int64_t type, int64_t K) {
  TORCH_CHECK(tgserve::block_width(static_cast<int>(type)) > 0 && type != tgserve::kMixedBlocks,
              "pack_blocks: unsupported GGML type ", type);
  TORCH_CHECK(raw.dim() == 2 && raw.is_contiguous() && raw.scalar_type() == at::kByte,
              "pack_blocks: a contiguous uint8 [N, row bytes] tensor");
  const int64_t rb = tgserve::row_bytes(static_cast<int>(type), K);
  TORCH_CHECK(rb > 0 && raw.size(1) == rb, "pack_blocks: rows of ", raw.size(1),
              " bytes do not hold ", K, " weights");
  const int64_t N = raw.size(0);
  auto packed = torch::empty({(N + 15) / 16, 16 * rb}, raw.options());
  tgserve::pack_blocks(raw.data_ptr<uint8_t>(), N, K, static_cast<int>(type),
                       packed.data_ptr<uint8_t>());
  return packed;
}

void check_packed(const torch::Tensor& packed, int64_t type, int64_t K, int64_t N) {
  TORCH_CHECK(tgserve::block_width(static_cast<int>(type)) > 0, "unsupported GGML type ", type);
  if (type == tgserve::kMixedBlocks) {  // one row: header + segments (mixed_blocks.cpp)
    TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 && packed.size(0) == 1 &&
                    packed.is_contiguous() &&
                    tgserve::mixed_blocks_valid(packed.data_ptr<uint8_t>(), packed.numel(), K, N),
                "the mixed packed blocks do not match N = ", N, " and K = ", K);
    return;
  }
  const int64_t rb = tgserve::row_bytes(static_cast<int>(type), K);
  TORCH_CHECK(packed.scalar_type() == at::kByte && packed.dim() == 2 &&
                  packed.size(0) == (N + 15) / 16 && rb > 0 && packed.size(1) == 16 * rb,
              "the packed blocks do not match N = ", N, " and K = ", K);
}

// Rows ids [T] of a packed weight -> float32 [T, K], bitwise as gguf's dequantisation.
torch::Tensor block_rows(torch::Tensor packed, int64_t type, int64_t K, int64_t N,
                         torch::Tensor ids) {
  check_packed(packed, type, K, N);
  TORCH_CHECK(ids.scalar_type() == at::kLong && ids.dim() == 1 && ids.is_contiguous(),
              "block_rows: ids must be a contiguous int64 [T] tensor");
  const int64_t T = ids.size(0);
  const int64_t* idp = ids.data_ptr<int64_t>();
  for (int64_t t = 0; t < T; ++t)
    TORCH_CHECK(idp[t] >= 0 && idp[t] < N, "block_rows: id ", idp[t], " outside [0, ", N, ")");
  auto out = torch::empty({T, K}, packed.options().dtype(at::kFloat));
  tgserve::block_rows(packed.data_ptr<uint8_t>(), K, static_cast<int>(type), idp, T,
                      out.data_ptr<float>());
  return out;
}

// x [M, K] @ W^T (+ bias) from packed blocks -> [M, N] float32 (float_out) or in x's dtype.
torch::Tensor block_linear(torch::Tensor x, torch::Tensor packed, int64_t type, int64_t N,
                           c10::optional<torch::Tensor> bias, bool float_out) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), "block_linear: x must be a contiguous [M, K] tensor");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16,
              "block_linear: x must be float32 or bfloat16");
  TORCH_CHECK(!bias || (bias->scalar_type() == x.scalar_type() && bias->numel() == N),
              "block_linear: bias must be [N] in x's dtype");
  const int64_t M = x.size(0), K = x.size(1);
  check_packed(packed, type, K, N);
  auto y = torch::empty({M, N}, x.options().dtype(float_out ? at::kFloat : x.scalar_type()));
  const uint8_t* wp = packed.data_ptr<uint8_t>();
  const int t = static_cast<int>(type);
  if (x.scalar_type() == at::kFloat) {
    const float* b = bias ? bias->data_ptr<float>() : nullptr;
    tgserve::block_linear<float, float>(x.data_ptr<float>(), M, K, wp, t, b, y.data_ptr<float>(), N);
    return y;
  }
  using BF = c10::BFloat16;
  const BF* xp = static_cast<const BF*>(x.data_ptr());
  const BF* b = bias ? static_cast<const BF*>(bias->data_ptr()) : nullptr;
  if (float_out)
    tgserve::block_linear<BF, float>(xp, M, K, wp, t, b, y.data_ptr<float>(), N);
  else
    tgserve::block_linear<BF, BF>(xp, M, K, wp, t, b, static_cast<BF*>(y.data_ptr()), N);
  return y;
}

#ifndef TGSERVE_LINEAR_KERNELS_ONLY
// Seconds of one pass of the read probe over a contiguous uint8 buffer, and the xor it read.
std::tuple<double, int64_t> read_probe(torch::Tensor buffer, int64_t streams, bool prefetch) {
  TORCH_CHECK(buffer.scalar_type() == at::kByte && buffer.is_contiguous(),
              "read_probe: buffer must be a contiguous uint8 tensor");
  TORCH_CHECK(streams == 1 || streams == 2 || streams == 4 || streams == 8,
              "read_probe: streams must be 1, 2, 4 or 8");
  uint64_t sink = 0;
  const double s = tgserve::read_probe_seconds(buffer.data_ptr<uint8_t>(), buffer.numel(),
                                               static_cast<int>(streams), prefetch, &sink);
  return {s, static_cast<int64_t>(sink)};
}

#endif  // TGSERVE_LINEAR_KERNELS_ONLY

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack_linear", &pack_linear, "a linear weight packed for linear (see kernels.h)");
  m.def("linear", &linear, "linear layer over a packed weight (see kernels.h)", py::arg("x"),
        py::arg("packed"), py::arg("bias"), py::arg("n"), py::arg("float_out"),
        py::arg("scales") = py::none());
  m.def("pack_blocks", &pack_blocks, "GGUF blocks packed for block_linear (see kernels.h)",
        py::arg("raw"), py::arg("type"), py::arg("k"));
  m.def("block_rows", &block_rows, "rows of packed GGUF blocks as float32 (see kernels.h)",
        py::arg("packed"), py::arg("type"), py::arg("k"), py::arg("n"), py::arg("ids"));
  m.def("block_linear", &block_linear, "linear layer over packed GGUF blocks (see kernels.h)",
        py::arg("x"), py::arg("packed"), py::arg("type"), py::arg("n"), py::arg("bias"),
        py::arg("float_out"));
  tgserve::bind_q8_linear(m);
#ifndef TGSERVE_LINEAR_KERNELS_ONLY
  m.def("paged_decode", &paged_decode, "paged decode attention (see kernels.h)");
  m.def("write_kv_int8", &write_kv_int8, "K/V rows into an int8 cache (see kv_int8.h)");
  m.def("read_probe", &read_probe, "one pass of the bench's memory read probe (see kernels.h)",
        py::arg("buffer"), py::arg("streams"), py::arg("prefetch"));
  tgserve::bind_moe(m);
  tgserve::bind_decoder(m);
  tgserve::bind_lora(m);
#endif
}
