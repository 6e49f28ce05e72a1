// Paged decode attention for CPU: see kernels.h and models/cpu_decode_kernel.py for the contract.
#include "kernels.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kChunk = 32;  // keys scored between two online-softmax rescales

// exp for x <= 0 (scores minus their running max): Cody-Waite reduction + degree-6
// polynomial, ~2 ulp; plain float ops so `omp simd` loops vectorize (libm expf does not).
inline float exp_nonpos(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(float));
  return p * two_n;
}

// One cache row (D values) as float32: float rows are used in place, others converted.
template <typename T> struct Row;
template <> struct Row<float> {
  static const float* load(const float* src, float*, int64_t) { return src; }
  static void load_to(const float* src, float* dst, int64_t n) { std::memcpy(dst, src, n * 4); }
};
template <> struct Row<c10::BFloat16> {
  static const float* load(const c10::BFloat16* src, float* buf, int64_t n) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;  // bf16 = top half of fp32
      float f;
      std::memcpy(&f, &bits, sizeof(float));
      buf[i] = f;
    }
    return buf;
  }
  static void load_to(const c10::BFloat16* src, float* dst, int64_t n) { load(src, dst, n); }
};
template <> struct Row<c10::Half> {
  static const float* load(const c10::Half* src, float* buf, int64_t n) {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
  static void load_to(const c10::Half* src, float* dst, int64_t n) { load(src, dst, n); }
};

// Attention of all H query heads of sequence b over its keys [k0, k1): unnormalised
// acc [H, D], running max m [H] and sum l [H] (online softmax). A key's row in the cache holds
// all KV heads ([KVH, D], contiguous), so a block is read as one contiguous stretch.
// DC > 0 fixes head_dim at compile time (64, 128): the D-loops then unroll into whole vectors.
template <typename T, int DC>
void attend_range(const float* qf, const T* kc, const T* vc, const int64_t* table, int64_t k0,
                  int64_t k1, int64_t H, int64_t KVH, int64_t Drt, int64_t bs, int64_t num_blocks,
                  float* acc, float* m, float* l, float* row, float* s, int64_t* off, int* bad) {
  const int64_t D = DC > 0 ? DC : Drt;
  const int64_t G = H / KVH;  // query heads per KV head
  const int64_t W = KVH * D;  // one token's row
  for (int64_t h = 0; h < H; ++h) {
    m[h] = -std::numeric_limits<float>::infinity();
    l[h] = 0.0f;
  }
  std::fill(acc, acc + H * D, 0.0f);
  for (int64_t c0 = k0; c0 < k1; c0 += kChunk) {
    const int64_t n = std::min(kChunk, k1 - c0);
    for (int64_t i = 0; i < n; ++i) {
      const int64_t pos = c0 + i;
      int64_t blk = table[pos / bs];
      if (blk < 0 || blk >= num_blocks) {
        *bad = 2;  // reported after the parallel region (no throwing inside it)
        blk = 0;
      }
      off[i] = (blk * bs + pos % bs) * W;  // cache is [blocks, bs, KVH, D]
    }
    // The loads are latency-bound (blocks sit anywhere in memory): ask for this chunk's V rows
    // and the next chunk's K rows now, so they arrive while the K rows are scored.
    constexpr int64_t kLine = 64 / sizeof(T);
    for (int64_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < W; j += kLine) __builtin_prefetch(vc + off[i] + j);
    for (int64_t pos = c0 + kChunk; pos < std::min(k1, c0 + 2 * kChunk); ++pos) {
      const int64_t blk = table[pos / bs];
      if (blk < 0 || blk >= num_blocks) continue;
      const T* r = kc + (blk * bs + pos % bs) * W;
      for (int64_t j = 0; j < W; j += kLine) __builtin_prefetch(r + j);
    }
    for (int64_t i = 0; i < n; ++i) {  // scores s [H, kChunk]
      const float* kr = Row<T>::load(kc + off[i], row, W);
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = qf + h * D;
        const float* kh = kr + (h / G) * D;
        float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * kh[d];
        s[h * kChunk + i] = dot;
      }
    }
    for (int64_t h = 0; h < H; ++h) {  // online softmax: rescale what came before
      float* sh = s + h * kChunk;
      float mx = m[h];
      for (int64_t i = 0; i < n; ++i) mx = std::max(mx, sh[i]);
      const float alpha = exp_nonpos(m[h] - mx);  // ~0 on the first chunk (m = -inf)
      float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
      for (int64_t i = 0; i < n; ++i) {
        sh[i] = exp_nonpos(sh[i] - mx);
        sum += sh[i];
      }
      l[h] = l[h] * alpha + sum;
      m[h] = mx;
      if (alpha != 1.0f) {
        float* ah = acc + h * D;
#pragma omp simd
        for (int64_t d = 0; d < D; ++d) ah[d] *= alpha;
      }
    }
    for (int64_t i = 0; i < n; ++i) Row<T>::load_to(vc + off[i], row + i * W, W);
    for (int64_t h = 0; h < H; ++h) {  // acc[h] += p[h, :n] @ V[:n, h / G]
      const float* ph = s + h * kChunk;
      const float* vh = row + (h / G) * D;
      float* ah = acc + h * D;
      int64_t d0 = 0;
      for (; d0 + 16 <= D; d0 += 16) {  // 16 accumulators stay in registers over the keys
        float a[16];
        for (int j = 0; j < 16; ++j) a[j] = ah[d0 + j];
        for (int64_t i = 0; i < n; ++i) {
          const float p = ph[i];
          const float* v = vh + i * W + d0;
#pragma omp simd
          for (int j = 0; j < 16; ++j) a[j] += p * v[j];
        }
        for (int j = 0; j < 16; ++j) ah[d0 + j] = a[j];
      }
      for (; d0 < D; ++d0)
        for (int64_t i = 0; i < n; ++i) ah[d0] += ph[i] * vh[i * W + d0];
    }
  }
}

// Work items are (sequence, split): with few sequences each one's keys are cut into `splits`
// ranges so both cores work; partial (acc, m, l) are then merged per sequence.
template <typename T, int DC>
void decode(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
            T* out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t nb,
            int64_t num_blocks, float scale, int64_t window, int64_t splits, int* bad) {
  const int64_t items = B * splits;
  // Partials [items, H, D] + [items, H] x2, used only when splitting.
  std::vector<float> part(splits > 1 ? items * H * (D + 2) : 0);
#pragma omp parallel
  {
    // Per-thread scratch: qf/acc [H, D], row [kChunk, KVH * D], s [H, kChunk], m/l [H], off [kChunk].
    std::vector<float> scratch(2 * H * D + kChunk * KVH * D + H * kChunk + 2 * H);
    std::vector<int64_t> off(kChunk);
    float* qf = scratch.data();
    float* acc = qf + H * D;
    float* row = acc + H * D;
    float* s = row + kChunk * KVH * D;
    float* m = s + H * kChunk;
    float* l = m + H;
#pragma omp for schedule(dynamic, 1)
    for (int64_t it = 0; it < items; ++it) {
      const int64_t b = it / splits, sp = it % splits;
      int64_t len = lens[b];
      if (len < 0 || len > nb * bs) {
        *bad = 1;
        len = 0;
      }
      const int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      const int64_t span = (len - start + splits - 1) / splits;
      const int64_t k0 = std::min(len, start + sp * span), k1 = std::min(len, k0 + span);
      for (int64_t j = 0; j < H * D; ++j) qf[j] = static_cast<float>(q[b * H * D + j]) * scale;
      if (splits == 1) {
        attend_range<T, DC>(qf, kc, vc, tables + b * nb, k0, k1, H, KVH, D, bs, num_blocks, acc, m,
                        l, row, s, off.data(), bad);
        for (int64_t h = 0; h < H; ++h) {
          const float inv = l[h] > 0.0f ? 1.0f / l[h] : 0.0f;
          for (int64_t d = 0; d < D; ++d)
            out[(b * H + h) * D + d] = static_cast<T>(acc[h * D + d] * inv);
        }
      } else {
        float* pa = part.data() + it * H * D;
        float* pm = part.data() + items * H * D + it * H;
        attend_range<T, DC>(qf, kc, vc, tables + b * nb, k0, k1, H, KVH, D, bs, num_blocks, pa, pm,
                        pm + items * H, row, s, off.data(), bad);
      }
    }
    if (splits > 1) {
#pragma omp for
      for (int64_t bh = 0; bh < B * H; ++bh) {  // merge the splits of one (sequence, head)
        const int64_t b = bh / H, h = bh % H;
        float mx = -std::numeric_limits<float>::infinity();
        for (int64_t sp = 0; sp < splits; ++sp)
          mx = std::max(mx, part[items * H * D + (b * splits + sp) * H + h]);
        float total = 0.0f;
        std::fill(acc, acc + D, 0.0f);
        for (int64_t sp = 0; sp < splits; ++sp) {
          const int64_t it = b * splits + sp;
          const float ms = part[items * H * D + it * H + h];
          if (ms == -std::numeric_limits<float>::infinity()) continue;  // empty range
          const float w = exp_nonpos(ms - mx);
          total += w * part[items * H * D + items * H + it * H + h];
          const float* pa = part.data() + (it * H + h) * D;
          for (int64_t d = 0; d < D; ++d) acc[d] += w * pa[d];
        }
        const float inv = total > 0.0f ? 1.0f / total : 0.0f;
        for (int64_t d = 0; d < D; ++d) out[bh * D + d] = static_cast<T>(acc[d] * inv);
      }
    }
  }
}

}  // namespace

namespace tgserve {

template <typename T>
int paged_decode_attention(const T* q, const T* k_cache, const T* v_cache, const int64_t* tables,
                           int64_t table_width, const int64_t* seq_lens, T* out, int64_t B,
                           int64_t H, int64_t KVH, int64_t D, int64_t block_size,
                           int64_t num_blocks, float scale, int64_t window) {
  // Key ranges per sequence: enough work items for every thread (4 each, for balance) when
  // the batch is small, but no range shorter than ~256 keys (merging has a cost).
  const int64_t threads = omp_get_max_threads();
  const int64_t max_len = table_width * block_size;
  const int64_t splits = B >= 2 * threads
                             ? 1
                             : std::max<int64_t>(1, std::min((4 * threads + B - 1) / B,
                                                             (max_len + 255) / 256));
  int bad = kOk;
  const auto go = D == 64 ? decode<T, 64> : D == 128 ? decode<T, 128> : decode<T, 0>;
  go(q, k_cache, v_cache, tables, seq_lens, out, B, H, KVH, D, block_size, table_width,
     num_blocks, scale, window, splits, &bad);
  return bad;
}

#define TGSERVE_INSTANTIATE(T)                                                              \
  template int paged_decode_attention<T>(const T*, const T*, const T*, const int64_t*,    \
                                         int64_t, const int64_t*, T*, int64_t, int64_t,     \
                                         int64_t, int64_t, int64_t, int64_t, float, int64_t);
TGSERVE_INSTANTIATE(float)
TGSERVE_INSTANTIATE(c10::BFloat16)
TGSERVE_INSTANTIATE(c10::Half)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
