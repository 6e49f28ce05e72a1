// Linear layers over GGUF Q5_0, Q5_1, Q4_K, Q5_K and Q6_K weights kept as stored: the blocks
// are unpacked in registers, activations stay in their dtype, sums are float32 (block_linear.cpp
// does Q4_0 / Q4_1 / Q8_0 and dispatches these types here).
//
// Formats and the packed layout: kquant_format.h.
//
// Accumulation order of y[m, n] (one float32 lane, fixed by K alone): acc = 0; for each
// sub-block j in K order (32 wide; Q6_K 16 wide): dot = 0; for each k-pair step of j: dot += x
// . q (one vdpbf16ps; the integers, offsets applied, are exact in bf16); acc = fma(s_j, dot,
// acc) with s_j = d (Q5_0, Q5_1) or fl(d sc_j) (K types); then Q5_1: acc = fma(m, xsum_j, acc);
// Q4_K / Q5_K: acc = fma(-fl(dmin m_j), xsum_j, acc); xsum_j = sub-block j's x summed left to
// right. y = round(acc + bias[n]). The register tile, M, the thread and the other rows change
// which lanes run together, never a lane's sequence: batch invariance (issue #14) holds.
// float32 activations and CPUs without AVX512-BF16 run the portable order: dot = fma(x, q, dot)
// per element in float32 (x not rounded to bf16), as SIMD code (kquant_fma.h: AVX-512 or
// AVX2 + FMA) or plain loops.
#include "x86_intrinsics.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels.h"
#include "aligned_scratch.h"
#include "group_walk.h"
#include "kquant_fma.h"
#include "kquant_format.h"
#include "kquant_bf16_few.h"
#include "kquant_bf16_wide.h"
#include "kquant_order_passes.h"

namespace tgserve {

bool is_kquant_type(int type) { return type == kMixedBlocks || kformat(type).width > 0; }

int64_t block_width(int type) {
  if (type == kMixedBlocks) return 256;  // the widest of its parts' (each part checks its own)
  if (is_kquant_type(type)) return kformat(type).width;
  return block_bytes(type) > 0 ? 32 : 0;
}

int64_t row_bytes(int type, int64_t K) {
  const int64_t w = block_width(type);
  if (w == 0 || type == kMixedBlocks || K <= 0 || K % w) return 0;
  return K / w * (is_kquant_type(type) ? kformat(type).file_block : block_bytes(type));
}

void kquant_pack(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp) {
  const KFormat f = kformat(type);
  const int64_t nb = K / f.width, bb = f.file_block * kPanel, panels = (N + kPanel - 1) / kPanel;
#pragma omp parallel for schedule(static)
  for (int64_t p = 0; p < panels; ++p)
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* dst = Wp + (p * nb + b) * bb;
      uint8_t* nib = dst + f.scales;
      uint8_t* hi = nib + 8 * f.width;
      std::memset(dst, 0, bb);
      for (int l = 0; l < kPanel; ++l) {
        const int64_t n = p * kPanel + l;
        if (n >= N) continue;  // zero rows: zero scales
        const uint8_t* blk = raw + (n * nb + b) * f.file_block;
        if (type == kQ6_K) {
          std::memcpy(dst + 2 * l, blk + 208, 2);
          for (int j = 0; j < 16; ++j) dst[32 + 16 * j + l] = blk[192 + j];
        } else {
          std::memcpy(dst + 2 * l, blk, 2);                                         // d
          if (f.has_min) std::memcpy(dst + 32 + 2 * l, blk + 2, 2);                // m / dmin
          for (int j = 0; f.width == 256 && j < 8; ++j) {
            int sc, m;
            file_scale_min(blk, j, &sc, &m);
            dst[64 + 16 * j + l] = static_cast<uint8_t>((sc & 0xF) | (m & 0xF) << 4);
            dst[192 + 16 * (j % 4) + l] |= static_cast<uint8_t>(((sc >> 4) | (m >> 4) << 2) << (4 * (j / 4)));
          }
        }
        for (int e = 0; e < f.width; ++e) {
          const int q = file_q(blk, type, e);
          int shift;
          nib[nib_pos(l, e, &shift)] |= static_cast<uint8_t>((q & 0xF) << shift);
          for (int h = 0; h < f.hbits; ++h) {
            const int bit = (e / 2) * f.hbits * 32 + h * 32 + 2 * l + e % 2;
            hi[bit / 8] |= static_cast<uint8_t>(((q >> (4 + h)) & 1) << (bit % 8));
          }
        }
      }
    }
}

// Unpacked rows, as gguf's dequantisation computes them: fl(fl(s q) + m) or fl(fl(s q) - fl(dmin
// m)), no fused multiply-add (the empty asm keeps the compiler from contracting the roundings).
void kquant_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T, float* out) {
  if (type == kMixedBlocks) return mixed_rows(Wp, K, ids, T, out);  // mixed_blocks.cpp
  const KFormat f = kformat(type);
  const int64_t nb = K / f.width, bb = f.file_block * kPanel;
#pragma omp parallel for schedule(static) if (T * K >= 65536)
  for (int64_t t = 0; t < T; ++t) {
    const int64_t p = ids[t] / kPanel;
    const int l = static_cast<int>(ids[t] % kPanel);
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* blk = Wp + (p * nb + b) * bb;
      for (int e = 0; e < f.width; ++e) {
        float s, mt;
        lane_scales(blk, type, l, e / f.sub, &s, &mt);
        float v = s * static_cast<float>(packed_q(blk, f, l, e) - f.offset);
        asm volatile("" : "+x"(v), "+x"(mt));
        out[t * K + b * f.width + e] = f.has_min ? v + mt : v;  // mt = -fl(dmin m): v - fl(dmin m)
      }
    }
  }
}

template <typename T, typename OutT>
void kquant_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                   OutT* y, int64_t N) {
  if (type == kMixedBlocks) return mixed_linear<T, OutT>(x, M, K, Wp, bias, y, N);
  kquant_linear_ld<T, OutT>(x, M, K, Wp, type, bias, y, N, N);
}

template <typename T, typename OutT>
void kquant_linear_ld(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                      OutT* y, int64_t N, int64_t ldy) {
  const KFormat f = kformat(type);
  const int64_t panel_bytes = K / f.width * f.file_block * kPanel, ns = K / kSum;
  const int64_t panels = (N + kPanel - 1) / kPanel;
  std::vector<float> xsum(f.has_min ? M * ns : 0);
  if (f.has_min) sub_sums(x, M, K, xsum.data());
  if (kHasSimd<T> && M > kWideM)
    return wide_any<T, OutT>(type, x, M, K, Wp, bias, y, N, ldy, f.has_min ? xsum.data() : nullptr);
  // Tile: few rows -> more panels per pass (independent chains); many rows -> more rows.
  int rows_per_pass = kMaxMR, nr_max = M <= 2 ? kMaxNR : 2;
#if defined(TGSERVE_KQUANT_FMA)
  if (!kHasSimd<T>) {
    if (M > kWideFmaM)
      return wide_fma_any<T, OutT>(type, x, M, K, Wp, bias, y, N, ldy,
                                   f.has_min ? xsum.data() : nullptr);
    rows_per_pass = kWideFmaM;
    nr_max = kquant_fma::few_rows_panels(
        static_cast<int>(std::min<int64_t>(M, kquant_fma::kFewRowsPerPass)));
  }
#endif
  nr_max = group_walk::balanced_panels(panels, nr_max, omp_get_max_threads());
  const int64_t groups = (panels + nr_max - 1) / nr_max;
#pragma omp parallel for schedule(static)
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t p0 = g * nr_max;
    const int nr = static_cast<int>(std::min<int64_t>(nr_max, panels - p0));
    const int64_t n0 = p0 * kPanel, nn = std::min(N - n0, nr * kPanel);
    alignas(64) float out[kWideFmaM * kMaxNR * kPanel];
    for (int64_t m0 = 0; m0 < M; m0 += rows_per_pass) {
      const int mr = static_cast<int>(std::min<int64_t>(rows_per_pass, M - m0));
      const float* xs = f.has_min ? xsum.data() + m0 * ns : nullptr;
      if constexpr (kHasSimd<T>)
        simd_any<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      else
        order_pass<T>(type, x + m0 * K, K, Wp + p0 * panel_bytes, panel_bytes, xs, mr, nr, out);
      store_out(out, mr, nn, bias ? bias + n0 : nullptr, y + m0 * ldy + n0, ldy);
    }
  }
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                            \
  template void kquant_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*,  \
                                       OutT*, int64_t);                                            \
  template void kquant_linear_ld<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, int, const T*, \
                                          OutT*, int64_t, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
