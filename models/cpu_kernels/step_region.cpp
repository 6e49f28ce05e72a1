// The one-region decode step (the contract and why: step_region.h).
#include "step_region.h"

#include <cmath>
#include <type_traits>

namespace tgserve {

template <typename T>
int decode_attention(const StepModel& m, size_t l, const T* q, T* out, const int64_t* tables,
                     int64_t width, const int64_t* lens, int64_t B) {
  const torch::Tensor &kc = m.k_caches[l], &vc = m.v_caches[l];
  const float scale = 1.0f / std::sqrt(static_cast<float>(m.D));
  const auto attend = [&](auto* k, auto* v) {
    return paged_decode_attention(q, k, v, tables, width, lens, out, B, m.H, m.KVH, m.D,
                                  kc.size(1), kc.size(0), scale, m.window);
  };
  if (m.kv_int8)
    return attend(static_cast<const int8_t*>(kc.data_ptr()), static_cast<const int8_t*>(vc.data_ptr()));
  if constexpr (std::is_same_v<T, float>) {  // a float32 model's float16 K (and V) rows
    if (m.kv_int8v)
      return attend(static_cast<const c10::Half*>(kc.data_ptr()),
                    static_cast<const int8_t*>(vc.data_ptr()));
    if (m.kv_half)
      return attend(static_cast<const c10::Half*>(kc.data_ptr()),
                    static_cast<const c10::Half*>(vc.data_ptr()));
  }
  return attend(static_cast<const T*>(kc.data_ptr()), static_cast<const T*>(vc.data_ptr()));
}

namespace {

// The bits w's input rows are quantised to: 8, 16 (Q8 panels' kinds) or 0 (block kernels).
int q8(const LinearWeights& w) { return activation_bits(static_cast<int>(w.block_type)); }
int64_t panels(int64_t n) { return (n + 15) / 16; }

// The step's shared rows (each written by the threads' slices, read after a barrier).
template <typename T>
struct Shared {
  std::vector<T> qkv, q, attn, o, gate_up, act, down;
  std::vector<int8_t> act_q;  // act quantised by gate_up's units (Q8 down projections)
  std::vector<int16_t> act_q16;  // the same for int16 activations
  std::vector<float> act_d;
  std::vector<int32_t> act_s;
  std::vector<T> logits;           // [B, E] a sparse MLP's router logits
  moe_experts::Plan<T> plan;       // its routing and expert buffers (experts_team's)
  Shared(int64_t B, int64_t C, int64_t q_size, int64_t qkv_size, int64_t I, int64_t E)
      : qkv(B * qkv_size), q(B * q_size), attn(B * q_size), o(B * C), gate_up(B * 2 * I),
        act(B * I), down(B * C), act_q(B * I), act_q16(B * I), act_d(B * I / 32), act_s(B * I / 32),
        logits(B * E) {}
};

// Router panels [p0, p1) of w for the rows x [M, K] into y [M, N] on the calling thread: the
// block panels' product, or packed_linear over those panels (a panel's lanes follow K alone,
// so a row's logits are those of the whole product over M rows).
template <typename T>
void router_panels(const LinearWeights& w, const T* x, int64_t M, int64_t K, T* y, int64_t p0,
                   int64_t p1) {
  if (p1 <= p0) return;
  const int kind = static_cast<int>(w.block_type);
  const int64_t N = w.out_features;
  const T* bias = w.bias ? static_cast<const T*>(w.bias->data_ptr()) : nullptr;
  if (kind) {
    block_linear_panels<T, T>(x, M, K, w.packed.data_ptr<uint8_t>(), kind, bias, y, N, p0, p1);
    return;
  }
  constexpr bool pairs = std::is_same_v<T, c10::BFloat16>;  // packed_linear's bf16 pairs
  const int64_t panel_elems = packed_linear_steps(K, pairs) * 16 * (pairs ? 2 : 1);
  const T* wp = static_cast<const T*>(w.packed.data_ptr()) + p0 * panel_elems;
  const int64_t n0 = 16 * p0, n = std::min(N, 16 * p1) - n0;
  for (int64_t b = 0; b < M; ++b)
    packed_linear<T, T, T>(x + b * K, 1, K, wp, nullptr, bias ? bias + n0 : nullptr,
                           y + b * N + n0, n);
}

template <typename T>
class RegionStep {
 public:
  RegionStep(const StepModel& m, T* x, T* h, const T* cos, const T* sin, const int64_t* slots,
             int64_t B, int64_t I, int64_t E)
      : m_(m), x_(x), h_(h), cos_(cos), sin_(sin), slots_(slots), B_(B), C_(m.C),
        q_size_(m.H * m.D), qkv_size_(q_size_ + 2 * m.KVH * m.D),
        s_(B, m.C, q_size_, qkv_size_, I, E) {}

  T* q() { return s_.q.data(); }
  T* attn() { return s_.attn.data(); }

  // Inside a region: each thread's copy of the residual rows, from x.
  void enter(region::Own<T>& own) const {
    own.x.assign(x_, x_ + B_ * C_);
    own.h.resize(B_ * C_);
  }

  // Layer l's input norm and qkv, then (one thread) rotary and the K/V writes, and x = the
  // residual rows for the next region.
  void qkv(size_t l, region::Own<T>& own) {
    const LayerWeights& w = m_.layers[l];
    const region::Rows<T> in =
        own.normed(static_cast<const T*>(w.input_norm.data_ptr()), B_, C_, m_.eps, q8(w.qkv));
    const auto [p0, p1] = region::slice(panels(qkv_size_));
    region::product(w.qkv, in, B_, C_, s_.qkv.data(), p0, p1);
#pragma omp barrier
#pragma omp single nowait
    {
      void* kc = m_.k_caches[l].data_ptr();
      void* vc = m_.v_caches[l].data_ptr();
      for (int64_t b = 0; b < B_; ++b)
        rope_and_append(m_, w, s_.qkv.data() + b * qkv_size_, cos_ + b * m_.D, sin_ + b * m_.D,
                        slots_[b], kc, vc, s_.q.data() + b * q_size_);
      std::copy(own.x.begin(), own.x.end(), x_);
    }
  }

  // Layer l from its out projection (the attention's output in attn) to its MLP's residual;
  // then layer l + 1's qkv, or the final norm into h.
  void rest(size_t l, region::Own<T>& own) {
    const LayerWeights& w = m_.layers[l];
    const auto [p0, p1] = region::slice(panels(C_));
    region::product(w.o_proj, own.quantized(s_.attn.data(), B_, q_size_, q8(w.o_proj)), B_,
                    q_size_, s_.o.data(), p0, p1);
#pragma omp barrier
    for (int64_t b = 0; b < B_; ++b) add_row(own.x.data() + b * C_, s_.o.data() + b * C_, C_);
    const T* post_norm = static_cast<const T*>(w.post_norm.data_ptr());
    if (w.moe)
      sparse_mlp(*w.moe, own.normed(post_norm, B_, C_, m_.eps, false).x);
    else
      dense_mlp(w, own.normed(post_norm, B_, C_, m_.eps, q8(*w.gate_up)), p0, p1);
    for (int64_t b = 0; b < B_; ++b) add_row(own.x.data() + b * C_, s_.down.data() + b * C_, C_);
    if (l + 1 < m_.layers.size()) return qkv(l + 1, own);
#pragma omp single nowait
    {
      const T* norm = static_cast<const T*>(m_.final_norm.data_ptr());
      for (int64_t b = 0; b < B_; ++b)
        rms_norm_row(own.x.data() + b * C_, norm, h_ + b * C_, C_, m_.eps);
    }
  }

 private:
  // The dense SwiGLU MLP of w on the normed rows `in` into down (o's panel slice [p0, p1)).
  void dense_mlp(const LayerWeights& w, const region::Rows<T>& in, int64_t p0, int64_t p1) {
    const int64_t I = w.gate_up->out_features / 2, G = panels(I);
    // Unit u: gate panels 2u, 2u + 1 and the same up panels -> 32 activations (one int8 block).
    const auto [g0, g1] = region::slice(G);
    region::product(*w.gate_up, in, B_, C_, s_.gate_up.data(), g0, g1);
    region::product(*w.gate_up, in, B_, C_, s_.gate_up.data(), G + g0, G + g1);
    const int64_t e0 = 16 * g0, e1 = std::min(I, 16 * g1), nb = I / 32;
    for (int64_t b = 0; b < B_ && e1 > e0; ++b) {
      const T* row = s_.gate_up.data() + b * 2 * I;
      silu_mul(row + e0, row + I + e0, s_.act.data() + b * I + e0, e1 - e0);
      const T* a = s_.act.data() + b * I + e0;
      float* d = s_.act_d.data() + b * nb + e0 / 32;
      int32_t* s = s_.act_s.data() + b * nb + e0 / 32;
      if (q8(*w.down) == 16)
        q8_quantize_rows(a, 1, e1 - e0, s_.act_q16.data() + b * I + e0, d, s);
      else if (q8(*w.down))
        q8_quantize_rows(a, 1, e1 - e0, s_.act_q.data() + b * I + e0, d, s);
    }
#pragma omp barrier
    const region::Rows<T> act{s_.act.data(), s_.act_q.data(), s_.act_d.data(), s_.act_s.data(),
                              s_.act_q16.data()};
    region::product(*w.down, act, B_, I, s_.down.data(), p0, p1);
#pragma omp barrier
  }

  // The sparse MLP `moe` on this thread's normed rows h [B, C] into down: the router's panels
  // (one a unit), then the team's routing, experts and weighted sum (experts_team, whose last
  // loop ends at a barrier). Every thread's h holds the same values: any may plan.
  void sparse_mlp(const MoeWeights& moe, const T* h) {
    const int64_t E = moe.router.out_features, t = omp_get_thread_num(), n = omp_get_num_threads();
    router_panels(moe.router, h, B_, C_, s_.logits.data(), panels(E) * t / n,
                  panels(E) * (t + 1) / n);
#pragma omp barrier
    const auto logits = [this]() -> const T* { return s_.logits.data(); };
    const auto route = [&moe, E](const T* row, int64_t* experts, float* weights) {
      route_row<T>(row, E, moe.top_k, moe.renormalize, experts, weights);
    };
    experts_team<T>(h, B_, C_, moe.gate_up, moe.down, moe.top_k, logits, route, s_.plan,
                    s_.down.data());
  }

  const StepModel& m_;
  T *x_, *h_;
  const T *cos_, *sin_;
  const int64_t* slots_;
  int64_t B_, C_, q_size_, qkv_size_;
  Shared<T> s_;
};

}  // namespace

template <typename T>
int one_region_step(const StepModel& m, T* x, T* h, const T* cos, const T* sin,
                    const int64_t* slots, const int64_t* tables, int64_t width,
                    const int64_t* lens, int64_t B) {
  int64_t I = 0, E = 0;  // the widest dense MLP row, the most experts
  for (const LayerWeights& w : m.layers)
    if (w.moe)
      E = std::max(E, w.moe->router.out_features);
    else
      I = std::max(I, w.gate_up->out_features / 2);
  RegionStep<T> step(m, x, h, cos, sin, slots, B, I, E);
#pragma omp parallel
  {
    thread_local region::Own<T> own;
    step.enter(own);
    step.qkv(0, own);
  }
  for (size_t l = 0; l < m.layers.size(); ++l) {
    const int code = decode_attention<T>(m, l, step.q(), step.attn(), tables, width, lens, B);
    if (code != kOk) return code;
#pragma omp parallel
    {
      thread_local region::Own<T> own;
      step.enter(own);
      step.rest(l, own);
    }
  }
  return kOk;
}

template int decode_attention<float>(const StepModel&, size_t, const float*, float*,
                                     const int64_t*, int64_t, const int64_t*, int64_t);
template int decode_attention<c10::BFloat16>(const StepModel&, size_t, const c10::BFloat16*,
                                             c10::BFloat16*, const int64_t*, int64_t,
                                             const int64_t*, int64_t);
template int one_region_step<float>(const StepModel&, float*, float*, const float*, const float*,
                                    const int64_t*, const int64_t*, int64_t, const int64_t*,
                                    int64_t);
template int one_region_step<c10::BFloat16>(const StepModel&, c10::BFloat16*, c10::BFloat16*,
                                            const c10::BFloat16*, const c10::BFloat16*,
                                            const int64_t*, const int64_t*, int64_t,
                                            const int64_t*, int64_t);

}  // namespace tgserve
