"""Long prompts together against each one alone: the acceptance shape of issue 46, four
8,184-token prompts and a short request behind them.

`python -m bench.long_batch [--model M] [--num-long 4] [--long-len 8184] [--short-len 16]
[--output-len 8] [--threads N] [--clock wall|process]`

Contract: `measure(engine, spec)` runs every request alone first, one after another (its solo
latency: from its add until its last token), then all of them in one engine: the `num_long`
prompts of `long_len` seeded random ids added at once, the short one (`short_len` ids) added
right after them, so it queues behind them, and the engine stepped until every request
finished (each one's batched latency: from the batch's start until its last token). Every
request asks for `output_len` greedy tokens (ignore_eos), so its batched tokens must equal its
solo tokens (same request, same answer): `LongBatchResult.same_tokens` says whether they did.
The engine must run without prefix caching (the batch would hit the solo runs' blocks).
The two readings of "completes within 2x its solo time": `worst_ratio`, the largest batched /
solo latency over the requests (each request against its own solo run), and `batch_ratio`,
the batch's time to its last token over the sum of the solo latencies (the work done together
against the same work done in turn). `--clock process` times the process's CPU time instead of
the wall clock (one thread: the work, whatever else the host runs). Timing only, no targets
asserted; a shared host's wall figures are its load's.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable
from dataclasses import dataclass

from engine import Engine, EngineConfig, OutputAccumulator, SamplingParams


@dataclass(frozen=True)
class LongBatchSpec:
    num_long: int = 4
    long_len: int = 8184
    short_len: int = 16
    output_len: int = 8
    seed: int = 0
    vocab: int = 1000  # prompt ids are drawn from [100, vocab)


@dataclass(frozen=True)
class RequestTiming:
    name: str  # "long 0" .. "long N-1", "short"
    prompt_len: int
    solo_s: float
    batched_s: float

    @property
    def ratio(self) -> float:
        return self.batched_s / self.solo_s


@dataclass(frozen=True)
class LongBatchResult:
    requests: tuple[RequestTiming, ...]
    batch_s: float  # the batch's start until its last request finished
    same_tokens: bool  # every request's batched tokens equal its solo tokens

    @property
    def worst_ratio(self) -> float:
        return max(r.ratio for r in self.requests)

    @property
    def batch_ratio(self) -> float:
        return self.batch_s / sum(r.solo_s for r in self.requests)


def prompts(spec: LongBatchSpec) -> list[tuple[str, list[int]]]:
    """(name, prompt ids) of the long prompts, then the short one; seeded."""
    rng = random.Random(spec.seed)
    low = min(100, spec.vocab // 2)
    named = [(f"long {i}", spec.long_len) for i in range(spec.num_long)] + [
        ("short", spec.short_len)
    ]
    return [(name, [rng.randrange(low, spec.vocab) for _ in range(n)]) for name, n in named]


def _run(
    engine: Engine, batch: list[tuple[str, list[int]]], output_len: int, clock: Callable[[], float]
):
    """Adds `batch` in order, steps until all finish: ({name: seconds from the first add until
    its last token}, {name: token ids}, seconds until the last one finished)."""
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    start = clock()
    for name, prompt in batch:
        engine.add_request(name, prompt, params)
    done: dict[str, float] = {}
    outputs = {name: OutputAccumulator() for name, _ in batch}  # deltas folded, restarts cut
    while engine.has_unfinished_requests():
        for out in engine.step():
            outputs[out.request_id].add(out)
            if out.finished:
                done[out.request_id] = clock() - start
    tokens = {name: list(acc.result().outputs[0].token_ids) for name, acc in outputs.items()}
    return done, tokens, clock() - start


def measure(
    engine: Engine, spec: LongBatchSpec, clock: Callable[[], float] = time.perf_counter
) -> LongBatchResult:
    if engine.config.enable_prefix_caching:  # the batch would reuse the solo runs' blocks
        raise ValueError("measure() needs an engine without prefix caching (compute, not hits)")
    named = prompts(spec)
    solo, solo_tokens = {}, {}
    for name, prompt in named:
        times, tokens, _ = _run(engine, [(name, prompt)], spec.output_len, clock)
        solo[name], solo_tokens[name] = times[name], tokens[name]
    batched, tokens, batch_s = _run(engine, named, spec.output_len, clock)
    timings = tuple(RequestTiming(name, len(p), solo[name], batched[name]) for name, p in named)
    return LongBatchResult(timings, batch_s, tokens == solo_tokens)


def render(result: LongBatchResult) -> str:
    lines = [f"{'request':<8} {'prompt':>7} {'solo s':>9} {'batched s':>10} {'ratio':>6}"]
    for r in result.requests:
        lines.append(
            f"{r.name:<8} {r.prompt_len:>7} {r.solo_s:>9.2f} {r.batched_s:>10.2f} {r.ratio:>5.2f}x"
        )
    solo_sum = sum(r.solo_s for r in result.requests)
    lines.append(
        f"each request vs its solo run: worst {result.worst_ratio:.2f}x; the batch "
        f"{result.batch_s:.2f} s vs the solo runs' sum {solo_sum:.2f} s: {result.batch_ratio:.2f}x; "
        f"batched tokens {'equal' if result.same_tokens else 'DIFFER FROM'} the solo tokens"
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.long_batch", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--num-long", type=int, default=4)
    parser.add_argument("--long-len", type=int, default=8184)
    parser.add_argument("--short-len", type=int, default=16)
    parser.add_argument("--output-len", type=int, default=8)
    parser.add_argument("--threads", type=int, default=None, help="torch / OpenMP threads")
    parser.add_argument("--clock", choices=["wall", "process"], default="wall")
    args = parser.parse_args(argv)
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    spec = LongBatchSpec(args.num_long, args.long_len, args.short_len, args.output_len)
    engine = Engine.from_model(
        args.model,
        EngineConfig(
            max_model_len=max(args.long_len, args.short_len) + args.output_len,
            enable_prefix_caching=False,
        ),
    )
    clock = time.process_time if args.clock == "process" else time.perf_counter
    result = measure(engine, spec, clock)
    print(render(result))
    print(
        json.dumps(
            {
                "spec": vars(args),
                "solo_s": {r.name: round(r.solo_s, 3) for r in result.requests},
                "batched_s": {r.name: round(r.batched_s, 3) for r in result.requests},
                "worst_ratio": round(result.worst_ratio, 3),
                "batch_ratio": round(result.batch_ratio, 3),
                "same_tokens": result.same_tokens,
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
