// Small-M linear layers: y [M, N] = x [M, K] @ W [N, K]^T (+ bias). At decode time M is the
// batch (often 1-16) and the layer is bound by streaming W from memory, where torch's bf16
// matrix-vector path reaches about half the bandwidth. Here each thread streams one
// contiguous half of W, 4 rows at a time, and reuses those rows from L1 for every row of x.
#include "kernels.h"

#include <immintrin.h>

#include <algorithm>

namespace tgserve {
namespace {

constexpr int64_t kRows = 4;  // rows of W per tile
constexpr int64_t kXRows = 4;  // rows of x per pass over a tile (kRows * kXRows accumulators)
// Rows of W ahead whose cache lines are requested while a tile is computed: the hardware
// prefetcher alone keeps fewer lines in flight than 4 interleaved row streams need.
constexpr int64_t kPrefetchRows = 8;

template <typename OutT>
inline void store(OutT* y, float v) { *y = static_cast<OutT>(v); }

#if defined(__AVX512F__) && defined(__AVX512BF16__)

// acc[m][j] accumulates x[m] . W[n0 + j] over K, 32 bf16 pairs per instruction.
template <int MB>
inline void tile_bf16(const c10::BFloat16* x, int64_t K, const c10::BFloat16* W, int64_t nn,
                      float out[kXRows][kRows]) {
  __m512 acc[MB][kRows];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kRows; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 32) {
    const __mmask32 mask = K - k >= 32 ? ~__mmask32{0} : (__mmask32{1} << (K - k)) - 1;
    for (int j = 0; j < kRows; ++j)  // a prefetch past the end of W is harmless (never faults)
      _mm_prefetch(reinterpret_cast<const char*>(W + (j + kPrefetchRows) * K + k), _MM_HINT_T0);
    __m512bh w[kRows];
    for (int j = 0; j < kRows; ++j)  // rows past N (last tile) repeat row 0: never stored
      w[j] = (__m512bh)_mm512_maskz_loadu_epi16(mask, W + (j < nn ? j : 0) * K + k);
    for (int m = 0; m < MB; ++m) {
      const __m512bh xv = (__m512bh)_mm512_maskz_loadu_epi16(mask, x + m * K + k);
      for (int j = 0; j < kRows; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xv, w[j]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kRows; ++j) out[m][j] = _mm512_reduce_add_ps(acc[m][j]);
}

template <int MB>
inline void tile_f32(const float* x, int64_t K, const float* W, int64_t nn,
                     float out[kXRows][kRows]) {
  __m512 acc[MB][kRows];
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kRows; ++j) acc[m][j] = _mm512_setzero_ps();
  for (int64_t k = 0; k < K; k += 16) {
    const __mmask16 mask = K - k >= 16 ? ~__mmask16{0} : (__mmask16{1} << (K - k)) - 1;
    for (int j = 0; j < kRows; ++j)
      _mm_prefetch(reinterpret_cast<const char*>(W + (j + kPrefetchRows) * K + k), _MM_HINT_T0);
    __m512 w[kRows];
    for (int j = 0; j < kRows; ++j) w[j] = _mm512_maskz_loadu_ps(mask, W + (j < nn ? j : 0) * K + k);
    for (int m = 0; m < MB; ++m) {
      const __m512 xv = _mm512_maskz_loadu_ps(mask, x + m * K + k);
      for (int j = 0; j < kRows; ++j) acc[m][j] = _mm512_fmadd_ps(xv, w[j], acc[m][j]);
    }
  }
  for (int m = 0; m < MB; ++m)
    for (int j = 0; j < kRows; ++j) out[m][j] = _mm512_reduce_add_ps(acc[m][j]);
}

inline void tile(const c10::BFloat16* x, int64_t K, const c10::BFloat16* W, int64_t nn,
                 int64_t mb, float out[kXRows][kRows]) {
  switch (mb) {
    case 1: tile_bf16<1>(x, K, W, nn, out); break;
    case 2: tile_bf16<2>(x, K, W, nn, out); break;
    case 3: tile_bf16<3>(x, K, W, nn, out); break;
    default: tile_bf16<4>(x, K, W, nn, out); break;
  }
}

inline void tile(const float* x, int64_t K, const float* W, int64_t nn, int64_t mb,
                 float out[kXRows][kRows]) {
  switch (mb) {
    case 1: tile_f32<1>(x, K, W, nn, out); break;
    case 2: tile_f32<2>(x, K, W, nn, out); break;
    case 3: tile_f32<3>(x, K, W, nn, out); break;
    default: tile_f32<4>(x, K, W, nn, out); break;
  }
}

#endif

// Portable path (other CPUs, and float16): plain loops the compiler vectorizes as it can.
template <typename T>
inline void tile_generic(const T* x, int64_t K, const T* W, int64_t nn, int64_t mb,
                         float out[kXRows][kRows]) {
  for (int64_t m = 0; m < mb; ++m)
    for (int64_t j = 0; j < nn; ++j) {
      float dot = 0.0f;
      for (int64_t k = 0; k < K; ++k)
        dot += static_cast<float>(x[m * K + k]) * static_cast<float>(W[j * K + k]);
      out[m][j] = dot;
    }
}

template <typename T>
inline void any_tile(const T* x, int64_t K, const T* W, int64_t nn, int64_t mb,
                     float out[kXRows][kRows]) {
#if defined(__AVX512F__) && defined(__AVX512BF16__)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    tile(x, K, W, nn, mb, out);
    return;
  }
#endif
  tile_generic(x, K, W, nn, mb, out);
}

}  // namespace

template <typename T, typename OutT>
void small_m_linear(const T* x, int64_t M, int64_t K, const T* W, const T* bias, OutT* y,
                    int64_t N) {
  const int64_t tiles = (N + kRows - 1) / kRows;
#pragma omp parallel for schedule(static)
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t n0 = t * kRows, nn = std::min(kRows, N - n0);
    float out[kXRows][kRows];
    for (int64_t m0 = 0; m0 < M; m0 += kXRows) {
      const int64_t mb = std::min(kXRows, M - m0);
      any_tile(x + m0 * K, K, W + n0 * K, nn, mb, out);
      for (int64_t m = 0; m < mb; ++m)
        for (int64_t j = 0; j < nn; ++j) {
          const float b = bias ? static_cast<float>(bias[n0 + j]) : 0.0f;
          store(y + (m0 + m) * N + n0 + j, out[m][j] + b);
        }
    }
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                       \
  template void small_m_linear<T, OutT>(const T*, int64_t, int64_t, const T*, const T*, OutT*, \
                                        int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
TGSERVE_INSTANTIATE(c10::Half, c10::Half)
TGSERVE_INSTANTIATE(c10::Half, float)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
