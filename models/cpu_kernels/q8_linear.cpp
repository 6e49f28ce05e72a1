// Linear layers with int8 or int16 activations over Q8 panels (the contract and the layout:
// q8_linear.h; the passes and their dispatch per ISA: q8_passes.h; the activations' quantisers:
// q8_quantize.cpp; the Python bindings: q8_bindings.cpp). The activations are quantised once
// per call into a scratch ([M, K] int8 or int16 + a scale and a sum per block of 32); passes of
// up to kRows rows x kPanels panels then run block by block, the threads splitting the panel
// pairs (each row's order is the same whoever runs it).
#include "q8_linear.h"

#include <torch/extension.h>

#include <algorithm>
#include <vector>

#include "aligned_scratch.h"
#include "q8_passes.h"

namespace tgserve {

using namespace q8_pass;  // q8_passes.h: this file's own helpers

bool is_q8_kind(int kind) { return layout_of(kind).bytes > 0; }

int activation_bits(int kind) {
  const Layout f = layout_of(kind);
  return f.bytes == 0 ? 0 : f.act16 ? 16 : 8;
}

int64_t q8_block_bytes(int kind) { return layout_of(kind).bytes; }

namespace {

// Panels [p0, p0 + nr) (nr <= kPanels) for the quantised rows xq [M, K] (dx, sx [M, K / 32]):
// y = round(acc + bias) in passes of kRows rows.
template <typename T, typename OutT, typename A>
void q8_group(const Layout& f, const A* xq, const float* dx, const int32_t* sx, int64_t M,
              int64_t K, const uint8_t* Wp, const T* bias, OutT* y, int64_t N, int64_t p0,
              int nr) {
  const int64_t nb = K / kBlock, panel_bytes = nb * f.bytes;
  const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
  alignas(64) float acc[kRows * kPanels * kPanel];
  for (int64_t m0 = 0; m0 < M; m0 += kRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kRows, M - m0));
    const A* xr = xq + m0 * K;
    const float* dr = dx + m0 * nb;
    const int32_t* sr = sx + m0 * nb;
    const uint8_t* wp = Wp + p0 * panel_bytes;
    if (f.q4)
      nr == kPanels ? pass_rows<true, kPanels>(mr, f, xr, dr, sr, K, wp, panel_bytes, acc)
                    : pass_rows<true, 1>(mr, f, xr, dr, sr, K, wp, panel_bytes, acc);
    else
      nr == kPanels ? pass_rows<false, kPanels>(mr, f, xr, dr, sr, K, wp, panel_bytes, acc)
                    : pass_rows<false, 1>(mr, f, xr, dr, sr, K, wp, panel_bytes, acc);
    // y = round(acc + bias) panel by panel (lanes past nn are padding rows)
    for (int m = 0; m < mr; ++m)
      for (int j = 0; j < nr; ++j) {
        const float* a = acc + (m * nr + j) * kPanel;
        const int64_t c0 = j * kPanel, count = std::min<int64_t>(kPanel, nn - c0);
        OutT* out = y + (m0 + m) * N + n0 + c0;
        if (bias) {
          for (int64_t l = 0; l < count; ++l)
            out[l] = static_cast<OutT>(a[l] + static_cast<float>(bias[n0 + c0 + l]));
        } else {
          for (int64_t l = 0; l < count; ++l) out[l] = static_cast<OutT>(a[l] + 0.0f);
        }
      }
  }
}

}  // namespace

template <typename T, typename OutT>
void q8_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int kind, const T* bias,
               OutT* y, int64_t N) {
  const Layout f = layout_of(kind);
  const int64_t nb = K / kBlock;
  std::vector<float> dx(M * nb);
  std::vector<int32_t> sx(M * nb);
  const auto run = [&](auto* xq) {  // int8_t* or int16_t*: the rows' values, 32 at a time
    q8_quantize_rows(x, M, K, xq, dx.data(), sx.data());
    const int64_t panels = (N + kPanel - 1) / kPanel;
    const int64_t groups = (panels + kPanels - 1) / kPanels;
#pragma omp parallel for schedule(static)
    for (int64_t g = 0; g < groups; ++g) {
      const int64_t p0 = g * kPanels;
      const int nr = static_cast<int>(std::min<int64_t>(kPanels, panels - p0));
      q8_group<T, OutT>(f, xq, dx.data(), sx.data(), M, K, Wp, bias, y, N, p0, nr);
    }
  };
  if (f.act16) {
    AlignedScratch<int16_t> xq;
    run(xq.resize(M * K));
  } else {
    AlignedScratch<int8_t> xq;
    run(xq.resize(M * K));
  }
}

template <typename T, typename OutT, typename A>
void q8_linear_panels(const A* xq, const float* dx, const int32_t* sx, int64_t M, int64_t K,
                      const uint8_t* Wp, int kind, const T* bias, OutT* y, int64_t N,
                      int64_t p_begin, int64_t p_end) {
  const Layout f = layout_of(kind);
  for (int64_t p0 = p_begin; p0 < p_end; p0 += kPanels) {
    const int nr = static_cast<int>(std::min<int64_t>(kPanels, p_end - p0));
    q8_group<T, OutT>(f, xq, dx, sx, M, K, Wp, bias, y, N, p0, nr);
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                          \
  template void q8_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                   OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE
#define TGSERVE_INSTANTIATE(T, A)                                                         \
  template void q8_linear_panels<T, T, A>(const A*, const float*, const int32_t*, int64_t, \
                                          int64_t, const uint8_t*, int, const T*, T*, int64_t, \
                                          int64_t, int64_t);
TGSERVE_INSTANTIATE(float, int8_t)
TGSERVE_INSTANTIATE(c10::BFloat16, int8_t)
TGSERVE_INSTANTIATE(float, int16_t)
TGSERVE_INSTANTIATE(c10::BFloat16, int16_t)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
