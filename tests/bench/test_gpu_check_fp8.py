"""The GPU check (bench/gpu_check) times a batch-1 decode over an fp8 K/V cache on the GPU, and
leaves it out of the CPU dry run (a CPU refuses fp8); the report shows it beside the default."""

from __future__ import annotations

from dataclasses import replace

from bench.gpu_check.plan import Settings, build_plan
from bench.gpu_check.report import _benchmarks

GPU = Settings(tiny=False, device="cuda", wheels=None, site="site", suite=(), workers=0)


def test_the_gpu_plan_decodes_over_fp8_kv_and_the_dry_run_does_not() -> None:
    stages = {s.name: s for s in build_plan(GPU)}
    argv = stages["latency_fp8"].argv
    assert argv[argv.index("--kv-cache-dtype") + 1] == "fp8"
    assert argv[: argv.index("--skip-limits")] == stages["latency"].argv[: len(argv) - 3]
    tiny = build_plan(replace(GPU, tiny=True, device="cpu"))
    assert "latency_fp8" not in {s.name for s in tiny}


def test_the_report_puts_the_fp8_decode_beside_the_default() -> None:
    lat = {"input_len": 512, "output_len": 128, "runs": 3, "decode_tok_s": 200.0}
    lat |= {"prefill_tok_s": 1000.0, "decode_bound_tok_s": 400.0, "prefill_bound_tok_s": 2e3}
    lat |= {"decode_fraction_of_bound": 0.5, "prefill_fraction_of_bound": 0.5}
    figures = {"latency": lat, "latency_fp8": {"decode_tok_s": 250.0, "prefill_tok_s": 900.0}}
    figures |= {"offline": None, "offline_wide": None, "serve": None, "serve_itl": None}
    table = _benchmarks(figures)
    assert "batch-1 decode tok/s, fp8 K/V" in table and "x1.25 / x0.90 of the default" in table
