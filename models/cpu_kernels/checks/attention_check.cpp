// Standalone checks of the paged attention kernel (attention.cpp), no torch or Python needed:
// built for any target with the kernel sources, so a cross build (aarch64, run under
// qemu-user) is checked by the same program as this host's builds
// (tests/models/test_kernel_cross_build.py builds and runs it). For each cache kind the
// kernel reads (float32 rows, float16 rows, int8 rows, float16 K with int8 V) it checks:
//   1. each row's output against a float64 attention over the values the cache holds (float16
//      widened, int8 rows as W (q * s) / P: kv_int8.h), within a bound derived from float32
//      rounding (below);
//   2. batch invariance: a batch's rows equal, bit for bit, each row computed alone;
//   3. a prefill chunk's rows (one sequence, one block table, consecutive lengths: the
//      kernel's group path) equal, bit for bit, each row computed alone (its decode path).
// Prints one line per failure and a summary; exits 1 on any failure. An argument scales the
// float64 bound (the test passes 1e-3 to see that check fail: a bound that cannot fail checks
// nothing).
#include "../kernels.h"
#include "../kv_int8.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace {

using tgserve::append_rows;
using tgserve::kv_rotation_block;

int failures = 0;
double bound_scale = 1.0;  // argv[1]

void fail(const std::string& what) {
  ++failures;
  std::printf("FAIL %s\n", what.c_str());
}

// A cache of element type E [blocks, bs, KVH, DS] with each (token, head) row's value as the
// kernel reads it (float64), and writers that round as the C++ step's append does.
template <typename E>
struct Cache {
  int64_t KVH, D, DS;
  std::vector<E> rows;
  std::vector<double> seen;  // [slots, KVH, D]: the values the rows stand for
  Cache(int64_t slots, int64_t kvh, int64_t d)
      : KVH(kvh), D(d), DS(d + tgserve::KVRowExtra<E>::value), rows(slots * kvh * DS),
        seen(slots * kvh * d) {}
  void write(int64_t slot, const float* x) {  // x [KVH, D]
    append_rows(x, slot, KVH, D, rows.data());
    for (int64_t g = 0; g < KVH; ++g) {
      const E* r = rows.data() + (slot * KVH + g) * DS;
      double* o = seen.data() + (slot * KVH + g) * D;
      if constexpr (std::is_same_v<E, int8_t>) {  // x = W (q * s) / P
        const double s = tgserve::kv_row_scale(r, D);
        const int64_t P = kv_rotation_block(D);
        for (int64_t b = 0; b < D; b += P)
          for (int64_t i = 0; i < P; ++i) {
            double acc = 0.0;
            for (int64_t j = 0; j < P; ++j)
              acc += (__builtin_popcountll(i & j) % 2 ? -1.0 : 1.0) * r[b + j] * s;
            o[b + i] = acc / static_cast<double>(P);
          }
      } else {
        for (int64_t d = 0; d < D; ++d) o[d] = static_cast<float>(r[d]);
      }
    }
  }
};

struct Shape {
  int64_t H, KVH, D, bs;
};

// One cache kind over one shape: tables of shuffled blocks, rows of several lengths.
template <typename KV, typename VV>
void check(const char* kind, const Shape& s, std::mt19937& rng) {
  const int64_t H = s.H, KVH = s.KVH, D = s.D, bs = s.bs, G = H / KVH;
  const std::vector<int64_t> lens = {1, 15, 16, 17, 255, 256, 257, 700};
  const int64_t B = static_cast<int64_t>(lens.size());
  const int64_t nb = (*std::max_element(lens.begin(), lens.end()) + bs - 1) / bs;
  const int64_t num_blocks = B * nb + 3;
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  Cache<KV> kc(num_blocks * bs, KVH, D);
  Cache<VV> vc(num_blocks * bs, KVH, D);
  std::vector<float> x(KVH * D);
  for (int64_t slot = 0; slot < num_blocks * bs; ++slot) {
    for (float& v : x) v = u(rng);
    kc.write(slot, x.data());
    for (float& v : x) v = u(rng);
    vc.write(slot, x.data());
  }
  std::vector<int64_t> perm(num_blocks);
  for (int64_t i = 0; i < num_blocks; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  std::vector<int64_t> tables(B * nb);
  for (int64_t i = 0; i < B * nb; ++i) tables[i] = perm[i];
  std::vector<float> q(B * H * D);
  for (float& v : q) v = u(rng);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D));
  auto run = [&](const float* qq, const int64_t* tb, const int64_t* ln, int64_t n, float* out) {
    return tgserve::paged_decode_attention<float, KV, VV>(qq, kc.rows.data(), vc.rows.data(), tb,
                                                          nb, ln, out, n, H, KVH, D, bs,
                                                          num_blocks, scale, 0);
  };
  std::vector<float> batch(B * H * D), alone(H * D);
  if (run(q.data(), tables.data(), lens.data(), B, batch.data()) != tgserve::kOk)
    return fail(std::string(kind) + ": the kernel reported an error");
  const std::string where = std::string(kind) + " H=" + std::to_string(H) + " KVH=" +
                            std::to_string(KVH) + " D=" + std::to_string(D);
  const double unit = std::ldexp(1.0, -24);  // float32's unit roundoff
  for (int64_t b = 0; b < B; ++b) {
    // 2. the row alone: the same bits
    run(q.data() + b * H * D, tables.data() + b * nb, &lens[b], 1, alone.data());
    if (std::memcmp(alone.data(), batch.data() + b * H * D, H * D * sizeof(float)) != 0)
      fail(where + ": row " + std::to_string(b) + " differs alone and in the batch");
    // 1. against float64. A score is a D-term float32 dot product times the scale: error up
    // to (D + 2) u sabs (sabs = scale * sum |q k|), which moves a key's weight by that factor
    // and the output by twice it times max |v|; the exp (a polynomial, <= 4 u) likewise; the
    // V sum adds n products in chains of at most n / 2 plus the merge (n / 16 + 64 roundings
    // of a term <= max |v|); int8 rows add the output's rotation (log2 P roundings of sums of
    // P values: P u max |v| each).
    const int64_t n = lens[b];
    for (int64_t h = 0; h < H; ++h) {
      const int64_t g = h / G;
      const float* qh = q.data() + (b * H + h) * D;
      std::vector<double> sc(n);
      double mx = -1e300, sabs = 0.0, vmax = 0.0;
      for (int64_t i = 0; i < n; ++i) {
        const int64_t slot = tables[b * nb + i / bs] * bs + i % bs;
        const double* kr = kc.seen.data() + (slot * KVH + g) * D;
        double dot = 0.0, mag = 0.0;
        for (int64_t d = 0; d < D; ++d) dot += qh[d] * kr[d], mag += std::fabs(qh[d] * kr[d]);
        sc[i] = dot * scale;
        mx = std::max(mx, sc[i]);
        sabs = std::max(sabs, mag * scale);
        const double* vr = vc.seen.data() + (slot * KVH + g) * D;
        for (int64_t d = 0; d < D; ++d) vmax = std::max(vmax, std::fabs(vr[d]));
      }
      const double rot = std::is_same_v<VV, int8_t> ? kv_rotation_block(D) * 8.0 : 0.0;
      const double tol =
          bound_scale * vmax * unit *
          (2.0 * (D + 2) * sabs * 2.0 + 8.0 + n / 16.0 + 64.0 + n / 2.0 + rot);
      double den = 0.0;
      std::vector<double> ref(D, 0.0);
      for (int64_t i = 0; i < n; ++i) {
        const double w = std::exp(sc[i] - mx);
        den += w;
        const int64_t slot = tables[b * nb + i / bs] * bs + i % bs;
        const double* vr = vc.seen.data() + (slot * KVH + g) * D;
        for (int64_t d = 0; d < D; ++d) ref[d] += w * vr[d];
      }
      double worst = 0.0;
      for (int64_t d = 0; d < D; ++d)
        worst = std::max(worst, std::fabs(ref[d] / den - batch[(b * H + h) * D + d]));
      if (!(worst <= tol)) {
        char msg[160];
        std::snprintf(msg, sizeof msg, ": row %lld head %lld off float64 by %.3g (bound %.3g)",
                      static_cast<long long>(b), static_cast<long long>(h), worst, tol);
        fail(where + msg);
      }
    }
  }
  // 3. a prefill chunk: rows 0 .. R-1 of the longest sequence at lengths L - R + 1 .. L
  const int64_t R = 40, L = lens.back(), last = B - 1;
  std::vector<int64_t> ctab(R * nb), clen(R);
  std::vector<float> cq(R * H * D), cout(R * H * D);
  for (int64_t r = 0; r < R; ++r) {
    std::copy(tables.begin() + last * nb, tables.begin() + (last + 1) * nb, ctab.begin() + r * nb);
    clen[r] = L - R + 1 + r;
    for (int64_t e = 0; e < H * D; ++e) cq[r * H * D + e] = u(rng);
  }
  run(cq.data(), ctab.data(), clen.data(), R, cout.data());
  for (int64_t r = 0; r < R; ++r) {
    run(cq.data() + r * H * D, ctab.data() + r * nb, &clen[r], 1, alone.data());
    if (std::memcmp(alone.data(), cout.data() + r * H * D, H * D * sizeof(float)) != 0)
      fail(where + ": prefill row " + std::to_string(r) + " differs from its decode");
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) bound_scale = std::atof(argv[1]);
  std::mt19937 rng(20261130);
  int cases = 0;
  for (const Shape& s : {Shape{9, 3, 64, 16}, Shape{4, 4, 128, 16}, Shape{8, 2, 80, 32}}) {
    check<float, float>("float32", s, rng);
    check<c10::Half, c10::Half>("float16", s, rng);
    check<int8_t, int8_t>("int8", s, rng);
    check<c10::Half, int8_t>("float16 K, int8 V", s, rng);
    cases += 4;
  }
  std::printf("%d cases, %d failures\n", cases, failures);
  return failures == 0 ? 0 : 1;
}
