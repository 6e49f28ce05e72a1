"""A CPU kernel for paged DECODE attention (one query token per sequence), reading K/V
straight from the block tables instead of gathering them into a padded copy first.

Contract: `paged_decode_attention(q [B, H, D], k_cache, v_cache, block_tables [B, nb] int64,
seq_lens [B] int64, scale, sliding_window) -> [B, H, D]` in q's dtype equals SDPA of each
query against keys `max(0, seq_len - window) .. seq_len - 1` of its sequence, where token t
sits in block `block_tables[b, t // block_size]` at offset `t % block_size` of caches shaped
`[num_blocks, block_size, kv_heads, head_dim]` (contiguous, float32 / bfloat16 / float16,
same dtype as q). Scores, softmax and the V sum run in float32.

The C++ source is built with `torch.utils.cpp_extension.load_inline` at first use
(-O3 -march=native -fopenmp) and cached in torch's extension dir, keyed by a hash of this
source and the CPU's flags. `is_available()` says False (and logs why, once) when it cannot
be built or the device is not a CPU; callers then keep their SDPA path.
"""

from __future__ import annotations

import functools
import hashlib
import logging
from pathlib import Path

import torch

log = logging.getLogger(__name__)

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace {

constexpr int64_t kChunk = 32;  // keys scored between two online-softmax rescales

// exp for x <= 0 (scores minus their running max): Cody-Waite reduction + degree-6
// polynomial, ~2 ulp; plain float ops so `omp simd` loops vectorize (libm expf does not).
inline float exp_nonpos(float x) {
  x = std::max(x, -87.0f);
  const float n = std::floor(x * 1.44269504088896341f + 0.5f);
  const float r = x - n * 0.693145751953125f - n * 1.428606765330187e-06f;
  float p = 1.0f / 720.0f;
  p = p * r + 1.0f / 120.0f;
  p = p * r + 1.0f / 24.0f;
  p = p * r + 1.0f / 6.0f;
  p = p * r + 0.5f;
  p = p * r + 1.0f;
  p = p * r + 1.0f;
  const int32_t bits = (static_cast<int32_t>(n) + 127) << 23;
  float two_n;
  std::memcpy(&two_n, &bits, sizeof(float));
  return p * two_n;
}

// One cache row (D values) as float32: float rows are used in place, others converted.
template <typename T> struct Row;
template <> struct Row<float> {
  static const float* load(const float* src, float*, int64_t) { return src; }
};
template <> struct Row<c10::BFloat16> {
  static const float* load(const c10::BFloat16* src, float* buf, int64_t n) {
    const uint16_t* s = reinterpret_cast<const uint16_t*>(src);
#pragma omp simd
    for (int64_t i = 0; i < n; ++i) {
      const uint32_t bits = static_cast<uint32_t>(s[i]) << 16;  // bf16 = top half of fp32
      float f;
      std::memcpy(&f, &bits, sizeof(float));
      buf[i] = f;
    }
    return buf;
  }
};
template <> struct Row<c10::Half> {
  static const float* load(const c10::Half* src, float* buf, int64_t n) {
    for (int64_t i = 0; i < n; ++i) buf[i] = static_cast<float>(src[i]);
    return buf;
  }
};

template <typename T>
void decode(const T* q, const T* kc, const T* vc, const int64_t* tables, const int64_t* lens,
            T* out, int64_t B, int64_t H, int64_t KVH, int64_t D, int64_t bs, int64_t nb,
            int64_t num_blocks, float scale, int64_t window, int* bad) {
  const int64_t G = H / KVH;  // query heads per KV head
  const int64_t pairs = B * KVH;
#pragma omp parallel num_threads(at::get_num_threads())
  {
    // Per-thread scratch: qf/acc [G, D], row [D], s [G, kChunk], m/l [G], off [kChunk].
    std::vector<float> scratch(2 * G * D + D + G * kChunk + 2 * G);
    std::vector<int64_t> off(kChunk);
    float* qf = scratch.data();
    float* acc = qf + G * D;
    float* row = acc + G * D;
    float* s = row + D;
    float* m = s + G * kChunk;
    float* l = m + G;
#pragma omp for schedule(dynamic, 1)
    for (int64_t p = 0; p < pairs; ++p) {
      const int64_t b = p / KVH, h = p % KVH;
      int64_t len = lens[b];
      const int64_t* table = tables + b * nb;
      int64_t start = window > 0 ? std::max<int64_t>(0, len - window) : 0;
      if (len < 0 || len > nb * bs) {
        *bad = 1;  // reported after the parallel region (no throwing inside it)
        start = len = 0;
      }
      for (int64_t g = 0; g < G; ++g) {
        const T* qs = q + (b * H + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) qf[g * D + d] = static_cast<float>(qs[d]) * scale;
        m[g] = -std::numeric_limits<float>::infinity();
        l[g] = 0.0f;
      }
      std::fill(acc, acc + G * D, 0.0f);
      for (int64_t c0 = start; c0 < len; c0 += kChunk) {
        const int64_t n = std::min(kChunk, len - c0);
        for (int64_t i = 0; i < n; ++i) {
          const int64_t pos = c0 + i;
          int64_t blk = table[pos / bs];
          if (blk < 0 || blk >= num_blocks) {
            *bad = 2;
            blk = 0;
          }
          off[i] = ((blk * bs + pos % bs) * KVH + h) * D;  // cache is [blocks, bs, KVH, D]
        }
        for (int64_t i = 0; i < n; ++i) {
          const float* kr = Row<T>::load(kc + off[i], row, D);
          for (int64_t g = 0; g < G; ++g) {
            const float* qg = qf + g * D;
            float dot = 0.0f;
#pragma omp simd reduction(+ : dot)
            for (int64_t d = 0; d < D; ++d) dot += qg[d] * kr[d];
            s[g * kChunk + i] = dot;
          }
        }
        for (int64_t g = 0; g < G; ++g) {
          float* sg = s + g * kChunk;
          float mx = m[g];
          for (int64_t i = 0; i < n; ++i) mx = std::max(mx, sg[i]);
          const float alpha = exp_nonpos(m[g] - mx);  // 0 on the first chunk (m = -inf)
          float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
          for (int64_t i = 0; i < n; ++i) {
            sg[i] = exp_nonpos(sg[i] - mx);
            sum += sg[i];
          }
          l[g] = l[g] * alpha + sum;
          m[g] = mx;
          if (alpha != 1.0f) {
            float* ag = acc + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ag[d] *= alpha;
          }
        }
        for (int64_t i = 0; i < n; ++i) {
          const float* vr = Row<T>::load(vc + off[i], row, D);
          for (int64_t g = 0; g < G; ++g) {
            const float pg = s[g * kChunk + i];
            float* ag = acc + g * D;
#pragma omp simd
            for (int64_t d = 0; d < D; ++d) ag[d] += pg * vr[d];
          }
        }
      }
      for (int64_t g = 0; g < G; ++g) {
        const float inv = l[g] > 0.0f ? 1.0f / l[g] : 0.0f;
        T* os = out + (b * H + h * G + g) * D;
        for (int64_t d = 0; d < D; ++d) os[d] = static_cast<T>(acc[g * D + d] * inv);
      }
    }
  }
}

}  // namespace

// q [B, H, D]; caches [num_blocks, bs, KVH, D]; tables [B, nb] int64; lens [B] int64.
// Shapes, dtypes and contiguity are validated by the Python wrapper.
torch::Tensor paged_decode(torch::Tensor q, torch::Tensor k_cache, torch::Tensor v_cache,
                           torch::Tensor tables, torch::Tensor lens, double scale,
                           int64_t window) {
  auto out = torch::empty_like(q);
  const int64_t B = q.size(0), H = q.size(1), D = q.size(2);
  const int64_t num_blocks = k_cache.size(0), bs = k_cache.size(1), KVH = k_cache.size(2);
  int bad = 0;
  const auto run = [&](auto tag) {
    using T = decltype(tag);
    decode<T>(static_cast<const T*>(q.data_ptr()), static_cast<const T*>(k_cache.data_ptr()),
              static_cast<const T*>(v_cache.data_ptr()), tables.data_ptr<int64_t>(),
              lens.data_ptr<int64_t>(), static_cast<T*>(out.data_ptr()), B, H, KVH, D, bs,
              tables.size(1), num_blocks, static_cast<float>(scale), window, &bad);
  };
  switch (q.scalar_type()) {
    case at::kFloat: run(float{}); break;
    case at::kBFloat16: run(c10::BFloat16{}); break;
    case at::kHalf: run(c10::Half{}); break;
    default: TORCH_CHECK(false, "paged_decode: unsupported dtype ", q.scalar_type());
  }
  TORCH_CHECK(bad != 1, "paged_decode: a seq_len is negative or exceeds its block table");
  TORCH_CHECK(bad != 2, "paged_decode: a block table entry is outside the cache");
  return out;
}
"""


def _cpu_tag() -> str:
    """A short hash of the CPU flags: the build uses -march=native, so a .so cached on one
    machine must not be loaded on another."""
    try:
        info = Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in info.splitlines() if ln.startswith("flags")), "")
    except OSError:
        flags = ""
    return hashlib.sha1(flags.encode()).hexdigest()[:8]


@functools.cache
def _extension():
    """Builds (or loads the cached build of) the extension; None, logged once, on failure."""
    try:
        from torch.utils.cpp_extension import load_inline

        return load_inline(
            name=f"tgserve_paged_decode_{_cpu_tag()}",
            cpp_sources=_SOURCE,
            functions=["paged_decode"],
            extra_cflags=["-O3", "-march=native", "-fopenmp"],
            extra_ldflags=["-fopenmp"],
            verbose=False,
        )
    except Exception as exc:  # no compiler, missing headers, ninja, ...: fall back to SDPA
        log.warning("CPU paged decode kernel unavailable, using SDPA instead: %s", exc)
        return None


@functools.cache
def is_available(device: torch.device | str = "cpu") -> bool:
    """True when the kernel can serve tensors on `device` (a CPU and a built extension)."""
    if torch.device(device).type != "cpu":
        log.info("CPU paged decode kernel not used on device %s", device)
        return False
    return _extension() is not None


def paged_decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    block_tables: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """q: [B, H, D] (one query per sequence, at position seq_len - 1) -> [B, H, D]."""
    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        raise ValueError(
            f"expected q [B, H, D] and equal caches [blocks, bs, KVH, D]; got q {tuple(q.shape)},"
            f" k {tuple(k_cache.shape)}, v {tuple(v_cache.shape)}"
        )
    b, heads, dim = q.shape
    kv_heads = k_cache.shape[2]
    if k_cache.shape[3] != dim or heads % kv_heads != 0:
        raise ValueError(f"head_dim {dim} / heads {heads} do not fit the cache's {kv_heads} KV heads")
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        raise ValueError(f"q and caches must share a dtype in {_DTYPES}; got {q.dtype}, {k_cache.dtype}")
    if not (k_cache.is_contiguous() and v_cache.is_contiguous()):
        raise ValueError("the KV caches must be contiguous (a copy would defeat the kernel)")
    if block_tables.dim() != 2 or block_tables.shape[0] != b or seq_lens.shape != (b,):
        raise ValueError(f"need block_tables [{b}, nb] and seq_lens [{b}] for {b} queries")
    if block_tables.dtype != torch.int64 or seq_lens.dtype != torch.int64:
        raise ValueError("block_tables and seq_lens must be int64")
    if sliding_window is not None and sliding_window < 1:
        raise ValueError(f"sliding_window must be >= 1 or None, got {sliding_window}")
    ext = _extension()
    if ext is None or q.device.type != "cpu":
        raise ValueError("the CPU decode kernel is unavailable here; check is_available() first")
    return ext.paged_decode(
        q.contiguous(),
        k_cache,
        v_cache,
        block_tables.contiguous(),
        seq_lens.contiguous(),
        float(scale),
        sliding_window or 0,
    )
