"""`tgserve bench latency|throughput|grammar|serve|soak|burst|short-behind-long|gpu-check`: the
arguments, and the entry `tgserve` calls (gpu-check: bench/gpu_check/).

Contract: `add_arguments(parser)` declares the subcommands (soak's and write-gguf's flags live in
cli_tools.py, gpu-check's in gpu_check/main.py, the model and engine flags the measuring
subcommands share in cli_engine_args.py; soak exits 1 when it finds a leak or a 5xx);
`run(args) -> int` runs one
(commands.py) and prints its results (a table, or `--json`: one JSON object per line, the machine
limits first) to stdout, with a progress bar on stderr when it is a terminal. `--backend` may be
repeated (tgserve, transformers, vllm, llamacpp, tgserve-baseline): every backend runs the same
seeded workload in the same command, and ratios are against the first one named. To measure a
change against the previous build in one command, check that build out (`git worktree add
/tmp/base COMMIT`) and add `--backend tgserve-baseline --baseline-tree /tmp/base`: it runs that
checkout's own tgserve backend in a subprocess (bench/backends/tgserve_baseline.py). latency
and throughput measure the machine's limits first (skip with `--skip-limits`) and report each
result as a fraction of its bound. Bad arguments raise ValueError (the CLI prints it and exits
2). server/cli.py imports this module only when the `bench` subcommand is asked for; heavy
imports happen in `run`.
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from bench.cli_engine_args import DTYPE_CHOICES, add_model_arguments, add_output_arguments
from bench.cli_tools import (
    add_grow_model_arguments,
    add_lora_arguments,
    add_soak_arguments,
    add_write_gguf_arguments,
)
from bench.kv_tiers import add_kv_tier_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)
    latency = sub.add_parser("latency", help="batch-1 prefill and decode tok/s")
    add_model_arguments(latency)
    _lengths(latency)
    latency.add_argument("--runs", type=int, default=3, help="timed runs (the median is reported)")
    latency.add_argument("--warmup-runs", type=int, default=1)
    latency.add_argument(
        "--workload",
        default="random",
        choices=["random", "edit"],
        help="random: seeded random token ids; edit: prompts asking to rewrite a passage they "
        "hold with one edit (bench/edit_workload.py; input-grounded, where --speculative ngram "
        "helps)",
    )
    latency.add_argument(
        "--temperature",
        type=float,
        default=0.0,
        help="tgserve: sample every request at this temperature, seeded (seed + i), instead of "
        "greedy; random prompts at 1.0 show what refused n-gram proposals cost",
    )
    latency.add_argument(
        "--clock",
        default="wall",
        choices=["wall", "process"],
        help="tgserve, llamacpp: time with the wall clock, or the process's CPU time (a shared "
        "machine: with --threads 1 it counts the work, not the wait for a core)",
    )
    _plot_arg(latency, "bars of prefill and decode tok/s per backend, with the machine bounds")
    throughput = sub.add_parser("throughput", help="offline: N requests submitted at once")
    throughput.add_argument("--runs", type=int, default=1, help="timed runs per backend (median)")
    add_model_arguments(throughput)
    _workload_args(throughput, default_requests=64)
    throughput.add_argument(
        "--hf-batch-size", type=int, default=16, help="transformers static batch size"
    )
    _plot_arg(throughput, "bars of output tok/s per backend, with the machine bound")
    grammar = sub.add_parser(
        "grammar", help="first-token latency a JSON schema adds (new: compiled; cached)"
    )
    grammar.add_argument("--runs", type=int, default=20, help="timed requests of each kind")
    grammar.add_argument("--input-len", type=int, default=64, help="prompt tokens per request")
    grammar.add_argument("--seed", type=int, default=0, help="seed of the random prompts")
    add_model_arguments(grammar)
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
        help="random prompt ids are drawn below it (default: --model's, else the server's "
        "from /info, else 1000)",
    )
    serve.add_argument("--api-key", default=None)
    serve.add_argument("--timeout", type=float, default=600.0, help="seconds per request")
    serve.add_argument(
        "--long-prompt-every", type=int, default=0, help="every K-th request gets a long prompt"
    )
    serve.add_argument("--long-prompt-len", type=int, default=0)
    serve.add_argument(
        "--token-logprobs",
        action="store_true",
        help="ask for logprobs 0, so every token comes in its own chunk (also while the server "
        "holds back a character's text): ITL per token",
    )
    serve.add_argument(
        "--dtype",
        default="bfloat16",
        choices=DTYPE_CHOICES,
        help="for the compute bound with --model",
    )
    serve.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="the server's, for the compute bound",
    )
    serve.add_argument(
        "--device",
        default="auto",
        help="where the server runs, for the compute bound with --model (auto: CUDA when present)",
    )
    serve.add_argument(
        "--sweep",
        default=None,
        metavar="NAME=V1,V2,...",
        help="run the load once per point: concurrency=1,2,4,8 or request-rate=0.5,1,2 "
        "(bench/sweep.py)",
    )
    serve.add_argument(
        "--label",
        default=None,
        help="the backend's name in --plot's legend (default: the URL's host:port)",
    )
    _plot_arg(serve, "TTFT and ITL p50/p99 vs output tok/s, a point per sweep value")
    _workload_args(serve, default_requests=64)
    add_output_arguments(serve)
    add_write_gguf_arguments(
        sub.add_parser(
            "write-gguf",
            help="a GGUF with random weights in a real model's shape (bench/random_gguf.py)",
        )
    )
    add_grow_model_arguments(
        sub.add_parser(
            "grow-model",
            help="the default model grown deeper, agreeing with it often (a target for "
            "--speculative draft; bench/grown_model.py)",
        )
    )
    from bench.gpu_check.main import add_arguments as gpu_check_arguments

    gpu_check_arguments(
        sub.add_parser(
            "gpu-check",
            help="on a GPU machine: install carried wheels, benchmarks against the measured "
            "bounds, CUDA suite, profile; one report (gpu/check.sh; --tiny: a CPU dry run)",
        )
    )
    add_lora_arguments(
        sub.add_parser(
            "lora",
            help="LoRA adapters' cost: offline and batch-1 decode with random adapters against "
            "the base model in the same run (bench/lora_speed.py)",
        )
    )
    add_soak_arguments(
        sub.add_parser("soak", help="a long run at a fixed rate: fails on leaks or 5xx")
    )
    _burst_args(sub.add_parser("burst", help="N simultaneous requests: 429 arithmetic and latency"))
    _probe_args(
        sub.add_parser(
            "short-behind-long", help="TTFT of a short request while long prompts prefill"
        )
    )
    add_kv_tier_arguments(
        sub.add_parser(
            "kv-tiers", help="TTFT of a conversation re-sent from the RAM / disk K/V tier vs cold"
        )
    )


def _plot_arg(p: argparse.ArgumentParser, what: str) -> None:
    p.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help=f"write a PNG: {what} (needs the plot extra: pip install 'tgserve[plot]')",
    )


def _burst_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--num-requests", type=int, default=40, help="requests sent at once")
    p.add_argument(
        "--in-flight",
        type=int,
        default=None,
        help="the server's --max-num-seqs + --max-queued-requests: checks 429s = N - this",
    )
    p.add_argument("--prompt-len", type=int, default=16, help="random prompt tokens")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (EOS ignored)")
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", default=None, help="the request's model field (default: none)")
    p.add_argument("--seed", type=int, default=0)


def _probe_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--num-long", type=int, default=4, help="long prompts sent at once")
    p.add_argument(
        "--long-len", type=int, default=8190, help="their tokens (they generate one more)"
    )
    p.add_argument("--short-len", type=int, default=5, help="the short request's prompt tokens")
    p.add_argument("--delay", type=float, default=5.0, help="seconds between longs and short")
    p.add_argument(
        "--long-stream",
        choices=("both", "true", "false"),
        default="both",
        help="the long requests' stream setting (both: a set of runs each)",
    )
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--model", default=None, help="the request's model field (default: none)")
    p.add_argument("--seed", type=int, default=0)


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


def run(args: argparse.Namespace) -> int:
    from bench.commands import run_command

    return run_command(args)
