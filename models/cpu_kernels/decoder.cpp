// One forward step (every new token of the step: decodes and prefill chunks alike, each token
// one query of the paged attention over its own context) through every layer of a
// Llama-family model: RMSNorm, fused qkv (+ bias), rotary, K/V written to the paged cache,
// paged attention, out projection, residual, RMSNorm, SwiGLU MLP, residual; then the final
// norm. Under tensor parallel a rank runs its shard (its heads, KV heads and MLP columns) and
// the o / down projections' partial sums go through an all-reduce callback. Eager PyTorch
// spends most of a small model's step dispatching ~15 ops per layer; here a layer is 5 parallel
// loops, and a decode step of up to 8 rows over panel-kernel linears (and panel-kernel experts)
// runs each layer in one OpenMP region (step_region.h: the same bits). Numerics mirror
// models/llama.py (same rounding points to the model dtype).
#include "decoder.h"

#include <ATen/ATen.h>

#include <vector>

#include "kernels.h"
#include "kv_int8.h"
#include "moe_block.h"
#include "q8_linear.h"
#include "step_region.h"
#include "vec_math.h"

namespace tgserve {
namespace {

class LlamaDecoder {
 public:
  LlamaDecoder(std::vector<LayerWeights> layers, torch::Tensor final_norm,
               std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
               int64_t window, pybind11::object all_reduce)
      : layers_(std::move(layers)), final_norm_(std::move(final_norm)),
        k_caches_(std::move(k_caches)), v_caches_(std::move(v_caches)), H_(num_heads),
        KVH_(num_kv_heads), D_(head_dim), eps_(static_cast<float>(eps)), window_(window),
        all_reduce_(std::move(all_reduce)) {
    TORCH_CHECK(!layers_.empty(), "LlamaDecoder: no layers");
    TORCH_CHECK(layers_.size() == k_caches_.size() && layers_.size() == v_caches_.size(),
                "one K and one V cache per layer");
    hidden_ = final_norm_.size(0);
    // int8 K/V rows with their scales (kv_int8.h; --kv-cache-dtype int8), else the model's dtype.
    kv_int8_ = k_caches_.front().scalar_type() == at::kChar;
    // float16 rows of a float32 model (kv_half.h; --kv-cache-dtype float16)
    kv_half_ = k_caches_.front().scalar_type() == at::kHalf &&
               final_norm_.scalar_type() == at::kFloat;
    // float16 K rows with int8 V rows (kv_int8.h; --kv-cache-dtype int8v)
    kv_int8v_ = kv_half_ && v_caches_.front().scalar_type() == at::kChar;
    kv_half_ = kv_half_ && !kv_int8v_;
    TORCH_CHECK(kv_int8_ || kv_half_ || kv_int8v_ ||
                    k_caches_.front().scalar_type() == final_norm_.scalar_type(),
                "LlamaDecoder: a K/V cache of the model's dtype, int8 rows, or float16 rows of a "
                "float32 model (K, and V unless int8 rows)");
    TORCH_CHECK(kv_int8v_ || k_caches_.front().scalar_type() == v_caches_.front().scalar_type(),
                "LlamaDecoder: K and V caches of one type, or float16 K with int8 V rows");
    for (const LayerWeights& w : layers_)  // the widest MLP row, to size element-wise threading
      intermediate_ = std::max(intermediate_, w.moe ? w.moe->top_k * w.moe->gate_up[0].out_features / 2
                                                    : w.gate_up->out_features / 2);
    region_layers_ = all_reduce_.is_none() && runs_in_one_region(layers_);
  }

  // Decode steps of up to kRegionRows rows in one OpenMP region per layer (step_region.h) where
  // the layers allow it; off: op by op, as larger steps run (the same bits either way).
  bool one_region = true;
  bool region_layers() const { return region_layers_; }

  // x [B, hidden] embeddings; rope_cos/sin [B, D] in x's dtype; slots [B]; tables [B, nb];
  // seq_lens [B] (context incl. this token). Returns the final-normed hidden [B, hidden].
  // Every linear layer runs packed_linear (linear.cpp), whose per-row accumulation order does
  // not depend on B: a row's values are the same whatever else shares the step.
  torch::Tensor forward(torch::Tensor x, torch::Tensor rope_cos, torch::Tensor rope_sin,
                        torch::Tensor slots, torch::Tensor tables, torch::Tensor seq_lens,
                        std::optional<torch::Tensor> lora_rows) {
    x = x.clone();
    // [B] int64 adapter slot per row (-1: base), read by every linear with LoRA slots.
    TORCH_CHECK(!lora_rows || lora_rows->numel() == x.size(0), "LlamaDecoder: a slot per row");
    lora_rows_ = lora_rows ? lora_rows->data_ptr<int64_t>() : nullptr;
    torch::Tensor out;
    switch (x.scalar_type()) {
      case at::kFloat:
        out = run<float>(x, rope_cos, rope_sin, slots, tables, seq_lens);
        break;
      case at::kBFloat16:
        out = run<c10::BFloat16>(x, rope_cos, rope_sin, slots, tables, seq_lens);
        break;
      default: TORCH_CHECK(false, "LlamaDecoder: unsupported dtype ", x.scalar_type());
    }
    return out;
  }

 private:
  // Tensor parallel: the o and down projections hold a rank's input columns, so their
  // [B, hidden] partial products are summed over the ranks (in place) by the Python callable
  // (models/parallel/group.py); None without tensor parallel.
  void reduce(torch::Tensor& partial) const {
    if (all_reduce_.is_none()) return;
    pybind11::gil_scoped_acquire gil;
    all_reduce_(partial);
  }

  // The product below, plus each row's LoRA adapter where the layer has slots (lora.cpp).
  template <typename T>
  torch::Tensor linear(const torch::Tensor& x, const LinearWeights& w) const {
    torch::Tensor y = base_linear<T>(x, w);
    if (w.lora && lora_rows_)
      lora_add<T>(*w.lora, static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()),
                  x.size(0), lora_rows_);
    return y;
  }

  // [B, N] = x [B, K] @ w^T (* scales) (+ bias), from w's packed copy (int8 or x's dtype).
  template <typename T>
  torch::Tensor base_linear(const torch::Tensor& x, const LinearWeights& w) const {
    const int64_t N = w.out_features;
    auto y = torch::empty({x.size(0), N}, x.options());
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* bias = w.bias ? static_cast<const T*>(w.bias->data_ptr()) : nullptr;
    T* yp = static_cast<T*>(y.data_ptr());
    if (is_q8_kind(static_cast<int>(w.block_type))) {  // int8 activations (q8_linear.cpp)
      q8_linear<T, T>(xp, x.size(0), x.size(1), w.packed.data_ptr<uint8_t>(),
                      static_cast<int>(w.block_type), bias, yp, N);
      return y;
    }
    if (w.block_type) {  // GGUF blocks as stored (block_linear.cpp)
      block_linear<T, T>(xp, x.size(0), x.size(1), w.packed.data_ptr<uint8_t>(),
                         static_cast<int>(w.block_type), bias, yp, N);
      return y;
    }
    if (w.packed.scalar_type() == at::kChar) {
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        packed_linear<T, T, int8_t>(xp, x.size(0), x.size(1), w.packed.data_ptr<int8_t>(),
                                    w.scales->data_ptr<float>(), bias, yp, N);
        return y;
      }
      TORCH_CHECK(false, "LlamaDecoder: int8 weights need bfloat16 activations");
    }
    packed_linear<T, T, T>(xp, x.size(0), x.size(1), static_cast<const T*>(w.packed.data_ptr()),
                           nullptr, bias, yp, N);
    return y;
  }

  // The dense SwiGLU MLP of layer w: down(T(silu(gate)) * up) [B, hidden] for h [B, hidden].
  template <typename T>
  torch::Tensor dense_mlp(const torch::Tensor& h, const LayerWeights& w, bool wide) const {
    const int64_t B = h.size(0), I = w.gate_up->out_features / 2;
    const torch::Tensor gate_up = linear<T>(h, *w.gate_up);
    auto act = torch::empty({B, I}, h.options());
    const T* gup = static_cast<const T*>(gate_up.data_ptr());
    T* actp = static_cast<T*>(act.data_ptr());
#pragma omp parallel for if (wide)
    for (int64_t b = 0; b < B; ++b) silu_mul_row(gup + b * 2 * I, actp + b * I, I);
    return linear<T>(act, *w.down);
  }

  template <typename T>
  torch::Tensor run(torch::Tensor x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin,
                    const torch::Tensor& slots, const torch::Tensor& tables,
                    const torch::Tensor& seq_lens) {
    const int64_t B = x.size(0), C = hidden_, I = intermediate_;  // I: the widest MLP row
    const int64_t q_size = H_ * D_, kv_size = KVH_ * D_, qkv_size = q_size + 2 * kv_size;
    const auto opts = x.options();
    auto h = torch::empty({B, C}, opts);
    T* xp = static_cast<T*>(x.data_ptr());
    T* hp = static_cast<T*>(h.data_ptr());
    const T* cosp = static_cast<const T*>(rope_cos.data_ptr());
    const T* sinp = static_cast<const T*>(rope_sin.data_ptr());
    const int64_t* slot = slots.data_ptr<int64_t>();
    const StepModel model{layers_, final_norm_, k_caches_, v_caches_, H_,
                          KVH_,    D_,          C,         eps_,      window_, kv_int8_, kv_half_,
                          kv_int8v_};
    if (one_region && region_layers_ && B <= kRegionRows && sparse_teams_on(layers_)) {
      const int code =
          one_region_step<T>(model, xp, hp, cosp, sinp, slot, tables.data_ptr<int64_t>(),
                             tables.size(1), seq_lens.data_ptr<int64_t>(), B);
      TORCH_CHECK(code == kOk, "LlamaDecoder: bad block table or seq_len (code ", code, ")");
      return h;
    }
    auto q = torch::empty({B, H_, D_}, opts), attn = torch::empty({B, q_size}, opts);
    T* qp = static_cast<T*>(q.data_ptr());
    const bool wide = B * I >= 16384;  // enough element-wise work to share between threads
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& w = layers_[l];
      const T* norm_in = static_cast<const T*>(w.input_norm.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) rms_norm_row(xp + b * C, norm_in, hp + b * C, C, eps_);
      const torch::Tensor qkv = linear<T>(h, w.qkv);
      T* qkvp = static_cast<T*>(qkv.data_ptr());
      void* kc = k_caches_[l].data_ptr();
      void* vc = v_caches_[l].data_ptr();
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b)  // (q/k norms,) rotary on q and k, then k, v to the cache
        rope_and_append(model, w, qkvp + b * qkv_size, cosp + b * D_, sinp + b * D_, slot[b], kc,
                        vc, qp + b * q_size);
      const int code = decode_attention<T>(model, l, qp, static_cast<T*>(attn.data_ptr()),
                                           tables.data_ptr<int64_t>(), tables.size(1),
                                           seq_lens.data_ptr<int64_t>(), B);
      TORCH_CHECK(code == kOk, "LlamaDecoder: bad block table or seq_len (code ", code, ")");
      torch::Tensor o = linear<T>(attn, w.o_proj);
      reduce(o);
      const T* op = static_cast<const T*>(o.data_ptr());
      const T* norm_post = static_cast<const T*>(w.post_norm.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) {
        add_row(xp + b * C, op + b * C, C);
        rms_norm_row(xp + b * C, norm_post, hp + b * C, C, eps_);
      }
      if (w.moe) {  // router, experts and weighted sum (moe_block.h), reduced inside
        const auto product = [this](const torch::Tensor& a, const LinearWeights& lw) {
          return linear<T>(a, lw);
        };
        o = moe_forward<T>(h, *w.moe, product, [this](torch::Tensor& t) { reduce(t); });
      } else {
        o = dense_mlp<T>(h, w, wide);
        reduce(o);
      }
      op = static_cast<const T*>(o.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) add_row(xp + b * C, op + b * C, C);
    }
    const T* norm_final = static_cast<const T*>(final_norm_.data_ptr());
#pragma omp parallel for if (wide)
    for (int64_t b = 0; b < B; ++b) rms_norm_row(xp + b * C, norm_final, hp + b * C, C, eps_);
    return h;
  }

  std::vector<LayerWeights> layers_;
  torch::Tensor final_norm_;
  std::vector<torch::Tensor> k_caches_, v_caches_;
  int64_t H_, KVH_, D_, hidden_ = 0, intermediate_ = 0;
  float eps_;
  int64_t window_;
  bool kv_int8_ = false, kv_half_ = false, kv_int8v_ = false, region_layers_ = false;
  pybind11::object all_reduce_;
  const int64_t* lora_rows_ = nullptr;  // the running step's, or none
};

}  // namespace

void bind_decoder(pybind11::module& m) {
  namespace py = pybind11;
  // Keyword-only constructors: Python names every weight, no tensor is matched by position.
  py::class_<LinearWeights>(m, "LinearWeights", py::module_local())
      .def(py::init([](torch::Tensor weight, torch::Tensor packed,
                       std::optional<torch::Tensor> bias, std::optional<torch::Tensor> scales,
                       int64_t block_type, int64_t out_features,
                       std::optional<LoraWeights> lora) {
             const bool int8 = packed.scalar_type() == at::kChar;
             TORCH_CHECK(int8 == scales.has_value() &&
                             (!scales || (scales->scalar_type() == at::kFloat &&
                                          scales->numel() == weight.size(0))),
                         "LinearWeights: int8 weights come with float32 scales [N], only they");
             const bool known = block_width(static_cast<int>(block_type)) > 0 ||
                                is_q8_kind(static_cast<int>(block_type));
             TORCH_CHECK(!block_type || (known &&
                                         packed.scalar_type() == at::kByte && out_features > 0),
                         "LinearWeights: GGUF blocks need a supported type, uint8 packed "
                         "blocks and out_features");
             const int64_t n = block_type ? out_features : weight.size(0);
             return LinearWeights{std::move(weight), std::move(packed), std::move(bias),
                                  std::move(scales), block_type, n, std::move(lora)};
           }),
           py::kw_only(), py::arg("weight"), py::arg("packed"), py::arg("bias") = py::none(),
           py::arg("scales") = py::none(), py::arg("block_type") = 0,
           py::arg("out_features") = 0, py::arg("lora") = py::none())
      .def_readonly("weight", &LinearWeights::weight)
      .def_readonly("packed", &LinearWeights::packed)
      .def_readonly("bias", &LinearWeights::bias)
      .def_readonly("scales", &LinearWeights::scales);
  py::class_<LayerWeights>(m, "LayerWeights", py::module_local())
      .def(py::init([](torch::Tensor input_norm, LinearWeights qkv, LinearWeights o_proj,
                       torch::Tensor post_norm, std::optional<LinearWeights> gate_up,
                       std::optional<LinearWeights> down, std::shared_ptr<MoeWeights> moe,
                       std::optional<torch::Tensor> q_norm, std::optional<torch::Tensor> k_norm) {
             TORCH_CHECK(q_norm.has_value() == k_norm.has_value(),
                         "LayerWeights: q_norm and k_norm come together");
             TORCH_CHECK((gate_up && down && !moe) || (!gate_up && !down && moe),
                         "LayerWeights: gate_up and down, or moe");
             return LayerWeights{std::move(input_norm), std::move(qkv),     std::move(o_proj),
                                 std::move(post_norm),  std::move(gate_up), std::move(down),
                                 std::move(moe),        std::move(q_norm),  std::move(k_norm)};
           }),
           py::kw_only(), py::arg("input_norm"), py::arg("qkv"), py::arg("o_proj"),
           py::arg("post_norm"), py::arg("gate_up") = py::none(), py::arg("down") = py::none(),
           py::arg("moe") = py::none(), py::arg("q_norm") = py::none(),
           py::arg("k_norm") = py::none());
  py::class_<LlamaDecoder>(m, "LlamaDecoder", py::module_local())
      .def(py::init<std::vector<LayerWeights>, torch::Tensor, std::vector<torch::Tensor>,
                    std::vector<torch::Tensor>, int64_t, int64_t, int64_t, double, int64_t,
                    py::object>(),
           py::kw_only(), py::arg("layers"), py::arg("final_norm"), py::arg("k_caches"),
           py::arg("v_caches"), py::arg("num_heads"), py::arg("num_kv_heads"),
           py::arg("head_dim"), py::arg("eps"), py::arg("window"),
           py::arg("all_reduce") = py::none())
      .def_readwrite("one_region", &LlamaDecoder::one_region)
      .def_property_readonly("region_layers", &LlamaDecoder::region_layers)
      .def("forward", &LlamaDecoder::forward, py::kw_only(), py::arg("x"), py::arg("rope_cos"),
           py::arg("rope_sin"), py::arg("slots"), py::arg("tables"), py::arg("seq_lens"),
           py::arg("lora_rows") = py::none(), py::call_guard<py::gil_scoped_release>());
}

}  // namespace tgserve
