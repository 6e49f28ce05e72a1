"""What an accelerator can do at best, measured now: the limits `tgserve bench` holds GPU results to.

Contract: `measure_device_limits(config, dtype, ms, device)` measures, on `device` (a CUDA GPU in
practice; any torch device works, which is how CI runs it on the CPU):
- memory bandwidth: a `BANDWIDTH_BYTES` buffer (far beyond any L2) copied (bytes read + written)
  and summed (bytes read only, what a decode step does to the weights), each the median of
  `REPEATS` timed calls after a warm-up;
- the peak matrix rate: a square `PEAK_N`^3 product of random `dtype` operands (never zeros: the
  tensor cores run faster on them), median of `REPEATS`;
- for each M in `ms`, the rate of the model's own projections at M rows (every layer's weights
  and the LM head, `copies` layers so the weights stream from memory), median of `REPEATS`.
Time is read through a `Clock`: `CudaEventClock` puts CUDA events around each call (device work
is asynchronous; one synchronize at the end), `HostClock` synchronizes and reads the host clock.
`rate(work, seconds)` turns the timings into work per second from their median, so the
arithmetic is testable with a `FakeClock`-style stand-in. Medians, not best-of: a bound the
kernels can hold, not a lucky pass.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

from bench.model_shapes import layer_linears, lm_head

if TYPE_CHECKING:
    import torch

    from bench.machine_limits import MachineLimits
    from models.config import ModelConfig

BANDWIDTH_BYTES = 2 * 1024**3  # 2 GiB: ~40x an H100's or H200's 50-60 MB L2
PEAK_N = 8192  # 8192^3 bf16: ~1.4 ms on an H100, fills every multiprocessor
REPEATS = 10
WEIGHT_BYTES = 512 * 1024**2  # model-shape weights per pass: many times the L2
# Small buffers for dry runs (`--quick-limits`): the same code in well under a second.
QUICK = {"bandwidth_bytes": 16 * 1024**2, "peak_n": 256, "weight_bytes": 4 * 1024**2, "repeats": 3}


class Clock(Protocol):
    def seconds(self, fn: Callable[[], object], repeats: int) -> list[float]:
        """Seconds of each of `repeats` calls of `fn` (after the caller's warm-up)."""
        ...


class HostClock:
    """The host's clock around each call, synchronizing the device before and after."""

    def __init__(self, synchronize: Callable[[], None] = lambda: None) -> None:
        self.synchronize = synchronize

    def seconds(self, fn: Callable[[], object], repeats: int) -> list[float]:
        out = []
        for _ in range(repeats):
            self.synchronize()
            start = time.perf_counter()
            fn()
            self.synchronize()
            out.append(time.perf_counter() - start)
        return out


class CudaEventClock:
    """CUDA events recorded around each call on the current stream: device time, no host gaps."""

    def seconds(self, fn: Callable[[], object], repeats: int) -> list[float]:
        import torch

        pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))]
        pairs += [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(repeats - 1)
        ]
        for start, end in pairs:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize()
        return [start.elapsed_time(end) / 1e3 for start, end in pairs]


def clock_for(device: torch.device) -> Clock:
    return CudaEventClock() if device.type == "cuda" else HostClock()


def rate(work: float, seconds: Sequence[float]) -> float:
    """Work per second at the median of the timed calls (ValueError when nothing was timed)."""
    if not seconds:
        raise ValueError("no timed call to take a rate from")
    median = statistics.median(seconds)
    if median <= 0:
        raise ValueError(f"a timed call took {median} s: the clock cannot time this work")
    return work / median


def timed(clock: Clock, fn: Callable[[], object], repeats: int, warmup: int = 2) -> list[float]:
    for _ in range(warmup):  # kernel selection, lazy module loads, allocator growth
        fn()
    return clock.seconds(fn, repeats)


def bandwidth_gb_s(
    device: torch.device, num_bytes: int, clock: Clock, repeats: int = REPEATS
) -> tuple[float, float]:
    """(copy GB/s counting bytes read + written, sum GB/s counting bytes read)."""
    import torch

    n = max(1, num_bytes // 2)
    src = torch.randn(n, dtype=torch.float32, device=device).to(torch.bfloat16)
    dst = torch.empty_like(src)
    copy = rate(2 * n * 2, timed(clock, lambda: dst.copy_(src), repeats)) / 1e9
    # float32 accumulation: the sum reads the bf16 buffer once and writes one number
    read = rate(n * 2, timed(clock, lambda: src.sum(dtype=torch.float32), repeats)) / 1e9
    return copy, read


def peak_matmul_gflops(
    device: torch.device, dtype: torch.dtype, n: int, clock: Clock, repeats: int = REPEATS
) -> float:
    import torch

    gen = torch.Generator(device=device).manual_seed(0)
    a = torch.randn(n, n, generator=gen, device=device).to(dtype)
    b = torch.randn(n, n, generator=gen, device=device).to(dtype)
    return rate(2 * n**3, timed(clock, lambda: torch.mm(a, b), repeats)) / 1e9


def model_matmul_gflops(
    config: ModelConfig,
    dtype: torch.dtype,
    device: torch.device,
    m: int,
    clock: Clock,
    repeats: int = REPEATS,
    weight_bytes: int = WEIGHT_BYTES,
) -> float:
    one_pass, flops = projection_pass(config, dtype, device, m, weight_bytes)
    return rate(flops, timed(clock, one_pass, repeats)) / 1e9


def projection_pass(
    config: ModelConfig, dtype: torch.dtype, device: torch.device, m: int, weight_bytes: int
) -> tuple[Callable[[], None], int]:
    """(one pass, its FLOPs): X[m, in] times `copies` layers' projections and the LM head, as
    `F.linear` runs them, with enough layer copies (up to the model's) to hold `weight_bytes`,
    so the weights stream from memory rather than sit in a cache. Seeded random operands."""
    import torch
    import torch.nn.functional as F

    layer, head = layer_linears(config), lm_head(config)
    itemsize = torch.empty((), dtype=dtype).element_size()
    layer_bytes = sum(lin.params for lin in layer) * itemsize
    copies = max(1, min(config.num_layers, math.ceil(weight_bytes / layer_bytes)))
    gen = torch.Generator(device=device).manual_seed(0)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=device).to(dtype)

    weights = [[randn(lin.out_features, lin.in_features) for lin in layer] for _ in range(copies)]
    head_w = randn(head.out_features, head.in_features)
    xs = {k: randn(m, k) for k in {lin.in_features for lin in layer} | {head.in_features}}

    def one_pass() -> None:
        with torch.inference_mode():
            for layer_weights in weights:
                for lin, w in zip(layer, layer_weights, strict=True):
                    F.linear(xs[lin.in_features], w)
            F.linear(xs[head.in_features], head_w)

    return one_pass, 2 * m * (copies * sum(lin.params for lin in layer) + head.params)


def measure_device_limits(
    config: ModelConfig,
    dtype: str,
    ms: tuple[int, ...],
    device: str,
    bandwidth_bytes: int = BANDWIDTH_BYTES,
    peak_n: int = PEAK_N,
    weight_bytes: int = WEIGHT_BYTES,
    repeats: int = REPEATS,
) -> MachineLimits:
    import torch

    from bench.machine_limits import MachineLimits, MatmulRate

    dev = torch.device(device)
    torch_dtype = getattr(torch, dtype)
    clock = clock_for(dev)
    copy_gb_s, read_gb_s = bandwidth_gb_s(dev, bandwidth_bytes, clock, repeats)
    peak = peak_matmul_gflops(dev, torch_dtype, peak_n, clock, repeats)
    rates = tuple(
        MatmulRate(
            m, model_matmul_gflops(config, torch_dtype, dev, m, clock, repeats, weight_bytes)
        )
        for m in sorted(set(ms))
    )
    name = torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"
    if dev.type == "cuda":
        torch.cuda.empty_cache()  # the buffers above go back before the model loads
    return MachineLimits(
        dtype,
        torch.get_num_threads(),
        copy_gb_s,
        read_gb_s,
        rates,
        device=dev.type,
        device_name=name,
        peak_matmul_gflops=peak,
    )
