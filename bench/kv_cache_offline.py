"""Offline throughput with the K/V cache in the model's dtype and in int8 (`--kv-cache-dtype
int8`) or float16 (`--kinds auto,float16`), measured alternately in one process.

`python -m bench.kv_cache_offline [--model PATH] [--requests 64] [--input-len 1024]
[--output-len 128] [--rounds 2] [--kinds auto,int8]` builds one engine per cache kind (default
model, `--dtype auto`, prefix caching off: each round computes every prompt), and warms each up with one short
request; each round submits the same seeded random prompts of `--input-len` tokens to both
engines in turn, all at once (`Engine.generate`), `--output-len` greedy tokens each
(ignore_eos). Prints each round's output tok/s and total (prompt + output) tok/s per engine,
then one JSON line of the medians and each kind's speed over the first (`<kind>_over_<first>`). Alternating rounds share whatever load the
host has, so the ratio holds on a busy machine better than two separate commands.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

from engine import Engine, EngineConfig, SamplingParams

KINDS = ("auto", "int8")  # the default --kinds


def timed_run(engine: Engine, prompts: list[list[int]], output_len: int) -> float:
    params = SamplingParams(max_tokens=output_len, temperature=0.0, ignore_eos=True)
    start = time.perf_counter()
    outs = engine.generate(prompts, params)
    seconds = time.perf_counter() - start
    assert all(len(o.outputs[0].token_ids) == output_len for o in outs)
    return seconds


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_cache_offline")
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--input-len", type=int, default=1024)
    parser.add_argument("--output-len", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--kinds", default=",".join(KINDS), help="K/V cache dtypes, first = base")
    args = parser.parse_args(argv)
    kinds = args.kinds.split(",")
    rng = random.Random(0)
    prompts = [
        [rng.randrange(100, 40000) for _ in range(args.input_len)] for _ in range(args.requests)
    ]
    engines = {
        kind: Engine.from_model(
            args.model,
            EngineConfig(
                kv_cache_dtype=kind,
                enable_prefix_caching=False,
                max_model_len=args.input_len + args.output_len + 16,
            ),
        )
        for kind in kinds
    }
    for engine in engines.values():  # one-time costs (first steps, buffers) out of the rounds
        timed_run(engine, [prompts[0][:64]], 2)
    out_tokens = args.requests * args.output_len
    all_tokens = out_tokens + args.requests * args.input_len
    seconds: dict[str, list[float]] = {kind: [] for kind in kinds}
    for r in range(args.rounds):
        for kind, engine in engines.items():
            seconds[kind].append(timed_run(engine, prompts, args.output_len))
        print(
            f"round {r}: "
            + ", ".join(
                f"{k} {out_tokens / v[-1]:.1f} output tok/s ({all_tokens / v[-1]:.1f} total)"
                for k, v in seconds.items()
            ),
            flush=True,
        )
    median = {kind: statistics.median(v) for kind, v in seconds.items()}
    print(
        json.dumps(
            {
                "requests": args.requests,
                "input_len": args.input_len,
                "output_len": args.output_len,
                "output_tok_s": {k: round(out_tokens / v, 2) for k, v in median.items()},
                "total_tok_s": {k: round(all_tokens / v, 2) for k, v in median.items()},
                **{
                    f"{kind}_over_{kinds[0]}": round(median[kinds[0]] / median[kind], 3)
                    for kind in kinds[1:]
                },
            }
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
