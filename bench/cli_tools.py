"""Arguments of bench's auxiliary subcommands (bench/cli.py declares the benchmarks themselves):
`soak` (a long run at a fixed rate against a running server, bench/soak.py), `lora` (bench/lora_speed.py) and `write-gguf`
(a GGUF file with random weights in a real model's shape, bench/random_gguf.py).

Contract: `add_soak_arguments(parser)` and `add_write_gguf_arguments(parser)` declare the flags
on the subcommand's parser; commands.py runs them.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_write_gguf_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the .gguf file to write")
    p.add_argument("--type", default="Q4_1", help="GGML type of the matrices, e.g. Q4_1, Q8_0")
    p.add_argument(
        "--shape", default="llama-3.2-1b", help="model shape (llama-3.2-1b, qwen3-moe-0.5b)"
    )
    p.add_argument(
        "--vocab-from",
        type=Path,
        default=None,
        help="GGUF whose tokenizer to copy (default model's)",
    )
    p.add_argument("--seed", type=int, default=0)


def add_grow_model_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, required=True, help="the .gguf file to write")
    p.add_argument("--extra-layers", type=int, default=60, help="layers added between the source's")
    p.add_argument(
        "--noise",
        type=float,
        default=0.03,
        help="std of the new layers' output projections (0: the source's function exactly)",
    )
    p.add_argument("--source", type=Path, default=None, help="Llama GGUF to grow (default model's)")
    p.add_argument("--seed", type=int, default=0)


def add_soak_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the server's base URL")
    p.add_argument("--duration", type=float, default=600.0, help="seconds of load")
    p.add_argument("--request-rate", type=float, default=4.0, help="requests per second (fixed)")
    p.add_argument(
        "--disconnect-fraction", type=float, default=0.2, help="clients leaving mid-stream"
    )
    p.add_argument("--prompt-len", type=int, default=32, help="random prompt tokens")
    p.add_argument("--max-tokens", type=int, default=64, help="tokens per request (EOS ignored)")
    p.add_argument("--vocab-size", type=int, default=1000, help="prompt ids are drawn below it")
    p.add_argument("--max-in-flight", type=int, default=256, help="arrivals beyond are skipped")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    p.add_argument("--sample-interval", type=float, default=2.0, help="seconds between samples")
    p.add_argument("--window", type=float, default=60.0, help="seconds per report window")
    p.add_argument("--drain", type=float, default=60.0, help="seconds to wait for idle after")
    p.add_argument(
        "--pid", type=int, default=None, help="read RSS / FDs from /proc/PID, not /metrics"
    )
    p.add_argument("--max-rss-slope", type=float, default=8.0, help="MB/min, second half")
    p.add_argument("--max-fd-growth", type=int, default=8, help="open FDs, idle to idle")
    p.add_argument("--model", default=None, help="the request's model field (default: none)")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", action="store_true", help="one JSON object instead of a table")


def add_lora_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default=None, help="HF folder or GGUF (default: the default model)")
    p.add_argument("--adapters", type=int, default=8, help="random adapters (default 8)")
    p.add_argument("--rank", type=int, default=16, help="their rank (default 16)")
    p.add_argument("--requests", type=int, default=64, help="offline requests (default 64)")
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=128)
    p.add_argument("--decode-tokens", type=int, default=64, help="batch-1 decode steps timed")
    p.add_argument("--repeats", type=int, default=2, help="runs of each, best kept (default 2)")
    p.add_argument("--dtype", default="auto")
