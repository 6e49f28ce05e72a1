// Standalone checks of the GGUF block linears (block_linear.cpp, kquant_linear.cpp) with float32
// activations, no torch or Python needed (models/cpu_kernels/cross_check.py builds it for this
// host's x86 builds and for aarch64, run under qemu-user). For each block type, on seeded
// random blocks (valid float16 scales) and activations:
//   1. row invariance: the rows of one product over M = 40 rows equal, bit for bit, each row's
//      product alone (M = 1) and in products of 3 and 9 rows (the kernels' passes by row count);
//   2. one FNV-1a digest of every output's bits, printed per type: the kernels fix each lane's
//      order and fuse its multiply-adds explicitly (std::fma where no SIMD pass runs), so every
//      build (AVX-512, AVX2, the portable loops, aarch64) must print the same digests; the
//      test compares them across builds.
// Prints "digest <type> <hex>" lines, one line per failure and a summary; exits 1 on failure.
#include "../kernels.h"
#include "row_products.h"

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

int failures = 0;

struct Kind {
  const char* name;
  int type;
  std::vector<int> half_offsets;  // float16 scale fields in a file block: made finite
};

void check(const Kind& kind, int64_t K, int64_t N, std::mt19937& rng, uint64_t& digest) {
  const int64_t width = tgserve::block_width(kind.type), rb = tgserve::row_bytes(kind.type, K);
  const int64_t file_block = rb / (K / width);
  std::vector<uint8_t> raw(N * rb);
  for (uint8_t& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < N * K / width; ++blk)
    for (int off : kind.half_offsets) {
      const uint16_t h = tgserve::checks::small_half(rng);
      std::memcpy(raw.data() + blk * file_block + off, &h, 2);
    }
  std::vector<uint8_t> packed((N + 15) / 16 * 16 * rb);
  tgserve::pack_blocks(raw.data(), N, K, kind.type, packed.data());
  auto product = [&](const float* x, int64_t rows, const float* bias, float* y) {
    tgserve::block_linear<float, float>(x, rows, K, packed.data(), kind.type, bias, y, N);
  };
  failures += tgserve::checks::check_row_products(kind.name, K, N, product, rng, digest);
}

}  // namespace

int main() {
  const std::vector<Kind> kinds = {
      {"Q4_0", tgserve::kQ4_0, {0}},  {"Q4_1", tgserve::kQ4_1, {0, 2}},
      {"Q5_0", tgserve::kQ5_0, {0}},  {"Q5_1", tgserve::kQ5_1, {0, 2}},
      {"Q8_0", tgserve::kQ8_0, {0}},  {"Q4_K", tgserve::kQ4_K, {0, 2}},
      {"Q5_K", tgserve::kQ5_K, {0, 2}}, {"Q6_K", tgserve::kQ6_K, {208}},
  };
  int cases = 0;
  for (const Kind& kind : kinds) {
    std::mt19937 rng(20261130 + kind.type);
    uint64_t digest = 0xcbf29ce484222325ull;
    for (auto [K, N] : {std::pair<int64_t, int64_t>{256, 40}, {512, 33}, {1024, 16}}) {
      check(kind, K, N, rng, digest);
      ++cases;
    }
    std::printf("digest %s %016llx\n", kind.name, static_cast<unsigned long long>(digest));
  }
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
