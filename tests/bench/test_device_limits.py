"""The GPU machine limits (bench/device_limits.py): their arithmetic against hand-worked figures
with clocks whose seconds are known, the CUDA event clock's pairing with fake events, and the
whole measurement for real on the CPU device (the CUDA branch is the same code with another
clock). Oracles: the byte and FLOP counts worked out by hand from the shapes."""

from __future__ import annotations

import pytest
import torch

from bench import device_limits as dl
from bench.machine_limits import MachineLimits, MatmulRate, measure_machine_limits
from bench.random_models import RANDOM_SHAPES
from bench.report import format_limits
from models.config import ModelConfig

TINY = ModelConfig.from_hf_dict(RANDOM_SHAPES["tiny-llama"])
# tiny-llama per layer: q 64x64, k 64x32, v 64x32, o 64x64, gate and up 64x128, down 128x64
LAYER_PARAMS = 4096 + 2048 + 2048 + 4096 + 8192 + 8192 + 8192
HEAD_PARAMS = 64 * 512


class ScriptedClock:
    """Hands out the given seconds in turn and counts the calls it timed."""

    def __init__(self, seconds: list[float]) -> None:
        self.script = list(seconds)
        self.calls = 0

    def seconds(self, fn, repeats: int) -> list[float]:
        out = []
        for _ in range(repeats):
            fn()
            self.calls += 1
            out.append(self.script.pop(0))
        return out


def test_rate_is_work_over_the_median_and_refuses_what_it_cannot_time():
    assert dl.rate(100.0, [3.0, 1.0, 2.0]) == pytest.approx(50.0)
    assert dl.rate(100.0, [4.0, 1.0, 2.0, 3.0]) == pytest.approx(40.0)  # median 2.5
    with pytest.raises(ValueError, match="no timed call"):
        dl.rate(1.0, [])
    with pytest.raises(ValueError, match="cannot time"):
        dl.rate(1.0, [0.0, 0.0, 1.0])


def test_bandwidth_counts_copy_as_read_plus_write_and_sum_as_read():
    num_bytes = 1 << 20  # bf16 elements: 2^19
    clock = ScriptedClock([1e-3, 3e-3, 2e-3] + [5e-4, 1e-3, 2e-3])
    copy, read = dl.bandwidth_gb_s(torch.device("cpu"), num_bytes, clock, repeats=3)
    assert copy == pytest.approx(2 * num_bytes / 2e-3 / 1e9)  # median 2 ms, read + write
    assert read == pytest.approx(num_bytes / 1e-3 / 1e9)  # median 1 ms, read only
    assert clock.calls == 6


def test_peak_and_model_shape_rates_count_the_flops_by_hand():
    clock = ScriptedClock([2e-3, 1e-3, 4e-3])
    peak = dl.peak_matmul_gflops(torch.device("cpu"), torch.bfloat16, 64, clock, repeats=3)
    assert peak == pytest.approx(2 * 64**3 / 2e-3 / 1e9)
    # weight_bytes of one byte: one layer copy streams, plus the LM head
    clock = ScriptedClock([1e-3, 1e-3, 1e-3])
    m = 5
    gflops = dl.model_matmul_gflops(
        TINY, torch.float32, torch.device("cpu"), m, clock, repeats=3, weight_bytes=1
    )
    assert gflops == pytest.approx(2 * m * (LAYER_PARAMS + HEAD_PARAMS) / 1e-3 / 1e9)
    # enough bytes for every layer: both copies stream (capped at the model's 2 layers)
    clock = ScriptedClock([1e-3])
    gflops = dl.model_matmul_gflops(
        TINY, torch.float32, torch.device("cpu"), m, clock, repeats=1, weight_bytes=1 << 30
    )
    assert gflops == pytest.approx(2 * m * (2 * LAYER_PARAMS + HEAD_PARAMS) / 1e-3 / 1e9)


def test_the_cuda_event_clock_pairs_each_call_and_reports_seconds(monkeypatch):
    recorded: list[float] = []

    class FakeEvent:  # elapsed_time in milliseconds, as CUDA events report it
        def __init__(self, enable_timing: bool) -> None:
            assert enable_timing
            self.at = None

        def record(self) -> None:
            self.at = float(len(recorded)) * 1.5
            recorded.append(self.at)

        def elapsed_time(self, end: FakeEvent) -> float:
            return end.at - self.at

    synced = []
    monkeypatch.setattr(torch.cuda, "Event", FakeEvent)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: synced.append(1))
    calls = []
    seconds = dl.CudaEventClock().seconds(lambda: calls.append(1), 4)
    assert seconds == pytest.approx([1.5e-3] * 4) and len(calls) == 4
    assert len(recorded) == 8 and synced == [1]  # one synchronize, after the last call


def test_the_measurement_runs_for_real_on_the_cpu_device():
    limits = dl.measure_device_limits(
        TINY, "float32", (1, 4), "cpu", bandwidth_bytes=1 << 20, peak_n=64, repeats=3
    )
    assert limits.device == "cpu" and limits.device_name == "cpu"
    assert limits.bandwidth_copy_gb_s > 0 and limits.bandwidth_read_gb_s > 0
    assert limits.bandwidth_gb_s == max(limits.bandwidth_copy_gb_s, limits.bandwidth_read_gb_s)
    assert [r.m for r in limits.matmul] == [1, 4] and all(r.gflops > 0 for r in limits.matmul)
    assert limits.best_gflops_at(4) == max(limits.gflops_at(4), limits.peak_matmul_gflops)


def test_cuda_limits_are_measured_on_the_gpu_and_shown_as_such(monkeypatch):
    seen = {}

    def fake(config, dtype, ms, device):
        seen.update(dtype=dtype, ms=ms, device=device)
        return "gpu limits"

    monkeypatch.setattr(dl, "measure_device_limits", fake)
    assert measure_machine_limits(TINY, "bfloat16", (1, 512), device="cuda:0") == "gpu limits"
    assert seen == {"dtype": "bfloat16", "ms": (1, 512), "device": "cuda:0"}
    limits = MachineLimits(
        "bfloat16",
        16,
        4270.0,
        4400.0,
        (MatmulRate(1, 4000.0), MatmulRate(512, 600_000.0)),
        device="cuda",
        device_name="NVIDIA H200",
        peak_matmul_gflops=790_000.0,
    )
    line = format_limits(limits)
    assert "NVIDIA H200" in line and "4400 GB/s" in line and "peak (square product) 7.9e+05" in line
    assert limits.best_gflops_at(512) == 790_000.0 and limits.best_gflops_at(1) == 790_000.0
    assert limits.gflops_at(1) == 4000.0  # decode keeps the model-shape rate
