// The passes of block_linear.cpp in linear.cpp's fma order (float32 activations; bf16 on CPUs
// without AVX512-BF16): the portable pass and its SIMD twin (block_fma.h) for few rows, the
// many-rows path over float32 scratch panels, and the store of a pass's tile. Included by
// block_linear.cpp alone (its anonymous namespace).
#pragma once

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include <omp.h>

#include "block_bf16_few.h"  // store_lanes (AVX-512), kHasSimd
#include "block_fma.h"
#include "block_format.h"
#include "group_walk.h"

namespace tgserve {
namespace {

// float32 activations (and bf16 on CPUs without AVX512-BF16): each block of the nr panels is
// dequantised once (float32 weights for float32 x, bf16 for bf16 x), then every row runs
// linear.cpp's order over it: acc = fma(x, w, acc) per k (its AVX-512 float32 pass and its
// portable pass, both explicit fmas).
template <typename T>
void portable_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                   int mr, int nr, float* out) {
  using WT = std::conditional_t<std::is_same_v<T, float>, float, c10::BFloat16>;
  const Format f = format_of(type);
  const int64_t bb = f.file_block * kPanel, nb = K / kBlock;
  std::fill(out, out + kMaxMR * kMaxNR * kPanel, 0.0f);
  WT w[kPanel][kBlock];
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j) {
      dequant_block_portable<WT>(Wp + j * panel_bytes + b * bb, f, type, w);
      for (int m = 0; m < mr; ++m) {
        float* acc = out + (m * kMaxNR + j) * kPanel;
        for (int e = 0; e < kBlock; ++e) {
          const float xv = static_cast<float>(x[m * K + b * kBlock + e]);
          for (int l = 0; l < kPanel; ++l) {
            acc[l] = std::fma(xv, static_cast<float>(w[l][e]), acc[l]);
          }
        }
      }
    }
}

// The portable pass's order: SIMD float32 code where the CPU has AVX-512 or AVX2 + FMA
// (block_fma.h, the same bits), else the scalar loops above.
// `trusted`: a kQ4_1Exact weight (its blocks' constant terms checked when packed).
template <typename T>
void order_pass(int type, bool trusted, const T* x, int64_t K, const uint8_t* Wp,
                int64_t panel_bytes, int mr, int nr, float* out) {
#if defined(TGSERVE_BLOCK_FMA)
  const Format f = format_of(type);
  const auto run = [&](auto pass) {
    pass(x, K, Wp, panel_bytes, f.file_block, f.scales, mr, nr, kMaxNR, out);
  };
  switch (type) {
    case kQ4_0: return run(block_fma::pass<0, T>);
    case kQ4_1:
      return trusted ? run(block_fma::pass<1, T, true>) : run(block_fma::pass<1, T>);
    default: return run(block_fma::pass<2, T>);
  }
#else
  (void)trusted;
  portable_pass<T>(type, x, K, Wp, panel_bytes, mr, nr, out);
#endif
}

// y rows [0 .. mr) (N apart), columns [0 .. nn) = round(out + bias) in OutT, from a pass's
// out [kMaxMR][kMaxNR][16] (bf16: c10's nearest even, NaN -> 0x7FC0).
template <typename T, typename OutT>
void store_tile(const float* out, int mr, int64_t nn, const T* bias, OutT* y, int64_t N) {
  for (int m = 0; m < mr; ++m)
    for (int64_t c = 0; c < nn; c += kPanel) {
      const float* v = out + (m * kMaxNR + c / kPanel) * kPanel;
      const T* b = bias ? bias + c : nullptr;
      OutT* dst = y + m * N + c;
      const int count = static_cast<int>(std::min<int64_t>(kPanel, nn - c));
#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
      store_lanes(_mm512_loadu_ps(v), b, count, dst);
#else
      for (int l = 0; l < count; ++l)
        dst[l] = static_cast<OutT>(v[l] + (b ? static_cast<float>(b[l]) : 0.0f));
#endif
    }
}

#if defined(TGSERVE_BLOCK_FMA)
static_assert(kMaxMR == block_fma::kFewRows);

// Many rows without the bf16 dot product (float32 activations; bf16 on CPUs without
// AVX512-BF16): each thread dequantises a group of 4 panels into float32 in linear.cpp's
// layout (block_fma::dequant_panels; bf16 activations: the weights rounded to bf16 first) and
// runs the dense kernel's 6-row tile over it (block_fma::dense_rows), walked by
// group_walk::walk. A lane's operations are the portable order's: batch invariance holds, and
// the bits are linear.cpp's over the `--dequantize` weights.
template <typename T, typename OutT>
void many_rows_fma(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                   OutT* y, int64_t N) {
  const Format f = format_of(type);
  const int64_t panel_bytes = K / kBlock * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kMaxNR - 1) / kMaxNR;
  // bf16 x as float32 once (exact), so the tile broadcasts float32 as the dense pass does.
  std::vector<float> x32;
  const float* xf = group_walk::float_rows(x, M, K, x32);
  thread_local AlignedScratch<float> w;  // the group's panels, [4][K][16]
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kMaxNR, panels - g * kMaxNR));
  };
  const auto fill = [&](int64_t g) {
    float* dst = w.resize(kMaxNR * K * kPanel);
    const uint8_t* group = Wp + g * kMaxNR * panel_bytes;
    const auto run = [&](auto dequant) {
      dequant(group, K, panel_bytes, f.file_block, f.scales, group_panels(g), dst);
    };
    switch (type) {
      case kQ4_0: return run(block_fma::dequant_panels<0, T>);
      case kQ4_1: return run(block_fma::dequant_panels<1, T>);
      default: return run(block_fma::dequant_panels<2, T>);
    }
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float out[kMaxMR * kMaxNR * kPanel];
    const int nr = group_panels(g);
    const int64_t n0 = g * kMaxNR * kPanel, nn = std::min(N - n0, nr * kPanel);
    block_fma::dense_rows(xf + m0 * K, K, K, w.data(), mr, nr, out, kMaxNR);
    store_tile<T, OutT>(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * N + n0, N);
  };
  group_walk::walk_float_rows(M, K, groups, fill, pass);
}
#endif

}  // namespace
}  // namespace tgserve
