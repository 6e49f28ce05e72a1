"""`tgserve bench grammar`: the first-token latency a JSON schema adds, new (compiled) and cached.

Contract: `run_grammar_bench(source, options, schema_text, runs, input_len, seed)` loads tgserve's
engine and, `runs` times, times a one-token greedy request (submission to its first token, i.e.
validation + prefill + the first sample) three ways, interleaved so drift hits all alike:
unconstrained; under a schema never seen before (the file's schema with a fresh "title", so it is
compiled again); under the same schema again (a cache hit). Reported as p50 / p90 in ms, plus
the added p50s (schema minus unconstrained) and the compile time alone (the compiler's p50 on
fresh variants). Results are JSON lines (`--json`) or a short table.
"""

from __future__ import annotations

import json
import statistics
import time
from dataclasses import dataclass
from itertools import count

import torch

from bench.backends import BackendOptions
from bench.backends import tgserve as plain
from bench.model_source import ModelSource


@dataclass(frozen=True)
class GrammarResult:
    kind: str  # "grammar"
    model: str
    runs: int
    input_len: int
    ttft_plain_p50_ms: float
    ttft_new_schema_p50_ms: float
    ttft_cached_schema_p50_ms: float
    ttft_new_schema_p90_ms: float
    added_new_schema_p50_ms: float  # new schema p50 - unconstrained p50
    added_cached_schema_p50_ms: float
    compile_p50_ms: float  # GrammarCompiler.compile alone, fresh variants


def _variant(schema_text: str, i: int) -> str:
    schema = json.loads(schema_text)
    if not isinstance(schema, dict):
        raise ValueError("--json-schema must hold a JSON object schema")
    return json.dumps({**schema, "title": f"bench variant {i}"})


def run_grammar_bench(
    source: ModelSource,
    options: BackendOptions,
    schema_text: str,
    runs: int,
    input_len: int,
    seed: int,
) -> GrammarResult:
    from engine import SamplingParams, StructuredOutput

    engine = plain.load(source, options).engine
    ids = count()
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.info.vocab_size

    def ttft(so: StructuredOutput | None) -> float:
        prompt = torch.randint(3, vocab, (input_len,), generator=gen).tolist()  # no prefix hits
        params = SamplingParams(max_tokens=1, temperature=0.0, structured_output=so)
        start = time.perf_counter()
        engine.add_request(f"grammar-{next(ids)}", prompt, params)
        while engine.has_unfinished_requests():
            engine.step()
        return (time.perf_counter() - start) * 1e3

    cached = StructuredOutput("json_schema", _variant(schema_text, -1))
    for _ in range(2):  # warm-up: kernels, the masker's thread, the cached schema
        ttft(None), ttft(cached)
    plain_ms, new_ms, cached_ms = [], [], []
    for i in range(runs):
        plain_ms.append(ttft(None))
        new_ms.append(ttft(StructuredOutput("json_schema", _variant(schema_text, i))))
        cached_ms.append(ttft(cached))
    compile_ms = []
    for i in range(runs):
        start = time.perf_counter()
        engine.grammars.compiler.compile(
            StructuredOutput("json_schema", _variant(schema_text, runs + i))
        )
        compile_ms.append((time.perf_counter() - start) * 1e3)
    p50 = statistics.median
    return GrammarResult(
        kind="grammar",
        model=source.name,
        runs=runs,
        input_len=input_len,
        ttft_plain_p50_ms=p50(plain_ms),
        ttft_new_schema_p50_ms=p50(new_ms),
        ttft_cached_schema_p50_ms=p50(cached_ms),
        ttft_new_schema_p90_ms=statistics.quantiles(new_ms, n=10)[-1] if runs > 1 else new_ms[0],
        added_new_schema_p50_ms=p50(new_ms) - p50(plain_ms),
        added_cached_schema_p50_ms=p50(cached_ms) - p50(plain_ms),
        compile_p50_ms=p50(compile_ms),
    )


def format_grammar(r: GrammarResult) -> str:
    return (
        f"First-token latency, {r.model}, {r.input_len}-token prompts, {r.runs} runs (p50 ms): "
        f"unconstrained {r.ttft_plain_p50_ms:.1f}; new schema {r.ttft_new_schema_p50_ms:.1f} "
        f"(+{r.added_new_schema_p50_ms:.1f}, p90 {r.ttft_new_schema_p90_ms:.1f}); cached schema "
        f"{r.ttft_cached_schema_p50_ms:.1f} (+{r.added_cached_schema_p50_ms:.1f}); "
        f"compile alone {r.compile_p50_ms:.2f}"
    )
