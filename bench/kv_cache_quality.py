"""What `--kv-cache-dtype int8` (or `float16`, `int8v`) costs in answers, on the default model (or
`--model`).

`python -m bench.kv_cache_quality [--model PATH] [--dtype auto] [--max-tokens 48]
[--more-prompts 16] [--kv-cache-dtype int8|float16|int8v ...]` builds engines in one process,
the K/V cache in the model's dtype and in each `--kv-cache-dtype` (int8: models/kv_quant.py;
float16 rows of a float32 model: models/kv_half.py; int8v: float16 K, int8 V rows), and prints
one JSON line per tested cache against the model's dtype:
- greedy: the 8 prompts of bench/activation_quant_quality (issue 43's count), `--max-tokens`
  greedy tokens each: how many continuations are unchanged, and for the others the first
  position that differs and the float cache's margin there (its top-1 minus top-2
  log-probability: a near-tie that any small change of the K/V may flip); then the same count
  over `--more-prompts` more (`more_prompts`: the first 300 characters of every 4th pydoc topic
  of >= 600 characters): the 8 prompts' count moves by which near-ties a K/V error happens to
  flip (PERFORMANCE.md), so a change is judged on both counts and the mean log-prob change;
- perplexity: each of 10 passages of the Python documentation CPython ships
  (`pydoc_data.topics`: every 4th of the first 40 topics of >= 1500 characters, cut at a
  paragraph break before 1200 characters, as PERFORMANCE.md's lm-eval task) scored with
  `prompt_logprobs` (every token given the ones before it, the first one aside): bits per byte
  and its change, and how often the top-1 token agrees between the two caches.
The perplexity is the engine's own teacher-forced log-likelihood, the quantity lm-eval's
`loglikelihood_rolling` asks a server for (one window per passage: they fit the context).
"""

from __future__ import annotations

import argparse
import json
import math

from bench.activation_quant_quality import PROMPTS
from engine import Engine, EngineConfig, SamplingParams


def passages(count: int = 10) -> list[str]:
    from pydoc_data.topics import topics

    texts = [t for _, t in sorted(topics.items()) if len(t) >= 1500][: 4 * count : 4]
    out = []
    for text in texts:
        cut = text[:1200].rfind("\n\n")
        out.append(text[: cut if cut > 0 else 1200].strip())
    return out


def more_prompts(count: int = 16) -> list[str]:
    """The wider greedy set: the first 300 characters of every 4th pydoc topic of >= 600."""
    from pydoc_data.topics import topics

    return [t[:300] for _, t in sorted(topics.items()) if len(t) >= 600][::4][:count]


def scored(engine: Engine, texts: list[str]) -> list[list]:
    """Per passage, each token's TokenLogprob (with the top-1) after the first."""
    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=1)
    return [list(out.prompt_logprobs[1:]) for out in engine.generate(texts, params)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.kv_cache_quality")
    parser.add_argument("--model", default=None, help="model path (default: the default model)")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--more-prompts", type=int, default=16, help="0: the 8 prompts only")
    parser.add_argument(
        "--kv-cache-dtype", nargs="+", default=["int8"], choices=["int8", "float16", "int8v"]
    )
    args = parser.parse_args(argv)
    greedy = SamplingParams(
        max_tokens=args.max_tokens, temperature=0.0, ignore_eos=True, logprobs=2
    )
    texts = passages()
    prompts = list(PROMPTS) + more_prompts(args.more_prompts)
    nbytes = sum(len(t.encode()) for t in texts)
    runs = {}
    for kind in ("auto", *args.kv_cache_dtype):
        config = EngineConfig(dtype=args.dtype, kv_cache_dtype=kind)
        engine = Engine.from_model(args.model, config)
        outs = [out.outputs[0] for out in engine.generate(prompts, greedy)]
        runs[kind] = ([o.token_ids for o in outs], scored(engine, texts), outs)
        del engine
    for tested in args.kv_cache_dtype:
        report(args, runs, tested, len(texts), nbytes)
    return 0


def report(args, runs: dict, tested: str, num_texts: int, nbytes: int) -> None:
    """One JSON line: the `tested` cache's run against the model's dtype's (runs["auto"])."""
    (want, ref, float_outs), (got, test, _) = runs["auto"], runs[tested]
    first_diff = [
        next((i for i, (a, b) in enumerate(zip(w, g, strict=True)) if a != b), None)
        for w, g in zip(want, got, strict=True)
    ]
    margins = [
        None if i is None else round(o.logprobs[i].top[0][1] - o.logprobs[i].top[1][1], 4)
        for i, o in zip(first_diff, float_outs, strict=True)
    ]
    n, more = len(PROMPTS), first_diff[len(PROMPTS) :]
    bpb = {
        kind: -sum(t.logprob for p in runs[kind][1] for t in p) / math.log(2) / nbytes
        for kind in ("auto", tested)
    }
    pairs = [(a, b) for pa, pb in zip(ref, test, strict=True) for a, b in zip(pa, pb, strict=True)]
    agree = sum(a.top[0][0] == b.top[0][0] for a, b in pairs)
    print(
        json.dumps(
            {
                "model": args.model or "default",
                "dtype": args.dtype,
                "kv_cache_dtype": tested,
                "greedy_unchanged": f"{first_diff[:n].count(None)} / {n}",
                "first_differing_token": first_diff[:n],
                "float_margin_there": margins[:n],
                "more_prompts_unchanged": f"{more.count(None)} / {len(more)}",
                "passages": num_texts,
                "bytes": nbytes,
                "bits_per_byte": {k: round(v, 5) for k, v in bpb.items()},
                "bits_per_byte_change": f"{100 * (bpb[tested] / bpb['auto'] - 1):+.3f}%",
                "max_abs_logprob_change": round(
                    max(abs(a.logprob - b.logprob) for a, b in pairs), 4
                ),
                "mean_abs_logprob_change": round(
                    sum(abs(a.logprob - b.logprob) for a, b in pairs) / len(pairs), 5
                ),
                "top1_agreement": f"{agree} / {len(pairs)}",
            }
        )
    )


if __name__ == "__main__":
    raise SystemExit(main())
