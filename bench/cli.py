"""`tgserve bench latency|throughput|serve`: measure tgserve, side by side with its peers.

Contract: `add_arguments(parser)` declares the three subcommands; `run(args) -> int` runs one and
prints its results (a table, or `--json`: one JSON object per line, the machine limits first) to
stdout, with a progress bar on stderr when it is a terminal. `--backend` may be repeated
(tgserve, transformers, vllm, llamacpp): every backend runs the same seeded workload in the same
command, and ratios are against the first one named. latency and throughput measure the machine's
limits first (skip with `--skip-limits`) and report each result as a fraction of its bound.
Bad arguments raise ValueError (the CLI prints it and exits 2). Heavy imports happen in `run`.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from pathlib import Path

from bench.backends import BACKENDS

DTYPE_CHOICES = ["float32", "bfloat16", "float16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)
    latency = sub.add_parser("latency", help="batch-1 prefill and decode tok/s")
    _model_args(latency)
    _lengths(latency)
    latency.add_argument("--runs", type=int, default=3, help="timed runs (the median is reported)")
    latency.add_argument("--warmup-runs", type=int, default=1)
    throughput = sub.add_parser("throughput", help="offline: N requests submitted at once")
    throughput.add_argument("--runs", type=int, default=1, help="timed runs per backend (median)")
    _model_args(throughput)
    _workload_args(throughput, default_requests=64)
    throughput.add_argument(
        "--hf-batch-size", type=int, default=16, help="transformers static batch size"
    )
    serve = sub.add_parser(
        "serve", help="streaming load against a running server's /v1/completions"
    )
    serve.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    serve.add_argument(
        "--concurrency",
        type=int,
        default=None,
        help="requests in flight (default 32 without --request-rate)",
    )
    serve.add_argument(
        "--request-rate",
        type=float,
        default=math.inf,
        help="Poisson arrivals per second (default: all at once)",
    )
    serve.add_argument(
        "--model",
        default=None,
        help="the served weights (optional): for text data sets and the compute bound",
    )
    serve.add_argument(
        "--served-model-name",
        default=None,
        help="the request's model field (default: the first of /v1/models)",
    )
    serve.add_argument(
        "--vocab-size",
        type=int,
        default=None,
        help="random prompt ids are drawn below it (default: --model's, else 1000)",
    )
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    serve.add_argument(
        "--long-prompt-every", type=int, default=0, help="every K-th request gets a long prompt"
    )
    serve.add_argument("--long-prompt-len", type=int, default=0)
    serve.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="for the compute bound with --model",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=512,
        help="the server's, for the compute bound",
    )
    _workload_args(serve, default_requests=64)
    _output_args(serve)


def _lengths(p: argparse.ArgumentParser) -> None:
    p.add_argument("--input-len", type=int, default=128, help="prompt tokens per request")
    p.add_argument(
        "--output-len", type=int, default=128, help="tokens decoded per request (EOS ignored)"
    )
    p.add_argument("--seed", type=int, default=0, help="seed of the workload (prompts and lengths)")


def _workload_args(p: argparse.ArgumentParser, default_requests: int) -> None:
    _lengths(p)
    p.add_argument("--num-requests", type=int, default=default_requests)
    p.add_argument(
        "--dist", default="fixed", choices=["fixed", "uniform", "text"], help="length distribution"
    )
    p.add_argument(
        "--range-ratio", type=float, default=0.5, help="uniform: lengths in len * [1 - r, 1 + r]"
    )
    p.add_argument(
        "--dataset", type=Path, default=None, help="--dist text: a UTF-8 file, one prompt per line"
    )


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)"
    )
    p.add_argument("--dtype", default="bfloat16", choices=DTYPE_CHOICES)
    p.add_argument(
        "--backend",
        action="append",
        choices=list(BACKENDS),
        help="repeatable; the first is the reference",
    )
    p.add_argument("--max-num-seqs", type=int, default=64, help="tgserve / vLLM running batch")
    p.add_argument(
        "--max-num-batched-tokens", type=int, default=512, help="tgserve / vLLM tokens per step"
    )
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="off by default: measure compute, not cache hits",
    )
    p.add_argument("--quantization", choices=["int8"], default=None, help="tgserve: int8 weights")
    p.add_argument("--compile", action="store_true", help="tgserve: torch.compile the dense halves")
    p.add_argument(
        "--disable-cpu-kernels",
        action="store_true",
        help="tgserve: PyTorch ops only (no C++ decode step / attention kernel)",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    p.add_argument(
        "--skip-limits", action="store_true", help="do not measure bandwidth and matmul rates"
    )
    _output_args(p)


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when a terminal)",
    )


def run(args: argparse.Namespace) -> int:
    from bench.progress import enabled_by_default
    from bench.report import emit

    show_progress = enabled_by_default() if args.progress is None else args.progress
    _warn_if_busy()
    if args.bench_command == "serve":
        results, limits = _run_serve(args, show_progress)
    else:
        results, limits = _run_offline(args, show_progress)
    emit(results, limits, args.json, sys.stdout)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


def _warn_if_busy() -> None:
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    print(f"load average before: {load:.2f} ({cores} cores)", file=sys.stderr)
    if load > 0.5 * cores:
        print("warning: the machine is busy; figures will be low and noisy", file=sys.stderr)


def _run_offline(args: argparse.Namespace, show_progress: bool):
    from bench.backends import BackendOptions
    from bench.latency import LatencySpec, run_latency_bench
    from bench.machine_limits import measure_machine_limits
    from bench.model_source import resolve_model
    from bench.throughput import decode_batch, run_throughput_bench

    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    names = list(dict.fromkeys(args.backend or ["tgserve"]))
    source = resolve_model(args.model)
    if args.bench_command == "latency":
        spec = LatencySpec(args.input_len, args.output_len, args.runs, args.warmup_runs, args.seed)
        num_requests, max_len = 1, args.input_len + args.output_len
        batched_tokens = max(args.max_num_batched_tokens, args.input_len)  # prefill in one step
    else:
        spec = _workload_spec(args)
        num_requests, max_len, batched_tokens = (
            args.num_requests,
            spec.max_request_len(),
            args.max_num_batched_tokens,
        )
    options = BackendOptions(
        dtype=args.dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=batched_tokens,
        hf_batch_size=getattr(args, "hf_batch_size", 1),
        enable_prefix_caching=args.enable_prefix_caching,
        max_model_len=max_len,
        num_requests=num_requests,
        quantization=args.quantization,
        compile=args.compile,
        cpu_kernels=not args.disable_cpu_kernels,
    )
    limits = None
    if args.bench_command == "latency":
        if not args.skip_limits:
            limits = measure_machine_limits(source.config, args.dtype, (1, args.input_len))
        return run_latency_bench(names, source, options, spec, limits, show_progress), limits
    if not args.skip_limits:
        limits = measure_machine_limits(
            source.config, args.dtype, (1, decode_batch(options), batched_tokens)
        )
    tokenizer = _tokenizer(source.path) if spec.dist == "text" else None
    return run_throughput_bench(
        names, source, options, spec, limits, show_progress, tokenizer, args.runs
    ), limits


def _workload_spec(args: argparse.Namespace):
    from bench.workload import WorkloadSpec

    return WorkloadSpec(
        num_requests=args.num_requests,
        input_len=args.input_len,
        output_len=args.output_len,
        dist=args.dist,
        seed=args.seed,
        range_ratio=args.range_ratio,
        dataset=args.dataset,
        long_prompt_every=getattr(args, "long_prompt_every", 0),
        long_prompt_len=getattr(args, "long_prompt_len", 0),
    )


def _tokenizer(path: Path):
    from models.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _run_serve(args: argparse.Namespace, show_progress: bool):
    from bench.machine_limits import measure_machine_limits, min_compute_seconds
    from bench.model_source import resolve_model
    from bench.progress import ProgressBar
    from bench.serve_load import LoadSpec, discover_model, run_load
    from bench.serve_metrics import summarize_run
    from bench.workload import make_workload

    concurrency = (
        args.concurrency
        if args.concurrency is not None or not math.isinf(args.request_rate)
        else 32
    )
    spec = _workload_spec(args)
    if spec.dist == "text" and not args.model:
        raise ValueError("--dist text needs --model: its tokenizer turns the lines into prompts")
    source = resolve_model(args.model) if args.model else None
    vocab = args.vocab_size or (source.config.vocab_size if source else 1000)
    tokenizer = _tokenizer(source.path) if source and spec.dist == "text" else None
    requests = make_workload(spec, vocab, tokenizer)
    model_name = args.served_model_name or discover_model(args.url, args.api_key)
    load_spec = LoadSpec(
        args.url, concurrency, args.request_rate, args.seed, model_name, args.timeout, args.api_key
    )
    with ProgressBar("serve", len(requests), show_progress) as bar:
        load_before = os.getloadavg()
        records, duration = run_load(load_spec, requests, bar.update)
        load_after = os.getloadavg()
    limits = bound = None
    if source is not None:
        decode_m = min(concurrency or len(requests), len(requests))
        limits = measure_machine_limits(
            source.config, args.dtype, (decode_m, args.max_num_batched_tokens)
        )
        good = [r for r in records if r.ok]
        bound = min_compute_seconds(
            limits,
            source.config,
            sum(r.prompt_tokens for r in good),
            sum(r.output_tokens for r in good),
            args.max_num_batched_tokens,
            decode_m,
        )
    return [summarize_run(load_spec, records, duration, load_before, load_after, bound)], limits
