"""Batch-1 decode at a long context with the K/V cache in the model's dtype and in int8
(`--kv-cache-dtype int8`, or several: `int8 int8v float16`), measured alternately in one process.

`python -m bench.kv_cache_decode [--model PATH] [--context 4096] [--tokens 24] [--rounds 4]
[--kv-cache-dtype int8 ...] [--clock wall|thread]` builds one engine per cache (default model,
`--dtype auto`; the model's dtype first); each prefills one seeded
random prompt of `--context` tokens once (prefix caching keeps it), then each round re-sends it
to both engines in turn (a prefix hit: only its last partial block is computed) and decodes
`--tokens` greedy tokens. Decode tok/s = (tokens - 1) / (last output - first token); prints each
round and one JSON line of the medians and their ratio. Alternating rounds share whatever load
the host has, so the ratio holds on a busy machine better than two separate commands.
`--clock thread` times the calling thread's CPU time instead (time.thread_time): with
OMP_NUM_THREADS=1 the whole step runs on that thread, so other processes' load leaves it be.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from engine import Engine, EngineConfig, SamplingParams


def decode_rate(
    engine: Engine, request_id: str, prompt: list[int], tokens: int, clock=time.perf_counter
) -> float:
    params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(request_id, prompt, params)
    first = end = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = clock()
            if first is None and out.outputs and out.outputs[0].token_ids:
                first = now
            end = now
    return (tokens - 1) / (end - first)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_cache_decode")
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--context", type=int, default=4096)
    parser.add_argument("--tokens", type=int, default=24)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument(
        "--kv-cache-dtype", nargs="+", default=["int8"], choices=["int8", "int8v", "float16"]
    )
    parser.add_argument("--clock", choices=["wall", "thread"], default="wall")
    args = parser.parse_args(argv)
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    rng = random.Random(0)
    prompt = [rng.randrange(100, 40000) for _ in range(args.context)]
    engines = {
        kind: Engine.from_model(
            args.model,
            EngineConfig(
                kv_cache_dtype=kind,
                max_model_len=args.context + args.tokens + 16,
                max_num_batched_tokens=args.context,
                max_num_seqs=1,
            ),
        )
        for kind in ("auto", *args.kv_cache_dtype)
    }
    for kind, engine in engines.items():  # the cold prefill, kept by the prefix cache
        decode_rate(engine, f"{kind}-cold", prompt, args.tokens)
    rates: dict[str, list[float]] = {kind: [] for kind in engines}
    for r in range(args.rounds):
        for kind, engine in engines.items():
            rates[kind].append(decode_rate(engine, f"{kind}-{r}", prompt, args.tokens, clock))
        print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f} tok/s" for k, v in rates.items()))
    median = {kind: statistics.median(v) for kind, v in rates.items()}
    print(
        json.dumps(
            {
                "context": args.context,
                "clock": args.clock,
                "decode_tok_s": {k: round(v, 2) for k, v in median.items()},
                **{
                    f"{kind}_over_auto": round(median[kind] / median["auto"], 3)
                    for kind in args.kv_cache_dtype
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
