// Linear layers over GGUF block-quantised weights kept as stored (Q4_0, Q4_1, Q8_0): the
// blocks stay in memory as the file's bytes; the kernel dequantises them on the fly and runs
// the dense kernel's order, so the outputs are bitwise those of `--dequantize` + linear.cpp.
//
// Formats and the packed layout: block_format.h.
//
// Accumulation order of y[m, n] (one float32 lane, fixed by K alone): each weight is first
// dequantised as gguf does it in float32, w = d * q, Q4_1: w = (d * q) + m (d * q is exact:
// an 11-bit d times a q of at most 8 bits, so only the add rounds), then, for bfloat16
// activations, rounded to bf16 (nearest even, as torch's .to(torch.bfloat16)); then acc = 0;
// for every k-pair step in order: acc = vdpbf16ps(acc, x pair, w pair); y = round(acc +
// bias[n]). That is linear.cpp's order over the weights `--dequantize` holds, so the two paths
// agree bit for bit. float32 activations keep the float32 weights and run acc = fma(x[k], w[k],
// acc) for every k (linear.cpp's AVX-512 float32 pass, i.e. `--dequantize --dtype float32`);
// bf16 without AVX512-BF16 runs linear.cpp's portable order (acc = fma(x, w, acc) per k). The tile, M,
// the thread and the other rows change which lanes run together, never a lane's sequence:
// batch invariance (issue #14) holds as for linear.cpp.
//
// Two SIMD paths, one order. Few rows (M <= 8: decode, a speculative verify): a pass
// dequantises each pair of steps of its panels in registers and runs all its rows (up to 8)
// over them (the weights are read once; dequantising costs ALU work next to streaming a third
// of the dense bytes); from 2 rows, bf16 activations run each vdpbf16ps as its two fmas where
// this CPU's instruction gives their bits (bf16_pairs.h: half the cost per row), float32 ones
// a register tile of rows x panels per block (block_fma.h). Many rows:
// a thread dequantises a group of 4 panels once into a scratch (L2-sized) and runs the dense
// kernel's 6-row register tiles over it: the dense kernel's work plus the amortised
// dequantising. bf16 with AVX512-BF16: a bf16 scratch, 6 x 4 vdpbf16ps tiles (many_rows);
// float32 (and bf16 without AVX512-BF16, AVX-512 or AVX2): a float32 scratch in linear.cpp's
// layout, 6-row fma tiles (many_rows_fma, block_fma.h, group_walk.h).
#include "x86_intrinsics.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <vector>

#include <omp.h>

#include "kernels.h"
#include "bf16_pairs.h"
#include "block_fma.h"
#include "group_walk.h"
#include "aligned_scratch.h"
#include "block_format.h"
#include "block_bf16_few.h"
#include "block_bf16_many.h"
#include "block_order_passes.h"

namespace tgserve {

int64_t block_bytes(int type) { return format_of(type).file_block; }

void pack_blocks(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp) {
  if (is_kquant_type(type)) return kquant_pack(raw, N, K, type, Wp);  // kquant_linear.cpp
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, bb = f.file_block * kPanel, panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = Wp + (p * nb + b) * bb;
      std::memset(dst, 0, bb);
      for (int l = 0; l < kPanel; ++l) {
        const int64_t n = p * kPanel + l;
        if (n >= N) continue;  // zero rows: d = m = 0
        const uint8_t* blk = raw + (n * nb + b) * f.file_block;
        std::memcpy(dst + 2 * l, blk, 2);                            // d
        if (f.has_min) std::memcpy(dst + 32 + 2 * l, blk + 2, 2);  // m
        for (int e = 0; e < kBlock; ++e) {
          int shift;
          const int64_t pos = packed_pos(type, l, e, &shift);
          const int q = file_q(blk, type, e);
          const int stored = type == kQ4_0 ? q + 8 : q;  // the nibble (or the int8 byte)
          dst[f.scales + pos] |= static_cast<uint8_t>((stored & (type == kQ8_0 ? 0xFF : 0xF)) << shift);
        }
      }
    }
}

// Unpacked rows, as gguf's dequantisation computes them (dequant: fl(fl(d * q) + m)).
void block_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T,
                float* out) {
  if (type == kQ4_1Exact) type = kQ4_1;
  if (is_kquant_type(type)) return kquant_rows(Wp, K, type, ids, T, out);
  const Format f = format_of(type);
  const int64_t nb = K / kBlock, bb = f.file_block * kPanel;
#pragma omp parallel for schedule(static) if (T * K >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = ids[t] / kPanel;
    const int l = static_cast<int>(ids[t] % kPanel);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = Wp + (p * nb + b) * bb;
      uint16_t dh, mh = 0;
      std::memcpy(&dh, blk + 2 * l, 2);
      if (f.has_min) std::memcpy(&mh, blk + 32 + 2 * l, 2);
      const float d = half_to_float(dh), mn = half_to_float(mh);
      for (int e = 0; e < kBlock; ++e)
        out[t * K + b * kBlock + e] = dequant(d, mn, packed_q(blk + f.scales, type, l, e), f.has_min);
    }
  }
}

namespace {

// Panels [p0, p0 + nr) of the few-rows product for every row of x, in passes of kMaxMR rows
// (x32: x as float32 for the bf16 pair fmas, or null).
template <typename T, typename OutT>
void few_rows_group(int type, bool trusted, const T* x, const float* x32, int64_t M, int64_t K,
                    const uint8_t* Wp, int64_t panel_bytes, const T* bias, OutT* y, int64_t N,
                    int64_t p0, int nr) {
  const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
  alignas(64) float out[kMaxMR * kMaxNR * kPanel];
  for (int64_t m0 = 0; m0 < M; m0 += kMaxMR) {
    const int mr = static_cast<int>(std::min<int64_t>(kMaxMR, M - m0));
    if constexpr (kHasSimd<T>)
      simd_any<T>(type, x + m0 * K, x32 ? x32 + m0 * K : nullptr, K, Wp + p0 * panel_bytes,
                  panel_bytes, mr, nr, out);
    else
      order_pass<T>(type, trusted, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, mr, nr,
                    out);
    store_tile<T, OutT>(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * N + n0, N);
  }
}

// Panels per few-rows pass for M rows (fewer rows -> more panels per pass).
template <typename T>
int few_rows_nr(int64_t M) {
  int nr_max = M <= 2 ? kMaxNR : 2;
#if defined(TGSERVE_BLOCK_FMA)
  if constexpr (!kHasSimd<T>)
    nr_max = block_fma::few_rows_panels(
        static_cast<int>(std::min<int64_t>(M, block_fma::kFewRowsPerPass)));
#endif
  return nr_max;
}

// bf16 x as float32 (exact) for the pair fmas, where this CPU's vdpbf16ps is two fmas and
// rows share the dequantising (one row: vdpbf16ps, 5-10% faster there, one thread); else empty.
template <typename T>
std::vector<float> pair_rows(const T* x, int64_t M, int64_t K) {
  std::vector<float> x32;
#if defined(TGSERVE_BF16_PAIRS)
  if (kHasSimd<T> && M >= 2 && bf16_pairs::fmas_match_dpbf16()) {
    x32.resize(M * K);
    for (int64_t i = 0; i < M * K; ++i) x32[i] = static_cast<float>(x[i]);
  }
#else
  (void)x, (void)M, (void)K;
#endif
  return x32;
}

}  // namespace

template <typename T, typename OutT>
void block_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                  OutT* y, int64_t N) {
  const bool trusted = type == kQ4_1Exact;  // Q4_1's constant terms were checked when packed
  if (trusted) type = kQ4_1;
  if (is_kquant_type(type)) return kquant_linear<T, OutT>(x, M, K, Wp, type, bias, y, N);
  const Format f = format_of(type);
  const int64_t panel_bytes = K / kBlock * f.file_block * kPanel;
  const int64_t panels = (N + kPanel - 1) / kPanel;
#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
  if constexpr (kHasSimd<T>) {
    if (M > kFewRows) return many_rows<OutT>(x, M, K, Wp, type, bias, y, N);
  }
#endif
#if defined(TGSERVE_BLOCK_FMA)
  if constexpr (!kHasSimd<T>) {
    if (M > kMaxMR) return many_rows_fma<T, OutT>(x, M, K, Wp, type, bias, y, N);
  }
#endif
  // Few rows (decode, a speculative verify), or no SIMD.
  const int nr_max = group_walk::balanced_panels(panels, few_rows_nr<T>(M), omp_get_max_threads());
  const int64_t groups = (panels + nr_max - 1) / nr_max;
  const std::vector<float> x32 = pair_rows(x, M, K);
  const float* x32p = x32.empty() ? nullptr : x32.data();
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * nr_max;
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, panels - p0));
    few_rows_group<T, OutT>(type, trusted, x, x32p, M, K, Wp, panel_bytes, bias, y, N, p0, nr);
  }
}

bool block_panels_type(int type) {
  return type == kQ4_0 || type == kQ4_1 || type == kQ8_0 || type == kQ4_1Exact;
}

template <typename T, typename OutT>
void block_linear_panels(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
                         const T* bias, OutT* y, int64_t N, int64_t p_begin, int64_t p_end) {
  const bool trusted = type == kQ4_1Exact;
  if (trusted) type = kQ4_1;
  const int64_t panel_bytes = K / kBlock * format_of(type).file_block * kPanel;
  const int nr_max = few_rows_nr<T>(M);
  const std::vector<float> x32 = pair_rows(x, M, K);
  const float* x32p = x32.empty() ? nullptr : x32.data();
  for (int64_t p0 = p_begin; p0 < p_end; p0 += nr_max) {
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, p_end - p0));
    few_rows_group<T, OutT>(type, trusted, x, x32p, M, K, Wp, panel_bytes, bias, y, N, p0, nr);
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                          \
  template void block_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                      OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE
template void block_linear_panels<float, float>(const float*, int64_t, int64_t, const uint8_t*,
                                                int, const float*, float*, int64_t, int64_t,
                                                int64_t);
template void block_linear_panels<c10::BFloat16, c10::BFloat16>(
    const c10::BFloat16*, int64_t, int64_t, const uint8_t*, int, const c10::BFloat16*,
    c10::BFloat16*, int64_t, int64_t, int64_t);

}  // namespace tgserve
