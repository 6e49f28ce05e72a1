// Paged attention for CPU, one query per row: see kernels.h and paged_attention.py for the
// contract. This file is the driver: it cuts each sequence's keys into ranges of a fixed length
// (kRangeKeys), groups consecutive rows of one sequence over the same keys (a prefill chunk's
// queries), hands (group, range) work to attend_range (attention_range.h: the chunk loops and
// the reduction order per ISA) and merges each row's ranges in range order (merge_ranges).
// Work is split over the cores by (group of rows, key range): one long sequence's ranges
// spread over every core, and the ranges merge in range order, whatever the split.
// The cache holds rows of the model's dtype, int8 rows with a scale each (kv_int8.h), or a
// float32 model's float16 rows (kv_half.h: float32 queries and outputs; each value widened
// exactly, so the float32 order over the rounded rows, bit for bit).
// int8 rows hold Walsh-Hadamard-rotated values: each query head is rotated once when packed
// (kv_rotate_query) and each output row once before it is stored (merge_ranges).
// K and V rows may differ (VV, default KV): a float32 model's float16 K rows with int8 V rows
// (--kv-cache-dtype int8v: scores as the float16 cache's, the V sum and the output's rotation
// as the int8 cache's).
#include "kernels.h"

#include "attention_range.h"
#include "attention_simd.h"
#include "kv_int8.h"

#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

namespace {

using tgserve::attn::attend_range;
using tgserve::attn::kChunk;
using tgserve::attn::kGroupRows;
using tgserve::attn::RangeOut;
using tgserve::attn::round_up;

// Fewer rows than kGroupRows a group when its partials (rows x ranges x heads) would pass this
// many floats a thread (large models, long contexts), never fewer than 8.
constexpr int64_t kPartsBudget = int64_t{4} << 20;  // 16 MB of float32 partials a thread

// Keys per range: a sequence's keys [start, len) are cut into ranges of kRangeKeys keys from
// `start` (the last one shorter), each attended on its own into (acc, m, l), then merged in
// range order. The cut depends on the sequence alone, never on the batch: a row's output is
// the same bits whichever other rows share the call, however the work is spread over
// threads (batch invariance; only the grouping of work items changes with the batch), and
// whichever rows share its group (attend_range).
constexpr int64_t kRangeKeys = 256;

// out [D] = the merge of ranges 0 .. R-1 of head h, in order: weights exp(m_r - max m) on the
// partial sums. parts: acc [R, H, DA], then m [R, H], then l [R, H], at acc / pm / pl; the
// accumulators are in the layout of a cache of KV rows (int8 rows: rotated, turned back here).
template <typename KV, typename T>
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
  float inv = total > 0.0f ? 1.0f / total : 0.0f;
  if constexpr (std::is_same_v<KV, int8_t>) {  // the V sum of rotated rows: W sum / P (kv_int8.h)
    tgserve::walsh_hadamard(sum, D);
    inv /= static_cast<float>(tgserve::kv_rotation_block(D));  // a power of two: exact
  }
  tgserve::attn::store_row<KV>(sum, inv, D, out);
}

// Rows b and c (c > b) may share a group: the same key start and block table.
bool same_keys(const int64_t* tables, int64_t nb, const std::vector<int64_t>& start,
               const std::vector<int64_t>& len, int64_t bs, int64_t b, int64_t c) {
  if (start[b] != start[c]) return false;
  const int64_t blocks = std::min(nb, (std::max(len[b], len[c]) + bs - 1) / bs);
  return std::equal(tables + b * nb, tables + b * nb + blocks, tables + c * nb);
}

// Work items are (group, range) pairs when there are too few groups to keep each thread
// busy, else whole groups (each walking its ranges in order). Either way each row's range is
// computed by the same code into its own partials and merged by merge_ranges.
// q and out rows are T (float32 / bf16 / half), cache rows KV (T, int8: kv_int8.h, or half for
// T = float32: kv_half.h), V rows VV (KV, or int8 under half K rows).
template <typename T, typename KV, int DC, typename VV = KV>
void decode(const T* q, const KV* kc, const VV* vc, const int64_t* tables, const int64_t* lens,
            T* out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t nb,
            int64_t num_blocks, float scale, int64_t window, int* bad) {
  namespace simd = tgserve::attn;
  using QT = typename simd::QPack<KV>::type;
  const int64_t Dp = round_up(D, simd::QPack<KV>::pad), DA = simd::acc_stride<VV>(D);
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
  const int64_t row_parts = std::max<int64_t>(1, max_ranges * part_size);  // 0 when H = 0
  const int64_t group_rows = std::clamp<int64_t>(kPartsBudget / row_parts, 8, kGroupRows);
  // Groups: runs of up to group_rows consecutive rows over the same keys; group j is rows
  // gfirst[j] .. gfirst[j + 1] - 1, its ranges gitem[j] .. gitem[j + 1] - 1 (its longest row's).
  std::vector<int64_t> gfirst{0}, gitem{0};
  for (int64_t b = 1; b <= B; ++b) {
    const int64_t g0 = gfirst.back();
    if (b < B && b - g0 < group_rows && same_keys(tables, nb, start, len, bs, g0, b)) continue;
    int64_t ranges = 0;
    for (int64_t c = g0; c < b; ++c) ranges = std::max(ranges, first[c + 1] - first[c]);
    gfirst.push_back(b);
    gitem.push_back(gitem.back() + ranges);
  }
  const int64_t num_groups = static_cast<int64_t>(gfirst.size()) - 1;
  // Whole groups when there are enough to share out evenly (the last, longest ones first).
  const bool by_group = num_groups >= 4 * omp_get_max_threads();
  // Partials of every row's ranges (split work) or of one group per thread (by_group).
  std::vector<float> shared_parts(by_group ? 0 : first[B] * part_size);
#pragma omp parallel
  {
    std::vector<QT> qp(kGroupRows * H * Dp);  // a group's query heads, packed
    std::vector<float> own_parts(by_group ? group_rows * max_ranges * part_size : 0);
    // merge sum [DA], then attend_range's scratch [(kGroupRows + 1) G + 2 DA + kGroupRows H,
    // kChunk] and 16 floats to align its K rows
    std::vector<float> scratch(
        DA + ((kGroupRows + 1) * (H / KVH) + 2 * DA + kGroupRows * H) * kChunk + 16);
    float* sum = scratch.data();
    float* p = sum + DA;
    const QT* qrows[kGroupRows];
    int64_t k1[kGroupRows];
    RangeOut outs[kGroupRows];
    auto pack = [&](int64_t j) {  // group j's query heads into qp
      for (int64_t b = gfirst[j]; b < gfirst[j + 1]; ++b) {
        QT* dst = qp.data() + (b - gfirst[j]) * H * Dp;
        for (int64_t h = 0; h < H; ++h) {
          simd::pack_query<KV>(q + (b * H + h) * D, D, dst + h * Dp);
          if constexpr (std::is_same_v<KV, int8_t>) tgserve::kv_rotate_query(dst + h * Dp, D);
        }
      }
    };
    // Range r of group j's rows (queries packed in qp) into each row's partials: row b's
    // range r at parts(b) (merge_ranges' layout, R(b) = its range count).
    auto attend = [&](int64_t j, int64_t r, auto parts) {
      int R = 0;
      for (int64_t b = gfirst[j]; b < gfirst[j + 1]; ++b) {
        const int64_t rb = first[b + 1] - first[b];
        if (r >= rb) continue;  // a shorter row of the group: its ranges are done
        float* base = parts(b);
        qrows[R] = qp.data() + (b - gfirst[j]) * H * Dp;
        k1[R] = std::min(len[b], start[b] + (r + 1) * kRangeKeys);
        outs[R] = {base + r * H * DA, base + rb * H * DA + r * H, base + rb * H * (DA + 1) + r * H};
        ++R;
      }
      const int64_t b0 = gfirst[j];  // every row with a range r starts it at the same key
      const int64_t k0 = start[b0] + r * kRangeKeys;
      attend_range<KV, DC, VV>(qrows, Dp, kc, vc, tables + b0 * nb, k0, k1, R, H, KVH, D, bs,
                           num_blocks, scale, outs, p, bad);
    };
    auto merge = [&](int64_t b, const float* parts) {
      const int64_t R = first[b + 1] - first[b];
      for (int64_t h = 0; h < H; ++h)
        merge_ranges<VV, T>(parts, parts + R * H * DA, parts + R * H * (DA + 1), R, H, h, DA, D, sum,
                        out + (b * H + h) * D);
    };
    if (by_group) {
#pragma omp for schedule(dynamic, 1)
      for (int64_t jj = 0; jj < num_groups; ++jj) {
        const int64_t j = num_groups - 1 - jj;  // a prefill chunk's later rows have more keys
        auto parts = [&](int64_t b) { return own_parts.data() + (b - gfirst[j]) * max_ranges * part_size; };
        pack(j);
        for (int64_t r = 0; r < gitem[j + 1] - gitem[j]; ++r) attend(j, r, parts);
        for (int64_t b = gfirst[j]; b < gfirst[j + 1]; ++b) merge(b, parts(b));
      }
    } else {
      auto parts = [&](int64_t b) { return shared_parts.data() + first[b] * part_size; };
#pragma omp for schedule(dynamic, 1)
      for (int64_t it = 0; it < gitem[num_groups]; ++it) {
        const int64_t j = std::upper_bound(gitem.begin(), gitem.end(), it) - gitem.begin() - 1;
        pack(j);
        attend(j, it - gitem[j], parts);
      }
#pragma omp for
      for (int64_t b = 0; b < B; ++b) merge(b, parts(b));
    }
  }
}

}  // namespace

namespace tgserve {

template <typename T, typename KV, typename VV>
int paged_decode_attention(const T* q, const KV* k_cache, const VV* v_cache, const int64_t* tables,
                           int64_t table_width, const int64_t* seq_lens, T* out, int64_t B,
                           int64_t H, int64_t KVH, int64_t D, int64_t block_size,
                           int64_t num_blocks, float scale, int64_t window) {
  int bad = kOk;
  const auto go = D == 64    ? decode<T, KV, 64, VV>
                  : D == 128 ? decode<T, KV, 128, VV>
                             : decode<T, KV, 0, VV>;
  go(q, k_cache, v_cache, tables, seq_lens, out, B, H, KVH, D, block_size, table_width,
     num_blocks, scale, window, &bad);
  return bad;
}

#define TGSERVE_INSTANTIATE(T, KV, VV)                                                          \
  template int paged_decode_attention<T, KV, VV>(const T*, const KV*, const VV*, const int64_t*, \
                                                 int64_t, const int64_t*, T*, int64_t, int64_t,  \
                                                 int64_t, int64_t, int64_t, int64_t, float,      \
                                                 int64_t);
TGSERVE_INSTANTIATE(float, float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::Half, c10::Half, c10::Half)
TGSERVE_INSTANTIATE(float, c10::Half, c10::Half)  // a float32 model's float16 K/V rows (kv_half.h)
TGSERVE_INSTANTIATE(float, int8_t, int8_t)  // int8 K/V rows (kv_int8.h)
TGSERVE_INSTANTIATE(c10::BFloat16, int8_t, int8_t)
TGSERVE_INSTANTIATE(float, c10::Half, int8_t)  // float16 K, int8 V rows (--kv-cache-dtype int8v)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
