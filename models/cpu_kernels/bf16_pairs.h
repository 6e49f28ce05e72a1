// vdpbf16ps's accumulation as two float32 fmas, for the few-rows passes of bf16 activations on
// CPUs with AVX512-BF16 (block_linear.cpp). Included by the kernels' sources only.
//
// vdpbf16ps(acc, x, w) computes, per 32-bit lane, acc = fma(x.odd, w.odd, acc) and then acc =
// fma(x.even, w.even, acc): each step rounds to nearest even, reads denormal inputs as zero and
// flushes denormal results to zero (Intel's definition of the instruction). Two float32 fmas
// in that order, run with MXCSR's DAZ and FTZ set, give the same bits (the products of two
// bf16 are exact in float32, so only the adds round, as in the instruction). Why bother: a
// vdpbf16ps costs about four fmas' issue slots on the Xeons at hand and does the work of two,
// so at 2-8 rows, where the same dequantised weights meet every row, the fmas halve the cost
// per row (one row of a 3072 x 576 Q4_1 layer, 1 thread: ~48 us per extra row with vdpbf16ps,
// ~25 with the fmas).
//
// The equivalence is the instruction's documented behaviour, which another vendor's core need
// not share bit for bit, so `fmas_match_dpbf16` checks it on this CPU once (inputs that separate
// the odd-first order from even-first, one rounding from two, and DAZ / FTZ from none) and the
// kernels keep vdpbf16ps where it does not hold.
#pragma once

#include "x86_intrinsics.h"

#include <cstdint>
#include <cstring>

#if defined(__AVX512F__) && defined(__AVX512BF16__) && defined(__AVX512BW__)
#define TGSERVE_BF16_PAIRS 1

namespace tgserve::bf16_pairs {

// MXCSR with DAZ (bit 6) and FTZ (bit 15) set for the object's lifetime, then restored. The
// memory clobbers keep the compiler from moving loads, stores (and so the fmas between them)
// across the switch.
class FlushDenormals {
 public:
  FlushDenormals() : saved_(_mm_getcsr()) {
    const unsigned flushing = saved_ | 0x8040u;
    asm volatile("ldmxcsr %0" : : "m"(flushing) : "memory");
  }
  ~FlushDenormals() { asm volatile("ldmxcsr %0" : : "m"(saved_) : "memory"); }
  FlushDenormals(const FlushDenormals&) = delete;
  FlushDenormals& operator=(const FlushDenormals&) = delete;

 private:
  unsigned saved_;
};

// A vdpbf16ps operand (16 lanes x a pair of bf16) as two float32 vectors: the even and the odd
// element of each lane's pair (bf16 -> float32 is the bits shifted into the high half).
inline void split_pairs(__m512i pairs, __m512& even, __m512& odd) {
  even = _mm512_castsi512_ps(_mm512_slli_epi32(pairs, 16));
  odd = _mm512_castsi512_ps(
      _mm512_and_si512(pairs, _mm512_set1_epi32(static_cast<int32_t>(0xFFFF0000u))));
}

// acc += x . w over one pair as vdpbf16ps does it (under FlushDenormals): odd element first.
inline __m512 pair_fmas(__m512 acc, __m512 x_even, __m512 x_odd, __m512 w_even, __m512 w_odd) {
  return _mm512_fmadd_ps(x_even, w_even, _mm512_fmadd_ps(x_odd, w_odd, acc));
}

namespace detail {

inline uint32_t next(uint64_t& s) {  // xorshift64*, fixed seed: the same probe everywhere
  s ^= s >> 12;
  s ^= s << 25;
  s ^= s >> 27;
  return static_cast<uint32_t>((s * 0x2545F4914F6CDD1DULL) >> 32);
}

// A bf16 of the given sign and mantissa bits with a biased exponent in [lo, lo + span).
inline uint16_t bf16_bits(uint32_t r, int lo, int span) {
  return static_cast<uint16_t>((r & 0x807F) | ((lo + static_cast<int>((r >> 16) % span)) << 7));
}

// Whether vdpbf16ps and pair_fmas agree on every lane of `rounds` x 16 probes.
[[gnu::noinline]] inline bool probe(int rounds) {
  uint64_t s = 0x9E3779B97F4A7C15ULL;
  // (x and w exponents, acc exponents): ordinary magnitudes, products that cancel the sum
  // (rounding order), and the underflow range (DAZ / FTZ).
  constexpr int kModes[3][4] = {{110, 30, 100, 50}, {126, 3, 126, 3}, {55, 20, 0, 4}};
  for (int round = 0; round < rounds; ++round) {
    const int* mode = kModes[round % 3];
    alignas(64) uint16_t x[32], w[32];
    alignas(64) uint32_t acc[16];
    for (int i = 0; i < 32; ++i) {
      const bool zero_exp = round % 3 == 2 && next(s) % 5 == 0;  // denormal bf16 inputs
      x[i] = zero_exp ? static_cast<uint16_t>(next(s) & 0x807F) : bf16_bits(next(s), mode[0], mode[1]);
      w[i] = bf16_bits(next(s), mode[0], mode[1]);
    }
    for (int l = 0; l < 16; ++l) {
      const uint32_t r = next(s);
      acc[l] = (r & 0x807FFFFF) | static_cast<uint32_t>(mode[2] + (r >> 8) % mode[3]) << 23;
    }
    const __m512 a = _mm512_castsi512_ps(_mm512_load_si512(acc));
    const __m512i xi = _mm512_load_si512(x), wi = _mm512_load_si512(w);
    const __m512 want = _mm512_dpbf16_ps(a, (__m512bh)xi, (__m512bh)wi);
    __m512 got;
    {
      __m512 xe, xo, we, wo;
      split_pairs(xi, xe, xo);
      split_pairs(wi, we, wo);
      FlushDenormals flush;
      __m512 acc_in = a;
      asm volatile("" : "+v"(acc_in), "+v"(xe), "+v"(xo), "+v"(we), "+v"(wo));  // read after
      got = pair_fmas(acc_in, xe, xo, we, wo);
      asm volatile("" : "+v"(got));  // computed while flushing
    }
    const __m512i differ = _mm512_xor_si512(_mm512_castps_si512(got), _mm512_castps_si512(want));
    if (_mm512_test_epi32_mask(differ, differ)) return false;
  }
  return true;
}

}  // namespace detail

// Whether this CPU's vdpbf16ps gives pair_fmas's bits (checked once per process).
inline bool fmas_match_dpbf16() {
  static const bool match = detail::probe(3 * 4096);
  return match;
}

}  // namespace tgserve::bf16_pairs

#endif
