// One forward step (every new token of the step: decodes and prefill chunks alike, each token
// one query of the paged attention over its own context) through every layer of a
// Llama-family model: RMSNorm, fused qkv (+ bias), rotary, K/V written to the paged cache,
// paged attention, out projection, residual, RMSNorm, SwiGLU MLP, residual; then the final
// norm. Eager PyTorch spends most of a small model's step dispatching ~15 ops per layer; here
// a layer is 5 parallel loops. Numerics mirror models/llama.py (same rounding points to the model dtype).
#include "decoder.h"

#include <ATen/ATen.h>

#include <vector>

#include "kernels.h"
#include "vec_math.h"

namespace tgserve {
namespace {

// A linear layer's weight [N, K] as stored, its oneDNN-prepacked copy (undefined when
// oneDNN cannot pack it) and its bias (undefined when none).
struct LinearWeights {
  torch::Tensor plain, packed, bias;
};

struct LayerWeights {
  torch::Tensor input_norm, post_norm;
  LinearWeights qkv, o_proj, gate_up, down;
};

// oneDNN's linear over a prepacked weight (what inductor's freezing pass emits on CPU): the
// weight is not reordered on every call, ~1.6x faster than at::mm at M = 64 here.
at::Tensor onednn_linear(const at::Tensor& x, const at::Tensor& packed,
                         const std::optional<at::Tensor>& bias) {
  static const auto op =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("mkldnn::_linear_pointwise", "")
          .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const std::optional<at::Tensor>&,
                            c10::string_view, c10::List<std::optional<at::Scalar>>,
                            std::optional<c10::string_view>)>();
  c10::List<std::optional<at::Scalar>> scalars;
  scalars.push_back(std::nullopt);
  return op.call(x, packed, bias, "none", scalars, c10::string_view(""));
}

torch::Tensor defined_or_none(const torch::Tensor& t) { return t.numel() > 0 ? t : torch::Tensor(); }

class LlamaDecoder {
 public:
  // layers: per layer [input_norm, qkv, qkv_bias, o_proj, post_norm, gate_up, down, qkv_packed,
  // o_proj_packed, gate_up_packed, down_packed]; an empty tensor stands for "none".
  LlamaDecoder(const std::vector<std::vector<torch::Tensor>>& layers, torch::Tensor final_norm,
               std::vector<torch::Tensor> k_caches, std::vector<torch::Tensor> v_caches,
               int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, double eps,
               int64_t window, int64_t small_m_max)
      : final_norm_(std::move(final_norm)), k_caches_(std::move(k_caches)),
        v_caches_(std::move(v_caches)), H_(num_heads), KVH_(num_kv_heads), D_(head_dim),
        eps_(static_cast<float>(eps)), window_(window), small_m_max_(small_m_max) {
    TORCH_CHECK(layers.size() == k_caches_.size() && layers.size() == v_caches_.size(),
                "one K and one V cache per layer");
    for (const auto& l : layers) {
      TORCH_CHECK(l.size() == 11, "each layer needs 11 tensors");
      const torch::Tensor none;
      layers_.push_back({l[0], l[4], {l[1], defined_or_none(l[7]), defined_or_none(l[2])},
                         {l[3], defined_or_none(l[8]), none},
                         {l[5], defined_or_none(l[9]), none},
                         {l[6], defined_or_none(l[10]), none}});
    }
    hidden_ = final_norm_.size(0);
    intermediate_ = layers_.at(0).gate_up.plain.size(0) / 2;
  }

  // x [B, hidden] embeddings; rope_cos/sin [B, D] in x's dtype; slots [B]; tables [B, nb];
  // seq_lens [B] (context incl. this token). Returns the final-normed hidden [B, hidden].
  torch::Tensor forward(torch::Tensor x, torch::Tensor rope_cos, torch::Tensor rope_sin,
                        torch::Tensor slots, torch::Tensor tables, torch::Tensor seq_lens) {
    x = x.clone();
    torch::Tensor out;
    switch (x.scalar_type()) {
      case at::kFloat: out = run<float>(x, rope_cos, rope_sin, slots, tables, seq_lens); break;
      case at::kBFloat16:
        out = run<c10::BFloat16>(x, rope_cos, rope_sin, slots, tables, seq_lens);
        break;
      default: TORCH_CHECK(false, "LlamaDecoder: unsupported dtype ", x.scalar_type());
    }
    return out;
  }

 private:
  // [B, N] = x [B, K] @ w^T (+ bias): our streaming kernel for small batches (bound by
  // reading the weights), oneDNN's GEMM once the batch makes the layer compute-bound.
  template <typename T>
  torch::Tensor linear(const torch::Tensor& x, const LinearWeights& w) const {
    if (x.size(0) <= small_m_max_) {
      auto y = torch::empty({x.size(0), w.plain.size(0)}, x.options());
      small_m_linear<T, T>(static_cast<const T*>(x.data_ptr()), x.size(0), x.size(1),
                           static_cast<const T*>(w.plain.data_ptr()),
                           w.bias.defined() ? static_cast<const T*>(w.bias.data_ptr()) : nullptr,
                           static_cast<T*>(y.data_ptr()), w.plain.size(0));
      return y;
    }
    const std::optional<at::Tensor> bias =
        w.bias.defined() ? std::optional<at::Tensor>(w.bias) : std::nullopt;
    if (w.packed.defined()) return onednn_linear(x, w.packed, bias).contiguous();
    return bias ? at::addmm(*bias, x, w.plain.t()) : at::mm(x, w.plain.t());
  }

  template <typename T>
  torch::Tensor run(torch::Tensor x, const torch::Tensor& rope_cos, const torch::Tensor& rope_sin,
                    const torch::Tensor& slots, const torch::Tensor& tables,
                    const torch::Tensor& seq_lens) {
    const int64_t B = x.size(0), C = hidden_, I = intermediate_;
    const int64_t q_size = H_ * D_, kv_size = KVH_ * D_, qkv_size = q_size + 2 * kv_size;
    const auto opts = x.options();
    auto h = torch::empty({B, C}, opts), q = torch::empty({B, H_, D_}, opts);
    auto attn = torch::empty({B, q_size}, opts), act = torch::empty({B, I}, opts);
    T* xp = static_cast<T*>(x.data_ptr());
    T* hp = static_cast<T*>(h.data_ptr());
    T* qp = static_cast<T*>(q.data_ptr());
    const T* cosp = static_cast<const T*>(rope_cos.data_ptr());
    const T* sinp = static_cast<const T*>(rope_sin.data_ptr());
    const int64_t* slot = slots.data_ptr<int64_t>();
    const bool wide = B * I >= 16384;  // enough element-wise work to share between threads
    for (size_t l = 0; l < layers_.size(); ++l) {
      const LayerWeights& w = layers_[l];
      const T* norm_in = static_cast<const T*>(w.input_norm.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) rms_norm_row(xp + b * C, norm_in, hp + b * C, C, eps_);
      const torch::Tensor qkv = linear<T>(h, w.qkv);
      T* qkvp = static_cast<T*>(qkv.data_ptr());
      T* kc = static_cast<T*>(k_caches_[l].data_ptr());
      T* vc = static_cast<T*>(v_caches_[l].data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) {  // rotary on q and k, then k and v into their slot
        T* row = qkvp + b * qkv_size;
        rope_heads(row, cosp + b * D_, sinp + b * D_, H_ + KVH_, D_);
        std::copy(row, row + q_size, qp + b * q_size);
        std::copy(row + q_size, row + q_size + kv_size, kc + slot[b] * kv_size);
        std::copy(row + q_size + kv_size, row + qkv_size, vc + slot[b] * kv_size);
      }
      const int code = paged_decode_attention<T>(
          qp, kc, vc, tables.data_ptr<int64_t>(), tables.size(1), seq_lens.data_ptr<int64_t>(),
          static_cast<T*>(attn.data_ptr()), B, H_, KVH_, D_, k_caches_[l].size(1),
          k_caches_[l].size(0), 1.0f / std::sqrt(static_cast<float>(D_)), window_);
      TORCH_CHECK(code == kOk, "LlamaDecoder: bad block table or seq_len (code ", code, ")");
      torch::Tensor o = linear<T>(attn, w.o_proj);
      const T* op = static_cast<const T*>(o.data_ptr());
      const T* norm_post = static_cast<const T*>(w.post_norm.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) {
        add_row(xp + b * C, op + b * C, C);
        rms_norm_row(xp + b * C, norm_post, hp + b * C, C, eps_);
      }
      const torch::Tensor gate_up = linear<T>(h, w.gate_up);
      const T* gup = static_cast<const T*>(gate_up.data_ptr());
      T* actp = static_cast<T*>(act.data_ptr());
#pragma omp parallel for if (wide)
      for (int64_t b = 0; b < B; ++b) silu_mul_row(gup + b * 2 * I, actp + b * I, I);
      o = linear<T>(act, w.down);
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
  int64_t window_, small_m_max_;
};

}  // namespace

void bind_decoder(pybind11::module& m) {
  pybind11::class_<LlamaDecoder>(m, "LlamaDecoder")
      .def(pybind11::init<const std::vector<std::vector<torch::Tensor>>&, torch::Tensor,
                          std::vector<torch::Tensor>, std::vector<torch::Tensor>, int64_t,
                          int64_t, int64_t, double, int64_t, int64_t>())
      .def("forward", &LlamaDecoder::forward, pybind11::call_guard<pybind11::gil_scoped_release>());
}

}  // namespace tgserve
