// The dense float32 register tile over weights in linear.cpp's packed panel layout ([panel][K]
// [16 lanes]): block_fma.h's many-rows pass runs it over panels it dequantised into a scratch.
// Included by block_fma.h only.
//
// Per output lane: acc = 0; acc = fma(x[k], w[k], acc), k in order: the order of linear.cpp's
// float32 pass and of block_fma.h's few-rows pass, so the bits agree (batch invariance and "as
// stored == --dequantize" rest on it). Tile: AVX-512 6 rows x 4 panels (24 accumulators, 4
// weights, a broadcast: 29 of 32 zmm), AVX2 6 rows x 1 panel (12 + 2 + 1 of 16 ymm).
#pragma once

#include "group_walk.h"
#include "simd16.h"

#if defined(TGSERVE_SIMD16)

#include <cstdint>

namespace tgserve::block_fma {

using simd16::kLanes;
using simd16::VF;
namespace v = simd16;

constexpr int kTilePanels = TGSERVE_SIMD16 == 512 ? 4 : 1;

// out [m][j] (16 lanes at out + (m * row_stride + j) * 16) = rows x[0 .. MR) (row stride ldx)
// over panels w[0 .. NR) (panel stride K * 16): acc = 0; acc = fma(x[k], w[k], acc), k in order.
template <int MR, int NR>
inline void dense_tile(const float* x, int64_t ldx, int64_t K, const float* w, float* out,
                       int row_stride) {
  VF acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = v::zerof();
  const int64_t stride = K * kLanes;
  for (int64_t k = 0; k < K; ++k) {
    VF wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = v::loadf(w + j * stride + k * kLanes);
    for (int m = 0; m < MR; ++m) {
      const VF xv = v::set1f(x[m * ldx + k]);
      for (int j = 0; j < NR; ++j) acc[m][j] = v::fmadd(xv, wv[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) v::storef(out + (m * row_stride + j) * kLanes, acc[m][j]);
}

template <int MR>
inline void dense_tile_panels(const float* x, int64_t ldx, int64_t K, const float* w, int nr,
                              float* out, int row_stride) {
  if constexpr (kTilePanels == 1) {
    for (int j = 0; j < nr; ++j)
      dense_tile<MR, 1>(x, ldx, K, w + j * K * kLanes, out + j * kLanes, row_stride);
  } else {
    switch (nr) {
      case 1: return dense_tile<MR, 1>(x, ldx, K, w, out, row_stride);
      case 2: return dense_tile<MR, 2>(x, ldx, K, w, out, row_stride);
      case 3: return dense_tile<MR, 3>(x, ldx, K, w, out, row_stride);
      default: return dense_tile<MR, 4>(x, ldx, K, w, out, row_stride);
    }
  }
}

// dense_tile for mr (1 .. 6) rows and nr (1 .. 4) panels.
inline void dense_rows(const float* x, int64_t ldx, int64_t K, const float* w, int mr, int nr,
                       float* out, int row_stride) {
  group_walk::with_rows(mr, [&](auto rows) {
    dense_tile_panels<decltype(rows)::value>(x, ldx, K, w, nr, out, row_stride);
  });
}

}  // namespace tgserve::block_fma

#endif
