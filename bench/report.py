"""How benchmark results are shown: a readable table, or `--json` with one JSON object per line.

Contract: `emit(results, limits, as_json, stream)` writes the machine limits first (when measured)
then one entry per result, in the order run. JSON lines are `dataclasses.asdict` of the frozen
result (plus `"kind": "machine"` for the limits line, with the derived bandwidth), so fields keep
their names and units: seconds `_s`, milliseconds `_ms`, rates `_tok_s` / `_per_s`, fractions in
[0, 1] (not percent). Tables round for reading; JSON keeps full precision.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, is_dataclass
from typing import Any, TextIO

from bench.grammar_latency import GrammarResult, format_grammar
from bench.latency import LatencyResult
from bench.machine_limits import PROBE_PATTERNS, MachineLimits
from bench.serve_metrics import Percentiles, ServeResult
from bench.throughput import ThroughputResult


def to_json_line(result: Any) -> str:
    data = asdict(result) if is_dataclass(result) else dict(result)
    if isinstance(result, MachineLimits):
        data = {"kind": "machine", **data, "bandwidth_gb_s": result.bandwidth_gb_s}
    return json.dumps(data, separators=(",", ":"))


def emit(
    results: Sequence[Any], limits: MachineLimits | None, as_json: bool, stream: TextIO
) -> None:
    if as_json:
        for item in ([limits] if limits is not None else []) + list(results):
            stream.write(to_json_line(item) + "\n")
        stream.flush()
        return
    parts = [format_limits(limits)] if limits is not None else []
    latency = [r for r in results if isinstance(r, LatencyResult)]
    throughput = [r for r in results if isinstance(r, ThroughputResult)]
    parts += [format_latency(latency)] if latency else []
    parts += [format_throughput(throughput)] if throughput else []
    parts += [format_serve(r) for r in results if isinstance(r, ServeResult)]
    parts += [format_grammar(r) for r in results if isinstance(r, GrammarResult)]
    stream.write("\n\n".join(parts) + "\n")
    stream.flush()


def format_limits(limits: MachineLimits) -> str:
    rates = ", ".join(f"M={r.m}: {r.gflops:.3g}" for r in limits.matmul)
    if limits.device != "cpu":
        return (
            f"Device {limits.device_name or limits.device}: memory bandwidth "
            f"{limits.bandwidth_gb_s:.0f} GB/s (median copy {limits.bandwidth_copy_gb_s:.0f} "
            f"counting read + write, sum {limits.bandwidth_read_gb_s:.0f} reading); "
            f"{limits.dtype} matmul GFLOP/s: peak (square product) "
            f"{limits.peak_matmul_gflops or 0:.4g}, on the model's shapes {rates}"
        )
    return (
        f"Machine ({limits.threads} threads): memory bandwidth {limits.bandwidth_gb_s:.1f} GB/s "
        f"({_probe(limits)}torch copy {limits.bandwidth_copy_gb_s:.1f}, "
        f"sum {limits.bandwidth_read_gb_s:.1f}); "
        f"{limits.dtype} matmul GFLOP/s on the model's shapes: {rates}"
    )


def _probe(limits: MachineLimits) -> str:
    if limits.bandwidth_probe_gb_s is None:
        return ""
    patterns = ", ".join(
        f"{s}{'p' if p else ''} {g:.1f}"
        for (s, p), g in zip(PROBE_PATTERNS, limits.probe_patterns_gb_s, strict=True)
    )
    return f"read probe over 1 GiB, median GB/s by streams per thread (p: prefetch): {patterns}; "


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: Sequence[str]) -> str:  # first column left-aligned, numbers right-aligned
        return "  ".join(
            c.rjust(w) if i else c.ljust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    return "\n".join([line(headers), line(["-" * w for w in widths]), *(line(r) for r in rows)])


def _num(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _load(before: Sequence[float], after: Sequence[float]) -> str:
    return f"{before[0]:.2f} -> {after[0]:.2f}"


def _dtype(r: LatencyResult | ThroughputResult) -> str:
    return f"{r.dtype} (--dtype auto)" if r.dtype_auto else r.dtype


def _host(r: LatencyResult | ThroughputResult) -> str:
    return f"; on {r.host}" if r.host else ""


def format_latency(results: Sequence[LatencyResult]) -> str:
    r0 = results[0]
    title = (
        f"Latency, batch 1: {r0.model} {_dtype(r0)}, {r0.input_len} in / {r0.output_len} out"
        + (f", sampled at temperature {r0.temperature:g} (seeded)" if r0.temperature else "")
        + (", timed in process CPU time" if r0.clock == "process" else "")
        + f", median of {r0.runs} runs{_host(r0)}"
    )
    headers = [
        "backend",
        "prefill tok/s",
        "x",
        "% bound",
        "decode tok/s",
        "x",
        "% bound",
        "decode bound",
        "load 1m",
        "note",
    ]
    rows = [
        [
            r.backend,
            _num(r.prefill_tok_s),
            _num(r.prefill_ratio_vs_first, 2),
            _pct(r.prefill_fraction_of_bound),
            _num(r.decode_tok_s),
            _num(r.decode_ratio_vs_first, 2),
            _pct(r.decode_fraction_of_bound),
            _num(r.decode_bound_tok_s),
            _load(r.load_before, r.load_after),
            r.note,
        ]
        for r in results
    ]
    lines = [_speculation_line(r) for r in results if r.speculation is not None]
    return "\n".join([title, _table(headers, rows), *lines])


def _speculation_line(r: LatencyResult) -> str:
    """Proposed / accepted tokens over the timed runs, and the acceptance rate per position."""
    s = r.speculation
    rates = ", ".join(_pct(s.acceptance_rate_at(i)) for i in range(len(s.proposed_per_position)))
    return (
        f"{r.backend} speculation ({r.workload} prompts): {s.num_accepted_tokens} of "
        f"{s.num_proposed_tokens} proposed tokens accepted ({_pct(s.acceptance_rate)}) in "
        f"{s.num_proposals} proposals; acceptance by position: {rates}"
        + (
            f"; draft model: {s.draft_forwards} forwards, "
            f"{1000 * s.draft_seconds / s.draft_forwards:.2f} ms each"
            if s.draft_forwards
            else ""
        )
    )


def format_throughput(results: Sequence[ThroughputResult]) -> str:
    r0 = results[0]
    title = (
        f"Throughput: {r0.model} {_dtype(r0)}, {r0.num_requests} requests ({r0.dist}), "
        f"{r0.prompt_tokens} prompt + {r0.output_tokens} output tokens{_host(r0)}"
    )
    headers = [
        "backend",
        "req/s",
        "output tok/s",
        "x",
        "total tok/s",
        "elapsed s",
        "% bound",
        "load 1m",
        "note",
    ]
    rows = [
        [
            r.backend,
            _num(r.requests_per_s, 2),
            _num(r.output_tok_s),
            _num(r.output_ratio_vs_first, 2),
            _num(r.total_tok_s),
            _num(r.elapsed_s, 2),
            _pct(r.fraction_of_bound),
            _load(r.load_before, r.load_after),
            r.note,
        ]
        for r in results
    ]
    text = title + "\n" + _table(headers, rows)
    for r in results:
        kv = r.kv_cache
        if kv is not None:
            text += (
                f"\n{r.backend} KV cache: {kv.bytes_per_token} bytes/token (KV heads only; "
                f"{kv.bytes_per_token_all_heads} if repeated per query head), {kv.num_blocks} blocks of "
                f"{kv.block_size}; at peak {kv.peak_blocks_used} blocks for {kv.peak_num_seqs} sequences, "
                f"{kv.peak_cached_tokens} tokens cached, waste {kv.peak_waste_slots} slots "
                f"(worst sequence {kv.max_waste_slots_per_seq}; <= one partial block each: "
                f"{'yes' if kv.waste_within_one_block else 'NO'})"
            )
    return text


def _pcts(name: str, p: Percentiles) -> list[str]:
    return [name, _num(p.mean_ms), _num(p.p50_ms), _num(p.p90_ms), _num(p.p99_ms)]


def format_serve(r: ServeResult) -> str:
    load = "all at once" if r.request_rate is None else f"{r.request_rate:g} req/s (Poisson)"
    title = (
        f"Serving {r.url}: {r.num_requests} requests, {load}, concurrency {r.concurrency or 'unbounded'}; "
        f"{r.completed} completed, {r.failed} failed in {r.duration_s:.2f} s"
    )
    summary = (
        f"{r.requests_per_s:.2f} req/s, output {r.output_tok_s:.1f} tok/s, total {r.total_tok_s:.1f} tok/s; "
        f"ITL p99/p50 = {_num(r.itl_p99_over_p50, 2)}; compute bound {_pct(r.fraction_of_bound)}; "
        f"load {_load(r.load_before, r.load_after)}"
    )
    table = _table(
        ["ms", "mean", "p50", "p90", "p99"],
        [_pcts("TTFT", r.ttft), _pcts("TPOT", r.tpot), _pcts("ITL", r.itl), _pcts("E2E", r.e2e)],
    )
    errors = "".join(f"\n  error: {e}" for e in r.errors)
    merged = ""
    if r.merged_tokens:
        merged = (
            f"\n{r.merged_tokens} of {r.output_tokens} output tokens came inside another token's "
            "chunk (text held back inside a character): each such chunk is one ITL gap of "
            "several steps; --token-logprobs times every token"
        )
    return f"{title}\n{summary}\n{table}{merged}{errors}"
