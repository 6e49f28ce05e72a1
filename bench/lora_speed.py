"""`tgserve bench lora`: what serving LoRA adapters costs, against the base model in the same
process (issue 42's pair).

Contract: `run_lora_bench(args)` writes `--adapters` random PEFT folders (rank `--rank`, alpha
2 x rank, on q/k/v/o/gate/up/down, lora_B non-zero) for the model, loads the model twice (the
base alone; the base with every adapter, `--max-loras` = their number) and measures, each run
`--repeats` times alternating the two engines (best of the repeats kept: a shared host's other
work only slows a run):
- offline: `--requests` prompts of `--prompt-len` random tokens, `--output-len` greedy tokens
  each (ignore_eos), submitted at once; with adapters request i runs adapter i mod N;
- batch-1 decode: one request, the decode steps after its prefill, timed step by step.
Prints one line per figure and the ratios (LoRA / base; 1.0 = free). Offline runs only the
engine's front door (engine.generate); no server.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch
from safetensors.torch import save_file

from bench.model_source import resolve_model
from engine import Engine, EngineConfig, LoraConfig, SamplingParams

TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def write_random_adapters(folder: Path, config, count: int, rank: int) -> list[tuple[str, str]]:
    """PEFT folders of random adapters for `config`'s shapes: (name, path) pairs."""
    from models.lora.adapter import module_shape

    gen = torch.Generator().manual_seed(0)
    made = []
    for i in range(count):
        tensors = {}
        for layer in range(config.num_layers):
            for module in TARGETS:
                k, n = module_shape(config, module)
                part = "self_attn" if module[0] in "qkvo" else "mlp"
                stem = f"base_model.model.model.layers.{layer}.{part}.{module}"
                tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, k, generator=gen) / k**0.5
                tensors[f"{stem}.lora_B.weight"] = torch.randn(n, rank, generator=gen) * 0.01
        path = folder / f"a{i}"
        path.mkdir(parents=True)
        save_file(tensors, str(path / "adapter_model.safetensors"))
        cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": 2 * rank, "target_modules": TARGETS}
        (path / "adapter_config.json").write_text(json.dumps(cfg))
        made.append((f"a{i}", str(path)))
    return made


def offline_tokens_per_second(engine: Engine, args, adapters: list[str]) -> float:
    gen = torch.Generator().manual_seed(1)
    vocab = engine.info.vocab_size
    prompts = [torch.randint(3, vocab, (args.prompt_len,), generator=gen).tolist()
               for _ in range(args.requests)]  # fmt: skip
    params = [
        SamplingParams(
            max_tokens=args.output_len,
            temperature=0.0,
            ignore_eos=True,
            adapter=adapters[i % len(adapters)] if adapters else None,
        )  # fmt: skip
        for i in range(args.requests)
    ]
    start = time.perf_counter()
    engine.generate(prompts, params)
    return args.requests * args.output_len / (time.perf_counter() - start)


def decode_tokens_per_second(engine: Engine, args, adapter: str | None) -> float:
    prompt = [3 + i % (engine.info.vocab_size - 3) for i in range(args.prompt_len)]
    params = SamplingParams(
        max_tokens=args.decode_tokens + 1, temperature=0.0, ignore_eos=True, adapter=adapter
    )
    engine.add_request(f"decode-{time.monotonic_ns()}", prompt, params)
    engine.step()  # the prefill (and the first token)
    start = time.perf_counter()
    steps = 0
    while engine.has_unfinished_requests():
        engine.step()
        steps += 1
    return steps / (time.perf_counter() - start)


def run_lora_bench(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory() as tmp:  # adapters are read when first used
        return _run(args, Path(tmp))


def _run(args: argparse.Namespace, tmp: Path) -> int:
    common = dict(dtype=args.dtype, max_num_seqs=args.requests)
    base = Engine.from_model(args.model, EngineConfig(**common))
    config = resolve_model(args.model).config
    pairs = write_random_adapters(tmp, config, args.adapters, args.rank)
    lora = LoraConfig(adapters=tuple(pairs), max_loras=len(pairs), max_lora_rank=args.rank)
    adapted = Engine.from_model(args.model, EngineConfig(**common, lora=lora))
    names = [name for name, _ in pairs]
    path = adapted.describe().forward_path
    print(f"forward path: {path}; {len(names)} adapters of rank {args.rank}")
    best: dict[str, float] = {}
    for _ in range(args.repeats):  # alternating: a busy spell slows both alike
        for key, run in (
            ("offline base", lambda: offline_tokens_per_second(base, args, [])),
            ("offline lora", lambda: offline_tokens_per_second(adapted, args, names)),
            ("decode base", lambda: decode_tokens_per_second(base, args, None)),
            ("decode lora", lambda: decode_tokens_per_second(adapted, args, names[0])),
        ):
            best[key] = max(best.get(key, 0.0), run())
            print(f"{key}: {best[key]:.1f} output tok/s (best so far)", flush=True)
    offline = best["offline lora"] / best["offline base"]
    decode = best["decode lora"] / best["decode base"]
    print(
        f"offline {args.requests} x {args.prompt_len}/{args.output_len} over {len(names)} "
        f"adapters: {offline:.2f}x the base model; batch-1 decode with an adapter: "
        f"{decode:.2f}x the base model"
    )
    return 0
