// The C++ kernels behind models/cpu_kernels: declarations shared by the sources.
// All tensors are plain row-major arrays; T is float, c10::BFloat16 or c10::Half.
#pragma once

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace tgserve {

// Error codes returned by kernels that validate indices inside a parallel region.
enum KernelError : int { kOk = 0, kBadSeqLen = 1, kBadBlock = 2 };

// Paged attention, one query per row (a decode, or one token of a prefill chunk).
// q [B, H, D]; caches [num_blocks, block_size, KVH, D] of T, or int8 rows with their scales
// [num_blocks, block_size, KVH, D + 4] (KV = int8_t: kv_int8.h; T float or bf16); or, for a
// float32 q, float16 K rows with int8 V rows (KV = c10::Half, VV = int8_t: kv_int8.h);
// tables [B, table_width] block ids; seq_lens [B]; out [B, H, D]. Sequence b attends to its
// keys max(0, len - window) .. len - 1 (window <= 0: all). Scores, softmax and the V sum in
// float32.
template <typename T, typename KV = T, typename VV = KV>
int paged_decode_attention(const T* q, const KV* k_cache, const VV* v_cache, const int64_t* tables,
                           int64_t table_width, const int64_t* seq_lens, T* out, int64_t B,
                           int64_t H, int64_t KVH, int64_t D, int64_t block_size,
                           int64_t num_blocks, float scale, int64_t window);

// Linear layers over prepacked weights (linear.cpp: the layout and the accumulation order
// every row follows whatever M is). pack_linear_weight<T, WT>: W [N, K] of WT (T, or int8_t
// for T = bf16) -> Wp [ceil(N / 16), packed_linear_steps(K, pairs), 16 (, 2 for pairs)],
// zero-padded; pairs when T is bfloat16.
int64_t packed_linear_steps(int64_t K, bool pairs);
template <typename T, typename WT>
void pack_linear_weight(const WT* W, int64_t N, int64_t K, WT* Wp);

// y [M, N] = x [M, K] @ W [N, K]^T (* scales [N], int8 weights only, else null) (+ bias [N])
// from the packed Wp, accumulated in float32 and rounded once to OutT (T or float).
template <typename T, typename OutT, typename WT>
void packed_linear(const T* x, int64_t M, int64_t K, const WT* Wp, const float* scales,
                   const T* bias, OutT* y, int64_t N);

// GGUF block-quantised weights kept as stored (block_linear.cpp: the packed layout and the
// accumulation order). Types by their GGML ids. pack_blocks: raw [N, row_bytes(type, K)] as in
// the file -> Wp [ceil(N / 16), K / W, 16 * the block's bytes] (zero rows pad the last panel).
enum BlockType : int {
  kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14,
  kMixedBlocks = 1000,  // row segments of kquant types, one layer (mixed_blocks.cpp)
  // Q4_1 (the same packed bytes) whose every block's constant terms were found exact when packed
  // (models/block_linear.py q4_1_constants_exact): block_linear's few-rows float32 pass skips
  // its per-block check (mantissa_weights.h). block_linear and block_rows take it.
  kQ4_1Exact = 1001
};
int64_t block_bytes(int type);  // Q4_0 / Q4_1 / Q8_0: bytes of one row's block of 32 weights; else 0
// Every block type (kquant_linear.cpp): weights per block (32 or 256; 0: unknown type), and
// bytes of a row of K weights in the file (0: unknown type or K not a whole number of blocks).
// The packed weight is [ceil(N / 16), 16 * row_bytes] bytes.
int64_t block_width(int type);
int64_t row_bytes(int type, int64_t K);
// Q5_0, Q5_1, Q4_K, Q5_K, Q6_K and kMixedBlocks (kquant_linear.cpp; block_linear.cpp's
// functions dispatch there; kMixedBlocks weights are built in Python, not by pack_blocks).
bool is_kquant_type(int type);
void kquant_pack(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp);
void kquant_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T, float* out);
template <typename T, typename OutT>
void kquant_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                   OutT* y, int64_t N);
// The same writing y's rows `ldy` apart (a segment's columns of a kMixedBlocks layer).
template <typename T, typename OutT>
void kquant_linear_ld(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                      OutT* y, int64_t N, int64_t ldy);
// kMixedBlocks (mixed_blocks.cpp): the header checked against K, N and the packed bytes.
bool mixed_blocks_valid(const uint8_t* Wp, int64_t bytes, int64_t K, int64_t N);
void mixed_rows(const uint8_t* Wp, int64_t K, const int64_t* ids, int64_t T, float* out);
template <typename T, typename OutT>
void mixed_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y,
                  int64_t N);
void pack_blocks(const uint8_t* raw, int64_t N, int64_t K, int type, uint8_t* Wp);
// out [T, K] float32: rows ids[T] of the packed weight, bitwise as gguf's dequantisation.
void block_rows(const uint8_t* Wp, int64_t K, int type, const int64_t* ids, int64_t T, float* out);
// y [M, N] = x [M, K] @ W^T (+ bias) from the packed blocks, float32 sums rounded once to OutT.
template <typename T, typename OutT>
void block_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type, const T* bias,
                  OutT* y, int64_t N);
// block_linear's few-rows product over output panels [p_begin, p_end) only (rows 16 p ..
// min(N, 16 p_end) of W), run on the calling thread: for a caller that splits several
// products over the threads of its own OpenMP region (moe_experts.h). The same bits as
// block_linear for any M (whose passes never change a lane's order); few rows are its use
// (M <= 8: one pass per panel group). Types: those block_panels_type accepts.
bool block_panels_type(int type);  // Q4_0, Q4_1 (and kQ4_1Exact), Q8_0
template <typename T, typename OutT>
void block_linear_panels(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int type,
                         const T* bias, OutT* y, int64_t N, int64_t p_begin, int64_t p_end);

// The bench's read probe (read_probe.cpp): seconds of one pass over p's first bytes (whole
// 32 KiB units per thread) on the OpenMP threads, `streams` (1, 2, 4, 8) streams per thread,
// with or without software prefetch; xors what it read into *sink. No kernel uses it.
double read_probe_seconds(const uint8_t* p, int64_t bytes, int streams, bool prefetch, uint64_t* sink);

}  // namespace tgserve
