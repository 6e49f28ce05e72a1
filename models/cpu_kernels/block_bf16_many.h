// The many-rows path of block_linear.cpp for bfloat16 activations on AVX512-BF16 (M > 8: a
// prefill chunk): a thread dequantises a group of panels once into a bf16 scratch and runs
// 6-row register tiles of vdpbf16ps over it. Included by block_linear.cpp alone (its
// anonymous namespace).
#pragma once

#include "x86_intrinsics.h"

#include <algorithm>
#include <cstdint>
#include <vector>

#include <omp.h>

#include "block_bf16_few.h"

namespace tgserve {
namespace {

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)

// Many rows (M > kFewRows): a thread dequantises a group of kGroupPanels panels once into a
// bf16 scratch, w [K / 2 steps][nr panels] x 32 bf16 (the vdpbf16ps operand), then runs every
// row over it with a 6-row x 4-panel register tile (24 accumulators + 4 weights + 1 broadcast
// of 32 zmm), linear.cpp's pass over a scratch instead of a packed bf16 matrix.
constexpr int64_t kFewRows = 8;
constexpr int kTileRows = 6;
constexpr int kGroupPanels = 4;

struct Scratch {
  std::vector<__m512i> w;
  const uint8_t* group = nullptr;  // the panels the scratch holds (a thread reuses it)
};

template <int TYPE>
void unpack_group(const uint8_t* Wp, int64_t panel_bytes, int nr, int64_t nb, Scratch& s) {
  constexpr int64_t bb = kFormat<TYPE>.file_block * kPanel;
  for (int64_t b = 0; b < nb; ++b)
    for (int j = 0; j < nr; ++j)
      dequant_block<TYPE>(Wp + j * panel_bytes + b * bb, s.w.data() + b * 16 * nr + j, nr);
}

// Rows x[0 .. MR) against the scratch's NR panels, stored to y (row stride N, nn columns).
template <int MR, int NR, typename OutT>
void scratch_tile(const c10::BFloat16* x, int64_t K, const Scratch& s,
                  const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  const int64_t steps = K / 2;
  __m512 acc[MR][NR];
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const __m512i* ws = s.w.data();
  for (int64_t t = 0; t < steps; ++t, ws += NR) {
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = (__m512bh)_mm512_load_si512(ws + j);
    for (int m = 0; m < MR; ++m) {
      const __m512bh xv = x_pair(x + m * K + 2 * t);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, w[j]);
    }
  }
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j)
      if (j * kPanel < nn)
        store_lanes(acc[m][j], bias ? bias + j * kPanel : nullptr,
                    static_cast<int>(std::min<int64_t>(kPanel, nn - j * kPanel)), y + m * N + j * kPanel);
}

// scratch_tile with MR = mr (1 .. R) rows.
template <int R, int NR, typename OutT>
void scratch_tile_rows(int mr, const c10::BFloat16* x, int64_t K, const Scratch& s,
                       const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  if constexpr (R > 1)
    if (mr < R) return scratch_tile_rows<R - 1, NR>(mr, x, K, s, bias, nn, y, N);
  scratch_tile<R, NR>(x, K, s, bias, nn, y, N);
}

template <int NR, typename OutT>
void scratch_rows(const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                  const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  for (int64_t m0 = 0; m0 < M; m0 += kTileRows) {
    const int mr = static_cast<int>(std::min<int64_t>(kTileRows, M - m0));
    scratch_tile_rows<kTileRows, NR>(mr, x + m0 * K, K, s, bias, nn, y + m0 * N, N);
  }
}

template <typename OutT>
void scratch_any(int nr, const c10::BFloat16* x, int64_t M, int64_t K, const Scratch& s,
                 const c10::BFloat16* bias, int64_t nn, OutT* y, int64_t N) {
  switch (nr) {
    case 1: scratch_rows<1>(x, M, K, s, bias, nn, y, N); break;
    case 2: scratch_rows<2>(x, M, K, s, bias, nn, y, N); break;
    case 3: scratch_rows<3>(x, M, K, s, bias, nn, y, N); break;
    default: scratch_rows<kGroupPanels>(x, M, K, s, bias, nn, y, N); break;
  }
}

// The many-rows path: work items are (panel group, chunk of rows); a thread's items come in
// group order, so it dequantises each of its groups once.
template <typename OutT>
void many_rows(const c10::BFloat16* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
               const c10::BFloat16* bias, OutT* y, int64_t N) {
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, panel_bytes = nb * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  const int64_t groups = (panels + kGroupPanels - 1) / kGroupPanels;
  // Enough items to keep every thread busy, row chunks of at least 64 rows.
  const int64_t threads = omp_get_max_threads();
  const int64_t chunks =
      std::clamp<int64_t>((2 * threads + groups - 1) / groups, 1, (M + 63) / 64);
  const int64_t rows = (M + chunks - 1) / chunks;
#pragma omp parallel
  {
    thread_local Scratch s;
    s.w.resize(nb * 16 * kGroupPanels);
    s.group = nullptr;
#pragma omp for schedule(static)
    for (int64_t item = 0; item < groups * chunks; ++item) {
      const int64_t g = item / chunks, r0 = (item % chunks) * rows;
      const int64_t p0 = g * kGroupPanels;
      const int nr = static_cast<int>(std::min<int64_t>(kGroupPanels, panels - p0));
      const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
      const uint8_t* group = Wp + p0 * panel_bytes;
      if (s.group != group) {
        switch (type) {
          case kQ4_0: unpack_group<kQ4_0>(group, panel_bytes, nr, nb, s); break;
          case kQ4_1: unpack_group<kQ4_1>(group, panel_bytes, nr, nb, s); break;
          default: unpack_group<kQ8_0>(group, panel_bytes, nr, nb, s); break;
        }
        s.group = group;
      }
      const int64_t mm = std::min(rows, M - r0);
      if (mm <= 0) continue;
      scratch_any(nr, x + r0 * K, mm, K, s, bias ? bias + n0 : nullptr, nn, y + r0 * N + n0, N);
    }
  }
}
#endif

}  // namespace
}  // namespace tgserve
