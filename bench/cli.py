"""`tgserve bench latency|throughput|grammar|serve|soak|burst|short-behind-long|gpu-check`: the
arguments, and the entry `tgserve` calls (gpu-check: bench/gpu_check/).

Contract: `add_arguments(parser)` declares the subcommands (soak's and write-gguf's flags live in
cli_tools.py, gpu-check's in gpu_check/main.py; soak exits 1 when it finds a leak or a 5xx);
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

from bench.backends import BACKENDS
from bench.cli_tools import (
    add_grow_model_arguments,
    add_lora_arguments,
    add_soak_arguments,
    add_write_gguf_arguments,
)
from bench.kv_tiers import add_kv_tier_arguments

DTYPE_CHOICES = ["float32", "bfloat16", "float16"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="bench_command", required=True)
    latency = sub.add_parser("latency", help="batch-1 prefill and decode tok/s")
    _model_args(latency)
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
    _model_args(throughput)
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
    _model_args(grammar)
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
    _output_args(serve)
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


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--model",
        default=None,
        help="HF folder or .gguf file (default: SmolLM2-135M-Instruct), or random:llama3-8b / "
        "random:llama3-1b / random:tiny-llama: that shape with random weights built in memory "
        "(tgserve and transformers: the same seeded weights)",
    )
    p.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", *DTYPE_CHOICES],
        help="auto (default, as the server): float32 on a CPU serving GGUF blocks as stored, "
        "else bfloat16 where the device computes it natively, else float32 on a CPU, float16 "
        "on CUDA; tables name the host's ISA and what auto chose",
    )
    p.add_argument(
        "--backend",
        action="append",
        choices=list(BACKENDS),
        help="repeatable; the first is the reference",
    )
    p.add_argument(
        "--device",
        default="auto",
        help="tgserve and transformers run here, and the limits are measured here: auto (CUDA "
        "when present, as the server), cpu, cuda or cuda:N",
    )
    p.add_argument("--max-num-seqs", type=int, default=64, help="tgserve / vLLM running batch")
    p.add_argument(
        "--max-num-batched-tokens",
        type=int,
        default=2048,
        help="tgserve / vLLM tokens per step (tgserve: the upper bound, as its default)",
    )
    p.add_argument(
        "--target-itl-ms",
        type=float,
        default=None,
        help="tgserve: step-time target (0: off, fixed budget; default: the engine's)",
    )
    p.add_argument(
        "--enable-prefix-caching",
        action="store_true",
        help="off by default: measure compute, not cache hits",
    )
    p.add_argument("--quantization", choices=["int8"], default=None, help="tgserve: int8 weights")
    p.add_argument(
        "--activation-quantization",
        choices=["int8"],
        default=None,
        help="tgserve: int8 activations, integer dot products (CPU)",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "int8"],
        default="auto",
        help="tgserve: K/V cache rows (int8: a scale per token and head, CPU)",
    )
    p.add_argument("--compile", action="store_true", help="tgserve: torch.compile the dense halves")
    p.add_argument(
        "--dequantize",
        action="store_true",
        help="tgserve: dequantise a GGUF to --dtype (default: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K kept as stored)",
    )
    p.add_argument(
        "--disable-cpu-kernels",
        action="store_true",
        help="tgserve: PyTorch ops only (no C++ decode step / attention kernel)",
    )
    p.add_argument(
        "--enforce-eager",
        action="store_true",
        help="tgserve on CUDA: every step eager (no decode CUDA graphs; the CPU never captures)",
    )
    p.add_argument(
        "--batch-invariant",
        action="store_true",
        help="tgserve on CUDA: a row's bits independent of the batch (fixed-tile GEMMs; the CPU "
        "is batch-invariant anyway)",
    )
    _speculative_args(p)
    p.add_argument(
        "--baseline-tree",
        default=None,
        metavar="PATH",
        help="with --backend tgserve-baseline: another tgserve checkout (e.g. made by `git "
        "worktree add /tmp/base COMMIT`), run in its own subprocess on the same model, options "
        "and requests; reported as tgserve@COMMIT",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: torch's choice)"
    )
    p.add_argument(
        "--skip-limits", action="store_true", help="do not measure bandwidth and matmul rates"
    )
    p.add_argument(
        "--quick-limits",
        action="store_true",
        help="measure the limits on small buffers with the GPU method (dry runs: rough figures)",
    )
    p.add_argument(
        "--json-schema",
        type=Path,
        default=None,
        metavar="FILE",
        help="with --backend tgserve-json: every request follows this JSON schema (structured "
        "outputs; bench/schemas/records.json cannot end early, so counts match tgserve's)",
    )
    _output_args(p)


def _speculative_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        default=None,
        help="tgserve: speculative decoding (ngram: prompt lookup); the report adds how many "
        "proposed tokens were accepted, per position",
    )
    p.add_argument("--num-speculative-tokens", type=int, default=None, help="tgserve: k")
    p.add_argument("--speculative-ngram-min", type=int, default=None)
    p.add_argument("--speculative-ngram-max", type=int, default=None)
    p.add_argument("--speculative-model", default=None, help="tgserve: the draft model")


def _output_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when a terminal)",
    )


def run(args: argparse.Namespace) -> int:
    from bench.commands import run_command

    return run_command(args)
