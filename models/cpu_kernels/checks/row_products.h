// What the linears' standalone checks (linear_check.cpp, q8_check.cpp) share: seeded float16
// scales, the FNV-1a digest of outputs' bits, and the row-invariance check of a product y [M, N]
// = x [M, K] @ W^T + bias run over all M rows at once and over the rows in smaller products.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

namespace tgserve::checks {

// A float16 in [2^-10, 2^-6) with a random sign (bits 0x1400 .. 0x23ff): a finite block scale.
inline uint16_t small_half(std::mt19937& rng) {
  const uint16_t magnitude = 0x1400 + static_cast<uint16_t>(rng() % 0x1000);
  return magnitude | static_cast<uint16_t>((rng() & 1) << 15);
}

inline uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

// product(x, rows, bias, y) computes `rows` rows of y from x's. On seeded x [40, K] and bias
// [N]: one product over the 40 rows must equal, bit for bit, the rows' products 1, 3 and 9 at a
// time (the kernels' passes by row count); folds the outputs' bits into `digest`. Returns the
// failures found (each printed).
template <typename Product>
int check_row_products(const char* name, int64_t K, int64_t N, Product product, std::mt19937& rng,
                       uint64_t& digest) {
  const int64_t M = 40;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(M * K), bias(N), all(M * N), some(M * N);
  for (float& v : x) v = u(rng);
  for (float& v : bias) v = u(rng);
  product(x.data(), M, bias.data(), all.data());
  int failures = 0;
  for (int64_t rows : {1, 3, 9}) {
    for (int64_t m0 = 0; m0 < M; m0 += rows)
      product(x.data() + m0 * K, std::min(rows, M - m0), bias.data(), some.data() + m0 * N);
    if (std::memcmp(all.data(), some.data(), all.size() * sizeof(float)) != 0) {
      ++failures;
      std::printf("FAIL %s K=%lld N=%lld: rows in products of %lld differ from one product of %lld\n",
                  name, static_cast<long long>(K), static_cast<long long>(N),
                  static_cast<long long>(rows), static_cast<long long>(M));
    }
  }
  digest = fnv1a(all.data(), all.size() * sizeof(float), digest);
  return failures;
}

}  // namespace tgserve::checks
