// Paged attention for CPU, one query per row: see kernels.h and paged_attention.py for the
// contract.
//
// A sequence's keys are cut into ranges of a fixed length (kRangeKeys), attended one by one and
// merged in order (see decode). A range walks its keys in chunks of 16: the chunk's cache rows are located
// once, the next chunk's rows are prefetched, and for each KV head its G query heads are
// scored, softmaxed (online) and V-summed together by the SIMD loops of attention_simd.h.
#include "kernels.h"

#include "attention_simd.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

namespace {

using tgserve::attn::kChunk;
using tgserve::attn::round_up;

// Cache offsets (in elements) of the rows of tokens c0 .. c0 + 15 (the cache is
// [blocks, bs, KVH, D], a token's row is W = KVH * D long). Tokens at or past k1 repeat the last
// valid row so the inner loops can always read 16 rows. False if a block id is outside the cache
// (its rows are then read from block 0; the error is reported after the parallel region).
bool chunk_offsets(const int64_t* table, int64_t c0, int64_t k1, int64_t bs, int64_t W,
                   int64_t num_blocks, int64_t* off) {
  const int64_t n = std::min<int64_t>(kChunk, k1 - c0);
  int64_t bi = c0 / bs, within = c0 % bs;  // one division per chunk, then count
  bool ok = true;
  int64_t blk = -1;
  for (int64_t i = 0; i < n; ++i, ++within) {
    if (i == 0 || within == bs) {
      if (within == bs) ++bi, within = 0;
      blk = table[bi];
      if (blk < 0 || blk >= num_blocks) ok = false, blk = 0;
    }
    off[i] = (blk * bs + within) * W;
  }
  for (int64_t i = n; i < kChunk; ++i) off[i] = off[n - 1];
  return ok;
}

// Blocks sit anywhere in memory, so the hardware prefetcher cannot guess the coming rows: ask
// for them (K and V, all KV heads) kAhead chunks before they are used.
constexpr int kAhead = 1;
template <typename T>
void prefetch_rows(const T* kc, const T* vc, const int64_t* off, int64_t i0, int64_t i1,
                   int64_t W) {
  for (int64_t i = i0; i < i1; ++i) {
    const char* k = reinterpret_cast<const char*>(kc + off[i]);
    const char* v = reinterpret_cast<const char*>(vc + off[i]);
    for (int64_t j = 0; j < W * static_cast<int64_t>(sizeof(T)); j += 64) {
      __builtin_prefetch(k + j);
      __builtin_prefetch(v + j);
    }
  }
}

// Attention of all H query heads of one sequence over its keys [k0, k1): unnormalised
// acc [H, DA] (DA = acc_stride(D), in the attention_simd.h layout), reference max m [H] and
// sum l [H] of the online softmax. q [H, qstride] is packed by pack_query; scratch holds
// p [G, kChunk] and per-lane sums [H, kChunk].
// DC > 0 fixes head_dim at compile time (64, 128) so the D loops unroll.
template <typename T, int DC>
void attend_range(const typename tgserve::attn::QPack<T>::type* q, int64_t qstride, const T* kc,
                  const T* vc, const int64_t* table, int64_t k0, int64_t k1, int64_t H,
                  int64_t KVH, int64_t D, int64_t bs, int64_t num_blocks, float scale, float* acc,
                  float* m, float* l, float* scratch, int* bad) {
  namespace simd = tgserve::attn;
  const int64_t G = H / KVH, W = KVH * D, DA = simd::acc_stride<T>(D);
  float* p = scratch;
  float* lsum = scratch + G * kChunk;
  std::fill(m, m + H, -std::numeric_limits<float>::infinity());
  std::fill(lsum, lsum + H * kChunk, 0.0f);
  std::fill(acc, acc + H * DA, 0.0f);
  // Row offsets of chunk j (keys k0 + 16 j ...) live in ring slot j % (kAhead + 1).
  int64_t off[kAhead + 1][kChunk];
  auto locate = [&](int64_t j) -> int64_t {  // fills chunk j's slot; returns its key count
    const int64_t c = k0 + j * kChunk;
    if (c >= k1) return 0;
    if (!chunk_offsets(table, c, k1, bs, W, num_blocks, off[j % (kAhead + 1)]))
      *bad = tgserve::kBadBlock;
    return std::min<int64_t>(kChunk, k1 - c);
  };
  for (int64_t j = 0; j < kAhead; ++j)
    prefetch_rows(kc, vc, off[j % (kAhead + 1)], 0, locate(j), W);
  const T* krows[kChunk];
  const T* vrows[kChunk];
  for (int64_t c0 = k0, j = 0; c0 < k1; c0 += kChunk, ++j) {
    const int n = static_cast<int>(std::min<int64_t>(kChunk, k1 - c0));
    const int64_t* cur = off[j % (kAhead + 1)];
    const int64_t* ahead = off[(j + kAhead) % (kAhead + 1)];
    const int64_t n_ahead = locate(j + kAhead);
    for (int64_t g = 0; g < KVH; ++g) {  // KV head g serves query heads g*G .. g*G + G-1
      // Spread the prefetches over the heads so they do not queue up all at once.
      prefetch_rows(kc, vc, ahead, std::min(n_ahead, g * kChunk / KVH),
                    std::min(n_ahead, (g + 1) * kChunk / KVH), W);
      for (int i = 0; i < kChunk; ++i) {
        krows[i] = kc + cur[i] + g * D;
        vrows[i] = vc + cur[i] + g * D;
      }
      simd::score_chunk<T, DC>(q + g * G * qstride, qstride, krows, n, G, D, scale, p);
      simd::softmax_chunk(p, n, G, m + g * G, lsum + g * G * kChunk, acc + g * G * DA, DA);
      simd::accumulate_chunk<T, DC>(p, vrows, G, D, acc + g * G * DA, DA);
    }
  }
  for (int64_t h = 0; h < H; ++h)
    l[h] = std::accumulate(lsum + h * kChunk, lsum + (h + 1) * kChunk, 0.0f);
}

// Keys per range: a sequence's keys [start, len) are cut into ranges of kRangeKeys keys from
// `start` (the last one shorter), each attended on its own into (acc, m, l), then merged in
// range order. The cut depends on the sequence alone, never on the batch: a row's output is
// the same bits whichever other rows share the call and however the work is spread over
// threads (batch invariance; only the grouping of work items changes with the batch).
constexpr int64_t kRangeKeys = 256;

// out [D] = the merge of ranges 0 .. R-1 of head h, in order: weights exp(m_r - max m) on the
// partial sums. parts: acc [R, H, DA], then m [R, H], then l [R, H], at acc / pm / pl.
template <typename T>
void merge_ranges(const float* acc, const float* pm, const float* pl, int64_t R, int64_t H,
                  int64_t h, int64_t DA, int64_t D, float* sum, T* out) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t r = 0; r < R; ++r) mx = std::max(mx, pm[r * H + h]);
  float total = 0.0f;
  std::fill(sum, sum + DA, 0.0f);
  for (int64_t r = 0; r < R; ++r) {
    if (pm[r * H + h] == -std::numeric_limits<float>::infinity()) continue;  // no keys
    const float w = tgserve::fast_exp(pm[r * H + h] - mx);
    total += w * pl[r * H + h];
    const float* pa = acc + (r * H + h) * DA;
#pragma omp simd
    for (int64_t d = 0; d < DA; ++d) sum[d] += w * pa[d];
  }
  tgserve::attn::store_row(sum, total > 0.0f ? 1.0f / total : 0.0f, D, out);
}

// Work items are the ranges of every row when the batch is too small to keep each thread
// busy with whole rows, else whole rows (each walking its ranges in order). Either way each
// range is computed by the same code into its own partials and merged by merge_ranges.
template <typename T, int DC>
void decode(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
            T* out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t nb,
            int64_t num_blocks, float scale, int64_t window, int* bad) {
  namespace simd = tgserve::attn;
  using QT = typename simd::QPack<T>::type;
  const int64_t Dp = round_up(D, simd::QPack<T>::pad), DA = simd::acc_stride<T>(D);
  const int64_t part_size = H * (DA + 2);  // one range's acc [H, DA], m [H], l [H]
  // Row b's keys [start[b], len[b]) and its ranges first[b] .. first[b + 1] - 1.
  std::vector<int64_t> start(B), len(B), first(B + 1, 0);
  for (int64_t b = 0; b < B; ++b) {
    len[b] = lens[b];
    if (len[b] < 0 || len[b] > nb * bs) {
      *bad = tgserve::kBadSeqLen;
      len[b] = 0;
    }
    start[b] = window > 0 ? std::max<int64_t>(0, len[b] - window) : 0;
    first[b + 1] = first[b] + std::max<int64_t>(1, (len[b] - start[b] + kRangeKeys - 1) / kRangeKeys);
  }
  const int64_t max_ranges = (nb * bs + kRangeKeys - 1) / kRangeKeys + 1;
  const bool by_row = B >= 2 * omp_get_max_threads();
  // Partials of every range (split work) or of one row per thread (by_row).
  std::vector<float> shared_parts(by_row ? 0 : first[B] * part_size);
#pragma omp parallel
  {
    std::vector<QT> qp(H * Dp);  // a row's query heads, packed
    std::vector<float> own_parts(by_row ? max_ranges * part_size : 0);
    // merge sum [DA], then attend_range's scratch [G + H, kChunk]
    std::vector<float> scratch(DA + (H / KVH + H) * kChunk);
    float* sum = scratch.data();
    float* p = sum + DA;
    auto pack = [&](int64_t b) {  // row b's query heads into qp
      for (int64_t h = 0; h < H; ++h) simd::pack_query(q + (b * H + h) * D, D, qp.data() + h * Dp);
    };
    // Range r of row b (its query packed in qp) into parts (merge_ranges' layout, R ranges).
    auto attend = [&](int64_t b, int64_t r, float* parts, int64_t R) {
      const int64_t k0 = std::min(len[b], start[b] + r * kRangeKeys);
      const int64_t k1 = std::min(len[b], k0 + kRangeKeys);
      float* acc = parts + r * H * DA;
      float* m = parts + R * H * DA + r * H;
      float* l = parts + R * H * (DA + 1) + r * H;
      attend_range<T, DC>(qp.data(), Dp, kc, vc, tables + b * nb, k0, k1, H, KVH, D, bs,
                          num_blocks, scale, acc, m, l, p, bad);
    };
    auto merge = [&](int64_t b, const float* parts, int64_t R) {
      for (int64_t h = 0; h < H; ++h)
        merge_ranges<T>(parts, parts + R * H * DA, parts + R * H * (DA + 1), R, H, h, DA, D, sum,
                        out + (b * H + h) * D);
    };
    if (by_row) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t b = 0; b < B; ++b) {
        const int64_t R = first[b + 1] - first[b];
        pack(b);
        for (int64_t r = 0; r < R; ++r) attend(b, r, own_parts.data(), R);
        merge(b, own_parts.data(), R);
      }
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < first[B]; ++it) {
        const int64_t b = std::upper_bound(first.begin(), first.end(), it) - first.begin() - 1;
        const int64_t R = first[b + 1] - first[b];
        pack(b);
        attend(b, it - first[b], shared_parts.data() + first[b] * part_size, R);
      }
#pragma omp for
      for (int64_t b = 0; b < B; ++b)
        merge(b, shared_parts.data() + first[b] * part_size, first[b + 1] - first[b]);
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
  int bad = kOk;
  const auto go = D == 64 ? decode<T, 64> : D == 128 ? decode<T, 128> : decode<T, 0>;
  go(q, k_cache, v_cache, tables, seq_lens, out, B, H, KVH, D, block_size, table_width,
     num_blocks, scale, window, &bad);
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
