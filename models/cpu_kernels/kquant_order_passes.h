// The passes of kquant_linear.cpp in the portable order (float32 activations; bf16 on CPUs without
// AVX512-BF16): plain loops, their SIMD twins (kquant_fma.h: AVX-512 or AVX2 + FMA) for few rows
// and the many-rows tiles over unpacked panels. Included by kquant_linear.cpp alone (its helpers
// share that file's anonymous namespace).
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "aligned_scratch.h"
#include "group_walk.h"
#include "kquant_format.h"
#include "kquant_fma.h"

namespace tgserve {
namespace {

// The same per-lane order in plain loops (float32 activations, CPUs without AVX512-BF16).
template <typename T>
void portable_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                   const float* xsum, int mr, int nr, float* out) {
  const KFormat f = kformat(type);
  const int64_t bb = f.file_block * kPanel, nb = K / f.width, ns = K / kSum;
  for (int m = 0; m < mr; ++m)
    for (int n = 0; n < nr; ++n) {
      float acc[kPanel] = {};
      for (int64_t b = 0; b < nb; ++b) {
        const uint8_t* blk = Wp + n * panel_bytes + b * bb;
        for (int j = 0; j < f.width / f.sub; ++j) {
          const int64_t e0 = b * f.width + j * f.sub;
          for (int l = 0; l < kPanel; ++l) {
            float dot = 0.0f, s, mt;
            for (int e = 0; e < f.sub; ++e)  // an explicit fma: kquant_fma.h runs the same
              dot = std::fma(static_cast<float>(x[m * K + e0 + e]),
                             static_cast<float>(packed_q(blk, f, l, j * f.sub + e) - f.offset), dot);
            lane_scales(blk, type, l, j, &s, &mt);
            acc[l] = std::fma(s, dot, acc[l]);
            if (f.has_min) acc[l] = std::fma(mt, xsum[m * ns + e0 / kSum], acc[l]);
          }
        }
      }
      std::copy(acc, acc + kPanel, out + (m * kMaxNR + n) * kPanel);
    }
}

#if defined(TGSERVE_KQUANT_FMA)
// kquant_fma's name for a type's scales.
constexpr int fma_kind(int type) {
  namespace kf = kquant_fma;
  return type == kQ5_0 ? kf::kD : type == kQ5_1 ? kf::kDMin : type == kQ6_K ? kf::kInt8Scale : kf::kSixBit;
}

// kquant_fma::pass for one type, its shape taken from kformat.
template <int TYPE, typename T>
void fma_pass(const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes, const float* xsum,
              int mr, int nr, float* out) {
  namespace kf = kquant_fma;
  constexpr KFormat f = kformat(TYPE);
  constexpr int kind = fma_kind(TYPE);
  kf::pass<kind, f.width, f.sub, f.scales, f.hbits, f.offset, T>(
      x, K, Wp, panel_bytes, f.file_block, xsum, mr, nr, kMaxNR, out);
}

// Many rows without the bf16 dot product (float32 activations; bf16 on CPUs without
// AVX512-BF16): each thread unpacks a group of 4 panels once (kquant_fma::unpack_panels) and
// runs 6-row tiles over it (kquant_fma::tile_rows), walked by group_walk::walk: the portable
// order's operations per lane, so the bits are those of the few-rows passes.
template <int TYPE, typename T, typename OutT>
void wide_fma(const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y,
              int64_t N, int64_t ldy, const float* xsum) {
  namespace kf = kquant_fma;
  constexpr KFormat f = kformat(TYPE);
  constexpr int kind = fma_kind(TYPE);
  const int64_t panel_bytes = K / f.width * f.file_block * kPanel, ns = K / kSum;
  const int64_t panels = (N + kPanel - 1) / kPanel, groups = (panels + kMaxNR - 1) / kMaxNR;
  std::vector<float> x32;  // bf16 x as float32 once (exact)
  const float* xf = group_walk::float_rows(x, M, K, x32);
  thread_local AlignedScratch<float> unpacked;  // q [4][K][16], then s and mt [4][K / sub][16]
  const int64_t q_floats = kMaxNR * K * kPanel, s_floats = kMaxNR * (K / f.sub) * kPanel;
  const auto group_panels = [&](int64_t g) {
    return static_cast<int>(std::min<int64_t>(kMaxNR, panels - g * kMaxNR));
  };
  const auto fill = [&](int64_t g) {
    float* q = unpacked.resize(q_floats + 2 * s_floats);
    kf::unpack_panels<kind, f.width, f.sub, f.scales, f.hbits, f.offset>(
        Wp + g * kMaxNR * panel_bytes, K, panel_bytes, f.file_block, group_panels(g), q,
        q + q_floats, q + q_floats + s_floats);
  };
  const auto pass = [&](int64_t g, int64_t m0, int mr) {
    alignas(64) float out[group_walk::kPassRows * kMaxNR * kPanel];
    const int nr = group_panels(g);
    const float* q = unpacked.data();
    kf::tile_rows<kind, f.sub>(xf + m0 * K, K, K, q, q + q_floats, q + q_floats + s_floats,
                               xsum ? xsum + m0 * ns : nullptr, ns, mr, nr, out, kMaxNR);
    const int64_t n0 = g * kMaxNR * kPanel;
    store_out(out, mr, std::min(N - n0, nr * kPanel), bias ? bias + n0 : nullptr, y + m0 * ldy + n0, ldy);
  };
  group_walk::walk_float_rows(M, K, groups, fill, pass);
}

template <typename T, typename OutT>
void wide_fma_any(int type, const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias,
                  OutT* y, int64_t N, int64_t ldy, const float* xsum) {
  switch (type) {
    case kQ5_0: return wide_fma<kQ5_0, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ5_1: return wide_fma<kQ5_1, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ4_K: return wide_fma<kQ4_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    case kQ5_K: return wide_fma<kQ5_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
    default: return wide_fma<kQ6_K, T, OutT>(x, M, K, Wp, bias, y, N, ldy, xsum);
  }
}
#endif

// The portable pass's order: SIMD float32 code where the CPU has AVX-512 or AVX2 + FMA
// (kquant_fma.h, the same bits), else the scalar loops above.
template <typename T>
void order_pass(int type, const T* x, int64_t K, const uint8_t* Wp, int64_t panel_bytes,
                const float* xsum, int mr, int nr, float* out) {
#if defined(TGSERVE_KQUANT_FMA)
  switch (type) {
    case kQ5_0: return fma_pass<kQ5_0, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ5_1: return fma_pass<kQ5_1, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ4_K: return fma_pass<kQ4_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    case kQ5_K: return fma_pass<kQ5_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
    default: return fma_pass<kQ6_K, T>(x, K, Wp, panel_bytes, xsum, mr, nr, out);
  }
#else
  portable_pass<T>(type, x, K, Wp, panel_bytes, xsum, mr, nr, out);
#endif
}

}  // namespace
}  // namespace tgserve
