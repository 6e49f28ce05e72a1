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

#if defined(__AVX512F__) && defined(__AVX512BW__)

// One k-step of a panel: 16 columns x a pair of k, as vdpbf16ps's operand.
inline __m512bh load_pairs(const c10::BFloat16* w) { return (__m512bh)_mm512_loadu_si512(w); }
// 32 int8, widened exactly to bf16: |q| <= 128 has at most 8 significant bits, so its float32
// has 16 zero low bits and its high half is its bf16; one vpermt2w gathers the 32 high halves
// (the same bits as vcvtne2ps2bf16, which costs more on the vector pipes here).
inline __m512bh load_pairs(const int8_t* w) {
  const __m512i lo = _mm512_castps_si512(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)w))));
  const __m512i hi = _mm512_castps_si512(
      _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i*)(w + 16)))));
  // word i of the result = word 2i + 1 of (lo, hi) (indices 32.. pick from hi)
  const __m512i high_halves = _mm512_set_epi16(
      63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39, 37, 35, 33, 31, 29, 27, 25, 23, 21, 19,
      17, 15, 13, 11, 9, 7, 5, 3, 1);
  return (__m512bh)_mm512_permutex2var_epi16(lo, high_halves, hi);
}

// One k-step of MR rows against NR panels: acc[m][j] += x pair (m) . W pairs (panel j).
// Without AVX512-BF16 the step is the portable pass's order in float32 code: two fmas, the
// pair's first k then its second (a bf16 is the high half of its float32).
template <int MR, int NR>
[[gnu::always_inline]] inline void step_bf16(const int32_t* pairs, const __m512bh* w,
                                             __m512 acc[kMaxMR][kMaxNR]) {
#if defined(__AVX512BF16__)
  for (int m = 0; m < MR; ++m) {
    const __m512bh xb = (__m512bh)_mm512_set1_epi32(pairs[m]);
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_dpbf16_ps(acc[m][j], xb, w[j]);
  }
#else
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  __m512 w0[NR], w1[NR];
  for (int j = 0; j < NR; ++j) {
    w0[j] = _mm512_castsi512_ps(_mm512_slli_epi32((__m512i)w[j], 16));
    w1[j] = _mm512_castsi512_ps(_mm512_and_si512((__m512i)w[j], high));
  }
  for (int m = 0; m < MR; ++m) {
    const __m512 x0 = _mm512_castsi512_ps(_mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(pairs[m]) << 16)));
    const __m512 x1 = _mm512_castsi512_ps(
        _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(pairs[m]) & 0xFFFF0000u)));
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(x0, w0[j], acc[m][j]);
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(x1, w1[j], acc[m][j]);
  }
#endif
}

// One pass: rows x[0 .. MR) against panels Wp[0 .. NR) (each `steps` * 16 * step_k long).
// The steps whose pair lies inside x's rows run branch-free; an odd K's last k pairs with a
// zero in a last step of its own (the same vdpbf16ps on the same accumulators, in order).
template <int MR, int NR, typename WT>
[[gnu::always_inline]] inline void pass_bf16(const c10::BFloat16* x, int64_t K, const WT* Wp,
                                             int64_t steps, __m512 acc[kMaxMR][kMaxNR]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t full = K / 2;
  const int64_t stride = steps * 32;
  for (int64_t s = 0; s < full; ++s) {
    if constexpr (std::is_same_v<WT, int8_t>) {
      // int8 panels: a line (two steps) of each panel kPrefetchBytes ahead. The widening
      // leaves fewer misses in flight than the bf16 pass; without this the pass streams
      // below memory speed at M = 1.
      if ((s & 1) == 0)
        for (int j = 0; j < NR; ++j)
          _mm_prefetch(reinterpret_cast<const char*>(Wp + j * stride + s * 32) + kPrefetchBytes,
                       _MM_HINT_T0);
    }
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = load_pairs(Wp + j * stride + s * 32);
    int32_t pairs[MR];
    for (int m = 0; m < MR; ++m) std::memcpy(&pairs[m], x + m * K + 2 * s, 4);
    step_bf16<MR, NR>(pairs, w, acc);
  }
  if (full < steps) {  // odd K
    __m512bh w[NR];
    for (int j = 0; j < NR; ++j) w[j] = load_pairs(Wp + j * stride + full * 32);
    int32_t pairs[MR];
    for (int m = 0; m < MR; ++m) {
      uint16_t lo;
      std::memcpy(&lo, x + m * K + 2 * full, 2);
      pairs[m] = lo;
    }
    step_bf16<MR, NR>(pairs, w, acc);
  }
}

template <int MR, int NR>
[[gnu::always_inline]] inline void pass_f32(const float* x, int64_t K, const float* Wp,
                                            int64_t steps, __m512 acc[kMaxMR][kMaxNR]) {
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_setzero_ps();
  const int64_t stride = steps * 16;
  for (int64_t s = 0; s < steps; ++s) {
    __m512 w[NR];
    for (int j = 0; j < NR; ++j) w[j] = _mm512_loadu_ps(Wp + j * stride + s * 16);
    for (int m = 0; m < MR; ++m) {
      const __m512 xb = _mm512_set1_ps(x[m * K + s]);
      for (int j = 0; j < NR; ++j) acc[m][j] = _mm512_fmadd_ps(xb, w[j], acc[m][j]);
    }
  }
}

// y [16 lanes, the first cn stored] = round(v * scale + bias) from a register (scale: int8
// weights only, else null). Rounding to bfloat16 is c10's (nearest even, NaN -> 0x7FC0) in
// integer lanes, so the bits equal the scalar epilogue's.
template <typename OutT>
inline void store_lanes(__m512 v, const float* scale, const float* bias, int64_t cn, OutT* y) {
  const __mmask16 k = cn >= kPanel ? __mmask16(0xFFFF) : __mmask16((1u << cn) - 1);
  const __m512 b = _mm512_maskz_loadu_ps(k, bias);
  v = scale ? _mm512_fmadd_ps(v, _mm512_maskz_loadu_ps(k, scale), b) : _mm512_add_ps(v, b);
  if constexpr (std::is_same_v<OutT, float>) {
    _mm512_mask_storeu_ps(y, k, v);
  } else {
    const __m512i u = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
    const __m512i bias_ne = _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF));
    __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, bias_ne), 16);
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
    _mm512_mask_cvtepi32_storeu_epi16(y, k, r);
  }
}

template <typename T, int MR, int NR, typename WT, typename OutT>
inline void pass(const T* x, int64_t K, const WT* Wp, int64_t steps, const Tile<OutT>& t) {
  __m512 acc[kMaxMR][kMaxNR];
  if constexpr (std::is_same_v<T, c10::BFloat16>)
    pass_bf16<MR, NR, WT>(x, K, Wp, steps, acc);
  else
    pass_f32<MR, NR>(x, K, Wp, steps, acc);
  for (int m = 0; m < MR; ++m)
    for (int j = 0; j < NR; ++j) {
      const int64_t c = j * kPanel;
      if (c < t.nn)
        store_lanes(acc[m][j], t.scale ? t.scale + c : nullptr, t.bias_f + c, t.nn - c,
                    t.y + m * t.N + c);
    }
}

template <typename T, int NR, typename WT, typename OutT>
inline void pass_rows(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr,
                      const Tile<OutT>& t) {
  switch (mr) {
    case 1: pass<T, 1, NR>(x, K, Wp, steps, t); break;
    case 2: pass<T, 2, NR>(x, K, Wp, steps, t); break;
    case 3: pass<T, 3, NR>(x, K, Wp, steps, t); break;
    case 4: pass<T, 4, NR>(x, K, Wp, steps, t); break;
    case 5: pass<T, 5, NR>(x, K, Wp, steps, t); break;
    default: pass<T, 6, NR>(x, K, Wp, steps, t); break;
  }
}

template <typename T, typename WT, typename OutT>
inline void any_pass(const T* x, int64_t K, const WT* Wp, int64_t steps, int mr, int nr,
                     const Tile<OutT>& t) {
  switch (nr) {
    case 1: pass_rows<T, 1>(x, K, Wp, steps, mr, t); break;
    case 2: pass_rows<T, 2>(x, K, Wp, steps, mr, t); break;
    case 3: pass_rows<T, 3>(x, K, Wp, steps, mr, t); break;
    case 4: pass_rows<T, 4>(x, K, Wp, steps, mr, t); break;
    // more than 4 panels: one row only (M = 1 over int8 panels, see packed_linear)
    case 5: pass<T, 1, 5>(x, K, Wp, steps, t); break;
    case 6: pass<T, 1, 6>(x, K, Wp, steps, t); break;
    case 7: pass<T, 1, 7>(x, K, Wp, steps, t); break;
    default: pass<T, 1, 8>(x, K, Wp, steps, t); break;
  }
}

// Which (activation, weight) pairs have the SIMD pass: float/float and bf16 with bf16 or int8.
template <typename T, typename WT>
constexpr bool kHasSimdPass =
    (std::is_same_v<T, float> && std::is_same_v<WT, float>) ||
    (std::is_same_v<T, c10::BFloat16> &&
     (std::is_same_v<WT, c10::BFloat16> || std::is_same_v<WT, int8_t>));

#else
template <typename T, typename WT>
constexpr bool kHasSimdPass = false;
template <typename T, typename WT, typename OutT>
inline void any_pass(const T*, int64_t, const WT*, int64_t, int, int, const Tile<OutT>&) {}
#endif

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
