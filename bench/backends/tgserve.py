"""tgserve's own engine as a benchmark backend.

Contract (see bench.backends): requests go through `Engine.add_request` / `step()` exactly as the
server drives them, greedy (latency: sampled at the request's temperature and seed when it has
one; timed with `clock`, the wall clock unless bench latency sets the process's CPU clock),
`ignore_eos=True` and `max_tokens = output_len`, so every request
decodes its full count. Latency times engine steps directly: prefill is submission until the step
that samples the first token, decode is the remaining steps. Throughput submits every request at
once and steps until all finish (what `Engine.generate` does, stepped here so the block manager
can be read at peak usage for the KV cache figures), as whole-output requests (`streamed` False,
as `Engine.generate`'s: no stream's inter-token latency holds the steps back).
"""

from __future__ import annotations

import dataclasses
import gc
import time
from collections.abc import Callable, Sequence
from itertools import count

from bench.backends import BackendOptions, LatencySample, ThroughputSample, count_tokens
from bench.kv_usage import KvPeakTracker
from bench.model_source import ModelSource
from bench.workload import BenchRequest


class TgserveBackend:
    name = "tgserve"
    samples_seeded = True  # run_latency honours a request's temperature and seed
    clock = staticmethod(time.perf_counter)  # run_latency's clock (bench latency --clock)

    def __init__(self, engine) -> None:
        self.engine = engine
        described = engine.describe()  # the front door's account: path, graphs, held bytes
        self.note = (
            f"paged KV, block {engine.config.block_size}, max_num_seqs {engine.config.max_num_seqs}"
            + (f", {engine.config.quantization}" if engine.config.quantization else "")
            + (
                f", {engine.config.activation_quantization} activations"
                if engine.config.activation_quantization
                else ""
            )
            + (
                f", {engine.config.kv_cache_dtype} K/V"
                if engine.config.kv_cache_dtype in ("int8", "float16", "int8v")
                else ""
            )
            + (", compiled" if engine.config.compile else "")
            + (", batch-invariant" if engine.config.batch_invariant else "")
            + (", C++ CPU kernels" if described.cpu_kernels else "")
            + (", CUDA graphs" if described.cuda_graphs else "")
            + (", GGUF blocks as stored" if described.gguf_blocks_as_stored else "")
            + _speculative_note(engine.config.speculative)
        )
        self.held = dict(described.held_bytes)  # report_note splits the RSS growth at load with it
        self._ids = count()

    def _params(self, output_len: int, streamed: bool = True):
        from engine import SamplingParams

        return SamplingParams(
            max_tokens=output_len, temperature=0.0, ignore_eos=True, streamed=streamed
        )

    def run_latency(self, request: BenchRequest) -> LatencySample:
        engine = self.engine
        params = self._params(request.output_len)
        if request.temperature > 0:  # a seeded sampled request: the same tokens on every run
            params = dataclasses.replace(params, temperature=request.temperature, seed=request.seed)
        start = self.clock()
        engine.add_request(f"bench-{next(self._ids)}", request.prompt_token_ids, params)
        first = None
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                if first is None and out.outputs[0].token_ids:
                    first = self.clock()
                if out.finished:
                    final = out
        end = self.clock()
        generated = final.outputs[0].num_tokens if final is not None else 0
        if final is None or final.error or first is None:
            raise RuntimeError(
                f"tgserve failed the latency request: {final.error if final else 'no output'}"
            )
        return LatencySample(len(request.prompt_token_ids), generated, first - start, end - first)

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        engine = self.engine
        ids = [f"bench-{next(self._ids)}" for _ in requests]
        tracker = KvPeakTracker(engine, ids)
        start = time.perf_counter()
        for rid, request in zip(ids, requests, strict=True):
            # an offline batch, as Engine.generate: whole outputs, no stream to hold steps for
            params = self._params(request.output_len, streamed=False)
            engine.add_request(rid, request.prompt_token_ids, params)
        output_tokens = 0
        finished = 0
        while engine.has_unfinished_requests():
            outputs = engine.step()
            tracker.observe()
            for out in outputs:
                if out.finished:
                    if out.error:
                        raise RuntimeError(f"tgserve failed request {out.request_id}: {out.error}")
                    output_tokens += out.outputs[0].num_tokens
                    finished += 1
                    on_finished(finished)
        elapsed = time.perf_counter() - start
        prompt_tokens, expected = count_tokens(requests)
        if output_tokens != expected:
            raise RuntimeError(f"tgserve decoded {output_tokens} tokens, {expected} were asked for")
        return ThroughputSample(
            len(requests), prompt_tokens, output_tokens, elapsed, tracker.figures()
        )

    def speculation(self):
        """The engine's speculative decoding counters so far (None: it does not speculate)."""
        return self.engine.stats().speculation

    def close(self) -> None:
        self.engine = None
        gc.collect()


def _speculative_note(config) -> str:
    if config is None:
        return ""
    if config.method == "ngram":
        return f", speculative ngram k={config.num_tokens} n={config.ngram_min}..{config.ngram_max}"
    return f", speculative draft k={config.num_tokens}"


def load(source: ModelSource, options: BackendOptions) -> TgserveBackend:
    from engine import Engine, warm_up

    config = engine_config(source, options)
    if source.random_weights is not None:
        engine = Engine.from_random_weights(str(source.path), source.random_weights, config)
    else:
        engine = Engine.from_model(str(source.path), config)
    warm_up(engine)  # what a server runs before its first request (engine/warm_up.py)
    return TgserveBackend(engine)


def engine_config(source: ModelSource, options: BackendOptions):
    """The EngineConfig every tgserve backend of this package starts from."""
    from engine import EngineConfig

    target = (
        {} if options.target_itl_ms is None else {"target_itl_ms": options.target_itl_ms or None}
    )
    max_model_len = options.max_model_len
    if source.config.encoder_decoder is not None:
        from engine import EncoderLayout

        # the sequence holds the encoder region (the input and its digest, padded to whole
        # blocks: at most one block more) and the decoder prompt before the output
        layout = EncoderLayout(source.config, EngineConfig.block_size)
        max_model_len += layout.block_size + len(layout.decoder_prompt)
    return EngineConfig(
        **target,
        dtype=options.dtype,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=options.max_num_batched_tokens,
        enable_prefix_caching=options.enable_prefix_caching,
        max_queued_requests=max(256, options.num_requests),
        # the longest request of the run: the KV cache is sized for it, not for the full context
        max_model_len=min(max_model_len, source.config.max_position_embeddings),
        quantization=options.quantization,
        activation_quantization=options.activation_quantization,
        kv_cache_dtype=options.kv_cache_dtype,
        compile=options.compile,
        cpu_kernels=options.cpu_kernels,
        dequantize=options.dequantize,
        enforce_eager=options.enforce_eager,
        batch_invariant=options.batch_invariant,
        device=options.device,
        speculative=options.speculative,
    )
