"""`tgserve bench latency`: batch-1 prefill and decode speed, per backend, on the same prompts.

Contract: `run_latency_bench(names, source, options, spec, limits, show_progress)` loads each
backend in turn, runs `warmup_runs` requests it does not time, then `runs` requests (each with
its own seeded prompt of `input_len` tokens, the same for every backend, decoding `output_len`
tokens), and reports the medians: prefill tok/s = prompt tokens / time to first token; decode
tok/s = (generated - 1) / time from first to last token. With `limits`, decode is compared with
the memory-bandwidth bound (every weight read once per token: in `--dtype`, or a GGUF's matrices
as stored when tgserve keeps its blocks; plus the K and V of the mean context of a decode step,
input_len + output_len / 2 tokens) and prefill with the matmul bound at M = input_len (the
model-shape rate, or on a GPU the peak square product's when faster). Ratios are against the first backend named. Load averages are taken just before
and after each backend's timed runs: figures from a busy machine say so.
`workload` "random" (seeded random token ids) or "edit" (bench/edit_workload.py: prompts asking
to rewrite a passage they hold; needs the model's tokenizer). `temperature` > 0 samples every
request at that temperature with its own seed (`seed + i` for request i: the same tokens on
every run, with or without speculation; only backends with `samples_seeded`, tgserve's): on
random prompts at temperature 1 the output rarely repeats itself, so n-gram proposals are mostly
refused, the workload that shows what refused proposals cost. `clock` "process" times tgserve
(and llama.cpp, in process too) with the process's CPU time instead of the wall clock: on a shared machine, run with
OMP_NUM_THREADS=1 and it counts the work done, not the time spent waiting for a core. A backend that speculates
(tgserve with --speculative) adds its counters over the timed runs (`speculation`: proposed and
accepted tokens, per position).
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass, replace

from bench.backends import BackendOptions, LatencySample, load_backend, report_note
from bench.edit_workload import edit_requests
from bench.machine_limits import MachineLimits, decode_bytes_per_token
from bench.model_shapes import flops_per_token
from bench.model_source import ModelSource
from bench.progress import ProgressBar
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from engine import SpeculationStats, dtype_bytes

CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


@dataclass(frozen=True)
class LatencySpec:
    input_len: int
    output_len: int
    runs: int = 3
    warmup_runs: int = 1
    seed: int = 0
    workload: str = "random"  # "random" | "edit"
    temperature: float = 0.0  # > 0: requests sampled, request i seeded with seed + i
    clock: str = "wall"  # "wall" | "process": the process's CPU time (a shared machine)

    def __post_init__(self) -> None:
        if self.clock not in CLOCKS:
            raise ValueError(f"--clock must be one of {', '.join(CLOCKS)}, got {self.clock!r}")
        if not 0.0 <= self.temperature <= 2.0:
            raise ValueError(f"--temperature must be in [0, 2], got {self.temperature}")
        if self.workload not in ("random", "edit"):
            raise ValueError(f"--workload must be random or edit, got {self.workload!r}")
        if self.runs < 1 or self.warmup_runs < 0:
            raise ValueError(
                f"--runs must be >= 1 and --warmup-runs >= 0, got {self.runs}, {self.warmup_runs}"
            )
        if self.output_len < 2:
            raise ValueError(
                "--output-len must be >= 2: decode speed is timed after the first token"
            )

    def check_fits(self, context: int) -> None:
        """Raises ValueError when prompt + output exceed the model's context length, naming the
        longest --input-len that fits (8,192-token models: 8,176 for 16 out)."""
        total = self.input_len + self.output_len
        if total > context:
            raise ValueError(
                f"--input-len {self.input_len} + --output-len {self.output_len} = {total} "
                f"tokens exceeds the model's context length {context}; the longest prompt "
                f"that fits is --input-len {max(context - self.output_len, 0)}"
            )


@dataclass(frozen=True)
class LatencyResult:
    kind: str  # "latency"
    backend: str
    model: str
    dtype: str
    input_len: int
    output_len: int
    runs: int
    prefill_tok_s: float  # median over runs
    decode_tok_s: float  # median over runs
    prefill_tok_s_runs: tuple[float, ...]
    decode_tok_s_runs: tuple[float, ...]
    prefill_ratio_vs_first: float
    decode_ratio_vs_first: float
    decode_bound_tok_s: float | None  # bandwidth / (weight + mean context's KV) bytes per token
    decode_fraction_of_bound: float | None
    prefill_bound_tok_s: float | None  # matmul FLOP/s at M = input_len / FLOPs per token
    prefill_fraction_of_bound: float | None
    load_before: tuple[float, float, float]
    load_after: tuple[float, float, float]
    note: str
    host: str = ""  # the CPU's ISA or the GPU's name (bench/host_label.py)
    dtype_auto: bool = False  # `dtype` is what --dtype auto resolved to
    workload: str = "random"
    speculation: SpeculationStats | None = None  # over the timed runs; None: no speculation
    temperature: float = 0.0  # 0: greedy requests
    clock: str = "wall"  # "process": CPU time of the process


def run_latency_bench(
    names: list[str],
    source: ModelSource,
    options: BackendOptions,
    spec: LatencySpec,
    limits: MachineLimits | None,
    show_progress: bool,
) -> list[LatencyResult]:
    requests = latency_requests(source, spec)
    warmup, timed = requests[: spec.warmup_runs], requests[spec.warmup_runs :]
    results: list[LatencyResult] = []
    for name in names:
        backend = load_backend(name, source, options)
        try:
            if spec.temperature > 0 and not getattr(backend, "samples_seeded", False):
                raise ValueError(
                    f"--temperature needs a backend that samples seeded requests (tgserve); "
                    f"{name} decodes greedily"
                )
            if spec.clock != "wall":
                if not hasattr(backend, "clock"):
                    raise ValueError(
                        f"--clock {spec.clock} needs the tgserve or llamacpp backend, not {name}"
                    )
                backend.clock = CLOCKS[spec.clock]
            with ProgressBar(f"latency {name}", len(requests), show_progress) as bar:
                for i, request in enumerate(warmup):
                    backend.run_latency(request)
                    bar.update(i + 1)
                load_before = os.getloadavg()
                counted_before = _speculation(backend)
                samples = []
                for request in timed:
                    samples.append(backend.run_latency(request))
                    bar.update(len(warmup) + len(samples))
                load_after = os.getloadavg()
                speculation = _since(counted_before, _speculation(backend))
            results.append(
                replace(
                    _result(
                        backend.name,
                        source,
                        options,
                        spec,
                        samples,
                        limits,
                        load_before,
                        load_after,
                        report_note(backend),
                    ),
                    workload=spec.workload,
                    speculation=speculation,
                    temperature=spec.temperature,
                    clock=spec.clock,
                )
            )
        finally:
            backend.close()
    first = results[0]
    return [
        replace(
            r,
            prefill_ratio_vs_first=r.prefill_tok_s / first.prefill_tok_s,
            decode_ratio_vs_first=r.decode_tok_s / first.decode_tok_s,
        )
        for r in results
    ]


def latency_requests(source: ModelSource, spec: LatencySpec) -> list[BenchRequest]:
    """The warm-up then timed requests of `spec` (a pure function of the spec and the model's
    vocabulary / tokenizer); sampled with seed `spec.seed + i` when `spec.temperature` > 0."""
    count = spec.warmup_runs + spec.runs
    if spec.workload == "edit":
        from models.tokenizer import load_tokenizer

        tokenizer = None if source.random_weights is not None else load_tokenizer(source.path)
        requests = edit_requests(count, spec.input_len, spec.output_len, spec.seed, tokenizer)
    else:
        workload = WorkloadSpec(count, spec.input_len, spec.output_len, "fixed", spec.seed)
        requests = make_workload(workload, source.config.vocab_size)
    if spec.temperature > 0:
        requests = [
            replace(r, temperature=spec.temperature, seed=spec.seed + i)
            for i, r in enumerate(requests)
        ]
    return requests


def _speculation(backend) -> SpeculationStats | None:
    reader = getattr(backend, "speculation", None)
    return reader() if reader is not None else None


def _since(before: SpeculationStats | None, after: SpeculationStats | None):
    """The counters' growth between two snapshots (None without speculation)."""
    if before is None or after is None:
        return after
    return SpeculationStats(
        num_proposals=after.num_proposals - before.num_proposals,
        num_proposed_tokens=after.num_proposed_tokens - before.num_proposed_tokens,
        num_accepted_tokens=after.num_accepted_tokens - before.num_accepted_tokens,
        proposed_per_position=tuple(
            a - b
            for a, b in zip(after.proposed_per_position, before.proposed_per_position, strict=True)
        ),
        accepted_per_position=tuple(
            a - b
            for a, b in zip(after.accepted_per_position, before.accepted_per_position, strict=True)
        ),
        draft_forwards=after.draft_forwards - before.draft_forwards,
        draft_seconds=after.draft_seconds - before.draft_seconds,
    )


def _result(
    name, source, options, spec, samples: list[LatencySample], limits, load_before, load_after, note
) -> LatencyResult:
    for s in samples:
        if s.output_tokens != spec.output_len:
            raise RuntimeError(
                f"{name} generated {s.output_tokens} tokens, {spec.output_len} were asked for"
            )
    prefill = tuple(s.prompt_tokens / s.prefill_s for s in samples)
    decode = tuple((s.output_tokens - 1) / s.decode_s for s in samples)
    prefill_med, decode_med = statistics.median(prefill), statistics.median(decode)
    decode_bound = prefill_bound = None
    if limits is not None:
        stored = _stored_matrix_bytes(source, options) or 0
        itemsize = dtype_bytes(options.dtype)
        context = spec.input_len + spec.output_len / 2  # a decode step's mean context
        per_token = decode_bytes_per_token(source.config, itemsize, context)
        if stored:  # the matrices as stored replace the dense weights in the count
            per_token += stored - decode_bytes_per_token(source.config, itemsize, 0)
        decode_bound = limits.bandwidth_gb_s * 1e9 / per_token
        prefill_bound = (
            limits.best_gflops_at(spec.input_len)
            * 1e9
            / flops_per_token(source.config, with_lm_head=False)
        )
    return LatencyResult(
        kind="latency",
        backend=name,
        model=source.name,
        dtype=options.dtype,
        input_len=spec.input_len,
        output_len=spec.output_len,
        runs=spec.runs,
        prefill_tok_s=prefill_med,
        decode_tok_s=decode_med,
        prefill_tok_s_runs=prefill,
        decode_tok_s_runs=decode,
        prefill_ratio_vs_first=1.0,
        decode_ratio_vs_first=1.0,
        decode_bound_tok_s=decode_bound,
        decode_fraction_of_bound=decode_med / decode_bound if decode_bound else None,
        prefill_bound_tok_s=prefill_bound,
        prefill_fraction_of_bound=prefill_med / prefill_bound if prefill_bound else None,
        load_before=load_before,
        load_after=load_after,
        note=note,
    )


def _stored_matrix_bytes(source, options) -> int | None:
    """Bytes a batch-1 decode step streams when tgserve runs a GGUF's blocks as stored (every
    matrix as the file stores it; the embedding table only when it is also the LM head), else
    None (the weights are in `--dtype`)."""
    from models.block_linear import STORED_TYPES
    from models.gguf.file import open_gguf

    if source.gguf_file is None or options.dequantize or options.quantization:
        return None
    infos = [i for i in open_gguf(source.gguf_file).infos if len(i.shape) == 2]
    if not any(i.type_id in {int(t) for t in STORED_TYPES} for i in infos):
        return None
    tied = not any(i.name == "output.weight" for i in infos)
    return sum(i.nbytes for i in infos if tied or i.name != "token_embd.weight")
