"""llama.cpp through `llama-cpp-python` as a benchmark backend, when that package is installed.

Contract (see bench.backends): llama.cpp loads GGUF files only, so this backend needs `--model` to
be a .gguf file (the default model is one).
Weights: by default the ones tgserve runs: the file as stored when tgserve keeps its blocks (the
default for Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / K-quant files, e.g. the default model). With `--dequantize`, a GGUF whose
matrices are not stored in `--dtype` is rewritten once by gguf_requant.py (tensors dequantised
then rounded to `--dtype`, cached beside tgserve's converted folders) and llama.cpp loads the copy.
Setting `TGSERVE_LLAMACPP_WEIGHTS=stored` (read when the backend loads) runs the file as stored
instead, e.g. the 4.5-bit Q4_1 weights, whatever `--dtype` says. The report's note says which
weights ran; the KV cache is llama.cpp's default (f16). Quantised files load without llama.cpp's
AMX/repack buffers (see `_plain_cpu_buffers`: they crash here).
Greedy (argmax) decoding of exactly `output_len` tokens, EOS ignored.
Latency: one request through `Llama.generate` (batch 1); prefill is the time to the first
token, decode the rest, timed with `clock` (the wall clock unless bench latency's --clock sets
the process's CPU clock: with one thread, llama.cpp's work as for tgserve). Throughput: continuous batching on the low-level API, like llama.cpp's
own server: a second context on the same model, with `min(max_num_seqs, num_requests)` sequence
slots, each its own KV stream of `max_model_len` cells; each `llama_decode` call carries
one token of every decoding sequence plus prompt chunks, up to `max_num_batched_tokens` tokens
(llamacpp_batch.py plans the calls).
"""

from __future__ import annotations

import gc
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from pathlib import Path

import numpy as np

from bench.backends import (
    BackendOptions,
    BackendUnavailable,
    LatencySample,
    ThroughputSample,
    count_tokens,
)
from bench.backends.llamacpp_batch import ContinuousBatcher, StepToken
from bench.model_source import ModelSource
from bench.workload import BenchRequest

INSTALL_HINT = (
    'install it in its own virtual environment: CMAKE_ARGS="-DGGML_NATIVE=ON" pip install '
    "llama-cpp-python (builds llama.cpp from source, ~12 minutes on 2 cores)"
)
WEIGHTS_ENV = "TGSERVE_LLAMACPP_WEIGHTS"  # "same" (default) | "stored"


class _BatchedContext:
    """A llama.cpp context for `slots` concurrent sequences of up to `max_len` tokens each."""

    def __init__(
        self, lib, model, n_vocab: int, slots: int, max_len: int, max_tokens: int, threads: int
    ) -> None:
        self.lib, self.n_vocab = lib, n_vocab
        params = lib.llama_context_default_params()
        params.n_ctx = slots * max_len
        params.n_batch = max_tokens
        params.n_ubatch = min(max_tokens, 512)  # llama.cpp's default micro-batch
        params.n_seq_max = slots
        # One KV stream per sequence: a unified pool would make every token attend (masked)
        # over all the pool's cells, slots x more attention work per step.
        params.kv_unified = False
        params.n_threads = params.n_threads_batch = threads
        params.no_perf = True
        self.ctx = lib.llama_init_from_model(model, params)
        if not self.ctx:
            raise RuntimeError(
                f"llama.cpp could not create a context of {slots} x {max_len} tokens"
            )
        self.memory = lib.llama_get_memory(self.ctx)
        self.batch = lib.llama_batch_init(max_tokens, 0, 1)

    def decode(self, step: Sequence[StepToken]) -> list[int]:
        """Runs one llama_decode; returns the argmax of each row of logits asked for."""
        batch = self.batch
        for i, tok in enumerate(step):
            batch.token[i] = tok.token
            batch.pos[i] = tok.pos
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = tok.slot
            batch.logits[i] = tok.wants_logits
        batch.n_tokens = len(step)
        status = self.lib.llama_decode(self.ctx, batch)
        if status != 0:
            raise RuntimeError(f"llama_decode failed with status {status} on {len(step)} tokens")
        rows = sum(tok.wants_logits for tok in step)
        if rows == 0:
            return []
        # Rows in batch order of the tokens that asked for logits: [rows, n_vocab] float32.
        logits = np.ctypeslib.as_array(self.lib.llama_get_logits(self.ctx), (rows, self.n_vocab))
        return logits.argmax(axis=1).tolist()

    def release(self, slot: int) -> None:
        self.lib.llama_memory_seq_rm(self.memory, slot, -1, -1)

    def clear(self) -> None:
        self.lib.llama_memory_clear(self.memory, True)

    def close(self) -> None:
        self.lib.llama_batch_free(self.batch)
        self.lib.llama_free(self.ctx)


class LlamaCppBackend:
    name = "llamacpp"

    def __init__(self, llm, lib, options: BackendOptions, threads: int, weights: str) -> None:
        self.llm, self.lib, self.options, self.threads = llm, lib, options, threads
        self.slots = max(
            1, min(options.max_num_seqs, options.num_requests, lib.llama_max_parallel_sequences())
        )
        self.note = (
            f"llama-cpp-python on {weights}; latency one sequence, throughput continuously "
            f"batched ({self.slots} sequences, {options.max_num_batched_tokens} tokens per call)"
        )
        self._batched: _BatchedContext | None = None
        # The model's tensor bytes (llama_model_size); the file is memory-mapped, so they become
        # resident as the runs first read them (the report's RSS after the runs shows it).
        self.held = {"weights": int(lib.llama_model_size(llm.model))}

    clock = staticmethod(time.perf_counter)  # run_latency's clock (bench latency --clock)

    def _decode(self, request: BenchRequest) -> tuple[float, float, int]:
        """(first token time, end time, tokens) for one request, through the high-level API."""
        got = 0
        first = None
        for _token in self.llm.generate(
            list(request.prompt_token_ids), temp=0.0, top_k=1, reset=True
        ):
            got += 1
            if first is None:
                first = self.clock()
            if got >= request.output_len:
                break
        end = self.clock()
        return first if first is not None else end, end, got

    def run_latency(self, request: BenchRequest) -> LatencySample:
        start = self.clock()
        first, end, got = self._decode(request)
        return LatencySample(len(request.prompt_token_ids), got, first - start, end - first)

    def generate_batched(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None] = lambda n: None
    ) -> list[list[int]]:
        """Greedy output tokens of every request, served by continuous batching."""
        if self._batched is None:
            self._batched = _BatchedContext(
                self.lib,
                self.llm.model,
                self.llm.n_vocab(),
                self.slots,
                self.options.max_model_len,
                self.options.max_num_batched_tokens,
                self.threads,
            )
        context = self._batched
        context.clear()
        batcher = ContinuousBatcher(requests, self.slots, self.options.max_num_batched_tokens)
        done = 0
        while not batcher.done():
            for finished in batcher.accept(context.decode(batcher.next_step())):
                context.release(finished.slot)
                done += 1
                on_finished(done)
        return batcher.outputs

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        start = time.perf_counter()
        outputs = self.generate_batched(requests, on_finished)
        elapsed = time.perf_counter() - start
        prompt_tokens, expected = count_tokens(requests)
        output_tokens = sum(len(out) for out in outputs)
        if output_tokens != expected:
            raise RuntimeError(
                f"llama.cpp decoded {output_tokens} tokens, {expected} were asked for"
            )
        return ThroughputSample(len(requests), prompt_tokens, output_tokens, elapsed)

    def close(self) -> None:
        if self._batched is not None:
            self._batched.close()
            self._batched = None
        self.llm = None
        gc.collect()


@contextmanager
def _plain_cpu_buffers(lib) -> Iterator[None]:
    """Loads weights without llama.cpp's extra buffer types (AMX, repack) while inside.

    Why: with llama-cpp-python 0.3.36 on this AMX Xeon, Q4_1/Q8_0 weights repacked into the AMX
    buffer make the first llama_decode segfault. `Llama()` has no option for it, so the default
    model params it starts from are wrapped for the duration of the load.
    """
    original = lib.llama_model_default_params

    def params():
        p = original()
        p.use_extra_bufts = False
        return p

    lib.llama_model_default_params = params
    try:
        yield
    finally:
        lib.llama_model_default_params = original


def weights_for(gguf: Path, dtype: str, dequantize: bool = False) -> tuple[Path, str]:
    """(file llama.cpp loads, what its weights are) per `WEIGHTS_ENV` (read now, not at import)
    and whether tgserve runs the file's blocks as stored (`dequantize` False and every matrix
    in a type it keeps: then "same" is the file itself)."""
    from bench.backends.gguf_requant import needs_requant, requantized_gguf, stored_types
    from models.block_linear import STORED_TYPES

    mode = os.environ.get(WEIGHTS_ENV, "same")
    if mode not in ("same", "stored"):
        raise ValueError(f"{WEIGHTS_ENV} must be 'same' or 'stored', got {mode!r}")
    types = stored_types(gguf)
    stored = "/".join(types)
    as_stored = not dequantize and set(types) <= {t.name for t in STORED_TYPES} | {"F32"}
    if mode == "stored" or as_stored or not needs_requant(gguf, dtype):
        return gguf, f"{gguf.name} ({stored} weights as stored)"
    return requantized_gguf(gguf, dtype), f"{gguf.name} ({stored} dequantised to {dtype})"


def load(source: ModelSource, options: BackendOptions) -> LlamaCppBackend:
    if source.gguf_file is None:
        raise ValueError(
            f"the llamacpp backend loads GGUF files only, and --model {source.path} is a folder; "
            "pass a .gguf file (or leave --model out for the default GGUF)"
        )
    try:
        import llama_cpp
        import llama_cpp.llama_cpp as lib  # the module Llama() reads its default params from
        from llama_cpp import Llama
    except ImportError as exc:
        raise BackendUnavailable(
            f"the llamacpp backend needs llama-cpp-python ({exc}); {INSTALL_HINT}"
        ) from exc
    import torch

    gguf_path, weights = weights_for(source.gguf_file, options.dtype, options.dequantize)
    from bench.backends.gguf_requant import TARGET_TYPES, stored_types

    float_types = {t.name for t in TARGET_TYPES.values()}
    quantised = not set(stored_types(gguf_path)) <= float_types
    threads = torch.get_num_threads() or os.cpu_count() or 1
    with _plain_cpu_buffers(lib) if quantised else nullcontext():
        llm = Llama(
            model_path=str(gguf_path),
            n_ctx=options.max_model_len + 1,
            n_batch=max(options.max_num_batched_tokens, 512),
            n_threads=threads,
            n_threads_batch=threads,
            verbose=False,
        )
    return LlamaCppBackend(llm, llama_cpp, options, threads, weights)
