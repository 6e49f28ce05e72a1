"""The seam between the benchmarks and the engines they measure (tgserve and its peers).

Contract: `load_backend(name, source, options)` imports the backend's module only then (peers are
optional extras, never dependencies) and returns a `Backend`; a peer that is not installed raises
`BackendUnavailable` (a ValueError) saying how to install it. Every backend:
- decodes exactly `request.output_len` tokens per request whatever the model samples (EOS is
  ignored), greedily, so all backends do the same work on the same token ids;
- `run_latency(request)` runs one request alone and times its prefill (submission to first
  token) and its decode (first to last token);
- `run_throughput(requests, on_finished)` submits all requests the way that backend serves best
  and times the whole run; `on_finished(n)` is called as requests complete (progress bars);
- `close()` frees the model, so the next backend in the same command has the memory.
`load_backend` measures this process's RSS around the load (bench/load_memory.py) and sets it as
`backend.load_memory`; a backend may set `held` (name -> bytes it knows it holds: weights, KV
cache) so the report splits the RSS growth into them and the rest.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from bench.kv_usage import KvCacheFigures
from bench.load_memory import LoadMemory, measure_load, render
from bench.model_source import ModelSource
from bench.workload import BenchRequest

BACKENDS: dict[str, str] = {
    "tgserve": "bench.backends.tgserve",
    "tgserve-serial": "bench.backends.tgserve_serial",
    "tgserve-json": "bench.backends.tgserve_json",  # every request under --json-schema
    "tgserve-baseline": "bench.backends.tgserve_baseline",  # another checkout, in a subprocess
    "tgserve-tp2": "bench.backends.tgserve_tp",  # tensor parallel over 2 ranks
    "transformers": "bench.backends.transformers",
    "vllm": "bench.backends.vllm",
    "llamacpp": "bench.backends.llamacpp",
}


class BackendUnavailable(ValueError):
    """A peer backend's package is not installed here."""


@dataclass(frozen=True)
class BackendOptions:
    dtype: str  # "float32" | "bfloat16" | "float16"
    max_num_seqs: int  # tgserve / vLLM running batch
    max_num_batched_tokens: int  # tgserve / vLLM token budget per step
    hf_batch_size: int  # transformers static batch
    enable_prefix_caching: bool
    max_model_len: int  # the longest request (prompt + output) this run holds
    num_requests: int  # so queues are sized for the whole run
    quantization: str | None = None  # tgserve: None | "int8"
    # tgserve: "auto" | None ("none") | "int8" | "int16" (engine/activation_choice.py)
    activation_quantization: str | None = "auto"
    kv_cache_dtype: str = "auto"  # tgserve: "auto" | "int8" | "float16" | "int8v" (kv_quant.py)
    compile: bool = False  # tgserve: torch.compile the blocks' dense halves
    cpu_kernels: bool = True  # tgserve: the C++ decode step and attention kernel on CPU
    dequantize: bool = False  # tgserve: a GGUF dequantised to dtype (default: blocks as stored)
    enforce_eager: bool = False  # tgserve: no decode CUDA graphs on CUDA
    batch_invariant: bool = False  # tgserve on CUDA: the fixed-tile GEMMs, no split decode
    baseline_tree: str | None = None  # tgserve-baseline: the checkout to compare against
    target_itl_ms: float | None = None  # tgserve: step-time target; None: default, 0: off
    json_schema: str | None = None  # tgserve-json: the schema (JSON text) every request follows
    device: str = (
        "auto"  # tgserve and transformers: "auto" (CUDA when present) | "cpu" | "cuda[:N]"
    )
    speculative: Any = None  # tgserve: an engine SpeculativeConfig (None: no speculation)


@dataclass(frozen=True)
class LatencySample:
    prompt_tokens: int
    output_tokens: int
    prefill_s: float  # submission -> first generated token
    decode_s: float  # first -> last generated token (output_tokens - 1 steps)


@dataclass(frozen=True)
class ThroughputSample:
    num_requests: int
    prompt_tokens: int
    output_tokens: int
    elapsed_s: float
    kv_cache: KvCacheFigures | None = None  # tgserve only: read from its block manager


class Backend(Protocol):
    name: str  # as the report shows it (e.g. tgserve@32957a0 for a baseline tree)
    note: str  # what this backend really runs (e.g. quantised weights), shown in the report

    def run_latency(self, request: BenchRequest) -> LatencySample: ...

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample: ...

    def close(self) -> None: ...


def load_backend(name: str, source: ModelSource, options: BackendOptions) -> Backend:
    if name not in BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose from {', '.join(BACKENDS)}")
    module = importlib.import_module(BACKENDS[name])
    backend, memory = measure_load(lambda: module.load(source, options), source)
    backend.load_memory = memory
    return backend


def report_note(backend: Backend) -> str:
    """The backend's note for the report, with its memory at load and now (after the runs)."""
    from models.host_memory import resident_bytes

    memory: LoadMemory | None = getattr(backend, "load_memory", None)
    if memory is None:
        return backend.note
    return f"{backend.note}; {render(memory, getattr(backend, 'held', {}), resident_bytes())}"


def count_tokens(requests: Sequence[BenchRequest]) -> tuple[int, int]:
    """(prompt tokens, output tokens) the requests ask for."""
    return sum(len(r.prompt_token_ids) for r in requests), sum(r.output_len for r in requests)
