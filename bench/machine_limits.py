"""What this machine can do at best, measured now, and the bounds that follow for one model.

Contract:
- `measure_machine_limits(config, dtype, ms)` measures (1) memory bandwidth: the read probe
  (models/cpu_kernels/read_probe.cpp) streams a 1 GiB buffer, 32x the L3, the way the weight
  kernels read (AVX-512 loads on every OpenMP thread, each thread a contiguous share read as
  1, 2, 4 or 8 streams, with or without software prefetch: `PROBE_PATTERNS`): the median of
  `PROBE_PASSES` passes per access pattern, the best pattern's median is the bandwidth every bound uses (a median, not a
  best pass: the figure must be one the kernels can hold, and single passes on a shared machine
  jump by half). Torch's best copy (read + write) and sum (read only) of a 256 MiB tensor are
  kept for reference, and stand in when the C++ extension cannot be built. (2) for each M in `ms`, the matmul rate of the model's own projections in its dtype: X[M, in]
  times every layer's weights and the LM head, through `F.linear` as the models call it, on
  enough distinct layer copies that the weights stream from memory rather than sit in cache.
  Best-of timings: a limit is what the machine reaches, not what it usually reaches.
  On a CUDA device (`device="cuda"`) the GPU is measured instead (bench/device_limits.py: HBM
  copy and read bandwidth, the peak matrix rate of a large square product, the model-shape
  rates; CUDA events, medians), and `device`, `device_name`, `peak_matmul_gflops` say so.
  `quick` runs that method on small buffers on any device (dry runs: rough, fast figures).
- Bounds (used to report each result as a fraction of what the hardware allows):
  `decode_bytes_per_token`: batch-1 decode streams every weight once per token, and the K and V
  of every token in its context, so at most bandwidth / (weight bytes + context x KV bytes)
  tokens per second; `best_gflops_at(m)`: the fastest the machine multiplies M rows (the model's shapes, or
  the peak square product where one was measured), what a prefill of M tokens is held to;
  `min_compute_seconds`: the matmul FLOPs of a run's prompt and output tokens at the measured
  rates (prompt tokens at the best rate at the prefill M, output tokens at the model-shape rate
  at the decode batch M, where streaming the weights counts). Torch is imported inside the
  functions, so importing this module is cheap.
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

from bench.model_shapes import (
    flops_per_token,
    kv_bytes_per_token,
    weight_bytes_per_token,
)

if TYPE_CHECKING:  # the models package imports torch: keep `tgserve --help` fast
    from models.config import ModelConfig

CACHE_BUSTER_BYTES = 64 * 1024**2  # more weights than the largest last-level cache we expect
DEFAULT_BANDWIDTH_BYTES = 256 * 1024**2
PROBE_BYTES = 1024**3  # the read probe's buffer: far beyond any L3 we expect (32 MB here)
PROBE_PASSES = 7
# (streams per thread, software prefetch): the kernels' 4-panel pass reads 4 streams a thread
PROBE_PATTERNS = ((1, False), (2, False), (4, False), (8, False), (1, True), (4, True))
TORCH_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True)
class MatmulRate:
    m: int  # rows of X: tokens in one forward
    gflops: float  # measured over the model's projection shapes


@dataclass(frozen=True)
class MachineLimits:
    dtype: str
    threads: int
    bandwidth_copy_gb_s: float  # (read + write bytes) / time of a large copy
    bandwidth_read_gb_s: float  # bytes / time of a large sum
    matmul: tuple[MatmulRate, ...]
    # The read probe: the best pattern's median GB/s, and each pattern's (None: no C++ kernels).
    bandwidth_probe_gb_s: float | None = None
    probe_patterns_gb_s: tuple[float, ...] = ()
    device: str = "cpu"  # "cpu" | "cuda": what was measured
    device_name: str | None = None  # e.g. "NVIDIA H100 80GB HBM3"
    peak_matmul_gflops: float | None = None  # a large square product (measured on GPUs)

    @property
    def bandwidth_gb_s(self) -> float:
        """The bandwidth the bounds use: the read probe's, else torch's best copy or sum."""
        if self.bandwidth_probe_gb_s is not None:
            return self.bandwidth_probe_gb_s
        return max(self.bandwidth_copy_gb_s, self.bandwidth_read_gb_s)

    def gflops_at(self, m: int) -> float:
        for rate in self.matmul:
            if rate.m == m:
                return rate.gflops
        raise ValueError(
            f"no matmul rate was measured at M={m}; measured: {[r.m for r in self.matmul]}"
        )

    def best_gflops_at(self, m: int) -> float:
        """The model-shape rate at M, or the peak square product's where that is faster."""
        return max(self.gflops_at(m), self.peak_matmul_gflops or 0.0)


def measure_machine_limits(
    config: ModelConfig,
    dtype: str,
    ms: tuple[int, ...],
    device: str = "cpu",
    quick: bool = False,
    bandwidth_bytes: int = DEFAULT_BANDWIDTH_BYTES,
    min_time: float = 0.2,
) -> MachineLimits:
    import torch

    if dtype not in TORCH_DTYPES:
        raise ValueError(
            f"dtype must be one of {', '.join(TORCH_DTYPES)} to measure limits, got {dtype!r}"
        )
    if device.startswith("cuda") or quick:
        from bench.device_limits import QUICK, measure_device_limits

        return measure_device_limits(config, dtype, ms, device, **(QUICK if quick else {}))
    torch_dtype = getattr(torch, dtype)
    copy_gb_s, read_gb_s = _bandwidth(bandwidth_bytes)
    patterns = probe_read_gb_s()
    rates = tuple(
        MatmulRate(m, _matmul_gflops(config, torch_dtype, m, min_time)) for m in sorted(set(ms))
    )
    return MachineLimits(
        dtype,
        torch.get_num_threads(),
        copy_gb_s,
        read_gb_s,
        rates,
        max(patterns) if patterns else None,
        patterns,
    )


def probe_read_gb_s(num_bytes: int = PROBE_BYTES, passes: int = PROBE_PASSES) -> tuple[float, ...]:
    """Each probe pattern's median read GB/s over `passes` passes of a `num_bytes` buffer
    (empty when the C++ kernels are unavailable)."""
    import torch

    from models import cpu_kernels

    ext = cpu_kernels.extension()
    if ext is None:
        return ()
    buffer = torch.ones(num_bytes, dtype=torch.uint8)  # ones: every page really mapped
    ext.read_probe(buffer, 1, False)  # warm: the OpenMP pool, the TLB
    return tuple(
        num_bytes / statistics.median(ext.read_probe(buffer, s, p)[0] for _ in range(passes)) / 1e9
        for s, p in PROBE_PATTERNS
    )


def decode_bytes_per_token(config: ModelConfig, dtype_bytes: int, context_tokens: float) -> float:
    """Bytes a batch-1 decode step streams: every weight, and the K and V of `context_tokens`
    tokens (the KV cache is in the weights' dtype). Over the bandwidth: the decode bound."""
    kv = context_tokens * kv_bytes_per_token(config, dtype_bytes)
    return weight_bytes_per_token(config, dtype_bytes) + kv


def min_compute_seconds(
    limits: MachineLimits,
    config: ModelConfig,
    prompt_tokens: int,
    output_tokens: int,
    prefill_m: int,
    decode_m: int,
) -> float:
    prefill = (
        prompt_tokens
        * flops_per_token(config, with_lm_head=False)
        / (limits.best_gflops_at(prefill_m) * 1e9)
    )
    decode = (
        output_tokens
        * flops_per_token(config, with_lm_head=True)
        / (limits.gflops_at(decode_m) * 1e9)
    )
    return prefill + decode


def _best_seconds(fn, repeats: int) -> float:
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def _bandwidth(num_bytes: int) -> tuple[float, float]:
    import torch

    n = max(1, num_bytes // 4)
    src = torch.ones(n, dtype=torch.float32)  # ones, not empty: every page is really mapped
    dst = torch.zeros_like(src)
    dst.copy_(src)
    copy_s = _best_seconds(lambda: dst.copy_(src), 5)
    read_s = _best_seconds(lambda: src.sum(), 5)
    return 2 * n * 4 / copy_s / 1e9, n * 4 / read_s / 1e9


def _matmul_gflops(config: ModelConfig, dtype, m: int, min_time: float) -> float:
    import torch

    from bench.device_limits import projection_pass

    one_pass, flops = projection_pass(config, dtype, torch.device("cpu"), m, CACHE_BUSTER_BYTES)
    one_pass()  # warm-up: oneDNN picks and caches its kernels on the first call
    per_pass = _best_seconds(one_pass, 1)
    reps = max(1, int(min_time / 3 / max(per_pass, 1e-9)))
    best = min(_best_seconds(lambda: [one_pass() for _ in range(reps)], 3) / reps, per_pass)
    return flops / best / 1e9
