"""What `tgserve bench latency|throughput|grammar|serve|soak` runs, once bench/cli.py parsed the arguments.

Contract: `run_command(args) -> int` warns on stderr when the machine is already busy, runs the
offline benchmarks (latency, throughput: backends loaded in this process) or the serving load
(serve: streams against a running server's /v1/completions), measures the machine's limits when
asked, and emits the results on stdout (report.py), and with `--plot PATH` a PNG of them
(plots.py; matplotlib is checked before the run); `serve --sweep` runs one load per point
(sweep.py); soak, burst and short-behind-long run from bench/server_probes.py. Bad arguments
raise ValueError.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from bench.backends import BackendOptions
from bench.grammar_latency import run_grammar_bench
from bench.host_label import bench_device, labelled, resolved_dtype
from bench.latency import LatencyResult, LatencySpec, run_latency_bench
from bench.machine_limits import MachineLimits, measure_machine_limits, min_compute_seconds
from bench.model_source import resolve_model
from bench.plots import plot_results, require_matplotlib
from bench.progress import ProgressBar, enabled_by_default
from bench.report import emit
from bench.serve_load import LoadSpec, discover_model, discover_vocab_size, run_load
from bench.serve_metrics import ServeResult, summarize_run
from bench.server_probes import run_probe_command, run_soak_command
from bench.sweep import parse_sweep, run_sweep
from bench.throughput import ThroughputResult, decode_batch, run_throughput_bench
from bench.workload import WorkloadSpec, make_workload
from engine import speculative_config
from models.linear_backend import release_onednn_isa

if TYPE_CHECKING:
    from models.tokenizer import Tokenizer

# serve's prompt ids are drawn below the served vocabulary (--vocab-size, --model's, or what the
# server states at /info); below this one only when none of them is known. Ids this low are
# mostly byte tokens, whose answers often end inside a UTF-8 character.
FALLBACK_VOCAB = 1000


def run_command(args: argparse.Namespace) -> int:
    if args.bench_command == "write-gguf":
        from bench.random_gguf import write_random_gguf

        path = write_random_gguf(args.out, args.type, args.shape, args.vocab_from, args.seed)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")
        return 0
    if args.bench_command == "grow-model":
        from bench.grown_model import write_grown_gguf

        path = write_grown_gguf(args.out, args.extra_layers, args.noise, args.source, args.seed)
        print(f"wrote {path} ({path.stat().st_size / 2**20:.0f} MiB)")
        return 0
    if args.bench_command == "lora":
        from bench.lora_speed import run_lora_bench

        return run_lora_bench(args)
    if args.bench_command == "soak":
        return run_soak_command(args)
    if args.bench_command == "gpu-check":
        from bench.gpu_check.main import run

        return run(args)
    if args.bench_command == "kv-tiers":
        from bench.kv_tiers import run

        return run(args)
    if args.bench_command in ("burst", "short-behind-long"):
        return run_probe_command(args)
    show_progress = enabled_by_default() if args.progress is None else args.progress
    plot_path = getattr(args, "plot", None)
    if plot_path is not None:
        require_matplotlib()  # before the run, not after minutes of it
    _warn_if_busy()
    if args.bench_command == "serve":
        sweep = parse_sweep(args.sweep) if args.sweep else None
        results, limits = (
            run_sweep(args, sweep, partial(_run_serve, show_progress=show_progress))
            if sweep
            else _run_serve(args, show_progress)
        )
    else:
        results, limits = _run_offline(args, show_progress)
    emit(results, limits, args.json, sys.stdout)
    if plot_path is not None:
        serve = args.bench_command == "serve"
        label = (args.label or args.url.split("://", 1)[-1].rstrip("/")) if serve else ""
        print(f"wrote {plot_results(results, plot_path, label)}", file=sys.stderr)
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0


def _warn_if_busy() -> None:
    load = os.getloadavg()[0]
    cores = os.cpu_count() or 1
    print(f"load average before: {load:.2f} ({cores} cores)", file=sys.stderr)
    if load > 0.5 * cores:
        print("warning: the machine is busy; figures will be low and noisy", file=sys.stderr)


def _run_offline(
    args: argparse.Namespace, show_progress: bool
) -> tuple[list[LatencyResult] | list[ThroughputResult], MachineLimits | None]:
    if args.threads is not None:
        import torch

        torch.set_num_threads(args.threads)
    names = list(dict.fromkeys(args.backend or ["tgserve"]))
    if {"vllm", "transformers"} & set(names) and release_onednn_isa():
        print("oneDNN's AMX kernels left on for the in-process peers", file=sys.stderr)
    if ("tgserve-baseline" in names) != bool(args.baseline_tree):
        raise ValueError(
            "--backend tgserve-baseline and --baseline-tree PATH go together: the baseline "
            "backend runs the checkout at PATH (e.g. `git worktree add /tmp/base COMMIT`)"
        )
    grammar = args.bench_command == "grammar"
    if grammar and args.json_schema is None:
        raise ValueError("bench grammar needs --json-schema FILE")
    if not grammar and ("tgserve-json" in names) != (args.json_schema is not None):
        raise ValueError("--backend tgserve-json and --json-schema FILE go together")
    json_schema = args.json_schema.read_text() if args.json_schema is not None else None
    source = resolve_model(args.model)
    device = bench_device(args.device)
    dtype = resolved_dtype(args.dtype, device, _blocks_as_stored(args, source, device))
    if grammar:
        spec = None
        num_requests, max_len, batched_tokens = 1, args.input_len + 1, args.max_num_batched_tokens
    elif args.bench_command == "latency":
        spec = LatencySpec(
            args.input_len,
            args.output_len,
            args.runs,
            args.warmup_runs,
            args.seed,
            args.workload,
            args.temperature,
            args.clock,
        )
        spec.check_fits(source.config.max_position_embeddings)  # before any weights load
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
        dtype=dtype,
        max_num_seqs=args.max_num_seqs,
        max_num_batched_tokens=batched_tokens,
        hf_batch_size=getattr(args, "hf_batch_size", 1),
        enable_prefix_caching=args.enable_prefix_caching,
        max_model_len=max_len,
        num_requests=num_requests,
        quantization=args.quantization,
        activation_quantization=args.activation_quantization,
        kv_cache_dtype=args.kv_cache_dtype,
        compile=args.compile,
        cpu_kernels=not args.disable_cpu_kernels,
        dequantize=args.dequantize,
        enforce_eager=args.enforce_eager,
        batch_invariant=args.batch_invariant,
        baseline_tree=args.baseline_tree,
        target_itl_ms=args.target_itl_ms,
        json_schema=json_schema,
        device=args.device,
        speculative=speculative_config(
            args.speculative,
            args.num_speculative_tokens,
            args.speculative_ngram_min,
            args.speculative_ngram_max,
            args.speculative_model,
        ),
    )
    limits = None
    if grammar:
        result = run_grammar_bench(
            source, options, json_schema, args.runs, args.input_len, args.seed
        )
        return [result], None
    if args.bench_command == "latency":
        if not args.skip_limits:
            limits = measure_machine_limits(
                source.config, dtype, (1, args.input_len), device, args.quick_limits
            )
        results = run_latency_bench(names, source, options, spec, limits, show_progress)
        return labelled(results, device, args.dtype), limits
    if not args.skip_limits:
        ms = (1, decode_batch(options), batched_tokens)
        limits = measure_machine_limits(source.config, dtype, ms, device, args.quick_limits)
    tokenizer = _tokenizer(source.path) if spec.dist == "text" else None
    results = run_throughput_bench(
        names, source, options, spec, limits, show_progress, tokenizer, args.runs
    )
    return labelled(results, device, args.dtype), limits


def _blocks_as_stored(args: argparse.Namespace, source, device: str) -> bool:
    """The engine's own answer (engine.serves_blocks_as_stored) for this model and these flags:
    whether tgserve runs its GGUF blocks on the float block kernels (auto picks float32 then)."""
    if source.gguf_file is None:
        return False
    from engine import EngineConfig, serves_blocks_as_stored

    flags = EngineConfig(
        dequantize=args.dequantize,
        quantization=args.quantization,
        activation_quantization=args.activation_quantization,
        cpu_kernels=not args.disable_cpu_kernels,
    )
    return serves_blocks_as_stored(source.gguf_file, flags, device)


def _workload_spec(args: argparse.Namespace) -> WorkloadSpec:
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


def _tokenizer(path: Path) -> Tokenizer:
    from models.tokenizer import load_tokenizer

    return load_tokenizer(path)


def _run_serve(
    args: argparse.Namespace, show_progress: bool
) -> tuple[list[ServeResult], MachineLimits | None]:
    concurrency = (
        args.concurrency
        if args.concurrency is not None or not math.isinf(args.request_rate)
        else 32
    )
    spec = _workload_spec(args)
    if spec.dist == "text" and not args.model:
        raise ValueError("--dist text needs --model: its tokenizer turns the lines into prompts")
    source = resolve_model(args.model) if args.model else None
    model_name = args.served_model_name or discover_model(args.url, args.api_key)
    vocab = (
        args.vocab_size
        or (source.config.vocab_size if source else None)
        or discover_vocab_size(args.url, args.api_key)
        or FALLBACK_VOCAB
    )
    tokenizer = _tokenizer(source.path) if source and spec.dist == "text" else None
    requests = make_workload(spec, vocab, tokenizer)
    load_spec = LoadSpec(
        args.url,
        concurrency,
        args.request_rate,
        args.seed,
        model_name,
        args.timeout,
        args.api_key,
        token_logprobs=args.token_logprobs,
    )
    with ProgressBar("serve", len(requests), show_progress) as bar:
        load_before = os.getloadavg()
        records, duration = run_load(load_spec, requests, bar.update)
        load_after = os.getloadavg()
    limits = bound = None
    if source is not None:
        decode_m = min(concurrency or len(requests), len(requests))
        limits = measure_machine_limits(
            source.config,
            args.dtype,
            (decode_m, args.max_num_batched_tokens),
            device=bench_device(args.device),
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
