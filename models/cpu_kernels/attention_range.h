// One key range of the paged attention (attention.cpp) for a group of up to kGroupRows rows
// of one sequence (a prefill chunk's queries; a decode row is a group of one): attend_range
// walks the range's keys in chunks of 16: the chunk's cache rows are located once, the next
// chunk's rows are prefetched, and for each KV head its G query heads are scored, softmaxed
// (online) and V-summed together by the SIMD loops of attention_simd.h (AVX-512),
// attention_avx2.h (AVX2 + FMA) or the portable ones, each naming the reduction order it
// fixes. The group's rows attend to a chunk together while its K/V rows sit in L1, each in its
// own order, so a row's bits do not depend on its group.
// The AVX2 build scores all of a group's rows against a chunk at once with the keys in lanes
// (attention_avx2_scores.h: the chunk's K rows transposed once per KV head); the other builds
// score row by row (score_rows).
// int8 cache rows (kv_int8.h) are never dequantised as a whole: a row alone reads them in
// place (the SIMD loops widen them), a group of rows widens each chunk's rows once per KV head
// into an L1 buffer (exact: the same bits) and runs the float loops on it (AVX2: the V rows,
// bf16 / half ones too; its K rows are widened by their transpose). A K row's scale
// joins the score's multiplier and a V row's the key's softmax weight in the V sum (the
// softmax's running sums keep the unscaled weights), each once per key and head, in the order
// of the float caches.
// K and V rows may be of two types (VT, default T: the K rows' type): a float32 model's
// float16 K rows with int8 V rows (--kv-cache-dtype int8v; kv_int8.h). Each cache then has its
// own row width; a chunk's rows are located once as token slots and each cache's rows found
// from them.
#pragma once

#include "kernels.h"

#include "attention_simd.h"
#include "kv_int8.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <numeric>
#include <type_traits>

namespace tgserve::attn {

// Rows per group: consecutive rows of one sequence (a prefill chunk's queries) read each K/V
// chunk once for up to this many queries. A long prefill streams its whole context (12.6 MB a
// layer at 8k keys for the default model) from L3 or memory once per group: 32 rows read it a
// quarter as often as 8 did (PERFORMANCE.md, AVX2 long prompts). Fewer when a group's partials
// would pass attention.cpp's kPartsBudget; a row's bits do not depend on its group.
constexpr int kGroupRows = 32;

// Per-row state of attend_range: acc [H, DA] (DA = acc_stride(D), the attention_simd.h
// layout) the unnormalised V sums, m [H] the online softmax's reference max, l [H] its sum.
struct RangeOut {
  float* acc;
  float* m;
  float* l;
};

// Attention of the R rows of a group (queries of one sequence, same block table and key start
// k0) over keys [k0, k1[i]) of this range, row i into out[i]. q[i] [H, qstride] is packed by
// pack_query. scratch holds p [R, G, kChunk], V weights [G, kChunk] (int8 rows: p times each
// V row's scale), per-lane sums [R, H, kChunk], then 16 floats of slack to align a chunk's K
// and V rows widened [2, kChunk, DA] (R > 1 and rows not float32; AVX2: K^T [D, kChunk] in
// the first half). A head's cache row is DS = D + KVRowExtra
// elements (D values, then an int8 row's scale).
// A chunk's K/V rows are located and prefetched once and stay in L1 while every row of the
// group attends to them: rows share the memory traffic, never the arithmetic. For each KV
// head the rows' scores come first, then their softmax steps, then their V sums: each row's
// three steps depend on one another, different rows' do not, so the core overlaps one row's
// chain with the next row's instead of waiting at every step. Each row walks
// the chunks k0, k0 + 16, ... < k1[i] with n = min(16, k1[i] - c0) keys, exactly as it does
// alone (R = 1), so its bits do not depend on its group.
// DC > 0 fixes head_dim at compile time (64, 128) so the D loops unroll. T: the K rows'
// type (the query is packed for it), VT the V rows' (the accumulators' layout).
template <typename T, int DC, typename VT = T>
void attend_range(const typename tgserve::attn::QPack<T>::type* const* q, int64_t qstride,
                  const T* kc, const VT* vc, const int64_t* table, int64_t k0, const int64_t* k1,
                  int R, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t num_blocks,
                  float scale, const RangeOut* out, float* scratch, int* bad) {
  namespace simd = tgserve::attn;
  constexpr bool kInt8K = std::is_same_v<T, int8_t>, kInt8V = std::is_same_v<VT, int8_t>;
  // The AVX2 build transposes each chunk's K rows (widening them) for all the group's rows,
  // so only its V rows want a float32 copy, and then for bf16 / half rows too.
  // Elsewhere int8 rows are widened, and float16 K rows (their queries are float32: QPack): a
  // group's rows then score from L1 floats instead of converting each row once per row (the
  // float16 cache's and int8v's prefill attention ran 1.4-1.5x the float32 cache's time).
#if defined(TGSERVE_ATTN_AVX2)
  constexpr bool kWidenK = false, kWidenV = !std::is_same_v<VT, float>;
#else
  constexpr bool kWidenK = kInt8K || std::is_same_v<T, c10::Half>, kWidenV = kInt8V;
#endif
  constexpr bool kWiden = kWidenK || kWidenV;
  constexpr bool kSameRows = std::is_same_v<T, VT>;
  const int64_t G = H / KVH, DS = D + tgserve::KVRowExtra<T>::value, W = KVH * DS;
  const int64_t DSV = D + tgserve::KVRowExtra<VT>::value, WV = KVH * DSV;
  const int64_t DA = simd::acc_stride<VT>(D);
  float* p = scratch;                         // [R, G, kChunk] scores, then weights
  float* pv = scratch + R * G * kChunk;        // [G, kChunk] the V sum's weights (int8 rows)
  float* lsum = scratch + (R + 1) * G * kChunk;  // [R, H, kChunk]
  // [kChunk, DA] a chunk's K rows widened, or (AVX2) K^T [D, kChunk] 64-byte aligned
  float* kwide = tgserve::attn::align64(lsum + R * H * kChunk);
  float* kt = kwide;
  float* vwide = kwide + kChunk * DA;  // [kChunk, DA] its V rows widened
  float kmul[kChunk], vmul[kChunk];  // each key's score multiplier and V scale
  std::fill(kmul, kmul + kChunk, scale);
  // Where a chunk's rows are: element offsets (W per token) when K and V rows are alike, else
  // token slots, each cache's offset then slot * W or slot * WV.
  const int64_t WO = kSameRows ? W : 1, KW = kSameRows ? 1 : W, VW = kSameRows ? 1 : WV;
  const int64_t kmax = *std::max_element(k1, k1 + R);
  for (int i = 0; i < R; ++i) {
    std::fill(out[i].m, out[i].m + H, -std::numeric_limits<float>::infinity());
    std::fill(out[i].acc, out[i].acc + H * DA, 0.0f);
  }
  std::fill(lsum, lsum + R * H * kChunk, 0.0f);
  // Row offsets of chunk j (keys k0 + 16 j ...) live in ring slot j % (kAhead + 1).
  int64_t off[kAhead + 1][kChunk];
  auto locate = [&](int64_t j) -> int64_t {  // fills chunk j's slot; returns its key count
    const int64_t c = k0 + j * kChunk;
    if (c >= kmax) return 0;
    if (!chunk_offsets(table, c, kmax, bs, WO, num_blocks, off[j % (kAhead + 1)]))
      *bad = tgserve::kBadBlock;
    return std::min<int64_t>(kChunk, kmax - c);
  };
  for (int64_t j = 0; j < kAhead; ++j)
    prefetch_chunk(kc, W, vc, WV, off[j % (kAhead + 1)], 0, locate(j));
  const T* krows[kChunk];
  const VT* vrows[kChunk];
  const float* kwrows[kChunk];
  const float* vwrows[kChunk];
  const typename QPack<T>::type* qg[kGroupRows];  // row i's query heads of KV head g
  // The group's rows over the chunk's rows of KV head g (krow, vrow: T rows in the cache, or
  // float32 rows widened from them): scores, softmax steps, V sums.
  // The next chunk's rows [a0, a1) (this head's share, at `ahead`) are prefetched a third
  // before each pass, so a lone row's prefetches do not queue on the line-fill buffers all at
  // once ahead of its arithmetic.
  auto passes = [&](auto krow, auto vrow, const int* n, int64_t g, const int64_t* ahead,
                    int64_t a0, int64_t a1) {
    using UK = std::remove_cv_t<std::remove_pointer_t<std::remove_pointer_t<decltype(krow)>>>;
    using UV = std::remove_cv_t<std::remove_pointer_t<std::remove_pointer_t<decltype(vrow)>>>;
    const int64_t t1 = a0 + (a1 - a0) / 3, t2 = a0 + 2 * (a1 - a0) / 3;
    prefetch_chunk(kc, W, vc, WV, ahead, a0, t1);
    for (int i = 0; i < R; ++i) qg[i] = q[i] + g * G * qstride;
    simd::score_rows<UK, DC>(qg, qstride, krow, n, R, G, D, kmul, p, kt);
    prefetch_chunk(kc, W, vc, WV, ahead, t1, t2);
    for (int i = 0; i < R; ++i)
      if (n[i] > 0)
        simd::softmax_chunk(p + i * G * kChunk, n[i], G, out[i].m + g * G,
                            lsum + (i * H + g * G) * kChunk, out[i].acc + g * G * DA, DA);
    prefetch_chunk(kc, W, vc, WV, ahead, t2, a1);
    for (int i = 0; i < R; ++i) {
      if (n[i] == 0) continue;
      const float* pi = p + i * G * kChunk;
      float* acc = out[i].acc + g * G * DA;
      if constexpr (kInt8V) {  // weight of key j in the V sum: p * its V row's scale
        for (int64_t h = 0; h < G; ++h)
          for (int j = 0; j < kChunk; ++j) pv[h * kChunk + j] = pi[h * kChunk + j] * vmul[j];
        simd::accumulate_chunk<UV, DC>(pv, vrow, G, D, acc, DA, n[i]);
      } else {
        simd::accumulate_chunk<UV, DC>(pi, vrow, G, D, acc, DA, n[i]);
      }
    }
  };
  for (int64_t c0 = k0, j = 0; c0 < kmax; c0 += kChunk, ++j) {
    const int64_t* cur = off[j % (kAhead + 1)];
    const int64_t* ahead = off[(j + kAhead) % (kAhead + 1)];
    const int64_t n_ahead = locate(j + kAhead);
    for (int64_t g = 0; g < KVH; ++g) {  // KV head g serves query heads g*G .. g*G + G-1
      // Spread the prefetches over the heads (and their passes) so they do not queue up all
      // at once.
      const int64_t pa0 = std::min(n_ahead, g * kChunk / KVH);
      const int64_t pa1 = std::min(n_ahead, (g + 1) * kChunk / KVH);
      for (int i = 0; i < kChunk; ++i) {
        krows[i] = kc + cur[i] * KW + g * DS;
        vrows[i] = vc + cur[i] * VW + g * DSV;
        // rows past the range repeat a valid one: finite scales
        if constexpr (kInt8K) kmul[i] = scale * tgserve::kv_row_scale(krows[i], D);
        if constexpr (kInt8V) vmul[i] = tgserve::kv_row_scale(vrows[i], D);
      }
      int n[kGroupRows];  // row i's keys in this chunk (0: its range ended)
      for (int i = 0; i < R; ++i)
        n[i] = static_cast<int>(std::clamp<int64_t>(k1[i] - c0, 0, kChunk));
      // Compiled only where rows are widened: elsewhere the float loops' query packing is not
      // this cache's (AVX512-BF16 packs bf16 queries for bf16 rows).
      if constexpr (kWiden) {
        if (R > 1) {  // each row widened once here, not once per row of the group
          const int nk = static_cast<int>(std::min<int64_t>(kChunk, kmax - c0));
          if constexpr (kWidenK) tgserve::attn::widen_rows(krows, nk, D, DA, kwide);
          if constexpr (kWidenV) tgserve::attn::widen_rows(vrows, nk, D, DA, vwide);
          for (int i = 0; i < kChunk; ++i) {  // past nk: the last row again, as krows
            kwrows[i] = kwide + std::min(i, nk - 1) * DA;
            vwrows[i] = vwide + std::min(i, nk - 1) * DA;
          }
          // AVX2: K widened in its transpose; a mixed cache's float16 K rows read in place
          if constexpr (kWidenK && kWidenV) passes(kwrows, vwrows, n, g, ahead, pa0, pa1);
          else if constexpr (kWidenV) passes(krows, vwrows, n, g, ahead, pa0, pa1);
          else passes(kwrows, vrows, n, g, ahead, pa0, pa1);
          continue;
        }
      }
      passes(krows, vrows, n, g, ahead, pa0, pa1);
    }
  }
  for (int i = 0; i < R; ++i)
    for (int64_t h = 0; h < H; ++h) {
      const float* lh = lsum + (i * H + h) * kChunk;
      out[i].l[h] = std::accumulate(lh, lh + kChunk, 0.0f);
    }
}

}  // namespace tgserve::attn
