"""tgserve with batching taken away: the same engine runs the throughput requests one at a
time, each alone. The baseline that shows what continuous batching buys."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from bench.backends import BackendOptions, ThroughputSample, count_tokens
from bench.backends.tgserve import TgserveBackend
from bench.backends.tgserve import load as load_batched
from bench.model_source import ModelSource
from bench.workload import BenchRequest


class SerialTgserveBackend(TgserveBackend):
    name = "tgserve-serial"

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        start = time.perf_counter()
        output_tokens = 0
        for done, request in enumerate(requests, start=1):
            output_tokens += self.run_latency(request).output_tokens
            on_finished(done)
        elapsed = time.perf_counter() - start
        prompt_tokens, _ = count_tokens(requests)
        return ThroughputSample(len(requests), prompt_tokens, output_tokens, elapsed)


def load(source: ModelSource, options: BackendOptions) -> SerialTgserveBackend:
    backend = SerialTgserveBackend(load_batched(source, options).engine)
    backend.note = "the same engine, one request at a time"
    return backend
