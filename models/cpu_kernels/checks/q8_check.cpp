// Standalone checks of the int8 / int16 activation linears (q8_linear.cpp: `--activation-quantization
// int8 | int16`, the AVX2 build's default) with float32 activations in and out
// (models/cpu_kernels/cross_check.py builds it for this host's x86 builds and for aarch64, run
// under qemu-user). Q8 panels (q8_linear.h's layout) of seeded random quants and valid scales,
// for Q4_0, Q4_1, Q8_0 and float32-scaled int8 rows, each with int8 and int16 activations:
//   1. row invariance: one product over M = 40 rows equals, bit for bit, the rows' products
//      alone and in products of 3 and 9 rows;
//   2. one FNV-1a digest of the outputs' bits per kind: the blocks' sums are exact integers and
//      the epilogue one fma order (q8_linear.h), so every build (VNNI, AVX2, the scalar loops,
//      aarch64) must print the same digests; the test compares them across builds.
// Prints "digest <kind> <hex>" lines, one line per failure and a summary; exits 1 on failure.
#include "../kernels.h"
#include "../q8_linear.h"
#include "row_products.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

namespace {

int failures = 0;

// One panel block of `kind` (q8_linear.h): scales (fp16, or float32 for int8 rows), Q4_1's mins,
// then quants (Q8 kinds in [-127, 127], as files hold them; nibbles any).
void fill_block(int weights, uint8_t* blk, int64_t bytes, std::mt19937& rng) {
  const bool q4 = weights == tgserve::kQ4_0 || weights == tgserve::kQ4_1;
  int64_t quants = 32;
  if (weights == tgserve::kInt8Rows) {
    for (int l = 0; l < 16; ++l) {
      const float d = std::ldexp(1.0f + (rng() % 1024) / 1024.0f, -9);
      std::memcpy(blk + 4 * l, &d, 4);
    }
    quants = 64;
  } else {
    const int halves = weights == tgserve::kQ4_1 ? 32 : 16;  // d [16] (and m [16])
    for (int l = 0; l < halves; ++l) {
      const uint16_t h = tgserve::checks::small_half(rng);
      std::memcpy(blk + 2 * l, &h, 2);
    }
    quants = 2 * halves;
  }
  for (int64_t i = quants; i < bytes; ++i)
    blk[i] = q4 ? static_cast<uint8_t>(rng()) : static_cast<uint8_t>(static_cast<int8_t>(rng() % 255 - 127));
}

void check(const char* name, int kind, int weights, int64_t K, int64_t N, std::mt19937& rng,
           uint64_t& digest) {
  const int64_t bytes = tgserve::q8_block_bytes(kind), panels = (N + 15) / 16;
  std::vector<uint8_t> packed(panels * (K / 32) * bytes);
  for (int64_t b = 0; b < panels * (K / 32); ++b) fill_block(weights, packed.data() + b * bytes, bytes, rng);
  auto product = [&](const float* x, int64_t rows, const float* bias, float* y) {
    tgserve::q8_linear<float, float>(x, rows, K, packed.data(), kind, bias, y, N);
  };
  failures += tgserve::checks::check_row_products(name, K, N, product, rng, digest);
}

}  // namespace

int main() {
  struct Kind {
    const char* name;
    int weights;
  };
  const Kind kinds[] = {{"Q4_0", tgserve::kQ4_0}, {"Q4_1", tgserve::kQ4_1}, {"Q8_0", tgserve::kQ8_0},
                        {"int8-rows", tgserve::kInt8Rows}};
  int cases = 0;
  for (int base : {tgserve::kQ8Activations, tgserve::kQ16Activations}) {
    for (const Kind& k : kinds) {
      const std::string name = std::string(k.name) + (base == tgserve::kQ8Activations ? "/int8" : "/int16");
      std::mt19937 rng(20261130 + base + k.weights);
      uint64_t digest = 0xcbf29ce484222325ull;
      for (auto [K, N] : {std::pair<int64_t, int64_t>{256, 40}, {576, 33}, {1024, 16}}) {
        check(name.c_str(), base + k.weights, k.weights, K, N, rng, digest);
        ++cases;
      }
      std::printf("digest %s %016llx\n", name.c_str(), static_cast<unsigned long long>(digest));
    }
  }
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
