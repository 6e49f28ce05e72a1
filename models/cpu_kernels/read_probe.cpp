// A memory read probe for the bench (bench/machine_limits.py): how fast this machine streams a
// buffer far larger than its caches the way the weight kernels do (64-byte AVX-512 loads on the
// OpenMP threads, each thread a contiguous share), so a decode's "% of bound" compares with what
// the kernels could reach rather than with torch's sum or copy. A tool only: no kernel calls it.
//
// Access (each thread owns a contiguous 1 / T of the buffer, whole 4 KiB pages): `streams`
// forward streams per thread (1, 2, 4 or 8), each over an equal part of its share and advanced
// together, one cache line each per step (the 4-panel pass reads four panels side by side);
// `prefetch`: each stream also prefetches 1 KiB ahead. The loads are folded into the xor of all
// 64-bit words read (the checksum the tests compare), so they cannot be dropped.
#include "x86_intrinsics.h"
#include <omp.h>

#include <algorithm>
#include <chrono>

#include "kernels.h"

namespace tgserve {
namespace {

#if defined(__AVX512F__)
using Vec = __m512i;
inline Vec vload(const uint8_t* p) { return _mm512_loadu_si512(reinterpret_cast<const void*>(p)); }
inline Vec vxor(Vec a, Vec b) { return _mm512_xor_si512(a, b); }
inline Vec vzero() { return _mm512_setzero_si512(); }
inline uint64_t vfold(Vec v) {
  alignas(64) uint64_t w[8];
  _mm512_store_si512(reinterpret_cast<void*>(w), v);
  return w[0] ^ w[1] ^ w[2] ^ w[3] ^ w[4] ^ w[5] ^ w[6] ^ w[7];
}
#else
using Vec = uint64_t;
inline Vec vload(const uint8_t* p) {
  uint64_t a[8];
  std::copy(p, p + 64, reinterpret_cast<uint8_t*>(a));
  return a[0] ^ a[1] ^ a[2] ^ a[3] ^ a[4] ^ a[5] ^ a[6] ^ a[7];
}
inline Vec vxor(Vec a, Vec b) { return a ^ b; }
inline Vec vzero() { return 0; }
inline uint64_t vfold(Vec v) { return v; }
#endif

// Bytes [begin, end) of `p` as S streams of (end - begin) / S bytes (a multiple of 64).
template <int S>
uint64_t read_streams(const uint8_t* p, int64_t begin, int64_t end, bool prefetch) {
  const int64_t part = (end - begin) / S;
  Vec acc[S];
  for (int s = 0; s < S; ++s) acc[s] = vzero();
  for (int64_t i = begin; i < begin + part; i += 64) {
    for (int s = 0; s < S; ++s) {
      if (prefetch) __builtin_prefetch(p + i + s * part + 1024);  // prefetcht0 on x86
      acc[s] = vxor(acc[s], vload(p + i + s * part));
    }
  }
  Vec all = vzero();
  for (int s = 0; s < S; ++s) all = vxor(all, acc[s]);
  return vfold(all);
}

}  // namespace

double read_probe_seconds(const uint8_t* p, int64_t bytes, int streams, bool prefetch, uint64_t* sink) {
  uint64_t total = 0;
  const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(^ : total)
  {
    const int64_t t = omp_get_thread_num(), T = omp_get_num_threads();
    const int64_t unit = 8 * 4096;  // each stream whole pages
    const int64_t units = bytes / unit;
    const int64_t begin = units * t / T * unit, end = units * (t + 1) / T * unit;
    switch (streams) {
      case 1: total ^= read_streams<1>(p, begin, end, prefetch); break;
      case 2: total ^= read_streams<2>(p, begin, end, prefetch); break;
      case 4: total ^= read_streams<4>(p, begin, end, prefetch); break;
      default: total ^= read_streams<8>(p, begin, end, prefetch); break;
    }
  }
  const auto stop = std::chrono::steady_clock::now();
  *sink ^= total;
  return std::chrono::duration<double>(stop - start).count();
}

}  // namespace tgserve
