"""llama.cpp through `llama-cpp-python` as a benchmark backend, when that package is installed.

Contract (see backends.py): llama.cpp loads GGUF files only, so this backend needs `--model` to
be a .gguf file (the default model is one); it runs the weights as the GGUF stores them (e.g.
Q4_1), whatever `--dtype` says, and the report notes that. Greedy (temperature 0); tokens are
pulled from `Llama.generate`, which never stops on EOS by itself, until `output_len` arrived.
Latency: prefill is the time to the first token, decode the rest. Throughput: the package's
high-level API serves one sequence at a time, so requests run one after another (that is what a
user of llama-cpp-python gets; llama.cpp's own batched tools are faster).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Sequence

from server.bench.backends import (
    BackendOptions,
    BackendUnavailable,
    LatencySample,
    ThroughputSample,
    count_tokens,
)
from server.bench.model_source import ModelSource
from server.bench.workload import BenchRequest

INSTALL_HINT = (
    'install it in its own virtual environment: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install '
    "llama-cpp-python (builds llama.cpp from source, ~12 minutes on 2 cores)"
)


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, llm, gguf_name: str) -> None:
        self.llm = llm
        self.note = f"llama-cpp-python on {gguf_name} (weights as stored), one sequence at a time"

    def _decode(self, request: BenchRequest) -> tuple[float, float, int]:
        """(first token time, end time, tokens) after `start`, for one request."""
        got = 0
        first = None
        for _token in self.llm.generate(
            list(request.prompt_token_ids), temp=0.0, top_k=1, reset=True
        ):
            got += 1
            if first is None:
                first = time.perf_counter()
            if got >= request.output_len:
                break
        end = time.perf_counter()
        return first if first is not None else end, end, got

    def run_latency(self, request: BenchRequest) -> LatencySample:
        start = time.perf_counter()
        first, end, got = self._decode(request)
        return LatencySample(len(request.prompt_token_ids), got, first - start, end - first)

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        start = time.perf_counter()
        output_tokens = 0
        for i, request in enumerate(requests):
            output_tokens += self._decode(request)[2]
            on_finished(i + 1)
        elapsed = time.perf_counter() - start
        prompt_tokens, expected = count_tokens(requests)
        if output_tokens != expected:
            raise RuntimeError(
                f"llama.cpp decoded {output_tokens} tokens, {expected} were asked for"
            )
        return ThroughputSample(len(requests), prompt_tokens, output_tokens, elapsed)

    def close(self) -> None:
        self.llm = None
        gc.collect()


def load(source: ModelSource, options: BackendOptions) -> LlamaCppBackend:
    if source.gguf_file is None:
        raise ValueError(
            f"the llamacpp backend loads GGUF files only, and --model {source.path} is a folder; "
            "pass a .gguf file (or leave --model out for the default GGUF)"
        )
    try:
        from llama_cpp import Llama
    except ImportError as exc:
        raise BackendUnavailable(
            f"the llamacpp backend needs llama-cpp-python ({exc}); {INSTALL_HINT}"
        ) from exc
    import torch

    threads = torch.get_num_threads() or os.cpu_count() or 1
    llm = Llama(
        model_path=str(source.gguf_file),
        n_ctx=options.max_model_len + 1,
        n_batch=max(options.max_num_batched_tokens, 512),
        n_threads=threads,
        n_threads_batch=threads,
        verbose=False,
    )
    return LlamaCppBackend(llm, source.gguf_file.name)
