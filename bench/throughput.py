"""`tgserve bench throughput`: offline throughput of N requests submitted at once, per backend.

Contract: `run_throughput_bench(names, source, options, spec, limits, show_progress)` builds one
seeded workload (workload.py) and runs it on each backend in turn (after a small untimed warm-up
request, so one-off kernel selection is not timed). Reported: requests/s, output tok/s (generated
tokens / wall time) and total tok/s ((prompt + generated) / wall time), the ratio of output tok/s
to the first backend's, and with `limits` the fraction of the compute bound: the minimal time the
run's matmul FLOPs take at the measured rates (prompt tokens at M = max_num_batched_tokens, output
tokens at M = the decode batch) divided by the measured time. tgserve also reports its KV cache
figures (kv_usage.py). Load averages are taken just before and after each timed run.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace

from bench.backends import BackendOptions, ThroughputSample, load_backend, report_note
from bench.kv_usage import KvCacheFigures
from bench.machine_limits import MachineLimits, min_compute_seconds
from bench.model_source import ModelSource
from bench.progress import ProgressBar
from bench.workload import BenchRequest, WorkloadSpec, make_workload


@dataclass(frozen=True)
class ThroughputResult:
    kind: str  # "throughput"
    backend: str
    model: str
    dtype: str
    num_requests: int
    dist: str
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float
    requests_per_s: float
    output_tok_s: float
    total_tok_s: float
    output_ratio_vs_first: float
    bound_s: float | None  # minimal matmul time of this run's tokens at the measured rates
    fraction_of_bound: float | None  # bound_s / elapsed_s
    kv_cache: KvCacheFigures | None
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    note: str
    host: str = ""  # the CPU's ISA or the GPU's name (bench/host_label.py)
    dtype_auto: bool = False  # `dtype` is what --dtype auto resolved to


def decode_batch(options: BackendOptions) -> int:
    """Rows a decode step of tgserve / vLLM carries at best in this run."""
    return min(options.num_requests, options.max_num_seqs)


def run_throughput_bench(
    names: list[str],
    source: ModelSource,
    options: BackendOptions,
    spec: WorkloadSpec,
    limits: MachineLimits | None,
    show_progress: bool,
    tokenizer=None,
    runs: int = 1,
) -> list[ThroughputResult]:
    """Each backend runs the workload `runs` times; the run of median elapsed time is reported."""
    requests = make_workload(spec, source.config.vocab_size, tokenizer)
    warmup = [BenchRequest(requests[0].prompt_token_ids[:8], 4)]
    results: list[ThroughputResult] = []
    for name in names:
        backend = load_backend(name, source, options)
        try:
            backend.run_throughput(warmup, lambda _n: None)
            load_before = os.getloadavg()
            samples = []
            for run in range(runs):
                label = f"throughput {name}" + (f" run {run + 1}/{runs}" if runs > 1 else "")
                with ProgressBar(label, len(requests), show_progress) as bar:
                    samples.append(backend.run_throughput(requests, bar.update))
            load_after = os.getloadavg()
            sample = sorted(samples, key=lambda s: s.elapsed_s)[len(samples) // 2]
            results.append(
                _result(
                    backend.name,
                    source,
                    options,
                    spec,
                    sample,
                    limits,
                    load_before,
                    load_after,
                    report_note(backend),
                )
            )
        finally:
            backend.close()
    first = results[0]
    return [replace(r, output_ratio_vs_first=r.output_tok_s / first.output_tok_s) for r in results]


def _result(
    name: str,
    source: ModelSource,
    options: BackendOptions,
    spec: WorkloadSpec,
    sample: ThroughputSample,
    limits: MachineLimits | None,
    load_before: tuple[float, float, float],
    load_after: tuple[float, float, float],
    note: str,
) -> ThroughputResult:
    bound = None
    if limits is not None:
        bound = min_compute_seconds(
            limits,
            source.config,
            sample.prompt_tokens,
            sample.output_tokens,
            prefill_m=options.max_num_batched_tokens,
            decode_m=decode_batch(options),
        )
    elapsed = sample.elapsed_s
    return ThroughputResult(
        kind="throughput",
        backend=name,
        model=source.name,
        dtype=options.dtype,
        num_requests=sample.num_requests,
        dist=spec.dist,
        prompt_tokens=sample.prompt_tokens,
        output_tokens=sample.output_tokens,
        elapsed_s=elapsed,
        requests_per_s=sample.num_requests / elapsed,
        output_tok_s=sample.output_tokens / elapsed,
        total_tok_s=(sample.prompt_tokens + sample.output_tokens) / elapsed,
        output_ratio_vs_first=1.0,
        bound_s=bound,
        fraction_of_bound=bound / elapsed if bound is not None else None,
        kv_cache=sample.kv_cache,
        load_before=load_before,
        load_after=load_after,
        note=note,
    )
