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

uint16_t small_half(std::mt19937& rng) {  // a float16 in [2^-10, 2^-6), random sign: 0x1400 ..
  const uint16_t magnitude = 0x1400 + static_cast<uint16_t>(rng() % 0x1000);
  return magnitude | static_cast<uint16_t>((rng() & 1) << 15);
}

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const uint8_t*>(data);
  for (size_t i = 0; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return h;
}

void check(const Kind& kind, int64_t K, int64_t N, std::mt19937& rng, uint64_t& digest) {
  const int64_t width = tgserve::block_width(kind.type), rb = tgserve::row_bytes(kind.type, K);
  const int64_t file_block = rb / (K / width);
  std::vector<uint8_t> raw(N * rb);
  for (uint8_t& b : raw) b = static_cast<uint8_t>(rng());
  for (int64_t blk = 0; blk < N * K / width; ++blk)
    for (int off : kind.half_offsets) {
      const uint16_t h = small_half(rng);
      std::memcpy(raw.data() + blk * file_block + off, &h, 2);
    }
  std::vector<uint8_t> packed((N + 15) / 16 * 16 * rb);
  tgserve::pack_blocks(raw.data(), N, K, kind.type, packed.data());
  const int64_t M = 40;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> x(M * K), bias(N), all(M * N), some(M * N);
  for (float& v : x) v = u(rng);
  for (float& v : bias) v = u(rng);
  tgserve::block_linear<float, float>(x.data(), M, K, packed.data(), kind.type, bias.data(),
                                      all.data(), N);
  for (int64_t rows : {1, 3, 9}) {
    for (int64_t m0 = 0; m0 < M; m0 += rows) {
      const int64_t r = std::min(rows, M - m0);
      tgserve::block_linear<float, float>(x.data() + m0 * K, r, K, packed.data(), kind.type,
                                          bias.data(), some.data() + m0 * N, N);
    }
    if (std::memcmp(all.data(), some.data(), all.size() * sizeof(float)) != 0) {
      ++failures;
      std::printf("FAIL %s K=%lld N=%lld: rows in products of %lld differ from one product of %lld\n",
                  kind.name, static_cast<long long>(K), static_cast<long long>(N),
                  static_cast<long long>(rows), static_cast<long long>(M));
    }
  }
  digest = fnv1a(all.data(), all.size() * sizeof(float), digest);
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
