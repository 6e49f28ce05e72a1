// Row layouts shared by the paged attention kernel (attention.cpp) and its inner loops
// (attention_simd.h): chunk size, how query rows are packed, how float32 accumulator rows are
// padded, the lazy-softmax slack, where a chunk's cache rows are (chunk_offsets, with
// prefetch_rows ahead of use), and their float32 copies in L1 (widen_rows, align64).
// AVX-512 builds pad bf16 rows to 32 for pair loads; AVX2 builds use the portable layouts
// (float32 query rows padded to 16, no deinterleave).
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#if defined(__AVX512F__) && defined(__AVX512BW__) && defined(__AVX512VL__)
#include "x86_intrinsics.h"
#define TGSERVE_ATTN_AVX512 1
#elif defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include "x86_intrinsics.h"
#define TGSERVE_ATTN_AVX2 1  // attention_avx2.h
#endif

namespace tgserve::attn {

constexpr int kChunk = 16;  // keys per chunk: one online-softmax step, one vector of scores

// How score_chunk wants the query heads for a cache of element type T: element type and row
// padding (rows are zero-padded to a multiple of `pad` elements). bf16 pairs when the CPU has
// dot products on them; float32 for every other cache (int8 rows included: kv_int8.h).
template <typename T>
struct QPack {
  using type = float;
  static constexpr int pad = 16;
};
#if defined(TGSERVE_ATTN_AVX512) && defined(__AVX512BF16__)
template <>
struct QPack<c10::BFloat16> {
  using type = c10::BFloat16;
  static constexpr int pad = 32;
};
#endif

inline int64_t round_up(int64_t x, int64_t m) { return (x + m - 1) / m * m; }

// Rows of the float32 accumulators are acc_stride(D) long. For bf16 (AVX-512) each group of
// 32 columns is kept deinterleaved, [even columns, odd columns]: a V row's 32 bf16 then turn
// into float32 with one shift (even) and one mask (odd); store_row restores the order.
template <typename T>
struct AccPad {
  static constexpr int value = 16;
};
#if defined(TGSERVE_ATTN_AVX512)
template <>
struct AccPad<c10::BFloat16> {
  static constexpr int value = 32;
};
#endif
template <typename T>
int64_t acc_stride(int64_t D) {
  return round_up(D, AccPad<T>::value);
}

// Lazy online softmax: the running max m only moves when a score exceeds it by more than
// kSlack, so most chunks need no rescale; weights exp(s - m) stay <= e^8, far from overflow.
constexpr float kSlack = 8.0f;

// dst [Dp] = src [D] (converted), zero-padded to Dp = round_up(D, QPack<KV>::pad), for a
// cache of KV rows.
template <typename KV, typename T>
void pack_query(const T* src, int64_t D, typename QPack<KV>::type* dst) {
  using QT = typename QPack<KV>::type;
  const int64_t Dp = round_up(D, QPack<KV>::pad);
  for (int64_t d = 0; d < D; ++d) dst[d] = static_cast<QT>(static_cast<float>(src[d]));
  for (int64_t d = D; d < Dp; ++d) dst[d] = QT(0.0f);
}

// dst [n, stride] (float32) <- rows src[0 .. n-1] (their first D values; int8 rows' scales
// not applied), widened exactly: the SIMD loops then read each row from L1 for every query
// head and row of a group, instead of widening it once per head and row.
// float16 rows in vectors: c10::Half's float() is one scalar vcvtph2ps a value, which GCC
// does not vectorise (a 64-wide row cost 64 of them: a quarter of a float16 cache's prefill
// attention went there).
template <typename T>
void widen_rows(const T* const* src, int n, int64_t D, int64_t stride, float* dst) {
  for (int i = 0; i < n; ++i) {
    const T* r = src[i];
    float* o = dst + i * stride;
    int64_t d0 = 0;
    if constexpr (std::is_same_v<T, c10::Half>) {
#if defined(TGSERVE_ATTN_AVX512)
      for (; d0 + 16 <= D; d0 += 16)
        _mm512_storeu_ps(o + d0, _mm512_cvtph_ps(_mm256_loadu_si256(
                                     reinterpret_cast<const __m256i*>(r + d0))));
#elif defined(TGSERVE_ATTN_AVX2)
      for (; d0 + 8 <= D; d0 += 8)
        _mm256_storeu_ps(o + d0, _mm256_cvtph_ps(_mm_loadu_si128(
                                     reinterpret_cast<const __m128i*>(r + d0))));
#endif
    }
#pragma omp simd
    for (int64_t d = d0; d < D; ++d) o[d] = static_cast<float>(r[d]);
  }
}

// p rounded up to a 64-byte boundary (scratch carries 16 floats of slack for it): rows of
// 16 floats then never straddle two cache lines.
inline float* align64(float* p) {
  return reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(p) + 63) & ~uintptr_t{63});
}

// Cache offsets (in elements) of the rows of tokens c0 .. c0 + 15 (the cache is
// [blocks, bs, KVH, DS], a token's row is W = KVH * DS long; DS = D, or D + 4 for int8 rows). Tokens at or past k1 repeat the last
// valid row so the inner loops can always read 16 rows. False if a block id is outside the cache
// (its rows are then read from block 0; the error is reported after the parallel region).
inline bool chunk_offsets(const int64_t* table, int64_t c0, int64_t k1, int64_t bs, int64_t W,
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

// The same for K and V rows of two types (a mixed cache: attention_range.h): slots[i] a token
// slot, its K row at kc + slot * WK, its V row at vc + slot * WV (elements of each).
template <typename KT, typename VT>
void prefetch_slot_rows(const KT* kc, int64_t WK, const VT* vc, int64_t WV, const int64_t* slots,
                        int64_t i0, int64_t i1) {
  for (int64_t i = i0; i < i1; ++i) {
    const char* k = reinterpret_cast<const char*>(kc + slots[i] * WK);
    const char* v = reinterpret_cast<const char*>(vc + slots[i] * WV);
    for (int64_t j = 0; j < WK * static_cast<int64_t>(sizeof(KT)); j += 64) __builtin_prefetch(k + j);
    for (int64_t j = 0; j < WV * static_cast<int64_t>(sizeof(VT)); j += 64) __builtin_prefetch(v + j);
  }
}

// A chunk's rows i0 .. i1-1 at o: element offsets when K and V rows are alike (prefetch_rows),
// else token slots (prefetch_slot_rows). A function, not a lambda in attend_range: GCC 12 at
// -O3 deleted the call of such a lambda from every instance but int8's (its IPA mod/ref summary
// counts no side effect in a prefetch, so a void call of nothing else is dead; -fno-ipa-modref
// keeps it). Nothing changed but speed: batch-64 decode ran 1.16-1.25x slower.
// tests/models/test_attention_prefetch.py reads the built code for the prefetches.
template <typename KT, typename VT>
inline void prefetch_chunk(const KT* kc, int64_t WK, const VT* vc, int64_t WV, const int64_t* o,
                           int64_t i0, int64_t i1) {
  if constexpr (std::is_same_v<KT, VT>) prefetch_rows(kc, vc, o, i0, i1, WK);
  else prefetch_slot_rows(kc, WK, vc, WV, o, i0, i1);
}

}  // namespace tgserve::attn
