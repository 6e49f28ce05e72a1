"""`tgserve generate "prompt"`: one request through the engine, text streamed to stdout.

Greedy by default (`--temperature` > 0 samples). `--chat` wraps the prompt as a user message
through the model's chat template.
"""

from __future__ import annotations

import argparse
import sys
import time


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("prompt", help="the prompt text")
    parser.add_argument(
        "--model", default=None, help="HF folder or .gguf file (default: SmolLM2-135M-Instruct)"
    )
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"]
    )
    parser.add_argument("--chat", action="store_true", help="apply the model's chat template")
    parser.add_argument("--system", default=None, help="system message (with --chat)")
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--stats", action="store_true", help="print timing to stderr at the end")


def run(args: argparse.Namespace) -> int:
    from engine import Engine, EngineConfig, SamplingParams

    started = time.perf_counter()
    engine = Engine.from_model(args.model, EngineConfig(dtype=args.dtype), progress=True)
    loaded = time.perf_counter()
    tokenizer = engine.tokenizer
    if tokenizer is None:
        raise ValueError(
            "this model has no tiktoken-compatible tokenizer; use the HTTP API with token ids"
        )
    text = args.prompt
    if args.chat:
        messages = [{"role": "system", "content": args.system}] if args.system else []
        text = tokenizer.apply_chat_template(messages + [{"role": "user", "content": text}])
    prompt_ids = tokenizer.encode(text, add_special_tokens=not args.chat)
    params = SamplingParams(
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        top_p=args.top_p,
        top_k=args.top_k,
        seed=args.seed,
    )
    engine.add_request("cli", prompt_ids, params)
    first_token_at = None
    final = None
    while engine.has_unfinished_requests():
        for out in engine.step():
            completion = out.outputs[0]  # a delta: the text and ids new since the last step
            if first_token_at is None and completion.token_ids:
                first_token_at = time.perf_counter()
            sys.stdout.write(completion.text)
            sys.stdout.flush()
            if out.finished:
                final = completion
    sys.stdout.write("\n")
    if args.stats and final is not None and first_token_at is not None:
        done = time.perf_counter()
        decode_tokens = max(final.num_tokens - 1, 1)
        print(
            f"load {loaded - started:.2f}s, prompt {len(prompt_ids)} tokens, "
            f"generated {final.num_tokens} tokens, TTFT {first_token_at - loaded:.3f}s, "
            f"decode {decode_tokens / max(done - first_token_at, 1e-9):.1f} tok/s, "
            f"finish_reason={final.finish_reason}",
            file=sys.stderr,
        )
    return 0
