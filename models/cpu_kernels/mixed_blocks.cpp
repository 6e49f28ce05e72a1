// A linear layer whose row segments are stored in different GGUF block types (kMixedBlocks):
// llama.cpp's Q4_K_M files give attn_v Q6_K in some layers and q / k Q4_K, and tgserve fuses q,
// k and v into one layer (ffn gate / up likewise). Each segment keeps its own packed panels
// (kquant_linear.cpp's layout, bytes as in the file), one after the other.
//
// Packed layout: a 64-byte header, int32 count (1 .. 7) then count pairs (int32 GGML type, int32
// rows), then each segment's packed panels ([ceil(rows / 16), 16 * row_bytes(type, K)] bytes)
// in order. Segment s produces the output columns [r_s, r_s + rows_s), r_s the rows before it.
// Each column runs exactly as in a one-type layer of its segment's type (same per-lane order):
// batch invariance holds as there.
#include <cstring>

#include "kernels.h"

namespace tgserve {
namespace {

constexpr int64_t kHeader = 64;
constexpr int kMaxParts = 7;

struct Parts {
  int count = 0;
  int type[kMaxParts] = {};
  int64_t rows[kMaxParts] = {}, first[kMaxParts] = {}, offset[kMaxParts] = {};
};

// The header read and checked against K (and, when given, N and the tensor's `bytes`: the
// bindings check a packed tensor once, kernels pass -1); count 0 when invalid.
Parts read_parts(const uint8_t* Wp, int64_t K, int64_t bytes = -1, int64_t N = -1) {
  Parts p;
  if (bytes >= 0 && bytes < kHeader) return p;
  int32_t h[1 + 2 * kMaxParts];
  std::memcpy(h, Wp, sizeof h);
  if (h[0] < 1 || h[0] > kMaxParts) return p;
  int64_t first = 0, offset = kHeader;
  for (int s = 0; s < h[0]; ++s) {
    const int type = h[1 + 2 * s];
    const int64_t rows = h[2 + 2 * s], rb = row_bytes(type, K);
    if (!is_kquant_type(type) || type == kMixedBlocks || rows <= 0 || rb <= 0) return p;
    p.type[s] = type, p.rows[s] = rows, p.first[s] = first, p.offset[s] = offset;
    first += rows;
    offset += (rows + 15) / 16 * 16 * rb;
  }
  if ((N >= 0 && first != N) || (bytes >= 0 && offset != bytes)) return p;
  p.count = h[0];
  return p;
}

}  // namespace

bool mixed_blocks_valid(const uint8_t* Wp, int64_t bytes, int64_t K, int64_t N) {
  return read_parts(Wp, K, bytes, N).count > 0;
}

void mixed_rows(const uint8_t* Wp, int64_t K, const int64_t* ids, int64_t T, float* out) {
  const Parts p = read_parts(Wp, K);
  for (int64_t t = 0; t < T; ++t) {
    int s = 0;
    while (ids[t] >= p.first[s] + p.rows[s]) ++s;
    const int64_t id = ids[t] - p.first[s];
    kquant_rows(Wp + p.offset[s], K, p.type[s], &id, 1, out + t * K);
  }
}

template <typename T, typename OutT>
void mixed_linear(const T* x, int64_t M, int64_t K, const uint8_t* Wp, const T* bias, OutT* y,
                  int64_t N) {
  const Parts p = read_parts(Wp, K);
  for (int s = 0; s < p.count; ++s)
    kquant_linear_ld<T, OutT>(x, M, K, Wp + p.offset[s], p.type[s], bias ? bias + p.first[s] : nullptr,
                              y + p.first[s], p.rows[s], N);
}

#define TGSERVE_INSTANTIATE(T, OutT)                                                          \
  template void mixed_linear<T, OutT>(const T*, int64_t, int64_t, const uint8_t*, const T*, \
                                      OutT*, int64_t);
TGSERVE_INSTANTIATE(float, float)
TGSERVE_INSTANTIATE(c10::BFloat16, c10::BFloat16)
TGSERVE_INSTANTIATE(c10::BFloat16, float)
#undef TGSERVE_INSTANTIATE

}  // namespace tgserve
