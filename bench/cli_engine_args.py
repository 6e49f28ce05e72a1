"""The flags every measuring `tgserve bench` subcommand shares (bench/cli.py declares the
subcommands): `add_model_arguments(p)` -- the model, dtype, backends, device and the tgserve engine
options a run is measured under (batching, quantization, K/V dtype, kernels, speculation, the
baseline tree, threads, the machine-limit probes) plus the output flags; `add_output_arguments(p)`
-- `--json` and `--progress` alone (bench serve, which measures a running server).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from bench.backends import BACKENDS

DTYPE_CHOICES = ["float32", "bfloat16", "float16"]


def add_model_arguments(p: argparse.ArgumentParser) -> None:
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
        choices=["auto", "none", "int8", "int16"],
        default="auto",
        help="tgserve: auto (int16 against a GGUF's Q4_0/Q4_1/Q8_0 blocks on an AVX2 CPU without "
        "AVX-512, else float) | none | int8 | int16",
    )
    p.add_argument(
        "--kv-cache-dtype",
        choices=["auto", "int8", "fp8", "float16", "int8v"],
        default="auto",
        help="tgserve: K/V cache rows (int8: a scale per token and head, CPU; fp8: e4m3, CUDA; "
        "float16: a float32 model's K/V rounded to float16, CPU; int8v: float16 K, int8 V, CPU)",
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
    add_output_arguments(p)


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


def add_output_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="one JSON object per line instead of tables")
    p.add_argument(
        "--progress",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="progress bar on stderr (default: when a terminal)",
    )
