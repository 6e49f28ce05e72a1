// Linear layers over prepacked weights: y [M, N] = x [M, K] @ W [N, K]^T (+ bias), one kernel
// family for every M, so a row's values never depend on how many rows share the call.
//
// Packed layout (pack_linear_weight): W is cut into panels of 16 output columns; a panel
// stores, for each k-step, the 16 columns' weights side by side (float32: one k per step,
// [16]; bfloat16: a pair of k per step, [16][2], the operand layout of vdpbf16ps). Rows past N
// and the odd k past K are zeros. An element y[m, n] is then accumulated as one float32 lane:
// acc = 0; for every k-step in order: acc += x[m, step] . W[n, step] (one FMA, or one
// vdpbf16ps over the pair; an odd K's last k pairs with a zero); then y = round(acc + bias[n])
// (float32 add, bias 0 without one; rounding to bf16 is c10's nearest-even, NaN -> 0x7FC0,
// done in integer lanes). That order is fixed by K alone: the register tile (rows of x per
// pass, panels per pass), the row block and the thread that run a lane, M, and the other rows
// change which lanes are computed together, never the sequence of operations inside a lane.
// A lane's sum is one float32 value from its first step to its last (no K blocking, no
// partial sums combined). Batch invariance (issue #14) rests on this.
//
// int8 weights (weight-only, one scale per output row): the same layout and order over the
// int8 values as bf16 (exact: |q| <= 128), widened in registers when one pass of rows goes
// over a group of panels, else once per visit into a per-thread bf16 scratch (the same bits
// either way); y = round(fma(acc, scale[n], bias[n])) (one fused multiply-add, one rounding).
//
// Speed: a pass runs MR = 6 rows of x against NR <= 4 panels (24 accumulators in registers, no
// horizontal sums; one row over int8 panels: NR <= 8) and writes its tile straight from the
// registers. The work is a walk over row blocks (x's rows that fit in L2, kRowBlockBytes) x
// groups of NR panels x passes of MR rows: a row block stays in L2 while every group goes over
// it, and a group's panels stay in L2 while the block's rows go over them. Each thread takes an
// equal contiguous share of the walk. At M = 1 the kernel streams W at memory speed (one pass
// per group, the groups split between threads); at large M it runs near the vdpbf16ps peak
// (one per cycle per core here). AVX-512 CPUs without AVX512-BF16 run the same passes with
// two float32 fmas per k-pair (the portable order: k, then k + 1), not the scalar loops.

#include "aligned_scratch.h"
#include "group_walk.h"
#include "kernels.h"

#include "x86_intrinsics.h"
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "linear_tile.h"
#include "linear_avx512.h"

namespace tgserve {
namespace {

// Portable pass (CPUs without AVX-512 BF16, and float16): the same per-lane order, as plain
// loops over the 16 lanes (which the compiler vectorizes without reordering a lane's sums).
// Each k is an explicit fma, never `acc += x * w`: whether the compiler contracts that into an
// fma depends on the flags and the loop's shape, and block_linear.cpp's portable pass must
// produce the same bits over the same weights.
template <typename T, typename WT>
void portable_pass(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr, int nr,
                   float* out) {
  constexpr int64_t sk = step_k<T>();
  for (int m = 0; m < mr; ++m)
    for (int j = 0; j < nr; ++j) {
      float acc[kPanel] = {};
      const WT* panel = Wp + j * steps * kPanel * sk;
      for (int64_t s = 0; s < steps; ++s)
        for (int64_t i = 0; i < sk; ++i) {
          const int64_t k = s * sk + i;
          const float xv = k < K ? static_cast<float>(x[m * K + k]) : 0.0f;
          for (int64_t l = 0; l < kPanel; ++l)
            acc[l] = std::fma(xv, static_cast<float>(panel[(s * kPanel + l) * sk + i]), acc[l]);
        }
      std::copy(acc, acc + kPanel, out + (m * kMaxNR + j) * kPanel);
    }
}

// One pass of mr rows x nr panels into y (rows N apart, nn columns), SIMD where there is one.
template <typename T, typename OutT, typename WT>
inline void run_pass(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr, int nr, OutT* y,
                     int64_t N, int64_t nn, const float* scale, const float* bias_f) {
  if constexpr (kHasSimdPass<T, WT>) {
    any_pass(x, K, Wp, steps, mr, nr, Tile<OutT>{y, N, nn, scale, bias_f});
  } else {
    alignas(64) float out[kMaxMR * kMaxNR * kPanel];
    portable_pass(x, K, Wp, steps, mr, nr, out);
    for (int m = 0; m < mr; ++m)
      for (int j = 0; j < nr; ++j) {
        const int64_t c = j * kPanel, cn = std::min<int64_t>(kPanel, nn - c);
        if (cn > 0)
          store_row(out + (m * kMaxNR + j) * kPanel, scale ? scale + c : nullptr, bias_f + c, cn,
                    y + m * N + c);
      }
  }
}

// n int8 weights of packed panels -> the same n as bf16, exactly (n: a multiple of 32).
template <typename WT>
void widen_panels(const WT* src, int64_t n, c10::BFloat16* dst) {
  if constexpr (std::is_same_v<WT, int8_t>) {
#if defined(__AVX512F__) && defined(__AVX512BW__)
    for (int64_t e = 0; e < n; e += 32) _mm512_storeu_si512(dst + e, (__m512i)load_pairs(src + e));
#else
    for (int64_t e = 0; e < n; ++e) dst[e] = c10::BFloat16(static_cast<float>(src[e]));
#endif
  }
}

}  // namespace

int64_t packed_linear_steps(int64_t K, bool pairs) { return pairs ? (K + 1) / 2 : K; }

template <typename T, typename WT>
void pack_linear_weight(const WT* W, int64_t N, int64_t K, WT* Wp) {
  constexpr int64_t sk = step_k<T>();
  const int64_t steps = packed_linear_steps(K, sk == 2), panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t s = 0; s < steps; ++s)
      for (int64_t l = 0; l < kPanel; ++l)
        for (int64_t i = 0; i < sk; ++i) {
          const int64_t n = p * kPanel + l, k = s * sk + i;
          Wp[((p * steps + s) * kPanel + l) * sk + i] = n < N && k < K ? W[n * K + k] : WT(0);
        }
}

template <typename T, typename OutT, typename WT>
void packed_linear(const T* x, int64_t M, int64_t K, const WT* Wp, const float* scales,
                   const T* bias, OutT* y, int64_t N) {
  constexpr int64_t sk = step_k<T>();
  const int64_t steps = packed_linear_steps(K, sk == 2), panels = (N + kPanel - 1) / kPanel;
  const int64_t panel_elems = steps * kPanel * sk;
  // Panels per pass: as many as stay in L2 together, at most kMaxNRRows; a single row over
  // int8 panels (batch-1 decode) takes up to kMaxNR: twice the streams and independent
  // accumulators per thread, which is what keeps that pass near memory speed.
  const int64_t fit = kPanelBytesInL2 / std::max<int64_t>(1, panel_elems * sizeof(WT));
  const int nr_cap = std::is_same_v<WT, int8_t> && M == 1 ? kMaxNR : kMaxNRRows;
  const int nr_max = static_cast<int>(std::clamp<int64_t>(fit, 1, nr_cap));
  const int64_t groups = (panels + nr_max - 1) / nr_max;
  // int8 weights under more than one pass of rows (prefill): each group's panels are widened
  // to bf16 once per visit into the thread's scratch (same layout, exact, so the passes' bits
  // are those of the int8 pass) instead of once per pass.
  const bool widen = std::is_same_v<WT, int8_t> && M > kMaxMR;
  thread_local AlignedScratch<c10::BFloat16> wide;
  thread_local float bias_f[kMaxNR * kPanel];
  const auto group_columns = [&](int64_t g, int* nr, int64_t* n0, int64_t* nn) {
    *nr = static_cast<int>(std::min<int64_t>(nr_max, panels - g * nr_max));
    *n0 = g * nr_max * kPanel;
    *nn = std::min(N - *n0, *nr * kPanel);
  };
  const auto fill = [&](int64_t g) {
    int nr;
    int64_t n0, nn;
    group_columns(g, &nr, &n0, &nn);
    for (int64_t j = 0; j < kMaxNR * kPanel; ++j)
      bias_f[j] = bias && j < nn ? static_cast<float>(bias[n0 + j]) : 0.0f;
    if (widen) {
      widen_panels(Wp + g * nr_max * panel_elems, nr * panel_elems, wide.resize(nr_max * panel_elems));
    }
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    int nr;
    int64_t n0, nn;
    group_columns(g, &nr, &n0, &nn);
    const float* scale = scales ? scales + n0 : nullptr;
    const auto run = [&](const auto* group) {
      run_pass<T, OutT>(x + m0 * K, K, group, steps, mr, nr, y + m0 * N + n0, N, nn, scale,
                        bias_f);
    };
    if (widen)
      run(wide.data());
    else
      run(Wp + g * nr_max * panel_elems);
  };
  // The work is row blocks x groups x row passes (group_walk.h): a block of x's rows
  // (kRowBlockBytes) stays in L2 while every group of panels goes over it, and a group's panels
  // stay in L2 while the block's rows go over them. M = 1: one pass per group, a share of the
  // groups per thread.
  group_walk::walk(M, K * int64_t(sizeof(T)), kRowBlockBytes, groups, fill, pass);
}

#define TGSERVE_INSTANTIATE(T, OutT, WT)                                                     \
  template void packed_linear<T, OutT, WT>(const T*, int64_t, int64_t, const WT*, const float*, \
                                           const T*, OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16, int8_t)
TGSERVE_INSTANTIATE(c10::BFloat16, float, int8_t)
TGSERVE_INSTANTIATE(c10::Half, c10::Half, c10::Half)
TGSERVE_INSTANTIATE(c10::Half, float, c10::Half)
#undef TGSERVE_INSTANTIATE
template void pack_linear_weight<float, float>(const float*, int64_t, int64_t, float*);
template void pack_linear_weight<c10::BFloat16, c10::BFloat16>(const c10::BFloat16*, int64_t,
                                                               int64_t, c10::BFloat16*);
template void pack_linear_weight<c10::BFloat16, int8_t>(const int8_t*, int64_t, int64_t,
                                                        int8_t*);
template void pack_linear_weight<c10::Half, c10::Half>(const c10::Half*, int64_t, int64_t,
                                                       c10::Half*);

}  // namespace tgserve
