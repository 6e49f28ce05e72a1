// The shape of linear.cpp's passes (rows x panels, the L2 budgets of its walk) and where a pass's
// tile goes, with the scalar epilogue every path's rounding must equal. Included by linear.cpp
// alone (its helpers share that file's anonymous namespace).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>
#include <type_traits>

#include "group_walk.h"

namespace tgserve {
namespace {

constexpr int64_t kPanel = 16;  // output columns per panel
constexpr int kMaxMR = 6;       // rows of x per pass
static_assert(kMaxMR == group_walk::kPassRows);
constexpr int kMaxNR = 8;       // panels per pass: 8 only for one row over int8 panels,
constexpr int kMaxNRRows = 4;   // else at most 4 (6 x 4 accumulators fill the registers)
// A pass's panels of W should stay in L2 while the rows of x go over them.
constexpr int64_t kPanelBytesInL2 = 256 * 1024;
// Bytes of x's rows a block keeps in L2 while every group of panels goes over them.
constexpr int64_t kRowBlockBytes = 256 * 1024;
// How far ahead the int8 pass prefetches each panel (best of 256..2048 at M = 1 here).
constexpr int64_t kPrefetchBytes = 512;

// k per packed step: 2 for bfloat16 (a pair per lane), 1 otherwise.
template <typename T>
constexpr int64_t step_k() {
  return std::is_same_v<T, c10::BFloat16> ? 2 : 1;
}

// Where a pass's tile goes: rows of y N apart, nn columns from n0 (bias_f, scale from n0).
template <typename OutT>
struct Tile {
  OutT* y;
  int64_t N, nn;
  const float* scale;
  const float* bias_f;
};

// y [nn] = round(v * scale + bias) (scale: int8 weights only, else null).
template <typename OutT>
inline void store_row(const float* v, const float* scale, const float* bias_f, int64_t nn,
                      OutT* y) {
  if (scale)
    for (int64_t j = 0; j < nn; ++j) y[j] = static_cast<OutT>(v[j] * scale[j] + bias_f[j]);
  else
    for (int64_t j = 0; j < nn; ++j) y[j] = static_cast<OutT>(v[j] + bias_f[j]);
}

}  // namespace
}  // namespace tgserve
