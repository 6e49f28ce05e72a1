// The many-rows walk shared by the packed kernel (linear.cpp) and the block kernels' many-rows
// passes (block_linear.cpp, kquant_linear.cpp): a call's work is cut into units (row block,
// group of panels, pass of kPassRows rows), walked in that order, each OpenMP thread taking an
// equal contiguous share. A thread loads a group into its scratch (dequantised blocks, widened
// int8) when its walk reaches a group it does not hold (once per row block and group at most),
// so that cost is amortised over the block's rows; a row block stays in L2 while every group
// goes over it, and a group stays in L2 while the block's passes run.
//
// The walk decides only which rows and panels a pass covers and which thread runs it; a lane's
// sequence of operations is the pass's own, so batch invariance is the pass's to keep.
#pragma once

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdint>
#include <type_traits>
#include <vector>

namespace tgserve::group_walk {

constexpr int64_t kRowBlockBytes = 512 * 1024;  // float32 x kept in L2 (walk_float_rows)
constexpr int kPassRows = 6;  // rows per pass (the dense kernel's register tile)

// Panels per group for the few-rows passes (block_linear.cpp, kquant_linear.cpp), whose groups
// are split statically over `threads`: of nr_max and the sizes down to half of it (at least
// 2), the one whose busiest thread runs the fewest panels, the largest on a tie. E.g. 36
// panels (N = 576) on 2 threads: groups of 4 leave 20 and 16 panels, groups of 3 18 and 18.
// A pass's panel count never changes a lane's sequence: the bits are the same.
inline int balanced_panels(int64_t panels, int nr_max, int threads) {
  if (threads <= 1) return nr_max;
  int best = nr_max;
  int64_t best_load = INT64_MAX;
  for (int nr = nr_max; nr >= std::max(2, nr_max / 2); --nr) {
    const int64_t groups = (panels + nr - 1) / nr;
    const int64_t load = std::min<int64_t>(panels, (groups + threads - 1) / threads * nr);
    if (load < best_load) best = nr, best_load = load;
  }
  return best;
}

// fill(g): load group g into the calling thread's scratch (thread_local state of the caller).
// pass(g, m0, mr): rows m0 .. m0 + mr over group g (the thread's scratch holds it).
// A row block is `block_bytes` of rows `row_bytes` long, a whole number of passes.
template <typename Fill, typename Pass>
void walk(int64_t M, int64_t row_bytes, int64_t block_bytes, int64_t groups, Fill&& fill,
          Pass&& pass) {
  const int64_t block_rows =
      std::max<int64_t>(1, block_bytes / std::max<int64_t>(1, row_bytes) / kPassRows) * kPassRows;
  const int64_t work = groups * ((M + kPassRows - 1) / kPassRows);
#pragma omp parallel
  {
    const int64_t threads = omp_get_num_threads(), me = omp_get_thread_num();
    const int64_t begin = work * me / threads, end = work * (me + 1) / threads;
    int64_t held = -1;  // the group this thread's scratch holds
    int64_t u = 0;      // index of the walk's next unit
    for (int64_t r0 = 0; r0 < M && u < end; r0 += block_rows) {
      const int64_t passes = (std::min(M - r0, block_rows) + kPassRows - 1) / kPassRows;
      if (u + groups * passes <= begin) {
        u += groups * passes;
        continue;
      }
      for (int64_t g = 0; g < groups && u < end; ++g) {
        if (u + passes <= begin) {
          u += passes;
          continue;
        }
        for (int64_t q = 0; q < passes; ++q, ++u) {
          if (u < begin || u >= end) continue;
          if (held != g) {
            fill(g);
            held = g;
          }
          const int64_t m0 = r0 + q * kPassRows;
          pass(g, m0, static_cast<int>(std::min<int64_t>(kPassRows, M - m0)));
        }
      }
    }
  }
}

// The float32 passes' walk: row blocks of kRowBlockBytes of float32 x.
template <typename Fill, typename Pass>
void walk_float_rows(int64_t M, int64_t K, int64_t groups, Fill&& fill, Pass&& pass) {
  walk(M, K * int64_t(sizeof(float)), kRowBlockBytes, groups, fill, pass);
}

// x [M, K] as float32: x itself, or converted (exactly, from bf16) into `buffer`.
template <typename T>
const float* float_rows(const T* x, int64_t M, int64_t K, std::vector<float>& buffer) {
  if constexpr (std::is_same_v<T, float>) {
    return x;
  } else {
    buffer.resize(M * K);
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < M * K; ++i) buffer[i] = static_cast<float>(x[i]);
    return buffer.data();
  }
}

// f(std::integral_constant<int, mr>{}) for mr in 1 .. kPassRows: a pass's row count as a
// template argument (the register tile's size).
template <typename F>
void with_rows(int mr, F&& f) {
  switch (mr) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    default: return f(std::integral_constant<int, 6>{});
  }
}

}  // namespace tgserve::group_walk
