// Linear layers with int8 or int16 activations over Q8 panels (the contract and the layout:
// q8_linear.h; the passes and their dispatch per ISA: q8_passes.h; the activations' quantisers:
// q8_quantize.cpp; the Python bindings: q8_bindings.cpp). The activations are quantised once
// per call into a scratch ([M, K] int8 or int16 + a scale and a sum per block of 32); passes of
// up to kRows rows x kPanels panels then run block by block, the threads splitting the panel
// pairs (each row's order is the same whoever runs it); many int16 rows run q16_tile.h's tiles
// over panels widened once per group instead (many_rows16).
#include "q8_linear.h"

#include <algorithm>
#include <type_traits>
#include <vector>

#include "aligned_scratch.h"
#include "group_walk.h"
#include "q16_tile.h"
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

// y rows [0, mr) (N apart), columns n0 .. n0 + nn = round(acc + bias) to OutT, from acc
// [mr][nr][16] (lanes past nn are padding rows).
template <typename T, typename OutT>
void store_rows(const float* acc, int mr, int nr, const T* bias, OutT* y, int64_t N, int64_t n0,
                int64_t nn) {
  for (int m = 0; m < mr; ++m)
    for (int j = 0; j < nr; ++j) {
      const float* a = acc + (m * nr + j) * kPanel;
      const int64_t c0 = j * kPanel, count = std::min<int64_t>(kPanel, nn - c0);
      OutT* out = y + m * N + n0 + c0;
      if (bias) {
        for (int64_t l = 0; l < count; ++l)
          out[l] = static_cast<OutT>(a[l] + static_cast<float>(bias[n0 + c0 + l]));
      } else {
        for (int64_t l = 0; l < count; ++l) out[l] = static_cast<OutT>(a[l] + 0.0f);
      }
    }
}

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
    store_rows(acc, mr, nr, bias, y + m0 * N, N, n0, nn);
  }
}

#if defined(TGSERVE_Q16_TILE)
// Many int16 rows: q16_tile.h's tiles (kTileRows rows x one panel) over groups of kGroupPanels
// panels a thread widens once per row block, walked by group_walk.h (row blocks of
// kRowBlockBytes of int16 rows, kept in L2 beside a widened group). From kTileMinRows rows on
// (one thread, the shared AVX2 Zen 3 host: ~1.0x q16_avx2.h's passes at 8 rows, 1.2x at 12,
// 1.4x at 64; PERFORMANCE.md). Each row's order is q8_linear.h's whichever pass runs it.
constexpr int64_t kTileMinRows = 8;
constexpr int kGroupPanels = 4;
constexpr int64_t kRowBlockBytes = 256 * 1024;
static_assert(q16_tile::kTileRows == group_walk::kPassRows);

template <typename T, typename OutT>
void many_rows16(const Layout& f, const int16_t* xq, const float* dx, const int32_t* sx,
                 int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y, int64_t N) {
  const int64_t nb = K / kBlock, panel_bytes = nb * f.bytes, pw = q16_tile::panel_words(K);
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kGroupPanels - 1) / kGroupPanels;
  thread_local AlignedScratch<int32_t> w;  // the group's widened panels [kGroupPanels][pw]
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kGroupPanels, panels - g * kGroupPanels));
  };
  const auto fill = [&](int64_t g) {
    int32_t* dst = w.resize(kGroupPanels * pw);
    dispatch_layout(f, [&](auto kind) {
      for (int j = 0; j < group_panels(g); ++j)
        q16_tile::widen_panel<decltype(kind)::value>(Wp + (g * kGroupPanels + j) * panel_bytes,
                                                     K, f.bytes, f.quants, dst + j * pw);
    });
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float acc[q16_tile::kTileRows * kGroupPanels * kPanel];
    const int nr = group_panels(g);
    const int64_t n0 = g * kGroupPanels * kPanel, nn = std::min(N - n0, nr * kPanel);
    group_walk::with_rows(mr, [&](auto rows) {
      constexpr int MR = decltype(rows)::value;
      for (int j = 0; j < nr; ++j) {
        const auto tile = f.has_min ? q16_tile::tile<true, MR> : q16_tile::tile<false, MR>;
        tile(xq + m0 * K, dx + m0 * nb, sx + m0 * nb, K, w.data() + j * pw, acc + j * kPanel,
             nr * kPanel);
      }
    });
    store_rows(acc, mr, nr, bias, y + m0 * N, N, n0, nn);
  };
  group_walk::walk(M, K * int64_t(sizeof(int16_t)), kRowBlockBytes, groups, fill, pass);
}
#endif

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
#if defined(TGSERVE_Q16_TILE)
    if constexpr (std::is_same_v<std::remove_pointer_t<decltype(xq)>, int16_t>)
      if (M >= kTileMinRows)
        return many_rows16<T, OutT>(f, xq, dx.data(), sx.data(), M, K, Wp, bias, y, N);
#endif
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
