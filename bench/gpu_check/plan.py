"""The GPU check's stages: what each runs, for how long at most, in which order.

Contract (standard library only): `build_plan(settings) -> list[Stage]` in run order. Every stage
is one subprocess (`argv`, extra `env`), capped at `cap_s` seconds (the runner also cuts it to
what is left of the whole budget). On a GPU (`tiny` False) the benchmarks are issue 24's: the
8B shape's batch-1 decode and 512-token prefill against the limits measured in the same command,
64 x 512/256 offline against transformers `generate` in the same command, 256 x 512/256 at
`--max-num-seqs 256`, 64 streams through the HTTP server (and again with a step-time target
at GPU scale); then a profile of decode steps and the CUDA suite. `tiny` runs the same stages on `random:tiny-llama` on the CPU with small lengths (a
dry run CI can afford: every stage and the report, no figure that means anything).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Stage:
    name: str
    title: str  # what the report calls it
    argv: tuple[str, ...]
    cap_s: float
    env: dict[str, str] = field(default_factory=dict)
    min_s: float = 10.0  # not started with less than this left of the budget


@dataclass(frozen=True)
class Settings:
    tiny: bool
    device: str  # "cuda" or "cpu"
    wheels: str | None  # folder of wheels to install (None: nothing to install)
    site: str  # where the wheels go (prepended to PYTHONPATH for every later stage)
    suite: tuple[str, ...]  # pytest arguments of the suite stage
    workers: int  # xdist workers for the suite (0: none)


@dataclass(frozen=True)
class Sizes:
    model: str
    dtype: str
    input_len: int
    output_len: int
    latency_output_len: int
    offline: int  # requests in the offline comparison with transformers
    wide: int  # requests (and --max-num-seqs) of the wide offline run
    streams: int  # concurrent streams through the server
    profile_batches: tuple[int, ...]
    profile_steps: int
    extra: tuple[str, ...]  # bench flags every tgserve command gets


GPU_SIZES = Sizes("random:llama3-8b", "bfloat16", 512, 256, 128, 64, 256, 64, (1, 64), 16, ())
TINY_SIZES = Sizes(
    "random:tiny-llama", "float32", 16, 8, 8, 8, 16, 8, (1, 4), 4, ("--disable-cpu-kernels",)
)
TINY_LIMITS = ("--quick-limits",)  # the device limits' code on small buffers
TIGHT_ITL_MS = 20.0  # ~1.5x the H200's 64-row decode step (12.7 ms ITL p50 measured)
# issue 24's suite: the models and the engine, and the HTTP server over a live engine
GPU_SUITE = (
    "tests/models",
    "tests/engine",
    "tests/server/test_live_engine.py",
    "tests/server/test_batch_invariance_http.py",
)
TINY_SUITE = ("tests/bench/test_device_limits.py",)  # quick, and needs no C++ kernel build


def build_plan(settings: Settings) -> list[Stage]:
    s = TINY_SIZES if settings.tiny else GPU_SIZES
    py = sys.executable
    bench = (py, "-m", "server.cli", "bench")
    common = ("--model", s.model, "--dtype", s.dtype, "--device", settings.device, "--json")
    common += s.extra
    quick = TINY_LIMITS if settings.tiny else ()
    stages = []
    if settings.wheels:
        stages.append(
            Stage(
                "install",
                "Install the wheels brought along",
                (py, "-m", "bench.gpu_check.install", settings.wheels, settings.site),
                90,
            )
        )
    latency = (*bench, "latency", *common, "--backend", "tgserve", "--runs", "3")
    latency += ("--input-len", str(s.input_len), "--output-len", str(s.latency_output_len))
    stages += [
        Stage("environment", "Environment", (py, "-m", "bench.gpu_check.environment"), 30),
        Stage(
            "latency",
            f"Batch-1 decode and {s.input_len}-token prefill, against the measured limits",
            (*latency, *quick),
            100,
        ),
        # what --batch-invariant costs (README: not the default on CUDA, its cost unmeasured)
        Stage(
            "latency_invariant",
            "The same with --batch-invariant",
            (*latency, "--skip-limits", "--batch-invariant"),
            60,
            min_s=30,
        ),
    ]
    if not settings.tiny:  # fp8 K/V is CUDA's (a CPU refuses it): not in the CPU dry run
        stages.append(
            Stage(
                "latency_fp8",
                "The same with --kv-cache-dtype fp8 (e4m3 K/V, models/kv_fp8.py)",
                (*latency, "--skip-limits", "--kv-cache-dtype", "fp8"),
                60,
                min_s=30,
            )
        )
    stages += [
        Stage(
            "offline",
            f"{s.offline} x {s.input_len}/{s.output_len} offline, tgserve vs transformers",
            (*bench, "throughput", *common, *quick, "--backend", "tgserve")
            + ("--backend", "transformers")
            + _workload(s, s.offline)
            + ("--hf-batch-size", str(s.offline), "--max-num-seqs", str(s.offline)),
            130,
        ),
        Stage(
            "offline_wide",
            f"{s.wide} x {s.input_len}/{s.output_len} offline at --max-num-seqs {s.wide}",
            (*bench, "throughput", *common, "--backend", "tgserve", "--skip-limits")
            + _workload(s, s.wide)
            + ("--max-num-seqs", str(s.wide)),
            80,
        ),
        Stage(
            "serve",
            f"{s.streams} streams through the HTTP server (bench serve)",
            _serve_argv(s, settings.device),
            100,
            min_s=30,
        ),
        # The same load with the step-time target at GPU scale (the default, 100 ms, is a CPU's
        # step): what the ITL p99/p50 and TTFT a tighter target gives, for choosing a default.
        Stage(
            "serve_itl",
            f"The same with --target-itl-ms {TIGHT_ITL_MS:g}",
            _serve_argv(s, settings.device, ("--target-itl-ms", f"{TIGHT_ITL_MS:g}")),
            60,
            min_s=30,
        ),
        Stage(
            "profile",
            "Profile of decode steps and of a prompt's prefill",
            (py, "-m", "bench.gpu_check.profile_steps", "--model", s.model, "--dtype", s.dtype)
            + ("--device", settings.device, "--steps", str(s.profile_steps), *s.extra)
            + ("--batches", *map(str, s.profile_batches))
            + ("--prompt-len", str(s.input_len), "--prefill-len", str(s.input_len)),
            80,
        ),
        Stage(
            "suite",
            "Test suite on the device",
            (py, "-m", "bench.gpu_check.suite_stage")
            + (() if settings.tiny else ("--prebuild",))
            + ("-v", "-p", "no:cacheprovider", "-rfE", "--durations=25")
            + (("-n", str(settings.workers)) if settings.workers else ())
            + settings.suite,
            300,
            env={"TGSERVE_TEST_DEVICE": settings.device, "TGSERVE_TEST_INSTAFAIL": "1"},
            min_s=30,
        ),
    ]
    return stages


def _serve_argv(s: Sizes, device: str, server_flags: tuple[str, ...] = ()) -> tuple[str, ...]:
    return (
        (sys.executable, "-m", "bench.gpu_check.serve_stage", "--model", s.model)
        + ("--dtype", s.dtype, "--device", device, "--max-num-seqs", str(s.streams))
        + (*s.extra, *server_flags, "--")
        + ("--num-requests", str(s.streams), "--concurrency", str(s.streams))
        + ("--input-len", str(s.input_len), "--output-len", str(s.output_len), "--json")
    )


def _workload(s: Sizes, requests: int) -> tuple[str, ...]:
    return ("--num-requests", str(requests), "--input-len", str(s.input_len)) + (
        "--output-len",
        str(s.output_len),
        "--runs",
        "1",
    )
