"""The block-kernel bench (bench/block_kernels.py): its timing arithmetic and its report.

Oracles: a fake clock whose every call of a timed function advances by a known amount (the
medians, best calls and ratios then follow by hand), and the bench's own JSON lines (one per
layer and rows, a summary per rows; the R-row over one-row ratio only where one row was timed
beside R rows)."""

from __future__ import annotations

import json

import pytest

from bench import block_kernels


def test_interleaved_timing_reports_medians_and_best_calls(monkeypatch) -> None:
    now = [0.0]
    monkeypatch.setattr(block_kernels.time, "perf_counter", lambda: now[0])
    # Each function's calls take these microseconds in turn: the warm-up call first (not
    # counted), then 3 runs of 2 calls. a: run means 11, 12, 14 (median 12), best 10.
    # b: run means 40, 30, 45 (median 40), best 20.
    durations = {"a": [99, 10, 12, 12, 12, 14, 14], "b": [99, 40, 40, 20, 40, 45, 45]}
    order = []

    def timed(name: str):
        def fn() -> None:
            order.append(name)
            now[0] += durations[name][sum(1 for n in order if n == name) - 1] * 1e-6

        return fn

    us = block_kernels.time_interleaved_us({n: timed(n) for n in durations}, runs=3, calls=2)
    assert order == ["a", "b"] * 7  # warm-up, then alternating call by call
    assert us["a"] == pytest.approx(12.0) and us["a_best"] == pytest.approx(10.0)
    assert us["b"] == pytest.approx(40.0) and us["b_best"] == pytest.approx(20.0)


def test_rates_give_gflops_the_dense_ratio_and_rows_over_one_row() -> None:
    us = {"blocks": 20.0, "dense": 30.0, "blocks_best": 10.0, "dense_best": 30.0}
    alone = block_kernels.rates(2e6, us)
    assert alone["blocks_gflops"] == 100.0 and alone["dense_best_gflops"] == pytest.approx(66.7)
    assert alone["blocks_over_dense"] == 1.5 and alone["blocks_over_dense_best"] == 3.0
    assert "blocks_over_one_row" not in alone
    with_one = block_kernels.rates(2e6, us | {"blocks_1": 8.0, "dense_1": 12.0})
    assert with_one["blocks_over_one_row"] == 2.5 and with_one["dense_over_one_row"] == 2.5


def test_the_bench_prints_a_line_per_layer_and_a_summary_per_row_count(capsys) -> None:
    block_kernels.main(
        ["--rows", "1,3", "--dtype", "float32", "--types", "Q4_1", "--runs", "1", "--calls", "1"]
    )
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    layers = [line["layer"] for line in lines]
    assert layers == ["qkv", "gate_up", "down", "o", "all"] * 2
    for line in lines:  # timings on a shared machine: their presence, not their size
        assert {"blocks_gflops", "dense_gflops", "blocks_over_dense", "load"} <= line.keys()
        assert ("blocks_over_one_row" in line) == (line["rows"] == 3)
        assert ("dense_over_one_row" in line) == (line["rows"] == 3)


def test_the_int8_activation_bench_runs_and_prints_one_line_per_rows(capsys) -> None:
    from bench import q8_kernels

    q8_kernels.main(["--rows", "1,9", "--dtype", "float32", "--types", "Q4_1", "--runs", "1"])
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(line["type"], line["rows"]) for line in lines] == [("Q4_1", 1), ("Q4_1", 9)]
    for line in lines:  # timings on a shared machine: their presence, not their size
        assert {"q8_gflops", "float_gflops", "q8_over_float", "isa", "load"} <= line.keys()
        assert line["q8_over_float"] > 0
