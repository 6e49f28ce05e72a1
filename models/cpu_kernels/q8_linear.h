// Linear layers with int8 activations (`--activation-quantization int8`, q8_linear.cpp): the
// activations are quantised per row and per block of 32 k (llama.cpp's Q8_0 activations), the
// weights are int8 / 4-bit integers with float32 scales, and each block's dot product is an
// exact integer sum (AVX512-VNNI vpdpbusd; AVX2 vpmaddubsw; scalar loops: the same integers).
//
// Weight layout (`Q8 panels`, packed in Python by models/activation_quant.py): rows in panels of
// 16 (zero rows pad the last), a panel's blocks of 32 k in K order, each block:
//   d [16 lanes] (the row's block scale: fp16 as a GGUF file stores it; float32 for the int8
//   rows of `--quantization int8`, whose row scales are any float32), Q4_1 only: m [16] fp16
//   (its min), then the quants in groups of 4 k, lane-major inside a group (the vpdpbusd
//   operand: lane l's 32-bit word holds 4 consecutive k):
//   Q8 kinds (Q8_0, and kInt8Rows: `--quantization int8` weights with d = the row's scale): 8
//     groups of 64 int8 bytes, group g: byte 4l + j = q[l][4g + j];
//   Q4 kinds (Q4_0 / Q4_1): 4 groups of 64 bytes, byte 4l + j of group g holds the nibble of
//     k = 4g + j in its low half and of k = 16 + 4g + j in its high half (the file's order).
// A weight is d * (nibble - 8) (Q4_0), d * nibble + m (Q4_1) or d * q (Q8), d and m widened to
// float32 (exact). fp16 scales: a Q4_1 block is 20 bytes per 32 weights of a row and a Q8_0
// one 34, as in the file (float32 ones made them 24 and 36: a batch-1 decode reads every
// weight once, so bytes are time).
#pragma once

#include <c10/util/BFloat16.h>

#include <cstdint>

namespace tgserve {

// Kinds of Q8 panels: kQ8Activations + the GGML type id of the weights' format (kernels.h's
// kQ4_0, kQ4_1, kQ8_0; fp16 scales) or + kInt8Rows (Q8 quants, float32 scales). The fused
// decoder's LinearWeights carry them as their block_type.
constexpr int kQ8Activations = 2000;
constexpr int kInt8Rows = 1008;
// kQ16Activations + the same: the same panels with int16 activations (q16_dot.h: d = amax /
// 32767, the same order and epilogue below with xq int16). is_q8_kind holds for both families.
// (4000: above every int8 kind, kQ8Activations + kInt8Rows = 3008.)
constexpr int kQ16Activations = 4000;
bool is_q8_kind(int kind);
// 8 (int8 activations), 16 (int16) or 0 (not a kind): which q8_quantize_rows a kind's rows take.
int activation_bits(int kind);
// Bytes of one panel's block of 32 k (0: not a kind).
int64_t q8_block_bytes(int kind);

// x [M, K] (K a multiple of 32) -> xq [M, K] int8, dx [M, K / 32] float32, sx [M, K / 32] int32:
// per block of 32, d = amax / 127, q = round-to-nearest-even(x * (1 / d)) (0 where d = 0),
// sx = sum of q. Same bits on every ISA (one IEEE operation per step).
template <typename T>
void q8_quantize_rows(const T* x, int64_t M, int64_t K, int8_t* xq, float* dx, int32_t* sx);
// The same for the int16 kinds: d = amax / 32767, q in [-32767, 32767] (q16_dot.h).
template <typename T>
void q8_quantize_rows(const T* x, int64_t M, int64_t K, int16_t* xq, float* dx, int32_t* sx);

// y [M, N] = the quantised x [M, K] @ W^T (+ bias [N]) from Q8 panels Wp of `kind`. Per output
// y[m, n], in block order b = 0 .. K / 32 - 1 from acc = 0 (float32):
//   isum = sum over the block of xq * wq (exact int32; Q4_0: wq = nibble - 8);
//   acc = fma(d[n, b] * dx[m, b], (float)isum, acc);
//   Q4_1 only: acc = fma(m[n, b] * dx[m, b], (float)sx[m, b], acc);
// then y = round(acc + bias[n]) to OutT. The order depends on K alone: a row's bits do not
// depend on M, the other rows, the thread count or the ISA build.
template <typename T, typename OutT>
void q8_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, int kind, const T* bias,
               OutT* y, int64_t N);

// q8_linear's product of rows already quantised by q8_quantize_rows (xq [M, K], dx and sx
// [M, K / 32]) over output panels [p_begin, p_end) only (rows 16 p .. min(N, 16 p_end) of W),
// on the calling thread: for a caller that quantises a row once for several products and
// splits them over the threads of its own OpenMP region (moe_experts.h). The same bits as
// q8_linear. A: int8_t for the int8 kinds, int16_t for kQ16Activations ones (activation_bits).
template <typename T, typename OutT, typename A>
void q8_linear_panels(const A* xq, const float* dx, const int32_t* sx, int64_t M, int64_t K,
                      const uint8_t* Wp, int kind, const T* bias, OutT* y, int64_t N,
                      int64_t p_begin, int64_t p_end);

}  // namespace tgserve
